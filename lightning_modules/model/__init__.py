"""The decoder in plain torch (no Lightning, no tracking, no data): its size, its blocks and its attentions.

- config.py       ModelConfig (a size), loaded from conf/model/*.yaml
- layers.py       RMSNorm, RoPE, the ReLU^2 MLP
- transformer.py  the decoder: training forward and cached decode
"""
