"""Every entry point started once as a real process (main.py, the dispatcher and one verb through it); in this
process, each verb answers --help and ends a bad option in one error line. The one-line tables (tests/one_line.py) call the same functions in
this process; this is the check that the process around them (the `__main__` modules, the imports a verb
pulls in, its exit code) is what those tables assume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_modules.commands import PROG, VERBS, command, main, usage
from tests.one_line import run_in_process

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_answers_help(verb: str) -> None:
    """In this process, through the dispatcher: the verb's module imports and its parser is whole."""
    code, out, err = run_in_process(lambda: main([verb, "--help"]), {}, ROOT)
    assert code == 0 and f"usage: {PROG} {verb}" in out, err[-500:]


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_refuses_an_unknown_option_in_one_line(verb: str) -> None:
    code, _, stderr = run_in_process(lambda: main([verb, "--no-such-option"]), {}, ROOT)
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert code == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr
    assert errors[0].startswith(f"{PROG} {verb}: error: ")  # the verb names itself


@pytest.mark.slow
def test_main_py_and_the_dispatcher_start_as_processes() -> None:
    """The two entry points as a user starts them; a verb's --help as a process (its `__main__` path)."""
    helped = run("main.py", "--help")
    assert helped.returncode == 0 and "fit" in helped.stdout
    listed = run("-m", "lightning_modules", "--help")
    assert listed.returncode == 0 and listed.stdout.strip() == usage()
    verb = run("-m", "lightning_modules", "study", "--help")
    assert verb.returncode == 0 and f"usage: {PROG} study" in verb.stdout
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


def test_main_offers_fit_validate_and_test_but_not_predict(capsys: pytest.CaptureFixture[str]) -> None:
    """The model has no predict_step: `predict` is neither listed nor accepted (one line, exit 2)."""
    import main as entry  # the repository root is on sys.path (pyproject.toml's pytest pythonpath)

    with pytest.raises(SystemExit) as exit_:
        entry.run(["--help"])
    assert exit_.value.code == 0 and "{fit,validate,test}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        entry.run(["predict"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid choice: 'predict'" in err and "Traceback" not in err
