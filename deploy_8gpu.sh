#!/usr/bin/env bash
# One-line deploy of the S&P 500 forecaster on a rented GPU box (or, with --demo, on any CPU):
#
#   bash deploy_8gpu.sh                      # all GPUs, 151m preset, 25 years of S&P 500
#   bash deploy_8gpu.sh --demo               # CPU, 2 gloo workers, synthetic data, a few minutes
#
# Phases: preflight -> install -> check (full preflight with NCCL) -> fetch -> train -> export ->
# package -> download line. Non-interactive and idempotent: rerun it after a failure or a
# preemption and it skips what is done (install, cached data) and resumes training from the last
# checkpoint. Everything is logged to $OUT/deploy.log; a failure names its phase and the log.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=kit_lib.sh
. "$REPO/kit_lib.sh"

usage() {
  cat <<'EOF'
usage: bash deploy_8gpu.sh [options] [-- extra `trainers forecast` options]

  --gpus N               GPUs to use on this node (default: all visible)           [GPUS]
  --preset NAME          tiny | small | base | 151m (default: 151m, tiny with --demo) [PRESET]
  --years N              years of history to fetch (default: 25)                   [YEARS]
  --out DIR              output folder (default: /workspace/output if /workspace exists, else ./output) [OUT]
  --usd-per-gpu-hour X   price of one GPU hour, for the cost in results.json        [USD_PER_GPU_HOUR]
  --max-hours H          wall-clock training budget                                 [MAX_HOURS]
  --budget-usd B         money budget (needs --usd-per-gpu-hour)                    [BUDGET_USD]
  --max-restarts N       torchrun restarts after a worker failure (default: 3)      [MAX_RESTARTS]
  --skip-fetch           train on the existing cache
  --demo                 CPU, 2 gloo workers, synthetic data: the whole pipeline without a GPU
  --nnodes N             nodes in a multi-node run (default: 1)                     [NNODES]
  --node-rank R          this node's rank, 0..N-1                                   [NODE_RANK]
  --rdzv-endpoint H:P    rendezvous host:port (node 0's address) for --nnodes > 1    [RDZV_ENDPOINT]
  --dry-run              print each phase's commands without running them
  -h, --help             this help
Environment: TRAINERS_PYTHON (a Python that already has the kit installed), TORCH_SPEC,
TORCH_INDEX_URL (what the install phase uses for torch when it is missing).
EOF
}

GPUS="${GPUS:-all}"
PRESET="${PRESET:-}"
YEARS="${YEARS:-25}"
OUT="${OUT:-}"
USD_PER_GPU_HOUR="${USD_PER_GPU_HOUR:-}"
MAX_HOURS="${MAX_HOURS:-}"
BUDGET_USD="${BUDGET_USD:-}"
MAX_RESTARTS="${MAX_RESTARTS:-3}"
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
RDZV_ENDPOINT="${RDZV_ENDPOINT:-}"
SKIP_FETCH=0
DEMO=0
DRY_RUN=0
EXTRA=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --gpus) need_value "$@"; GPUS="$2"; shift 2 ;;
    --preset) need_value "$@"; PRESET="$2"; shift 2 ;;
    --years) need_value "$@"; YEARS="$2"; shift 2 ;;
    --out) need_value "$@"; OUT="$2"; shift 2 ;;
    --usd-per-gpu-hour) need_value "$@"; USD_PER_GPU_HOUR="$2"; shift 2 ;;
    --max-hours) need_value "$@"; MAX_HOURS="$2"; shift 2 ;;
    --budget-usd) need_value "$@"; BUDGET_USD="$2"; shift 2 ;;
    --max-restarts) need_value "$@"; MAX_RESTARTS="$2"; shift 2 ;;
    --nnodes) need_value "$@"; NNODES="$2"; shift 2 ;;
    --node-rank) need_value "$@"; NODE_RANK="$2"; shift 2 ;;
    --rdzv-endpoint) need_value "$@"; RDZV_ENDPOINT="$2"; shift 2 ;;
    --skip-fetch) SKIP_FETCH=1; shift ;;
    --demo) DEMO=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

[[ "$GPUS" == all ]] || { is_uint "$GPUS" && [[ "$GPUS" -ge 1 ]]; } || die "--gpus '$GPUS' must be 'all' or a number >= 1"
is_uint "$NNODES" && [[ "$NNODES" -ge 1 ]] || die "--nnodes '$NNODES' must be a number >= 1"
is_uint "$NODE_RANK" && [[ "$NODE_RANK" -lt "$NNODES" ]] || die "--node-rank '$NODE_RANK' must be in 0..$((NNODES - 1))"
is_uint "$MAX_RESTARTS" || die "--max-restarts '$MAX_RESTARTS' must be a number >= 0"
[[ "$NNODES" -eq 1 || -n "$RDZV_ENDPOINT" ]] || die "--nnodes $NNODES needs --rdzv-endpoint HOST:PORT (node 0's address)"
[[ "$YEARS" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--years '$YEARS' must be a positive number"

if [[ -z "$OUT" ]]; then
  if [[ -d /workspace ]]; then OUT=/workspace/output; else OUT="$PWD/output"; fi
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/deploy.log"
RUN_DIR="$OUT/forecast"
CACHE_DIR="$OUT/cache/sp500"
TARBALL="$OUT/forecast.tar.gz"
PHASE="start"
start_log

echo "deploy_8gpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) ($(uname -sm)); repo $REPO @ $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "out=$OUT demo=$DEMO gpus=$GPUS preset=${PRESET:-default} years=$YEARS nnodes=$NNODES node_rank=$NODE_RANK dry_run=$DRY_RUN"

# ---- phases ------------------------------------------------------------------------------------
preflight_shell() {
  # The cheap checks, before minutes are spent installing: GPUs present, as many as asked for.
  pick_nproc "$GPUS" "$DEMO"
  if [[ "$DEMO" -eq 1 ]]; then PRESET="${PRESET:-tiny}"; else PRESET="${PRESET:-151m}"; fi
  echo "preset $PRESET"
}

install() {
  if [[ -n "${TRAINERS_PYTHON:-}" ]]; then
    PY="$TRAINERS_PYTHON"
  elif python3 -c 'import trainers, torch' >/dev/null 2>&1; then
    PY="python3"  # inside our container image, or an environment that already has the kit
  else
    PY="$REPO/.venv/bin/python"
    local stamp
    stamp="$REPO/.venv/.installed-$(sha256sum "$REPO/pyproject.toml" | cut -c1-16)"
    if [[ -f "$stamp" ]]; then
      echo "already installed in $REPO/.venv"
    else
      run python3 -m venv "$REPO/.venv"
      run "$PY" -m pip install --quiet --upgrade pip
      if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
        local torch_spec="${TORCH_SPEC:-torch}"
        if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
          run "$PY" -m pip install --quiet "$torch_spec" --index-url "$TORCH_INDEX_URL"
        else
          run "$PY" -m pip install --quiet "$torch_spec"
        fi
      fi
      run "$PY" -m pip install --quiet -e "$REPO"
      [[ "$DRY_RUN" -eq 1 ]] || touch "$stamp"
    fi
  fi
  [[ "$DRY_RUN" -eq 1 ]] || "$PY" -c 'import trainers, torch; print("trainers", trainers.__version__, "torch", torch.__version__)'
}

check() {
  if [[ "$DEMO" -eq 1 ]]; then
    echo "demo: GPU checks skipped"
    return
  fi
  run "$PY" -m trainers preflight --expect-gpus "$NPROC" --out "$OUT" --preset "$PRESET" --json "$OUT/preflight.json"
}

fetch() {
  if [[ "$DEMO" -eq 1 ]]; then echo "demo: synthetic data, nothing to fetch"; return; fi
  if [[ "$SKIP_FETCH" -eq 1 ]]; then echo "--skip-fetch: training on $CACHE_DIR as it is"; return; fi
  if [[ "$NODE_RANK" -ne 0 && "$NNODES" -gt 1 ]]; then
    echo "node $NODE_RANK: the cache must be on storage node 0 fetched into (a shared volume)"; return
  fi
  run "$PY" -m trainers fetch-sp500 --years "$YEARS" --cache-dir "$CACHE_DIR"  # resumable: fetches only what is missing
}

train() {
  local launch=(--nproc_per_node="$NPROC" --max-restarts="$MAX_RESTARTS")
  if [[ "$NNODES" -gt 1 ]]; then
    launch+=(--nnodes="$NNODES" --node-rank="$NODE_RANK" --rdzv-backend=c10d --rdzv-endpoint="$RDZV_ENDPOINT"
             --rdzv-id="${RDZV_ID:-trainers-forecast}")
  else
    launch+=(--standalone)
  fi
  local args=(--run-dir "$RUN_DIR" --preset "$PRESET")
  if [[ "$DEMO" -eq 1 ]]; then
    args+=(--device cpu --source synthetic)
  else
    args+=(--source cache --cache-dir "$CACHE_DIR" --years "$YEARS")
  fi
  [[ -z "$USD_PER_GPU_HOUR" ]] || args+=(--usd-per-gpu-hour "$USD_PER_GPU_HOUR")
  [[ -z "$MAX_HOURS" ]] || args+=(--max-hours "$MAX_HOURS")
  [[ -z "$BUDGET_USD" ]] || args+=(--budget-usd "$BUDGET_USD")
  run "$PY" -m torch.distributed.run "${launch[@]}" -m trainers forecast "${args[@]}" "${EXTRA[@]}"
}

export_onnx() {
  [[ "$NODE_RANK" -eq 0 ]] || { echo "node $NODE_RANK: export runs on node 0"; return; }
  run "$PY" -m trainers export --run-dir "$RUN_DIR"
}

package() {
  [[ "$NODE_RANK" -eq 0 ]] || { echo "node $NODE_RANK: packaging runs on node 0"; return; }
  run "$PY" -m trainers package --run-dir "$RUN_DIR" --output "$TARBALL"
  [[ "$DRY_RUN" -eq 1 ]] || (cd "$OUT" && sha256sum -c "$(basename "$TARBALL").sha256")
}

download() {
  [[ "$NODE_RANK" -eq 0 ]] || return 0
  print_download "$TARBALL"
}

PY="${TRAINERS_PYTHON:-python3}"
NPROC=0
phase preflight preflight_shell
phase install install
phase check check
phase fetch fetch
phase train train
phase export export_onnx
phase package package
phase download download
PHASE="done"
echo "deploy finished; results in $RUN_DIR, tarball $TARBALL"
