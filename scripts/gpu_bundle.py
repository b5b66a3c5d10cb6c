"""The wheels `main.py fit` needs beyond the GPU image, for the fit step of scripts/gpu_check.py (docs/gpu.md).

    python scripts/gpu_bundle.py --out gpu-bundle/            # download them (PyPI), print the total MB
    python scripts/gpu_bundle.py --out gpu-bundle/ --check    # only measure a folder already there
    python scripts/gpu_bundle.py --list                       # the pinned requirements, one a line

The image has Python 3.12 with torch, triton, lightning, torchmetrics, numpy, pandas and tokenizers (and what
they require). main.py's path imports beyond those: jsonargparse with its `signatures` extra (LightningCLI
checks the extra's packages), mlflow-skinny with SQLAlchemy and alembic (the SQLite store;
lightning_modules/tracking/), and webdataset (the shards, data/streaming.py). The bundle is their dependency
closure minus the image's, each pinned to the version installed in this venv (what the tests ran), found by
reading the installed metadata. `pip download --no-deps --only-binary=:all:` fetches them for CPython 3.12 on
manylinux x86_64. The GPU machine takes at most 64 MiB of carried files in all, so a bundle over that is
refused in one line.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from lightning_modules.core.errors import UserError, run_entry

IMAGE = ("torch", "triton", "lightning", "torchmetrics", "numpy", "pandas", "tokenizers")
NEEDED = ("jsonargparse[signatures]", "mlflow-skinny", "sqlalchemy", "alembic", "webdataset")
LIMIT_MIB = 64
TARGET = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython"}  # fmt: skip
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...]) -> dict[str, str]:
    """canonical name -> installed version of the roots and everything they require on the target (with
    their extras), read from this environment's metadata. A root that is not installed here is an error."""
    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(r), True) for r in roots]
    while todo:
        req, is_root = todo.pop()
        name = canonical(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError as exc:
            if is_root:
                raise UserError(
                    f"{req.name} is not installed here: run `make setup`, then this again"
                ) from exc
            continue  # an optional platform package absent here; pip would not need it on the target either
        extras = [*req.extras, ""]
        found[name] = dist.version
        for spec in dist.requires or []:
            sub = Requirement(spec)
            if sub.marker is None or any(sub.marker.evaluate({**TARGET, "extra": e}) for e in extras):
                todo.append((sub, False))
    return found


def requirements() -> list[str]:
    """NEEDED's closure minus the image's, pinned (`name==version`), sorted."""
    image = closure(IMAGE)
    return sorted(f"{n}=={v}" for n, v in closure(NEEDED).items() if n not in image)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.whl"))


def check_size(folder: Path, limit_mib: float = LIMIT_MIB) -> str:
    """One line: the folder's wheels and their total; UserError when over the limit."""
    wheels = sorted(folder.glob("*.whl"))
    total = folder_bytes(folder)
    line = f"{folder}: {len(wheels)} wheels, {total / 1e6:.1f} MB ({total / 2**20:.1f} MiB)"
    if total > limit_mib * 2**20:
        raise UserError(
            f"{line}: over the {limit_mib:g} MiB the GPU machine takes; drop a package from NEEDED"
        )
    return line


def download(out: Path, pins: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "--dest", str(out), *[a for p in PLATFORMS for a in ("--platform", p)]]  # fmt: skip
    done = subprocess.run([*cmd, *pins])
    if done.returncode != 0:
        raise UserError(
            f"pip download failed (exit {done.returncode}; its message is above): is PyPI reachable?"
        )


def run(args: argparse.Namespace) -> int:
    pins = requirements()
    if args.list:
        print("\n".join(pins))
        return 0
    if not args.check:
        download(args.out, pins)
    print(check_size(args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("gpu-bundle"), help="folder of the wheels")
    parser.add_argument("--check", action="store_true", help="measure --out only, download nothing")
    parser.add_argument("--list", action="store_true", help="print the pinned requirements and stop")
    return run_entry(lambda: run(parser.parse_args(argv)), "scripts/gpu_bundle.py")


if __name__ == "__main__":
    sys.exit(main())
