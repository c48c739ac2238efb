#!/usr/bin/env bash
# Container entrypoint: the first argument picks what to run, the rest are passed through.
#   deploy [deploy_8gpu.sh options]   a trainer's whole pipeline (default: the forecaster; --trainer NAME)
#   gnn [run_multigpu.sh options]     the graph-colouring pipeline (deploy --trainer gnn)
#   preflight [options]               machine checks only
#   tensorboard [--logdir DIR]        TensorBoard on port 6006 over the output folder
#   shell                             an interactive shell (RunPod's web terminal, debugging)
#   <anything else>                   run as a command
set -euo pipefail

KIT_DIR="${KIT_DIR:-/opt/trainers}"
OUT="${OUT:-/workspace/output}"
export OUT

cmd="${1:-deploy}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  # --foreground: the container lives as long as its main process, so the job must not detach
  deploy) exec bash "$KIT_DIR/deploy_8gpu.sh" --foreground "$@" ;;
  gnn) exec bash "$KIT_DIR/run_multigpu.sh" --foreground "$@" ;;
  preflight) exec python -m trainers preflight --out "$OUT" "$@" ;;
  tensorboard)
    mkdir -p "$OUT"
    exec tensorboard --logdir "$OUT" --host 0.0.0.0 --port 6006 "$@" ;;
  shell) exec bash "$@" ;;
  -h|--help|help)
    sed -n '2,/^set -euo pipefail/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' ;;
  *) exec "$cmd" "$@" ;;
esac
