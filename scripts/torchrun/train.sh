#!/bin/bash
# Multi-node training with torchrun (no SLURM): run this on every node, with the same MASTER_ADDR and
# MASTER_PORT and its own NODE_RANK (0 .. NNODES-1). torchrun starts one process per GPU and sets the
# torchelastic environment, which Lightning detects (TorchElasticEnvironment); same main.py and configs
# as on one machine (docs/architecture.md, "Scale").
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 scripts/torchrun/train.sh     # on node0
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 scripts/torchrun/train.sh     # on node1
#   ... scripts/torchrun/train.sh --ckpt_path checkpoints/<run>/last.ckpt  # resume (same world size)
#
# Extra arguments go to `main.py fit` unchanged.

set -euo pipefail

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
SIZE=${SIZE:-1b}                  # conf/model/<SIZE>.yaml and conf/recipe/<SIZE>.yaml
ATTENTION=${ATTENTION:-lrkv}      # conf/attention/<ATTENTION>.yaml
STRATEGY=${STRATEGY:-hybrid-fsdp} # conf/strategy/<STRATEGY>.yaml: ddp, fsdp or hybrid-fsdp
DATA=${DATA:-fineweb-edu}         # conf/data/<DATA>.yaml
PYTHON=${PYTHON:-.venv/bin/python}

cd "$(dirname "$0")/../.."
"$PYTHON" -m torch.distributed.run \
    --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    main.py fit \
    --config conf/base.yaml \
    --config conf/recipe/paper.yaml \
    --config "conf/model/${SIZE}.yaml" \
    --config "conf/recipe/${SIZE}.yaml" \
    --config "conf/attention/${ATTENTION}.yaml" \
    --config "conf/data/${DATA}.yaml" \
    --config "conf/strategy/${STRATEGY}.yaml" \
    --trainer.accelerator gpu \
    --trainer.num_nodes "$NNODES" \
    --trainer.devices "$GPUS_PER_NODE" \
    "$@"
