"""Anticipated failures end in one line through the real entry points (main.py, python -m lightning_modules prepare,
python -m lightning_modules generate): non-zero exit, the thing named, what to do, no traceback
(lightning_modules/core/errors.py). LRKV_DEBUG=1 brings the traceback back."""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from lightning_modules.commands import generate
from lightning_modules.core.errors import DEBUG_ENV
from tests.core.helpers import NANO, ROOT
from tests.helpers import free_port
from tests.one_line import Case, assert_each_ends_in_one_line


class _Unsafe:
    """Unpickling this would call os.system: a checkpoint must never be loaded that way."""

    def __reduce__(self) -> tuple:
        return (os.system, ("echo unsafe-code-ran",))


def _unwritable(tmp_path: Path) -> Path | None:
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    try:  # root ignores modes: a read-only mount stands in
        os.rmdir(tempfile.mkdtemp(dir="/sys"))
    except OSError:
        return Path("/sys")
    return None


def _cases(tmp: Path, shards: Path) -> list[Case]:
    truncated = tmp / "truncated.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 1}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:500])
    text = tmp / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    foreign = tmp / "foreign.ckpt"
    torch.save({"a": 1}, foreign)
    unsafe = tmp / "unsafe.ckpt"
    torch.save({"x": _Unsafe()}, unsafe, pickle_module=pickle)
    bad_yaml = tmp / "bad.yaml"
    bad_yaml.write_text("trainer:\n  max_steps: [1\n")
    corrupt = tmp / "corrupt-shards"
    shutil.copytree(shards, corrupt)
    shard = corrupt / "train-00000.tar"
    payload = bytearray(shard.read_bytes())
    payload[3000:3100] = b"x" * 100
    shard.write_bytes(payload)
    main = [str(ROOT / "main.py"), "fit", *NANO, "--data.data_dir", str(shards)]
    deep = tmp / ("t" * 80)  # a TMPDIR too long for loader workers' sockets (data/worker_tempdir.py)
    deep.mkdir()
    cases = [
        ("missing ckpt", [*main, "--ckpt_path", str(tmp / "nope.ckpt")], {}, ["nope.ckpt: no such file"]),
        ("truncated ckpt", [*main, "--ckpt_path", str(truncated)], {}, ["truncated.ckpt", "not a readable"]),
        ("text as ckpt", [*main, "--ckpt_path", str(text)], {}, ["notes.ckpt", "not a readable checkpoint"]),
        ("foreign ckpt", [*main, "--ckpt_path", str(foreign)], {}, ["foreign.ckpt", "not a training checkpoint"]),
        ("unsafe ckpt", [*main, "--ckpt_path", str(unsafe)], {}, ["unsafe.ckpt", "not loaded"]),
        ("yaml syntax", [*main, "--config", str(bad_yaml)], {}, [f"{bad_yaml}: YAML syntax error at line 3"]),
        (
            "server down",
            main,
            {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"},
            ["is unreachable", "start the server"],
        ),
        (
            "corrupt shard",
            [*main, "--data.data_dir", str(corrupt), "--data.num_workers", "2"],
            {},
            ["train-00000.tar", "python -m lightning_modules verify"],
        ),
        (
            "generate nan",
            ["-m", "lightning_modules", "generate", "--ckpt", str(foreign), "--prompt", "x", "--temperature", "nan"],
            {},
            ["temperature=nan", "finite number >= 0"],
        ),
        ("precision env", [a for a in main if a not in ("--trainer.precision", "32-true")], {"LRKV_PRECISION": "fp16"},
         ["LRKV_PRECISION='fp16'", "auto, bf16 or fp32"]),  # read only where no precision is given
        ("long TMPDIR", [*main, "--data.num_workers", "2"], {"TMPDIR": str(deep)}, [f"TMPDIR={deep}", "num_workers=0"]),
        ("generate unsafe", ["-m", "lightning_modules", "generate", "--ckpt", str(unsafe), "--prompt", "x"], {}, ["not loaded"]),
    ]  # fmt: skip
    ro = _unwritable(tmp)
    if ro is not None:
        prep = [
            "-m",
            "lightning_modules",
            "prepare",
            "--source",
            "shakespeare",
            "--out",
            str(ro / "out"),
            "--no-progress",
        ]
        cases.append(("prepare read-only", prep, {}, [str(ro), "not writable"]))
    return cases


@pytest.mark.slow
def test_each_bad_input_ends_in_one_line(tiny_shards: Path, mlflow_uri: str, tmp_path: Path) -> None:
    assert_each_ends_in_one_line(_cases(tmp_path, tiny_shards), tmp_path)


def test_debug_env_shows_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # In this process: the table above runs `python -m lightning_modules generate` for real, and what
    # LRKV_DEBUG switches is errors.report, plain Python below the entry's main.
    argv = ["--ckpt", str(tmp_path / "nope.ckpt"), "--prompt", "x"]
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert generate.main(argv) == 2
    quiet = capsys.readouterr().err
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert generate.main(argv) == 2
    loud = capsys.readouterr().err
    assert "Traceback" not in quiet and "generate: error: --ckpt" in quiet
    assert "Traceback" in loud and "GenerateError" in loud
