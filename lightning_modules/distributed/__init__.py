"""How the decoder is spread over devices (docs/architecture.md, "Scale").

- compile.py    torch.compile per decoder block
- meta_init.py  building the decoder on the meta device and materialising it shard by shard
- parallel.py   FSDP2 sharding, its precision, activation checkpointing
- strategy.py   FSDP2Strategy: Lightning's ModelParallelStrategy, data-parallel over every rank
"""
