"""scripts/gpu_check.py and scripts/gpu_bundle.py without a GPU: the dry run goes through every step and
writes its files; a failing, hanging or skipped step is recorded and the next one still runs; the steps of
the bare image import none of the packages it lacks; no CUDA without --dry-run is one line and exit 2; a
bundle over 64 MiB is refused."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from lightning_modules.core.errors import UserError
from lightning_modules.model.attention import paper_names
from tests.scripts import ROOT, load_script

SCRIPT = ROOT / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu() -> ModuleType:
    """scripts/gpu/ as the package `gpu`, the way scripts/gpu_check.py imports it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu.archive
    import gpu.runner
    import gpu.site
    import gpu.steps
    import gpu.summary

    return gpu


@pytest.fixture(scope="module")
def bundle() -> ModuleType:
    return load_script("scripts/gpu_bundle.py", "gpu_bundle_script")


def no_cuda_env() -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("gpu-check")
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--dry-run", "--budget-s", "600"]
    done = subprocess.run(cmd, cwd=ROOT, env=no_cuda_env(), capture_output=True, text=True, timeout=900)
    return out, done


@pytest.mark.slow
def test_dry_run_goes_through_every_step(
    gpu: ModuleType, dry_run: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    out, done = dry_run
    assert done.returncode == 0, done.stderr[-2000:]
    names = [s.name for s in gpu.steps.plan(True, out, ROOT / "gpu-bundle")]
    assert names == ["env", "ceiling", "train-auto", "train-math", "decode-b64", "decode-b1", "fit"]
    records = {}
    for i, name in enumerate(names, 1):
        prefix = out / f"{i:02d}-{name}"
        records[name] = json.loads(prefix.with_suffix(".json").read_text())
        assert prefix.with_suffix(".stdout").is_file() and prefix.with_suffix(".stderr").is_file()
        assert records[name]["status"] == "ok", (name, records[name]["reason"])
    summary = (out / "summary").with_suffix(".md").read_text()  # OUT/summary.md
    assert summary == done.stdout.removesuffix("\n")  # printed as written
    # everything in one file: each step's three, the summary's two, the fit's MLflow store
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        packed_summary = tar.extractfile(members["gpu-check/summary.md"]).read().decode()  # type: ignore[union-attr]
    expected = {
        f"gpu-check/{i:02d}-{n}.{ext}" for i, n in enumerate(names, 1) for ext in ("stdout", "stderr", "json")
    }
    expected |= {"gpu-check/summary.md", "gpu-check/summary.json", "gpu-check/fit/mlflow.db"}
    assert expected <= set(members), sorted(expected - set(members))
    assert packed_summary == summary  # the archive's last rewrite came after the summary's
    assert [p.name for p in out.iterdir() if p.name.startswith("gpu-check")] == ["gpu-check.tar.gz"]
    for i, name in enumerate(names, 1):
        assert f"| {i} | {name} | ok |" in summary
    # what needs CUDA says so
    assert records["env"]["result"]["cuda_device"] == "skipped: no CUDA device"
    assert records["ceiling"]["result"]["cuda"].startswith("skipped: no CUDA device")
    assert (
        records["ceiling"]["result"]["gemm_n"] == 256 and records["ceiling"]["result"]["gemm_bf16_tflops"] > 0
    )
    # every attention through benchmarks/gpu.py at the smoke shapes, the backend switch passed to it
    auto = records["train-auto"]
    assert auto["env"] == {"LRKV_SDPA_BACKEND": "auto"} and records["train-math"]["env"] == {
        "LRKV_SDPA_BACKEND": "math"
    }
    rows = auto["result"]["rows"]
    # The reference paper's five arms (scripts/gpu/steps.py), each training path of each.
    assert [r["attention"] for r in rows] == [
        "mha",
        "mqa",
        "gqa-g2",
        "mla-c64",
        "lrkv-r8 (factorized)",
        "lrkv-r8 (materialized)",
    ]
    assert all(r["status"] == "ok" and r["seq_len"] == 32 and r["batch"] == 2 for r in rows)
    assert [r["attention"] for r in records["train-math"]["result"]["rows"]] == ["mha"]
    decoded = records["decode-b64"]["result"]
    decoded = decoded["rows"] if isinstance(decoded, dict) else decoded
    assert {r["attention"] for r in decoded} == set(paper_names())
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in decoded)
    fit = records["fit"]["result"]
    assert fit["size"] == "nano" and fit["mlflow_runs"][0]["status"] == "FINISHED"
    assert fit["metrics"]["train/loss"]["value"] > 0  # logged through MLflow's SQLite store in --out
    assert sorted(p.name for p in (out / "fit").iterdir() if p.suffix != ".lock") == [
        "artifacts",
        "mlflow.db",
    ]
    # (the store only: the installed wheels and the checkpoints went to a scratch folder, now gone)


def write(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def test_failed_timed_out_and_skipped_steps_are_recorded_and_the_next_runs(
    gpu: ModuleType, tmp_path: Path
) -> None:
    Step = gpu.steps.Step
    fail = write(tmp_path / "fail.py", "raise SystemExit('boom: injected failure')\n")
    hang = write(tmp_path / "hang.py", "import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    ok = write(tmp_path / "ok.py", "import json\nprint('progress')\nprint(json.dumps({'x': 1}))\n")
    skip = write(
        tmp_path / "skip.py", "import json\nprint(json.dumps({'status': 'skipped', 'reason': 'no wheels'}))\n"
    )
    silent = write(tmp_path / "silent.py", "print('no json here')\n")
    hidden = write(tmp_path / "hidden.py", "import mlflow\n")
    rows = "import json\nprint(json.dumps({'rows': [%s]}))\n"
    no_row = write(tmp_path / "no_row.py", rows % "{'status': 'error', 'error': 'E1'}")
    one_row = write(tmp_path / "one_row.py", rows % "{'status': 'ok'}, {'status': 'oom'}")
    plan = [
        Step("fail", "fails", fail, (), 60, "env", image_only=False),
        Step("hang", "hangs", hang, (), 1, "env", image_only=False),
        Step("ok", "works", ok, (), 60, "env"),
        Step("skip", "skips itself", skip, (), 60, "env"),
        Step("silent", "prints no JSON", silent, (), 60, "env"),
        Step("hidden", "imports what the image lacks", hidden, (), 60, "env"),
        Step("no-row", "exits 0, every row failed", no_row, (), 60, "train"),
        Step("one-row", "exits 0, a row failed", one_row, (), 60, "train"),
        Step("late", "needs more than is left", ok, (), 60, "env", min_s=10_000),
    ]
    out = tmp_path / "out"
    records = gpu.runner.run_all(plan, out, budget_s=300)
    status = {r["step"]: (r["status"], r["reason"]) for r in records}
    assert status["fail"] == ("failed", "exit 1: boom: injected failure")
    assert status["hang"][0] == "timeout" and status["hang"][1].startswith("killed after 1 s")
    assert (out / "02-hang.stdout").read_text() == "started\n"  # what it printed before the kill is kept
    assert status["ok"] == ("ok", "") and records[2]["result"] == {"x": 1}
    assert status["skip"] == ("skipped", "no wheels")
    assert status["silent"][0] == "failed" and "no JSON on stdout" in status["silent"][1]
    assert status["hidden"][0] == "failed" and "ModuleNotFoundError" in status["hidden"][1]
    assert status["no-row"] == ("failed", "no row ok; the first: E1")
    assert status["one-row"] == ("ok", "1 of 2 rows not ok; the first: oom")
    assert status["late"][0] == "skipped" and status["late"][1].startswith("budget spent")
    for i, r in enumerate(records, 1):
        assert json.loads((out / f"{i:02d}-{r['step']}.json").read_text())["status"] == r["status"]
    text = gpu.summary.render(records, "test")
    assert (
        "| 1 | fail | failed |" in text
        and "| 2 | hang | timeout |" in text
        and "| 9 | late | skipped |" in text
    )


def test_rows_stream_in_as_they_finish_and_a_killed_step_keeps_them(
    gpu: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that prints two rows, then hangs: each row reaches on_change (so the summary and the archive)
    while the step runs, and the step's record keeps both after its timeout."""
    monkeypatch.setattr(gpu.runner, "POLL_S", 0.2)
    Step = gpu.steps.Step
    rows = [{"attention": "mha", "kernel": "sdpa", "compile": False, "status": "ok", "tokens_per_s": 10},
            {"attention": "mqa", "kernel": "sdpa", "compile": False, "status": "ok", "tokens_per_s": 12}]  # fmt: skip
    body = "import json, time\n" + "".join(
        f"print({gpu.steps.ROW_MARK + json.dumps(r)!r}, flush=True)\ntime.sleep(0.8)\n" for r in rows
    )
    script = write(tmp_path / "rows.py", body + "time.sleep(60)\n")
    seen: list[list[dict]] = []
    out = tmp_path / "out"
    plan = [Step("train-auto", "rows, then a hang", script, (), 4, "train", image_only=False)]
    (record,) = gpu.runner.run_all(
        plan, out, budget_s=60, on_change=lambda r: seen.append(json.loads(json.dumps(r)))
    )
    assert record["status"] == "timeout" and record["result"] == {"rows": rows, "partial": True}
    running = [r[-1]["result"]["rows"] for r in seen if r[-1]["status"] == "running"]
    assert running[:2] == [rows[:1], rows]  # one call per new row, as it came
    assert seen[-1] == [json.loads((out / "01-train-auto.json").read_text())]  # then the record
    assert "| mqa | sdpa | - | off | - | 12 |" in gpu.summary.render(seen[-1], "test")


def test_the_archive_holds_every_file_and_replaces_itself_whole(gpu: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "fit").mkdir(parents=True)
    (out / "01-env.json").write_text("{}")
    (out / "fit" / "mlflow.db").write_bytes(b"db")
    packed = out / gpu.archive.NAME
    assert gpu.archive.write(out, packed) == ["gpu-check/01-env.json", "gpu-check/fit/mlflow.db"]
    (out / "02-ceiling.json").write_text('{"x": 1}')
    names = gpu.archive.write(out, packed)  # itself and its temporary file are never members
    assert names == ["gpu-check/01-env.json", "gpu-check/02-ceiling.json", "gpu-check/fit/mlflow.db"]
    with tarfile.open(packed) as tar:
        assert tar.getnames() == names
        assert tar.extractfile("gpu-check/02-ceiling.json").read() == b'{"x": 1}'  # type: ignore[union-attr]
    assert sorted(p.name for p in out.iterdir()) == ["01-env.json", "02-ceiling.json", "fit", packed.name]
    elsewhere = gpu.archive.write(out, tmp_path / "back" / "gpu-check.tar.gz")  # --archive outside OUT
    assert len(elsewhere) == 4 and "gpu-check/gpu-check.tar.gz" in elsewhere  # OUT's own archive is a file


def test_the_runners_row_mark_is_the_benchmarks(gpu: ModuleType) -> None:
    bench = load_script("benchmarks/gpu.py", "gpu_benchmark_mark")
    assert gpu.steps.ROW_MARK == bench.ROW_MARK


def test_summary_tables_carry_the_rows(gpu: ModuleType) -> None:
    row = {"attention": "mha", "kernel": "sdpa", "kernel_ran": "sdpa", "compile": True, "tokens_per_s": 123456,
           "mfu": 0.4512, "peak_mem_gib": 10.0, "plan_peak_gib": 20.0, "status": "ok"}  # fmt: skip
    failed = {"attention": "mla-c128", "status": "error", "error": "ConfigError: no"}
    train = {"step": "train-auto", "title": "t", "kind": "train", "status": "ok", "reason": "", "seconds": 1.0,
             "env": {"LRKV_SDPA_BACKEND": "flash"}, "result": {"rows": [row, failed], "targets": ["PASS x"]}}  # fmt: skip
    odd = {"step": "decode-b1", "title": "d", "kind": "decode", "status": "ok", "reason": "", "seconds": 1.0,
           "result": 42}  # fmt: skip
    text = gpu.summary.render([train, odd], "test")
    assert "| mha | sdpa | sdpa | on | flash | 123,456 | 45.1% | - | 10 | 20 | 0.5 | - | ok |" in text
    assert "| mla-c128 | - | - | off | flash | - | - | - | - | - | - | - | error: ConfigError: no |" in text
    assert "- PASS x" in text
    assert "(table failed" in text and "42" in text  # a JSON shape the table does not know comes out raw


@pytest.mark.slow
def test_gpu_plan_spells_out_the_benchmarks_flags(gpu: ModuleType, tmp_path: Path) -> None:
    plan = {s.name: s for s in gpu.steps.plan(False, tmp_path, tmp_path / "bundle")}
    auto, flash = plan["train-auto"].args, plan["train-flash"].args
    assert auto[:5] == ("--sizes", "128m", "--json", "--device", "cuda") and flash[:3] == auto[:3]
    assert auto[auto.index("--compile") + 1] == "both" and flash[flash.index("--compile") + 1] == "off"
    assert plan["train-flash"].env == {"LRKV_SDPA_BACKEND": "flash"}
    for name, batch in (("decode-b64", "64"), ("decode-b1", "1")):
        args = plan[name].args
        assert args[args.index("--context") + 1] == "8192" and args[args.index("--batch") + 1] == batch
    assert sum(s.timeout_s for s in plan.values()) == 480  # the default budget
    assert not plan["fit"].image_only and all(s.image_only for n, s in plan.items() if n != "fit")
    # every flag the GPU run passes exists in the benchmark's command line today
    for script, names in (
        ("gpu.py", ("train-auto", "train-flash")),
        ("decode.py", ("decode-b64", "decode-b1")),
    ):
        done = subprocess.run(
            [sys.executable, f"benchmarks/{script}", "--help"], cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        flags = {a for n in names for a in plan[n].args if a.startswith("--")}
        assert {f for f in flags if f not in done.stdout} == set(), script


@pytest.mark.slow
def test_step_modules_import_without_the_packages_the_image_lacks(gpu: ModuleType) -> None:
    hidden = gpu.steps.MISSING_ON_IMAGE
    modules = ["scripts/gpu_check.py", *(f"scripts/gpu/{n}.py" for n in ("steps", "runner", "summary", "launch", "site",
               "env_info", "ceiling")), "benchmarks/gpu.py", "benchmarks/decode.py"]  # fmt: skip
    probe = textwrap.dedent(f"""
        import importlib.util, sys
        sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "scripts")!r}]
        for name in {hidden!r}:
            sys.modules[name] = None
        for i, path in enumerate({modules!r}):
            spec = importlib.util.spec_from_file_location(f"step_{{i}}", {str(ROOT)!r} + "/" + path)
            sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)  # dataclasses look it up
            spec.loader.exec_module(module)
        try:
            import lightning_modules.tracking.logger  # needs mlflow: the hiding works
        except ImportError:
            print("hidden")
    """)
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "hidden"


@pytest.mark.slow
def test_without_cuda_it_refuses_in_one_line() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", "unused"], cwd=ROOT, env=no_cuda_env(),
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr.count("\n") == 1 and "no CUDA device here" in done.stderr and "--dry-run" in done.stderr
    )
    assert not (ROOT / "unused").exists()


def fake_wheels(folder: Path, sizes: list[int]) -> Path:
    folder.mkdir()
    for i, size in enumerate(sizes):
        with (folder / f"pkg{i}-1.0-py3-none-any.whl").open("wb") as f:
            f.truncate(size)  # sparse: the size is all that is measured
    (folder / "notes.txt").write_text("not a wheel, not counted")
    return folder


def test_bundle_within_64_mib_is_accepted_and_over_it_refused(bundle: ModuleType, tmp_path: Path) -> None:
    mib = 2**20
    exact = fake_wheels(tmp_path / "exact", [40 * mib, 24 * mib])
    assert bundle.check_size(exact) == f"{exact}: 2 wheels, 67.1 MB (64.0 MiB)"
    over = fake_wheels(tmp_path / "over", [40 * mib, 24 * mib + 1])
    with pytest.raises(UserError, match="over the 64 MiB the GPU machine takes"):
        bundle.check_size(over)


def test_bundle_refusal_is_one_line(
    bundle: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    over = fake_wheels(tmp_path / "over", [65 * 2**20])
    assert bundle.main(["--out", str(over), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scripts/gpu_bundle.py: error:") and "65.0 MiB" in err


def test_bundle_is_the_closure_minus_the_image(bundle: ModuleType) -> None:
    pins = dict(p.split("==") for p in bundle.requirements())
    assert {"jsonargparse", "mlflow-skinny", "webdataset", "braceexpand", "sqlalchemy", "alembic"} <= set(
        pins
    )
    assert {"docstring-parser", "typeshed-client"} <= set(
        pins
    )  # jsonargparse[signatures], which LightningCLI checks
    assert not {"torch", "lightning", "numpy", "pandas", "tokenizers", "pyyaml", "mlflow"} & set(pins)
    assert pins["mlflow-skinny"] == importlib.metadata.version("mlflow-skinny")  # what the tests ran here


def test_the_steps_get_jsonargparse_from_the_bundle(gpu: ModuleType, tmp_path: Path) -> None:
    bundle = fake_wheels(tmp_path / "bundle", [])
    for name in ("jsonargparse-4.53.0-py3-none-any.whl", "jsonargparse_extra-1.0-py3-none-any.whl",
                 "mlflow_skinny-3.17.2-py3-none-any.whl"):  # fmt: skip
        (bundle / name).write_bytes(b"")
    assert [p.name for p in gpu.site.wheels_for(bundle)] == ["jsonargparse-4.53.0-py3-none-any.whl"]
    assert gpu.site.install(tmp_path / "absent", tmp_path / "site").startswith("no jsonargparse wheel in")
    assert gpu.steps.HIDDEN == ("mlflow", "webdataset", "datatrove")  # what the steps run without
