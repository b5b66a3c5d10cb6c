"""The merge of `--tasks N`: check that every task completed, re-hash every shard against its task's
summary, write manifest.json (splits = the tasks' shards in task order; `source.tasks` says how many tasks
and what each dropped) and swap the work folder's dataset in for --out (data/task_plan.py has the layout).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from data.data_errors import ManifestError, PrepareError
from data.manifest import LAYOUT, MANIFEST_NAME, SPLITS, Manifest, ShardInfo, SplitInfo, dtype_for_vocab
from data.prepare_config import PrepareConfig, check_splits
from data.shards import sha256_file
from data.task_plan import WorkPaths, task_files
from data.tokenizer import TOKENIZER_NAME, eot_id, load_tokenizer

COUNTS = ("samples", "tokens", "text_bytes", "documents", "stream_tokens", "dropped_tokens")


def merge(paths: WorkPaths, out: Path, keep: Sequence[str] = ()) -> Manifest:
    """Verify every task's output, write the manifest, swap the dataset in for `out`, clear the work folder
    (all of it but `keep`)."""
    run = json.loads(paths.run.read_text(encoding="utf-8"))
    source, tasks = dict(run["source"]), int(run["fingerprint"]["tasks"])
    files = run["fingerprint"]["files"]
    seq_len, eot_token = int(source.pop("seq_len")), str(source.pop("eot_token"))
    summaries = _summaries(paths, files, tasks)
    splits, per_task = _join_splits(summaries)
    _verify_shards(paths.dataset, [s for split in splits.values() for s in split.shards])
    check_splits(_fractions_config(source, seq_len), splits)
    tokenizer = load_tokenizer(paths.tokenizer)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    order = {f: i for i, f in enumerate(files)}
    replaced = sorted(
        {f for s in summaries for f in s["replaced_files"]}, key=lambda f: order.get(f, len(order))
    )
    manifest = Manifest(
        vocab_size=vocab_size,
        dtype=dtype_for_vocab(vocab_size),
        seq_len=seq_len,
        tokenizer=TOKENIZER_NAME,
        eot_token=eot_token,
        eot_id=eot_id(tokenizer, eot_token, str(paths.tokenizer)),
        splits=splits,
        source={
            **source,
            "documents": sum(s["documents"] for s in summaries),
            "empty_documents_skipped": sum(s["empty_documents"] for s in summaries),
            "files_with_replaced_bytes": replaced,
            "tasks": {"count": tasks, "per_task": per_task},
        },
        layout=LAYOUT
        if tasks == 1
        else LAYOUT + "; one stream per task and split, tasks in order (source.tasks)",
    )
    manifest.check_consistent(str(paths.dataset))
    _remove_strays(paths.dataset, manifest)
    manifest.save(paths.dataset)
    swap_in(paths.dataset, out)
    _clear_work(paths, keep)
    return manifest


def _summaries(paths: WorkPaths, files: Sequence[str], tasks: int) -> list[dict[str, Any]]:
    """Every task's summary, in task order; an error naming the first task that did not finish."""
    summaries = []
    for rank in range(tasks):
        mine = task_files(files, rank, tasks)
        if not paths.completion(rank).exists() or not paths.summary(rank).is_file():
            raise PrepareError(
                f"task {rank} of {tasks} did not finish (files {mine[0]} .. {mine[-1]}); rerun the same command "
                f"to redo the unfinished tasks (log: {paths.logs / 'logs' / f'task_{rank:05d}.log'})"
            )
        summaries.append(json.loads(paths.summary(rank).read_text(encoding="utf-8")))
    return summaries


def _join_splits(
    summaries: Sequence[dict[str, Any]],
) -> tuple[dict[str, SplitInfo], list[dict[str, Any]]]:
    """Each split as the tasks' parts laid end to end, and what each task read and dropped."""
    splits = {name: SplitInfo() for name in SPLITS}
    per_task = []
    for rank, summary in enumerate(summaries):
        dropped = {}
        for name in SPLITS:
            raw = summary["splits"][name]
            part = SplitInfo(
                shards=[ShardInfo(**s) for s in raw["shards"]],
                **{k: v for k, v in raw.items() if k != "shards"},
            )
            total = splits[name]
            total.shards.extend(part.shards)
            for key in COUNTS:
                setattr(total, key, getattr(total, key) + getattr(part, key))
            dropped[name] = part.dropped_tokens
        per_task.append(
            {
                "task": rank,
                "files": len(summary["files"]),
                "documents": summary["documents"],
                "dropped_tokens": dropped,
            }
        )
    return splits, per_task


def _clear_work(paths: WorkPaths, keep: Sequence[str]) -> None:
    for entry in paths.root.iterdir():
        if entry.name not in keep:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    if not keep:
        paths.root.rmdir()


def _fractions_config(source: dict[str, Any], seq_len: int) -> PrepareConfig:
    return PrepareConfig(
        out=Path("."), val_frac=source["val_frac"], test_frac=source["test_frac"], seq_len=seq_len
    )


def _verify_shards(directory: Path, shards: Sequence[ShardInfo]) -> None:
    """Every shard present with the sha256 its task recorded (hashing releases the GIL: threads)."""

    def problem(shard: ShardInfo) -> str | None:
        path = directory / shard.path
        if not path.is_file():
            return f"{path}: missing"
        actual = sha256_file(path)
        return None if actual == shard.sha256 else f"{path}: sha256 {actual[:16]}... differs from its task's"

    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        problems = [p for p in pool.map(problem, shards) if p]
    if problems:
        raise PrepareError(
            f"{len(problems)} task shard(s) damaged since written, e.g. {problems[0]}; rerun the same command: "
            "it redoes the tasks whose shards are missing or damaged"
        )


def _remove_strays(directory: Path, manifest: Manifest) -> None:
    """Shards of an attempt that the manifest does not list (the work folder is ours)."""
    listed = {s.path for split in manifest.splits.values() for s in split.shards} | {manifest.tokenizer}
    for entry in directory.iterdir():
        if entry.name not in listed:
            entry.unlink()


def swap_in(built: Path, out: Path) -> None:
    """Replace `out` by the complete, verified folder `built`.

    `out` moves aside and `built` takes its place (two renames on one filesystem). Of the old folder, only the
    files its manifest lists (shards, tokenizer, manifest) are deleted; anything else in it moves into the new
    `out` (or stays in `.<out>.replaced` if the name is taken). A crash between the renames is repaired by the
    next call: the old folder moves back before anything else."""
    old = out.with_name(f".{out.name}.replaced")
    if old.exists() and not out.exists():
        os.replace(old, out)  # crashed between the two renames last time
    if not out.exists():
        os.replace(built, out)
        return
    if old.exists():
        raise PrepareError(f"{old} exists (left by an earlier replacement of {out}): move it away first")
    os.replace(out, old)
    os.replace(built, out)
    try:
        previous = Manifest.load(old)
        listed = {s.path for split in previous.splits.values() for s in split.shards}
        listed |= {previous.tokenizer, MANIFEST_NAME}
    except ManifestError:
        listed = set()
    for entry in sorted(old.iterdir()):
        if entry.name in listed:
            entry.unlink()
        elif not (out / entry.name).exists():
            os.replace(entry, out / entry.name)
    if not any(old.iterdir()):
        old.rmdir()
    else:
        print(f"kept {old}: files of the old {out} whose names the new dataset uses", file=sys.stderr)
