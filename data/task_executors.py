"""Where the tasks of `--tasks N` run: datatrove's local executor (a process pool here) or its SLURM executor
(an array job for the tasks, and the merge as a job that depends on it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from datatrove.pipeline.base import PipelineStep

from data.data_errors import DataError, PrepareError
from data.parallel_options import DistributedOptions
from data.task_plan import WorkPaths
from data.task_steps import MergeStep

REPO = Path(__file__).resolve().parents[1]


def local_workers(dist: DistributedOptions) -> int:
    return dist.workers or min(dist.tasks, os.cpu_count() or 1)


def task_threads(dist: DistributedOptions) -> int | None:
    """Threads each task's tokenizer may use (None: no limit, the task has the machine to itself)."""
    if dist.executor == "slurm":
        return dist.slurm.cpus_per_task
    workers = local_workers(dist)
    return None if workers == 1 else max(1, (os.cpu_count() or 1) // workers)


def run_local(steps: list[PipelineStep], dist: DistributedOptions, paths: WorkPaths) -> None:
    """Run the tasks here, `local_workers` at once; a task's failure as a PrepareError."""
    # late: datatrove's executors are needed only once the tasks run (the steps' module suffices to pickle)
    from datatrove.executor.local import LocalPipelineExecutor

    executor = LocalPipelineExecutor(
        steps, tasks=dist.tasks, workers=local_workers(dist), logging_dir=str(paths.logs)
    )
    try:
        executor.run()
    except DataError:
        raise
    except Exception as exc:  # a task's exception as the pool re-raises it
        raise PrepareError(
            f"a task failed ({type(exc).__name__}: {exc}); logs in {paths.logs / 'logs'}"
        ) from exc


def slurm_executors(
    steps: list[PipelineStep], dist: DistributedOptions, paths: WorkPaths, out: Path
) -> tuple[Any, Any]:
    """The tasks' array job and the merge job that depends on it (afterok), as datatrove submits them."""
    # late: datatrove's SLURM executor is needed only with --executor slurm
    from datatrove.executor.slurm import SlurmPipelineExecutor

    s = dist.slurm
    env = f"source {s.venv}/bin/activate\nexport PYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}}"
    common = {"time": s.time, "partition": s.partition, "qos": s.qos, "env_command": env}
    tasks = SlurmPipelineExecutor(
        steps,
        tasks=dist.tasks,
        workers=dist.workers or -1,
        cpus_per_task=s.cpus_per_task,
        mem_per_cpu_gb=s.mem_per_cpu_gb,
        job_name=f"prepare-{out.name}",
        logging_dir=str(paths.logs),
        **common,
    )
    merge_job = SlurmPipelineExecutor(
        [MergeStep(str(paths.root), str(out))],
        tasks=1,
        cpus_per_task=min(8, max(1, s.cpus_per_task)),
        mem_per_cpu_gb=s.mem_per_cpu_gb,
        job_name=f"prepare-{out.name}-merge",
        logging_dir=str(paths.merge_logs),
        depends=tasks,
        **common,
    )
    return tasks, merge_job


def submit_slurm(steps: list[PipelineStep], dist: DistributedOptions, paths: WorkPaths, out: Path) -> None:
    _, merge_job = slurm_executors(steps, dist, paths, out)
    merge_job.run()  # submits the tasks' array job first, then the merge after it
