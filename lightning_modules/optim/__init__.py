"""Optimisers: AdamW and Muon groups, the learning-rate schedule, and Muon's Newton-Schulz step spread over ranks.

- distributed.py  Newton-Schulz split over ranks
- muon.py         Muon for the block matrices and AdamW for the rest, in one optimiser
- setup.py        the optimiser and its learning-rate schedule from the config
"""
