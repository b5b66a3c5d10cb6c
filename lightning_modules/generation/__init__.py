"""Text from a trained decoder (the command: python -m lightning_modules generate).

- checkpoint.py  the decoder of a training checkpoint, ready to generate
- loop.py        sampling and the generation loop: prefill once, then one cached decode step per token
- text.py        the run's tokenizer through its data manifest, and the new tokens streamed as text
"""
