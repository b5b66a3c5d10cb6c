"""Fused GPU kernels in Triton, optional (pip install .[triton]; docs/attentions.md, "Fused decode").

- aot.py          the kernels compiled for a GPU target without a GPU: shared memory, registers, spills
- lrkv_decode.py  LRKV's absorbed decode step in one pass over the compressed cache
- mla_decode.py   MLA's absorbed decode step in one pass over the latent cache
- split_kv.py     the split-KV combine: partial softmax sums over ranges of cached positions merged in fp32
- support.py      whether a kernel runs (the per-kernel switch, cache dtype, device), its launch, the fallback
"""
