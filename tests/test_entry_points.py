"""Every entry point started once as a real process: main.py and each verb of the dispatcher answer --help,
and a bad option ends in one error line. The one-line tables (tests/one_line.py) call the same functions in
this process; this is the check that the process around them (the `__main__` modules, the imports a verb
pulls in, its exit code) is what those tables assume."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lightning_modules.commands import PROG, VERBS, command, main, usage

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_every_verb_answers_help_and_refuses_a_bad_option_as_a_process() -> None:
    argvs = [
        ["-m", "lightning_modules", verb, flag] for verb in VERBS for flag in ("--help", "--no-such-option")
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        done = list(pool.map(lambda argv: run(*argv), argvs))
    wrong = []
    for argv, result in zip(argvs, done, strict=True):
        verb, flag = argv[2], argv[3]
        if flag == "--help":
            if result.returncode != 0 or f"usage: {PROG} {verb}" not in result.stdout:
                wrong.append(
                    f"{verb} --help: exit {result.returncode}, {result.stdout[:200]!r}{result.stderr[-300:]!r}"
                )
        else:
            errors = [line for line in result.stderr.splitlines() if ": error: " in line]
            if result.returncode == 0 or len(errors) != 1 or "Traceback" in result.stderr:
                wrong.append(f"{verb} {flag}: exit {result.returncode}, {result.stderr[-300:]!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_main_py_and_the_dispatcher_start_as_processes() -> None:
    helped = run("main.py", "--help")
    assert helped.returncode == 0 and "fit" in helped.stdout
    listed = run("-m", "lightning_modules", "--help")
    assert listed.returncode == 0 and listed.stdout.strip() == usage()
    unknown = run("-m", "lightning_modules", "trian")
    assert unknown.returncode == 2 and unknown.stderr.strip().endswith(", ".join(VERBS))
    assert "no command 'trian'" in unknown.stderr


def test_every_command_module_is_a_verb_and_every_verb_has_a_main() -> None:
    modules = {p.stem for p in (ROOT / "lightning_modules" / "commands").glob("*.py")} - {"__init__"}
    assert modules == {module for module, _ in VERBS.values()}
    for verb in VERBS:
        assert callable(command(verb))


def test_the_dispatcher_lists_the_verbs_and_refuses_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {verb} " in out for verb in VERBS)
    assert main([]) == 2  # no verb: the list, and a failure for scripts that forgot one
    assert main(["nope"]) == 2
    assert "no command 'nope'" in capsys.readouterr().err
