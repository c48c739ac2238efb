#!/usr/bin/env bash
# The graph-colouring GNN on every GPU (seed 002): preflight -> data (generated once) -> train
# (torchrun, DDP over graphs) -> export ONNX (checked on graphs of other sizes) -> package.
#
#   bash run_multigpu.sh                 # all GPUs
#   bash run_multigpu.sh --demo          # CPU, 2 gloo workers, a small dataset
# Same conventions as deploy_8gpu.sh: non-interactive, idempotent, each phase timed and logged to
# $OUT/gnn.log; options after -- go to `trainers gnn`.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=kit_lib.sh
. "$REPO/kit_lib.sh"

usage() {
  cat <<'EOF_USAGE'
usage: bash run_multigpu.sh [options] [-- extra `trainers gnn` options]
  --gpus N          GPUs to use (default: all; 1 = a single process)   [GPUS]
  --out DIR         output folder (default: /workspace/output or ./output) [OUT]
  --train N         training graphs to generate (default: 2000; 200 with --demo)
  --val N           validation graphs (default: 200; 32 with --demo)
  --max-nodes N     largest generated graph (default: 300; 100 with --demo)
  --epochs N        training epochs (default: 20; 3 with --demo)
  --max-restarts N  torchrun restarts after a failure (default: 3)
  --demo            CPU, 2 gloo workers, small data
  --dry-run         print the commands
EOF_USAGE
}

GPUS="${GPUS:-all}"
OUT="${OUT:-}"
TRAIN="" VAL="" MAX_NODES="" EPOCHS=""
MAX_RESTARTS="${MAX_RESTARTS:-3}"
DEMO=0
DRY_RUN=0
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --gpus) need_value "$@"; GPUS="$2"; shift 2 ;;
    --out) need_value "$@"; OUT="$2"; shift 2 ;;
    --train) need_value "$@"; TRAIN="$2"; shift 2 ;;
    --val) need_value "$@"; VAL="$2"; shift 2 ;;
    --max-nodes) need_value "$@"; MAX_NODES="$2"; shift 2 ;;
    --epochs) need_value "$@"; EPOCHS="$2"; shift 2 ;;
    --max-restarts) need_value "$@"; MAX_RESTARTS="$2"; shift 2 ;;
    --demo) DEMO=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[[ "$GPUS" == all ]] || { is_uint "$GPUS" && [[ "$GPUS" -ge 1 ]]; } || die "--gpus '$GPUS' must be 'all' or a number >= 1"
if [[ "$DEMO" -eq 1 ]]; then
  TRAIN="${TRAIN:-200}" VAL="${VAL:-32}" MAX_NODES="${MAX_NODES:-100}" EPOCHS="${EPOCHS:-3}"
else
  TRAIN="${TRAIN:-2000}" VAL="${VAL:-200}" MAX_NODES="${MAX_NODES:-300}" EPOCHS="${EPOCHS:-20}"
fi
for v in TRAIN VAL MAX_NODES EPOCHS MAX_RESTARTS; do is_uint "${!v}" || die "--${v,,} '${!v}' must be a number"; done
if [[ -z "$OUT" ]]; then
  if [[ -d /workspace ]]; then OUT=/workspace/output; else OUT="$PWD/output"; fi
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gnn.log"
DATA_DIR="$OUT/graphs_${TRAIN}_${VAL}_${MAX_NODES}"
RUN_DIR="$OUT/gnn"
TARBALL="$OUT/gnn.tar.gz"
PY="${TRAINERS_PYTHON:-python3}"
PHASE="start"
NPROC=0
start_log
echo "run_multigpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname); out=$OUT demo=$DEMO gpus=$GPUS dry_run=$DRY_RUN"

preflight() {
  pick_nproc "$GPUS" "$DEMO"
  [[ "$DEMO" -eq 1 ]] || run "$PY" -m trainers preflight --expect-gpus "$NPROC" --out "$OUT" --preset tiny --no-nccl
}

data() {
  if [[ -f "$DATA_DIR/metadata.json" ]]; then echo "dataset already at $DATA_DIR"; return; fi
  run "$PY" -m trainers gnn-data --out "$DATA_DIR" --train "$TRAIN" --val "$VAL" --max-nodes "$MAX_NODES"
}

train() {
  local device=()
  [[ "$DEMO" -eq 0 ]] || device=(--device cpu)
  run "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" --max-restarts="$MAX_RESTARTS" \
    -m trainers gnn --data-dir "$DATA_DIR" --run-dir "$RUN_DIR" --epochs "$EPOCHS" "${device[@]}" "${EXTRA[@]}"
}

export_onnx() { run "$PY" -m trainers gnn-export --run-dir "$RUN_DIR"; }

package() {
  run "$PY" -m trainers package --run-dir "$RUN_DIR" --output "$TARBALL"
  [[ "$DRY_RUN" -eq 1 ]] || (cd "$OUT" && sha256sum -c "$(basename "$TARBALL").sha256")
  [[ "$DRY_RUN" -eq 1 ]] || cat "$RUN_DIR/results.md"
}

print_download_gnn() { print_download "$TARBALL"; }

phase preflight preflight
phase data data
phase train train
phase export export_onnx
phase package package
phase download print_download_gnn
PHASE="done"
echo "gnn finished; results in $RUN_DIR (results.md), tarball $TARBALL"
