"""Training with Lightning: the LightningModule, the CLI behind main.py, and the throughput callback.

- batch_limits.py      the Trainer's limit_*_batches arguments declared integer-first for the CLI
- cli.py               LightningCLI with the project's conventions (precision, tracking, resume, run names)
- final_validation.py  a validation at the last step of every fit
- host_sync.py         which steps read device values back; the non-finite loss watch
- language_model.py    the LightningModule: loss, metrics, optimisers, compute accounting, the budget
- signals.py           SIGTERM, Ctrl-C, SIGUSR1: save the step, end the run KILLED, exit 128 + the signal
- system_metrics.py    MLflow's system-metrics monitor for a fit's run; the fullest rank's peak CUDA memory
- throughput.py        tokens per second and model FLOPs utilisation over windows of steps (the peak table)
"""
