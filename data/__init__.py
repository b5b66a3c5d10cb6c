"""Data pipeline: prepare (text -> tokenizer + WebDataset shards + manifest), verify, ShardDataModule.

The DataModule is imported lazily so that `python -m lightning_modules prepare` does not pay for importing Lightning.

- atomic.py               build a dataset folder atomically
- build.py                the one-process preparation
- corpus_tokenizer.py     the tokenizer of a preparation
- data_errors.py          one exception family for the data pipeline: bad data told apart from bugs
- datamodule.py           ShardDataModule: the shards streamed evenly over ranks and workers, resumed exactly
- distributed_prepare.py  preparation as N datatrove tasks (`prepare --tasks N`)
- manifest.py             manifest.json
- packing.py              documents -> splits -> samples -> shards
- parallel_options.py     the --tasks / --workers / --executor / --slurm-* options of `prepare`
- plan.py                 which samples each rank and DataLoader worker reads
- prepare_config.py       the options of a preparation and the checks made on them and on its output
- shards.py               WebDataset shard files
- sources.py              documents from .txt / .jsonl / .parquet files or the embedded Shakespeare corpus, in a fixed order
- streaming.py            IterableDatasets that read data/plan.py's plan from the shards, batch by batch
- summary.py              what a finished preparation prints
- task_executors.py       where the tasks of `--tasks N` run
- task_merge.py           the merge of `--tasks N`
- task_plan.py            the work folder of `--tasks N` (`<out>.partial/` beside --out) and the plan its tasks share
- task_steps.py           the datatrove pipeline steps of `--tasks N` (pickled by datatrove into each task)
- tokenizer.py            byte-level BPE (HF tokenizers)
- train_position.py       where the train stream stands on one rank, as checkpoints save it and a resume reads it back
- verification.py         check every shard against manifest.json
- work_lock.py            one `prepare --tasks N` per --out at a time
- worker_tempdir.py       loader workers need a short TMPDIR
"""

from typing import Any

from data.data_errors import DataError, ManifestError, PrepareError, ShardError

__all__ = ["DataError", "ManifestError", "PrepareError", "ShardDataModule", "ShardError"]


def __getattr__(name: str) -> Any:
    if name == "ShardDataModule":
        # late: Lightning is heavy, and `python -m lightning_modules prepare` has no use for it
        from data.datamodule import ShardDataModule

        return ShardDataModule
    raise AttributeError(f"module 'data' has no attribute {name!r}")
