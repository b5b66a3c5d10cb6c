"""Data pipeline: prepare (text -> tokenizer + WebDataset shards + manifest), verify, ShardDataModule.

The DataModule is imported lazily so that `python -m data.prepare` does not pay for importing Lightning.
"""

from typing import Any

from data.errors import DataError, ManifestError, PrepareError, ShardError

__all__ = ["DataError", "ManifestError", "PrepareError", "ShardDataModule", "ShardError"]


def __getattr__(name: str) -> Any:
    if name == "ShardDataModule":
        # late: Lightning is heavy, and `python -m data.prepare` has no use for it
        from data.datamodule import ShardDataModule

        return ShardDataModule
    raise AttributeError(f"module 'data' has no attribute {name!r}")
