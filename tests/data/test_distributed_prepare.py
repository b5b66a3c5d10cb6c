"""`lightning_modules.commands.prepare --tasks N` on datatrove: N = 1 equals the one-process path shard for shard, N = 2 is
reproducible whatever the workers, a killed run redoes only the unfinished task and never touches the finished
dataset at --out, a failed task names its file, the SLURM path runs with stand-in sbatch/scontrol, and the
merged dataset trains."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from data.manifest import Manifest
from lightning_modules.commands.prepare import main as prepare_main
from tests.conftest import TINY_SEQ_LEN
from tests.data.helpers import OPTIONS, ROOT, env, files


def tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("two") / "out"
    assert prepare_main([*files(), "--out", str(out), *OPTIONS, "--tasks", "2", "--workers", "2"]) == 0
    return out


@pytest.mark.slow
def test_one_task_equals_the_one_process_path(tiny_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "one"
    assert prepare_main([*files(), "--out", str(out), *OPTIONS, "--tasks", "1"]) == 0
    reference, ours = Manifest.load(tiny_shards), Manifest.load(out)
    renamed = {}
    for name in reference.splits:
        shards, theirs = ours.split(name).shards, reference.split(name).shards
        assert len(shards) == len(theirs) > 0
        for number, (mine, one_process) in enumerate(zip(shards, theirs, strict=True)):
            assert mine.path == f"{name}-task00000-{number:05d}.tar"
            assert (out / mine.path).read_bytes() == (tiny_shards / one_process.path).read_bytes()
            renamed[mine.path] = one_process.path
    assert (out / "tokenizer.json").read_bytes() == (tiny_shards / "tokenizer.json").read_bytes()
    # The manifests differ by the shard names and source.tasks only.
    raw = json.loads((out / "manifest.json").read_text())
    tasks = raw["source"].pop("tasks")
    for split in raw["splits"].values():
        for shard in split["shards"]:
            shard["path"] = renamed[shard["path"]]
    assert raw == json.loads((tiny_shards / "manifest.json").read_text())
    drops = {name: split.dropped_tokens for name, split in reference.splits.items()}
    assert tasks == {
        "count": 1,
        "per_task": [{"task": 0, "files": 6, "documents": 6, "dropped_tokens": drops}],
    }
    assert not (tmp_path / "one.partial").exists()  # the work folder goes once the dataset is in place


@pytest.mark.slow
def test_two_tasks_give_the_same_bytes_whatever_the_workers(two_tasks: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert prepare_main([*files(), "--out", str(again), *OPTIONS, "--tasks", "2", "--workers", "1"]) == 0
    assert tree(again) == tree(two_tasks)
    manifest = Manifest.load(two_tasks)
    per_task = manifest.source["tasks"]["per_task"]
    assert manifest.source["tasks"]["count"] == 2 and [t["files"] for t in per_task] == [3, 3]
    for name, split in manifest.splits.items():
        assert split.dropped_tokens == sum(t["dropped_tokens"][name] for t in per_task)
        assert {s.path.split("-")[1] for s in split.shards} <= {"task00000", "task00001"}
    assert (
        subprocess.run(
            [sys.executable, "-m", "lightning_modules", "verify", str(two_tasks)], env=env()
        ).returncode
        == 0
    )


KILLER = """
import os, signal, sys
from datatrove.pipeline.base import PipelineStep
from data.distributed_prepare import prepare_distributed
from lightning_modules.commands.prepare import parse_args

class KillInTask(PipelineStep):
    name = type = "kill"
    def run(self, data, rank=0, world_size=1):
        for document in data:
            if rank == 1:  # task 0 has finished (workers=1 runs tasks in order, in this process)
                os.kill(os.getpid(), signal.SIGKILL)
            yield document

cfg = parse_args(sys.argv[1:])
prepare_distributed(cfg, cfg.parallel, extra_steps=[KillInTask()])
"""


@pytest.mark.slow
def test_killed_run_redoes_only_the_unfinished_task(
    two_tasks: Path, tiny_shards: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(tiny_shards, out)  # a finished dataset that the failed run must leave alone
    before = tree(out)
    command = [*files(), "--out", str(out), *OPTIONS, "--tasks", "2", "--workers", "1"]
    (tmp_path / "killer.py").write_text(KILLER)
    # Output to a file, not a pipe: the killed driver's orphaned multiprocess manager would hold a pipe open.
    with open(tmp_path / "killed.log", "wb") as log:
        killed = subprocess.Popen([sys.executable, str(tmp_path / "killer.py"), *command], env=env(), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        assert killed.wait(timeout=300) == -signal.SIGKILL
    os.killpg(killed.pid, signal.SIGKILL)  # what the kill left behind (datatrove's manager process)
    assert tree(out) == before
    work = tmp_path / "out.partial"
    assert (work / "logs/completions/00000").exists() and not (work / "logs/completions/00001").exists()
    done = sorted(work.glob("dataset/*-task00000-*.tar"))
    stamps = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in done}
    (work / "dataset/train-task00001-00099.tar").write_bytes(b"half a shard of the killed attempt")

    resumed = subprocess.run(
        [sys.executable, "-m", "lightning_modules", "prepare", *command],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "Skipping 1 already completed tasks" in resumed.stderr  # datatrove's own completion markers
    # task 0 not redone: its shards are the very files it wrote, renamed into --out with the work folder...
    assert {n: ((out / n).stat().st_ino, (out / n).stat().st_mtime_ns) for n in stamps} == stamps
    # ...and the result is the clean run's, byte for byte; the old dataset's files are gone, nothing else left.
    assert not work.exists() and not (tmp_path / ".out.replaced").exists()
    assert tree(out) == tree(two_tasks)


@pytest.mark.slow
def test_failed_task_names_its_file_and_a_rerun_finishes(
    tiny_shards: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for number, path in enumerate(files()[:4]):
        shutil.copy(path, inputs / f"{number}.txt")
    bad = inputs / "3.txt"
    good = bad.read_bytes()
    bad.write_bytes(b"not utf-8 \xff\xfe here")
    out = tmp_path / "out"
    command = [str(inputs), "--out", str(out), "--tokenizer", str(tiny_shards / "tokenizer.json"),
               "--seq-len", "32", "--txt-doc-chars", "4000", "--no-progress", "--val-frac", "0.1", "--test-frac", "0.1", "--tasks", "2",
               "--workers", "1"]  # fmt: skip
    assert prepare_main(command) == 1
    error = capfd.readouterr().err.strip().splitlines()[-1]
    assert str(bad) in error and "not valid UTF-8" in error
    assert not out.exists()
    # Another command does not mix with the unfinished one...
    assert prepare_main([*command[:-2], "--workers", "1", "--seq-len", "16"]) == 1
    assert "--seq-len" in capfd.readouterr().err.strip().splitlines()[-1]
    # ...the same one, after the fix, redoes only the failed task.
    bad.write_bytes(good)
    assert prepare_main(command) == 0
    assert "Skipping 1 already completed tasks" in capfd.readouterr().err
    assert Manifest.load(out).source["tasks"]["count"] == 2


FAKE_SBATCH = """#!/bin/bash
# stands in for SLURM: keeps each submitted script and its arguments, answers like sbatch
n=$(( $(ls "$SBATCH_LOG" | wc -l) + 1 ))
for last; do :; done
{ echo "ARGS: $*"; cat "$last"; } > "$SBATCH_LOG/job-$n.txt"
echo "Submitted batch job $n"
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.slow
def test_slurm_path_without_slurm(two_tasks: Path, tmp_path: Path) -> None:
    bin_dir, jobs = tmp_path / "bin", tmp_path / "jobs"
    bin_dir.mkdir(), jobs.mkdir()
    _executable(bin_dir / "sbatch", FAKE_SBATCH)
    _executable(bin_dir / "scontrol", "#!/bin/bash\necho node001\n")
    slurm_env = {**env(), "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
                 "SBATCH_LOG": str(jobs)}  # fmt: skip
    out = tmp_path / "out"
    submit = [sys.executable, "-m", "lightning_modules", "prepare", *files(), "--out", str(out), *OPTIONS, "--tasks", "2",
              "--executor", "slurm", "--slurm-partition", "cpu", "--slurm-cpus-per-task", "4", "--workers", "8"]  # fmt: skip
    result = subprocess.run(submit, env=slurm_env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "submitted 2 tasks" in result.stdout
    scripts = {p.name: p.read_text() for p in sorted(jobs.iterdir())}
    tasks_job = scripts["job-1.txt"]  # then datatrove's stats job (2), our merge (3) and its stats job (4)
    for line in ("#SBATCH --array=0-1%8", "#SBATCH --partition=cpu", "#SBATCH --cpus-per-task=4",
                 f"source {sys.prefix}/bin/activate", f"export PYTHONPATH={ROOT}", "launch_pickled_pipeline"):  # fmt: skip
        assert line in tasks_job, line
    merge_job = scripts["job-3.txt"]
    assert "--dependency=afterok:1" in merge_job and "prepare-out-merge" in merge_job
    assert not out.exists()

    # Run the jobs as SLURM would: each array index, then the merge.
    work = tmp_path / "out.partial"
    for index in ("0", "1"):
        array_env = {
            **slurm_env,
            "SLURM_ARRAY_TASK_ID": index,
            "SLURM_NODELIST": "node001",
            "SLURM_JOB_ID": "1",
        }
        run = subprocess.run(["launch_pickled_pipeline", str(work / "logs/executor.pik")], env=array_env,
                             capture_output=True, text=True)  # fmt: skip
        assert run.returncode == 0, run.stderr
    merge_env = {**slurm_env, "SLURM_ARRAY_TASK_ID": "0", "SLURM_NODELIST": "node001", "SLURM_JOB_ID": "3"}
    run = subprocess.run(["launch_pickled_pipeline", str(work / "merge-logs/executor.pik")], env=merge_env,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert tree(out) == tree(two_tasks)
    # What it leaves (its logs) does not stop the next preparation to the same place.
    assert {p.name for p in work.iterdir()} <= {"logs", "merge-logs"}
    assert prepare_main([*files(), "--out", str(out), *OPTIONS, "--tasks", "2", "--workers", "1"]) == 0
    assert tree(out) == tree(two_tasks)


@pytest.mark.slow
def test_merged_dataset_trains(two_tasks: Path, mlflow_uri: str) -> None:
    from main import main

    main(["fit", "--config", str(ROOT / "conf/base.yaml"), "--config", str(ROOT / "conf/model/nano.yaml"),
          "--config", str(ROOT / "conf/attention/gqa.yaml"), "--model.arch.seq_len", str(TINY_SEQ_LEN),
          "--data.data_dir", str(two_tasks), "--data.batch_size", "4", "--data.num_workers", "0",
          "--trainer.max_steps", "3", "--trainer.limit_val_batches", "2", "--trainer.val_check_interval", "3",
          "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"])  # fmt: skip
    checkpoints = list(Path("checkpoints").rglob("last.ckpt"))
    assert len(checkpoints) == 1


def test_swap_in_deletes_only_what_the_old_manifest_lists(tiny_shards: Path, tmp_path: Path) -> None:
    from data.task_merge import swap_in

    out, built = tmp_path / "out", tmp_path / "built"
    shutil.copytree(tiny_shards, out)
    (out / "notes.txt").write_text("the user's")
    built.mkdir()
    (built / "manifest.json").write_text("{}")
    (built / "train-task00000-00000.tar").write_bytes(b"new")
    swap_in(built, out)
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "notes.txt",
        "train-task00000-00000.tar",
    ]
    assert (out / "notes.txt").read_text() == "the user's" and not built.exists()
    assert not (tmp_path / ".out.replaced").exists()
