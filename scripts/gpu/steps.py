"""The steps of scripts/gpu_check.py: what each one runs, at GPU shapes or at the dry run's tiny CPU shapes.

Every step is a separate `python SCRIPT ARGS` process (scripts/gpu/runner.py), so a crash, a hang or a CUDA
error in one leaves the others' results. The benchmarks are called through their command lines with every
flag spelled out, so a changed default there cannot silently change what this check measures.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from lightning_modules.model.attention import paper_names

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# What the GPU image lacks: steps marked image_only run with these hidden (scripts/gpu/launch.py), so the dry
# run proves that they import none of them, exactly as on the bare image.
MISSING_ON_IMAGE = ("mlflow", "jsonargparse", "webdataset", "datatrove")
# ... except these, which the benchmarks do need: lightning_modules/core/fragments.py reads conf/ YAML with
# jsonargparse's loader (pure Python; PyYAML is on the image). scripts/gpu/site.py installs them from the
# bundle for every step before the first one runs.
NEEDED_BY_STEPS = ("jsonargparse",)
HIDDEN = tuple(n for n in MISSING_ON_IMAGE if n not in NEEDED_BY_STEPS)

# The SDPA backend switch read by lightning_modules/model/attention/kernel.py.
BACKEND_ENV = "LRKV_SDPA_BACKEND"
# benchmarks/gpu.py's ROW_MARK (tests/benchmarks/test_gpu_check.py holds them equal): the prefix of each row it
# prints as it finishes. Not imported from there: that module imports torch, and the runner needs none.
ROW_MARK = "gpu.py row: "


@dataclasses.dataclass(frozen=True)
class Step:
    """One subprocess: `python script *args` with `env` added, killed after `timeout_s` seconds; skipped when
    less than `min_s` of the budget is left. `kind` picks its table in OUT/summary.md."""

    name: str
    title: str
    script: Path
    args: tuple[str, ...]
    timeout_s: float
    kind: str
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    image_only: bool = True
    min_s: float = 5.0

    def argv(self, python: str = sys.executable) -> list[str]:
        if not self.image_only:
            return [python, str(self.script), *self.args]
        launch = [python, str(HERE / "launch.py"), "--hide", ",".join(HIDDEN), "--"]
        return [*launch, str(self.script), *self.args]


def backend_note() -> str | None:
    """None when kernel.py reads BACKEND_ENV, else the line OUT/summary.md prints beside the backend rows."""
    kernel = ROOT / "lightning_modules" / "model" / "attention" / "kernel.py"
    if BACKEND_ENV in kernel.read_text():
        return None
    return (
        f"{BACKEND_ENV} is set but {kernel.relative_to(ROOT)} does not read it: the rows ran torch's default"
    )


def train_args(
    dry_run: bool, compile_setting: str, timeout_s: float, kinds: tuple[str, ...]
) -> tuple[str, ...]:
    # benchmarks/gpu.py skips the rows past --budget-minutes: a third of the step is left for the rows
    # already started (a compiled 128m row spends most of its time compiling) and the process start. It runs
    # every attention's eager rows first and starts a compiled row only with --compiled-row-s left.
    minutes = f"{timeout_s * 2 / 3 / 60:.2f}"
    budget = ("--budget-minutes", minutes, "--compiled-row-s", "60")
    if dry_run:  # its CPU smoke run; compiling on 2 CPU cores would alone exceed the dry run's budget
        tiny = ("--device", "cpu", "--sizes", "nano", "--seq-len", "32", "--batch-size", "2")
        return (*tiny, "--steps", "1", "--warmup", "1", "--json", "--kernels", "sdpa", "--compile", "off",
                *budget, "--kinds", *kinds)  # fmt: skip
    return ("--sizes", "128m", "--json", "--device", "cuda", "--kernels", "flash", "sdpa", "--compile",
            compile_setting, *budget, "--kinds", *kinds)  # fmt: skip


def decode_args(dry_run: bool, batch: int) -> tuple[str, ...]:
    arms = ("--attention", *paper_names())
    # Peak memory in this process (reset between arms): the probe per child process that the CPU's default
    # starts would alone spend the step's share of the budget. At batch 1, where Python and kernel launches
    # weigh most, the GPU run also times each arm's step replayed from a CUDA graph.
    if dry_run:
        return ("--size", "nano", "--context", "32", "--batch", "2", "--steps", "1", "--repeats", "1",
                "--check-tokens", "8", "--device", "cpu", "--memory-mode", "in-process", "--json", *arms)  # fmt: skip
    graph = ("--cuda-graph",) if batch == 1 else ()
    return ("--size", "128m", "--context", "8192", "--batch", str(batch), "--steps", "16", "--repeats", "3",
            "--device", "cuda", "--memory-mode", "in-process", *graph, "--json", *arms)  # fmt: skip


def plan(dry_run: bool, out: Path, bundle: Path) -> list[Step]:
    """The steps in order, with their GPU timeouts summing to the 480 s default budget. The dry run's work
    takes about a minute on 2 idle cores; its timeouts are generous because a CPU shared with other jobs can
    be several times slower, and only a hang should end a step there."""
    t = {"env": 20, "ceiling": 30, "train": 160, "backend": 75, "decode64": 50, "decode1": 35, "fit": 110}
    if dry_run:
        t = {
            "env": 90,
            "ceiling": 90,
            "train": 150,
            "backend": 120,
            "decode64": 120,
            "decode1": 120,
            "fit": 150,
        }
    # The forced backend: flash on a GPU (MLA's row reports kernel.py's refusal: its unequal q/k and v head
    # dims keep it off flash); math on a CPU (the one SDPA backend a CPU has besides auto), for mha only: the
    # switch's path is the same for every attention, the dry run's time is not.
    # The reference paper's five attentions: what the first GPU hour is for; the later variants are run with
    # benchmarks/gpu.py --kinds by hand.
    arms = paper_names()
    forced, forced_kinds = ("math", ("mha",)) if dry_run else ("flash", arms)
    bench = ROOT / "benchmarks"
    train_size, fit_size = ("nano", "nano, one step") if dry_run else ("128m", "20m, 60 s")
    fit_args = ["--out", str(out / "fit"), "--bundle", str(bundle), "--seconds", "60"]
    return [
        Step("env", "GPU and versions", HERE / "env_info.py", (), t["env"], "env"),
        Step(
            "ceiling",
            "bf16 GEMM ceiling and copy bandwidth",
            HERE / "ceiling.py",
            ("--dry-run",) if dry_run else (),
            t["ceiling"],
            "ceiling",
        ),
        Step(
            "train-auto",
            f"training throughput at {train_size}, SDPA backend auto, eager and compiled",
            bench / "gpu.py",
            train_args(dry_run, "both", t["train"], arms),
            t["train"],
            "train",
            {BACKEND_ENV: "auto"},
            min_s=60 if not dry_run else 5,
        ),
        Step(
            f"train-{forced}",
            f"training throughput at {train_size}, SDPA backend forced to {forced}, eager",
            bench / "gpu.py",
            train_args(dry_run, "off", t["backend"], forced_kinds),
            t["backend"],
            "train",
            {BACKEND_ENV: forced},
            min_s=40 if not dry_run else 5,
        ),
        Step(
            "decode-b64",
            f"decode tokens/s at context {'32' if dry_run else '8K'}, batch {2 if dry_run else 64}",
            bench / "decode.py",
            decode_args(dry_run, 64),
            t["decode64"],
            "decode",
        ),
        Step(
            "decode-b1",
            f"decode tokens/s at context {'32' if dry_run else '8K'}, batch {2 if dry_run else 1}",
            bench / "decode.py",
            decode_args(dry_run, 1),
            t["decode1"],
            "decode",
        ),
        Step(
            "fit",
            f"main.py fit ({fit_size}) through Lightning and MLflow",
            HERE / "fit.py",
            (*fit_args, *(["--dry-run"] if dry_run else [])),
            t["fit"],
            "fit",
            image_only=False,
            min_s=75 if not dry_run else 30,
        ),
    ]
