#!/usr/bin/env bash
# The colouring GNN on one GPU (or with --demo on CPU): run_multigpu.sh with a single process.
#   bash gnn_training/run.sh [run_multigpu.sh options]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for a in "$@"; do
  [[ "$a" == -- ]] && break
  [[ "$a" == --demo ]] && exec bash "$here/../run_multigpu.sh" "$@"
done
exec bash "$here/../run_multigpu.sh" --gpus 1 "$@"
