"""The decoder in plain torch (no Lightning, no tracking, no data): its size, its blocks and its attentions.

- config.py       ModelConfig (a size), loaded from conf/model/*.yaml
- layers.py       RMSNorm, RoPE, the ReLU^2 MLP
- loss.py         the training loss from the final hidden states, in chunks (no (B, T, V) logits)
- launches.py     the fused-kernel launches of one decode step at a real size, recorded on meta tensors
- transformer.py  the decoder: training forward and cached decode
"""
