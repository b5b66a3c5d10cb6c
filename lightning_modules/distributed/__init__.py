"""How the decoder is spread over devices (docs/architecture.md, "Scale").

- strategy.py   FSDP2Strategy: Lightning's ModelParallelStrategy, data-parallel over every rank
- parallel.py   FSDP2 sharding, its precision, activation checkpointing
- meta_init.py  building the decoder on the meta device and materialising it shard by shard
- compile.py    torch.compile per decoder block
"""
