"""Fused GPU kernels in Triton, optional (pip install .[triton]; docs/attentions.md, "Fused decode").

- support.py      whether a kernel can run (triton installed, a CUDA tensor, or TRITON_INTERPRET=1 on the CPU)
                  and its launch, jitted on first use
- split_kv.py     the split-KV combine: partial softmax sums over ranges of cached positions merged in fp32
- lrkv_decode.py  LRKV's absorbed decode step in one pass over the compressed cache
- mla_decode.py   MLA's absorbed decode step in one pass over the latent cache

Each kernel has a plain-torch twin in model/attention/ that is the default wherever the kernel cannot run;
tests/kernels/ checks each against its twin through Triton's interpreter on the CPU.
"""
