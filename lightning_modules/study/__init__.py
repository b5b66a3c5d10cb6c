"""Running a study: a protocol's runs (sizes x arms x seeds on one budget), claimed in the tracking store and
trained resumably, one worker process per run; the committed ledger says what is done on any machine.
Reporting it is lightning_modules/reporting/.

    python -m lightning_modules study conf/study/cpu.yaml --workers 2   # run what is not done yet
    python -m lightning_modules study conf/study/cpu.yaml --plan        # what is done, what would run

- claims.py      done / claimed / free, from the MLflow store; the claim rule for several runners
- comparison.py  train attentions under one budget and test each in one process (make demo's job)
- ledger.py      the committed results ledger (results/<protocol>/runs.csv, evaluations.csv)
- lock.py        one worker per run: the run's lock, and the worker dying with its runner
- protocol.py    the protocol file and the runs it asks for, with their identities
- runner.py      N worker processes at a time, resume, progress
- settings.py    a protocol edited after its runs is refused, not counted as done
- timing.py      how long a protocol's next run should take here, from the runs already done
- worker.py      one run: fit (or resume) and test through main.py's CLI
"""
