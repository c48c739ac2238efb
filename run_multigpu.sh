#!/usr/bin/env bash
# The graph-colouring GNN on every GPU (seed 002), the user's name for it: deploy_8gpu.sh --trainer gnn.
#
#   bash run_multigpu.sh                 # all GPUs: generate graphs once, train, export, package
#   bash run_multigpu.sh --demo          # CPU, 2 gloo workers, a small dataset
#
# Every deploy_8gpu.sh flag works here (--gpus, --out, budgets, --nnodes/--node-rank/--rdzv-endpoint,
# --max-restarts, --dry-run) plus the GNN's own (--train, --val, --max-nodes, --epochs); options
# after -- go to `trainers gnn train`.
set -euo pipefail
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/deploy_8gpu.sh" --trainer gnn "$@"
