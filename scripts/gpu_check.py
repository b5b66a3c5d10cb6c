"""Everything the first hour on a CUDA machine must tell us, in one command within a time budget (docs/gpu.md).

    python3 scripts/gpu_check.py --out gpu-check/                 # on the GPU machine, 480 s by default
    python3 scripts/gpu_check.py --out /tmp/gpu-check --archive $OUT/gpu-check.tar.gz   # one file back
    python3 scripts/gpu_check.py --out gpu-check/ --only decode-b1 fit   # rerun some steps
    python scripts/gpu_check.py --out /tmp/dry --dry-run        # the same code on a CPU at tiny shapes

Steps (scripts/gpu/steps.py), each its own process with its own timeout, so one failure or hang does not lose
the rest: the GPU and versions; the bf16 GEMM ceiling and copy bandwidth; training throughput at 128m
(benchmarks/gpu.py) with the SDPA backend left to torch and forced; decode tokens/s at 8K context, batch 64
and 1 (benchmarks/decode.py); if time remains, a 60 s `main.py fit` at 20m with MLflow, its packages from the
wheel bundle of scripts/gpu_bundle.py. The steps before the fit import only what the bare image has and
the project's model and costs code, which reads conf/ with jsonargparse's YAML loader
(lightning_modules/core/fragments.py): that one package is installed from the bundle before the first step
(scripts/gpu/site.py). Into --out: per step NN-name.stdout, .stderr and .json (status ok / failed / timeout /
skipped, and why), OUT/summary.md (printed too at the end) and OUT/summary.json, and all of them in one file,
the --archive (default OUT/gpu-check.tar.gz; scripts/gpu/archive.py). The summary and the archive are
rewritten after every step and as each training row finishes, so a run killed at any point leaves what it
had measured. Without CUDA (and without --dry-run) it says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a file on a machine where the project is not installed: the repository and scripts/ on the path.
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from gpu import archive, runner, site, steps, summary  # noqa: E402

from lightning_modules.core.errors import UserError, run_entry  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for the steps' files and OUT/summary.md"
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="all steps together (default 480)")
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU at tiny shapes")
    parser.add_argument(
        "--only", nargs="+", metavar="STEP", help="run only these steps (names as in OUT/summary.md)"
    )
    parser.add_argument("--bundle", type=Path, default=ROOT / "gpu-bundle", help="the wheels of the fit step")
    parser.add_argument(
        "--archive",
        type=Path,
        default=None,
        help=f"the one file holding everything written (default OUT/{archive.NAME})",
    )
    return parser


def cuda_available() -> bool:
    import torch  # here, not at the top: --help and the tests of the other modules need no torch

    return torch.cuda.is_available()


def install_for_steps(args: argparse.Namespace, target: Path) -> str:
    """The bundle's packages the steps need (jsonargparse: scripts/gpu/steps.py NEEDED_BY_STEPS) into
    `target`, put on the PYTHONPATH every step inherits."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(target), os.environ.get("PYTHONPATH", "")) if p
    )
    return site.install(args.bundle.resolve(), target)


def run(args: argparse.Namespace) -> int:
    if not args.dry_run and not cuda_available():
        raise UserError("no CUDA device here: run it on a GPU machine, or add --dry-run for the CPU run")
    plan = steps.plan(args.dry_run, args.out.resolve(), args.bundle.resolve())
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in plan})
        if unknown:
            raise UserError(
                f"--only {' '.join(unknown)}: no such step; the steps: {' '.join(s.name for s in plan)}"
            )
        plan = [s for s in plan if s.name in args.only]
    out = args.out.resolve()
    packed = (args.archive or out / archive.NAME).resolve()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = f"{'dry run (CPU, tiny shapes)' if args.dry_run else 'GPU'}, {when}"
    note = ""

    def write(records: list[dict], done: bool) -> str:
        """OUT/summary.md and .json of the records so far, then the archive of everything in OUT."""
        so_far = "" if done else f", in progress: {len(records)} of {len(plan)} steps begun"
        text = summary.render(records, f"{header}{so_far}\n\n{note}")
        (out / "summary").with_suffix(".md").write_text(text)  # OUT/summary.md
        (out / "summary").with_suffix(".json").write_text(json.dumps(records, indent=1))
        archive.write(out, packed)
        return text

    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-site-"))  # not in OUT: what comes back is the report
    try:
        note = "dry run: the venv's own packages" if args.dry_run else install_for_steps(args, scratch)
        print(note, file=sys.stderr)
        records = runner.run_all(plan, out, args.budget_s, on_change=lambda r: write(r, done=False))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = write(records, done=True)
    print(text)
    print(f"everything above and each step's files: {packed}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_entry(lambda: run(args), "scripts/gpu_check.py")


if __name__ == "__main__":
    sys.exit(main())
