"""lightning_modules.commands.prepare's throughput: the one-process path against `--tasks N` on datatrove, same corpus and tokenizer.

    python benchmarks/prepare_parallel.py                 # Shakespeare x 4 copies, tasks 1 and 2
    python benchmarks/prepare_parallel.py --copies 8 --tasks 1 2 4 --json

The corpus is the embedded Shakespeare texts copied --copies times into one folder (more files than tasks).
A tokenizer (vocab 4096) is trained once beforehand and loaded by every timed run, so the figures are of the
part the tasks parallelise: read, split, encode, pack, write shards (and, for --tasks, the merge). Each run
is a fresh `python -m lightning_modules prepare` process, timed whole (imports, datatrove's process start and the merge
included). MB/s counts UTF-8 text bytes, tokens/s the documents' tokens plus one end-of-text each. CPU
seconds are user + sys of the run and every process under it: MB per CPU second is the per-core rate that an
estimate for a bigger node scales.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data.manifest import Manifest  # noqa: E402
from data.sources import shakespeare_files  # noqa: E402


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def make_corpus(folder: Path, copies: int) -> None:
    folder.mkdir()
    for copy in range(copies):
        for path in shakespeare_files():
            shutil.copy(path, folder / f"{copy:02d}-{path.name}")


def _proc_times() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user + sys CPU seconds) of every process, from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            out[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return out


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and every process under it). The tree is sampled every
    0.2 s from /proc because datatrove's pool workers are children of its forkserver, which is never reaped
    (the kernel's children rusage misses them); each process's last < 0.2 s is missed."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict[int, float] = {}
    while process.poll() is None:
        table = _proc_times()
        tree, grew = {process.pid}, True
        while grew:
            grew = False
            for pid, (parent, _) in table.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree:
            if pid in table:
                seen[pid] = max(seen.get(pid, 0.0), table[pid][1])
        time.sleep(0.2)
    wall = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode})")
    return wall, sum(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=4, help="copies of the Shakespeare corpus")
    parser.add_argument("--tasks", type=int, nargs="+", default=[1, 2], help="task counts to time")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    prepare = [sys.executable, "-m", "lightning_modules", "prepare", "--no-progress", "--seq-len", str(args.seq_len),
               "--txt-doc-chars", "8192"]  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus, tok = Path(tmp) / "corpus", Path(tmp) / "tok"
        make_corpus(corpus, args.copies)
        timed([*prepare, "--source", "shakespeare", "--out", str(tok)])
        base = [*prepare, str(corpus), "--tokenizer", str(tok / "tokenizer.json")]
        runs = [("one process (today's path)", [])]
        runs += [
            (f"--tasks {n} --workers {min(n, os.cpu_count() or 1)}", ["--tasks", str(n)]) for n in args.tasks
        ]
        for name, extra in runs:
            out = Path(tmp) / f"out-{len(rows)}"
            wall, cpu = timed([*base, "--out", str(out), *extra])
            manifest = Manifest.load(out)
            text = sum(s.text_bytes for s in manifest.splits.values())
            tokens = sum(s.stream_tokens for s in manifest.splits.values())
            rows.append({"run": name, "text_mb": text / 1e6, "tokens": tokens, "wall_s": wall, "cpu_s": cpu,
                         "mb_per_s": text / 1e6 / wall, "tokens_per_s": tokens / wall,
                         "mb_per_cpu_s": text / 1e6 / cpu})  # fmt: skip
            shutil.rmtree(out)
    result = {"cpu": cpu_name(), "cores": os.cpu_count(), "load_average": os.getloadavg(), "runs": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"machine: {result['cpu']}, {result['cores']} cores, load average {result['load_average'][0]:.1f}")
    for row in rows:
        print(
            f"{row['run']:32s} {row['text_mb']:6.1f} MB  {row['wall_s']:6.1f} s  {row['mb_per_s']:5.2f} MB/s  "
            f"{row['tokens_per_s']:10,.0f} tokens/s  {row['mb_per_cpu_s']:.2f} MB per CPU-s"
        )


if __name__ == "__main__":
    main()
