"""torch.compile per decoder block (`model.compile: true`).

Each block is compiled in place (nn.Module.compile), so module and parameter names stay what they were and
checkpoints do not depend on the setting. Order, as torchtitan applies it: activation checkpointing, then
compile, then FSDP's fully_shard (lightning_modules/distributed/parallel.py): the compiled region is the block's own
computation (with its recomputation under checkpointing), and FSDP's gathers and reduce-scatters run in
its hooks around it (dynamo skips FSDP2's hooks). One block shape is compiled once: every block has the
same code and shapes, so the blocks share the compiled graphs.

On a CPU inductor needs a C++ compiler (gcc); what it buys there is in BENCHMARKS.md ("torch.compile").
"""

from __future__ import annotations

from torch import nn


def compile_blocks(blocks: nn.ModuleList) -> None:
    for block in blocks:
        block.compile()
