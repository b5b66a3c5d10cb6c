"""What a finished preparation prints: per split what it wrote, and its text rate."""

from __future__ import annotations

from pathlib import Path

from data.manifest import Manifest


def print_summary(out: str | Path, manifest: Manifest, seconds: float, tasks: int | None = None) -> None:
    """What a finished preparation wrote, per split, and its text rate (one process or `tasks` tasks)."""
    text = sum(s.text_bytes for s in manifest.splits.values())
    by = f" with {tasks} tasks" if tasks else ""
    print(f"wrote {out}{by}: vocab {manifest.vocab_size} ({manifest.dtype}), seq_len {manifest.seq_len}")
    over = f" over {tasks} tasks" if tasks else ""
    for name, split in manifest.splits.items():
        print(
            f"  {name:5s} {len(split.shards):4d} shards {split.samples:9d} samples {split.tokens:12d} tokens "
            f"{split.text_bytes:12d} text bytes {split.documents:8d} docs "
            f"({split.dropped_tokens} tail tokens dropped{over})"
        )
    print(f"  {text / 1e6:.2f} MB of text in {seconds:.1f} s ({text / 1e6 / seconds:.2f} MB/s)")
