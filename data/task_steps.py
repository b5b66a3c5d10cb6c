"""The datatrove pipeline steps of `--tasks N` (pickled by datatrove into each task): read a task's
documents, pack them into its shards and summary, and the merge as a step of its own (the SLURM merge job).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from data.data_errors import DataError, PrepareError
from data.manifest import SPLITS, SplitInfo, dtype_for_vocab
from data.packing import SplitWriter, encode, split_of
from data.sources import SourceOptions, SourceStats, iter_documents
from data.task_merge import merge
from data.task_plan import WorkPaths, clear_task, file_stats, task_files, task_shard_name, write_json
from data.tokenizer import eot_id, for_encoding, load_tokenizer
from lightning_modules.core.files import fsync_dir

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
    ) -> None:
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

    def shard_name(self, number: int) -> str:
        return task_shard_name(self.split, self.task, number)


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
    ) -> None:
        super().__init__()
        self.work, self.files, self.seq_len = work, list(files), seq_len
        self.shard_samples, self.eot_token, self.threads = shard_samples, eot_token, threads

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        paths = WorkPaths(Path(self.work))
        clear_task(paths, rank)  # what a killed attempt of this task left
        if self.threads is not None:  # tasks share the machine: keep tokenizers' thread pool to their share
            os.environ.setdefault("RAYON_NUM_THREADS", str(self.threads))
        tokenizer = load_tokenizer(paths.tokenizer)
        eot = eot_id(tokenizer, self.eot_token, str(paths.tokenizer))
        dtype = dtype_for_vocab(tokenizer.get_vocab_size(with_added_tokens=True))
        writers = {
            s: TaskSplitWriter(paths.dataset, s, rank, self.seq_len, dtype, self.shard_samples)
            for s in SPLITS
        }
        current = ["(before the first document)"]

        def documents() -> Iterator[tuple[str, bytes, str]]:
            for doc in data or ():
                current[0] = doc.metadata["file"]
                yield doc.text, doc.metadata["raw"], doc.metadata["split"]

        try:
            encode(for_encoding(tokenizer), documents(), writers, eot, None, progress=False)
        except DataError:
            raise  # names its file already
        except Exception as exc:
            raise PrepareError(
                f"task {rank} of {world_size} failed at {current[0]} ({type(exc).__name__}: {exc})"
            ) from exc
        splits = {name: writer.close() for name, writer in writers.items()}
        # Each shard's bytes are on disk (data/shards.py); their names too once the folder is synced. Then
        # the summary, durably; datatrove writes the completion marker only after this step returns, so a
        # marker never stands beside a shard a crash could still lose.
        fsync_dir(paths.dataset)
        self._write_summary(paths, rank, world_size, splits)
        for name, info in splits.items():
            self.stat_update(f"{name}_samples", value=info.samples)
        return
        yield  # a generator: datatrove drains it

    def _write_summary(
        self, paths: WorkPaths, rank: int, world_size: int, splits: dict[str, SplitInfo]
    ) -> None:
        """tasks/<rank>.json: what the merge reads of this task."""
        stats = _SOURCE_STATS.pop((self.work, rank), SourceStats())
        write_json(
            paths.summary(rank),
            {
                "task": rank,
                "tasks": world_size,
                "files": file_stats(task_files(self.files, rank, world_size)),
                "splits": {name: asdict(info) for name, info in splits.items()},
                "documents": stats.documents,
                "empty_documents": stats.empty_documents,
                "replaced_files": stats.replaced_files,
            },
            durable=True,
        )


class MergeStep(PipelineStep):
    """The merge as a one-task pipeline, for the SLURM job that runs after all tasks."""

    type = "🔗 - MERGE"
    name = "lrkv manifest"

    def __init__(self, work: str, out: str) -> None:
        super().__init__()
        self.work, self.out = work, out

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        paths = WorkPaths(Path(self.work))
        # datatrove still writes into both log folders after the tasks and this step end
        merge(paths, Path(self.out), keep=[paths.logs.name, paths.merge_logs.name])
        return
        yield
