#!/bin/bash
# The command each SLURM task runs (scripts/slurm/train.sbatch starts it with srun), printed one argument
# per NUL-terminated field so that a test can start it without SLURM (tests/distributed/test_slurm_local.py):
#
#   mapfile -d '' COMMAND < <(bash scripts/slurm/command.sh [extra main.py fit arguments])
#
# SIZE, ATTENTION, STRATEGY, DATA, PYTHON and ACCELERATOR choose the run (defaults: the paper's 1b lrkv on
# GPUs, hybrid FSDP); conf/recipe/<SIZE>.yaml is used when it exists. The allocation comes from SLURM's
# environment: SLURM_JOB_NUM_NODES nodes of SLURM_NTASKS_PER_NODE tasks (one per device). `--ckpt_path auto`
# comes first, so a requeued job (the same command) resumes the run's newest checkpoint, or a new one starts;
# a --ckpt_path among the extra arguments wins, on every requeue too.
set -euo pipefail

SIZE=${SIZE:-1b}                  # conf/model/<SIZE>.yaml and conf/recipe/<SIZE>.yaml
ATTENTION=${ATTENTION:-lrkv}      # conf/attention/<ATTENTION>.yaml
STRATEGY=${STRATEGY:-hybrid-fsdp} # conf/strategy/<STRATEGY>.yaml: ddp, fsdp or hybrid-fsdp
DATA=${DATA:-fineweb-edu}         # conf/data/<DATA>.yaml
PYTHON=${PYTHON:-.venv/bin/python}
ACCELERATOR=${ACCELERATOR:-gpu}

# Absolute paths: the command runs from any folder (checkpoints/ and mlruns/ land in the working directory).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
recipe=()
if [[ -f "$ROOT/conf/recipe/${SIZE}.yaml" ]]; then
    recipe=(--config "$ROOT/conf/recipe/${SIZE}.yaml")
fi
# SLURM writes SLURM_NTASKS_PER_NODE as e.g. "8" or "8(x2)"; every node runs the same number of tasks here.
tasks_per_node=${SLURM_NTASKS_PER_NODE%%(*}

printf '%s\0' "$PYTHON" "$ROOT/main.py" fit \
    --config "$ROOT/conf/base.yaml" \
    --config "$ROOT/conf/recipe/paper.yaml" \
    --config "$ROOT/conf/model/${SIZE}.yaml" \
    "${recipe[@]}" \
    --config "$ROOT/conf/attention/${ATTENTION}.yaml" \
    --config "$ROOT/conf/data/${DATA}.yaml" \
    --config "$ROOT/conf/strategy/${STRATEGY}.yaml" \
    --trainer.accelerator "$ACCELERATOR" \
    --trainer.num_nodes "${SLURM_JOB_NUM_NODES}" \
    --trainer.devices "$tasks_per_node" \
    --ckpt_path auto \
    "$@"
