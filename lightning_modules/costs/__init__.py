"""What a configuration costs, computed from the shapes it builds (docs/costs.md).

- budget.py     a run's length as a budget of tokens or of training FLOPs
- counts.py     parameters, training and decode FLOPs per token, KV-cache bytes per token
- cuda_step.py  a CUDA step's saved tensors traced on the CPU (the GPU plan's SDPA kernels, fp32 ops, RMSNorm)
- fits.py       which paper runs fit on which GPUs, searched with the memory plan
- memory.py     the per-rank memory plan of one training step
- step_time.py  a training step's first-principles time on one GPU and the MFU it implies (the GPU targets)
- table.py      the cost rows as the printed table
"""
