"""`lightning_modules.commands.prepare --tasks N` owns its work folder: a second identical command, while the first runs, is refused
in one line and the first finishes (data/work_lock.py); a finished task whose shard was damaged afterwards is
redone by the next run of the same command instead of failing every rerun (data/task_plan.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from data.data_errors import PrepareError
from data.distributed_prepare import prepare_distributed
from data.manifest import Manifest
from data.work_lock import lock_path, preparation_lock
from lightning_modules.commands.prepare import main as prepare_main
from lightning_modules.commands.prepare import parse_args
from lightning_modules.commands.verify import main as verify_main
from tests.data.helpers import OPTIONS, env, files

# The first command stops inside its first task (so holding the lock, the tokenizer trained, a task
# running) until the test lets it go; everything else is the real command.
HOLDER = """
import os, sys, time
from pathlib import Path
from datatrove.pipeline.base import PipelineStep
from data.distributed_prepare import prepare_distributed
from lightning_modules.commands.prepare import parse_args

class WaitInTask(PipelineStep):
    name = type = "wait"
    def __init__(self, go):
        super().__init__()
        self.go = go
    def run(self, data, rank=0, world_size=1):
        Path(self.go + ".waiting").touch()
        while not os.path.exists(self.go):
            time.sleep(0.05)
        yield from data

if __name__ == "__main__":  # datatrove's pool workers are spawned: they import this file again
    cfg = parse_args(sys.argv[2:])
    prepare_distributed(cfg, cfg.parallel, extra_steps=[WaitInTask(sys.argv[1])])
"""


def _wait_for(path: Path, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 300
    while not path.exists():
        assert process.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "the first command never reached its task"
        time.sleep(0.1)


@pytest.mark.slow
def test_second_identical_command_is_refused_while_the_first_finishes(tmp_path: Path) -> None:
    out, go, log = tmp_path / "out", tmp_path / "go", tmp_path / "first.log"
    command = [*files(), "--out", str(out), *OPTIONS, "--tasks", "2", "--workers", "1"]
    (tmp_path / "holder.py").write_text(HOLDER)
    with open(
        log, "wb"
    ) as output:  # a file, not a pipe: datatrove's manager process may outlive a pipe reader
        first = subprocess.Popen([sys.executable, str(tmp_path / "holder.py"), str(go), *command], env=env(),
                                 stdout=output, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            _wait_for(Path(f"{go}.waiting"), first, log)
            work = sorted(p.relative_to(tmp_path) for p in (tmp_path / "out.partial").rglob("*"))
            second = subprocess.run([sys.executable, "-m", "lightning_modules", "prepare", *command], env=env(),
                                    capture_output=True, text=True, timeout=300)  # fmt: skip
            assert second.returncode == 1
            errors = [line for line in second.stderr.splitlines() if ": error: " in line]
            assert "Traceback" not in second.stderr and len(errors) == 1, second.stderr
            assert f"{out} is being prepared by pid {first.pid}" in errors[0], errors[0]
            # refused before touching anything of the first one's
            assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "out.partial").rglob("*")) == work
        finally:
            go.touch()
        assert first.wait(timeout=300) == 0, log.read_text()[-2000:]
    assert verify_main([str(out)]) == 0
    assert Manifest.load(out).source["tasks"]["count"] == 2
    assert not (tmp_path / "out.partial").exists() and not lock_path(out).exists()


@pytest.mark.slow
def test_a_killed_drivers_leftover_processes_do_not_keep_the_lock(tmp_path: Path) -> None:
    """datatrove's manager, forked by the driver, outlives a SIGKILL of it: it must not hold the lock."""
    out, go, log = tmp_path / "out", tmp_path / "go", tmp_path / "first.log"
    command = [*files(), "--out", str(out), *OPTIONS, "--tasks", "2", "--workers", "2"]
    (tmp_path / "holder.py").write_text(HOLDER)
    with open(log, "wb") as output:
        first = subprocess.Popen([sys.executable, str(tmp_path / "holder.py"), str(go), *command], env=env(),
                                 stdout=output, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        _wait_for(Path(f"{go}.waiting"), first, log)  # a pool worker runs a task: the manager is up
        first.kill()
        first.wait(timeout=60)
        with preparation_lock(out):  # refused (PrepareError) if an orphan still held it
            pass
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the orphans: the manager and the waiting workers


def test_lock_refuses_a_holder_and_is_taken_over_after_one_died(tmp_path: Path) -> None:
    out = tmp_path / "out"
    lock_path(out).write_text("pid 999999 on a crashed host\n")  # left by a killed driver: no lock held
    with preparation_lock(out) as path:
        assert path.read_text() == f"pid {os.getpid()} on {os.uname().nodename}\n"
        cfg = parse_args([*files(), "--out", str(out), *OPTIONS, "--tasks", "2"])
        with pytest.raises(PrepareError, match=rf"{out} is being prepared by pid {os.getpid()} on"):
            prepare_distributed(cfg, cfg.parallel)
        assert not (tmp_path / "out.partial").exists()
    assert not lock_path(out).exists()  # its holder removes it on the way out


class FailInSecondTask(PipelineStep):
    name = type = "fail"

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for document in data:
            if rank == 1:
                raise RuntimeError("stopped by the test")
            yield document


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_finished_task_with_a_damaged_shard_is_redone(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], damage: str
) -> None:
    out = tmp_path / "out"
    command = [*files(), "--out", str(out), *OPTIONS, "--tasks", "2", "--workers", "1"]
    cfg = parse_args(command)
    with pytest.raises(PrepareError, match="stopped by the test"):
        prepare_distributed(cfg, cfg.parallel, extra_steps=[FailInSecondTask()])
    work = tmp_path / "out.partial"
    assert (work / "logs/completions/00000").exists() and not (work / "logs/completions/00001").exists()
    shard = work / "dataset" / "train-task00000-00001.tar"
    if damage == "missing":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:5000])  # what a crash or a second command can leave
    capfd.readouterr()

    assert prepare_main(command) == 0  # the same command: task 0 is redone, not trusted
    err = capfd.readouterr().err
    assert f"task 0 finished but its shard {shard}" in err and "redoing it" in err
    assert verify_main([str(out)]) == 0
    assert not work.exists() and not lock_path(out).exists()
