"""The work folder of `--tasks N` (`<out>.partial/` beside --out) and the plan its tasks share: which files
each task reads, what a task leaves there, and whether a rerun resumes the same command.

Layout: `dataset/` (becomes --out: the tokenizer and every task's shards), `run.json` (the command's
fingerprint and the manifest's source), `tasks/<r>.json` (task r's summary), `logs/` (datatrove's:
`logs/completions/<r>` marks task r complete) and, on SLURM, `merge-logs/`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from data.data_errors import PrepareError
from data.manifest import SPLITS
from data.parallel_options import DistributedOptions
from data.prepare_config import PrepareConfig
from data.shards import sha256_file
from data.tokenizer import TOKENIZER_NAME
from lightning_modules.core.files import write_text_atomic

WORK_SUFFIX = ".partial"
RUN_FILE = "run.json"


@dataclass(frozen=True)
class WorkPaths:
    """The work folder beside --out: everything the tasks and the merge share."""

    root: Path

    @classmethod
    def beside(cls, out: Path) -> WorkPaths:
        return cls(out.with_name(out.name + WORK_SUFFIX))

    @property
    def dataset(self) -> Path:  # becomes --out
        return self.root / "dataset"

    @property
    def tokenizer(self) -> Path:
        return self.dataset / TOKENIZER_NAME

    @property
    def run(self) -> Path:
        return self.root / RUN_FILE

    @property
    def logs(self) -> Path:  # datatrove's logging folder: completions/, logs/, stats/
        return self.root / "logs"

    @property
    def merge_logs(self) -> Path:  # the SLURM merge job's; the only thing a finished SLURM run leaves
        return self.root / "merge-logs"

    def summary(self, rank: int) -> Path:
        return self.root / "tasks" / f"{rank:05d}.json"

    def completion(self, rank: int) -> Path:
        return self.logs / "completions" / f"{rank:05d}"


def task_shard_name(split: str, task: int, number: int) -> str:
    return f"{split}-task{task:05d}-{number:05d}.tar"


def task_files(files: Sequence[str], rank: int, tasks: int) -> list[str]:
    """Contiguous blocks of files, sizes differing by at most one."""
    return list(files[rank * len(files) // tasks : (rank + 1) * len(files) // tasks])


def file_stats(paths: Sequence[str]) -> list[list[Any]]:
    """(path, size, mtime_ns) per file: a finished task whose inputs changed since is redone."""
    out = []
    for path in paths:
        stat = os.stat(path)
        out.append([path, stat.st_size, stat.st_mtime_ns])
    return out


def write_json(path: Path, value: Any, durable: bool = False) -> None:
    write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True) + "\n", durable=durable)


def clear_task(paths: WorkPaths, rank: int) -> None:
    """What a killed attempt of task `rank` left: its summary and shards."""
    paths.summary(rank).unlink(missing_ok=True)
    for split in SPLITS:
        for old in paths.dataset.glob(f"{split}-task{rank:05d}-*.tar*"):
            old.unlink()


def fingerprint(cfg: PrepareConfig, dist: DistributedOptions, files: Sequence[str]) -> dict[str, Any]:
    """What the shards depend on. A trained tokenizer read every file, so then every file's size and mtime
    count too; with a loaded tokenizer each task checks only its own files (see invalidate_stale)."""
    options = {k: v for k, v in asdict(cfg).items() if k not in ("out", "progress", "inputs", "parallel")}
    found: dict[str, Any] = {"options": options, "tasks": dist.tasks, "files": list(files)}
    if cfg.tokenizer is None:
        found["file_stats"] = file_stats(files)
    else:
        found["tokenizer_sha256"] = sha256_file(Path(cfg.tokenizer))
    return json.loads(json.dumps(found))  # as it reads back from run.json


def start_or_resume(paths: WorkPaths, fingerprint: dict[str, Any]) -> bool:
    """True when resuming an unfinished preparation of the same command."""
    if paths.run.is_file():
        try:
            previous = json.loads(paths.run.read_text(encoding="utf-8"))["fingerprint"]
        except (OSError, ValueError, KeyError) as exc:
            raise PrepareError(f"{paths.run}: unreadable ({exc}); delete {paths.root} to start over") from exc
        if previous != fingerprint:
            raise PrepareError(
                f"{paths.root} holds an unfinished preparation of another command (differs in: "
                f"{', '.join(_differences(previous, fingerprint))}); rerun that command to finish it, or "
                f"delete {paths.root} to start over"
            )
        return True
    if paths.root.exists():
        leftovers = {p.name for p in paths.root.iterdir()}
        # what a finished SLURM run leaves (its logs) is ours to clear
        if not leftovers <= {paths.logs.name, paths.merge_logs.name}:
            raise PrepareError(
                f"{paths.root} exists and is not an unfinished preparation: move it away first"
            )
        shutil.rmtree(paths.root)
    paths.dataset.mkdir(parents=True)
    return False


def _differences(previous: dict[str, Any], fingerprint: dict[str, Any]) -> list[str]:
    before = previous.get("options", {})
    differs = ["--" + k.replace("_", "-") for k, v in fingerprint["options"].items() if before.get(k) != v]
    differs += [
        k
        for k in ("tasks", "files", "file_stats", "tokenizer_sha256")
        if fingerprint.get(k) != previous.get(k)
    ]
    return differs


def invalidate_stale(paths: WorkPaths, tasks: int) -> list[tuple[int, str]]:
    """Drop the completion marker (and summary) of finished tasks that must be redone: summary missing or
    unreadable, input files changed since, or a shard missing or not the bytes its summary recorded (a crash
    or another process got at it). (rank, why) for each."""
    finished = [rank for rank in range(tasks) if paths.completion(rank).exists()]
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # hashing releases the GIL
        reasons = list(pool.map(lambda rank: _why_stale(paths, rank), finished))
    stale = []
    for rank, reason in zip(finished, reasons, strict=True):
        if reason is not None:
            paths.completion(rank).unlink()
            paths.summary(rank).unlink(missing_ok=True)
            stale.append((rank, reason))
    return stale


def _why_stale(paths: WorkPaths, rank: int) -> str | None:
    """Why finished task `rank` cannot be kept (None: it can)."""
    try:
        summary = json.loads(paths.summary(rank).read_text(encoding="utf-8"))
        if summary["files"] != file_stats([f[0] for f in summary["files"]]):
            return "its input files changed since"
        shards = [shard for split in SPLITS for shard in summary["splits"][split]["shards"]]
        names = [(str(shard["path"]), str(shard["sha256"])) for shard in shards]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return f"its summary {paths.summary(rank)} is missing or unreadable"
    for name, sha256 in names:
        path = paths.dataset / name
        if Path(name).name != name or not path.is_file():
            return f"its shard {path} is missing"
        if sha256_file(path) != sha256:
            return f"its shard {path} differs from what the task wrote (sha256)"
    return None
