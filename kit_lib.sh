#!/usr/bin/env bash
# The deploy kit's shared part (sourced by deploy_8gpu.sh, not run): the flags every trainer takes,
# the phases every deploy goes through, and small helpers. Each trainer adds only its own flags,
# data phase and training options, in trainers/<name>/deploy.sh, through these hooks:
#
#   trainer_usage          lines of help for its own flags
#   trainer_flag ARGS...   parse one of its flags: set CONSUMED to how many words it took (0: not its flag)
#   trainer_defaults       defaults that depend on --demo, and checks of its flag values
#   trainer_data           the data phase (fetch, generate, or nothing)
#   trainer_train_args     fill the array TRAIN_ARGS with its `trainers <name> train` options
#   trainer_report         (optional) print a summary after packaging

die() { echo "error: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value"; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
# a plain decimal number: no nan, inf, exponent or sign tricks (Python would accept 'nan')
is_decimal() { [[ "$1" =~ ^[0-9]+([.][0-9]+)?$|^[.][0-9]+$ ]]; }
is_positive() { is_decimal "$1" && [[ ! "$1" =~ ^[0.]+$ ]]; }

# ---- common flags ------------------------------------------------------------------------------
TRAINER="${TRAINER:-forecast}"
GPUS="${GPUS:-all}"
OUT="${OUT:-}"
USD_PER_GPU_HOUR="${USD_PER_GPU_HOUR:-}"
MAX_HOURS="${MAX_HOURS:-}"
BUDGET_USD="${BUDGET_USD:-}"
MAX_RESTARTS="${MAX_RESTARTS:-3}"
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
RDZV_ENDPOINT="${RDZV_ENDPOINT:-}"
SKIP_DATA=0
DEMO=0
DRY_RUN=0
EXTRA=()
TRAIN_ARGS=()
PHASE="start"
NPROC=0

common_usage() {
  cat <<'EOF'
  --trainer NAME         forecast (default) | gnn | ppo                             [TRAINER]
  --gpus N               GPUs to use on this node (default: all visible)            [GPUS]
  --out DIR              output folder (default: /workspace/output if /workspace exists, else ./output) [OUT]
  --usd-per-gpu-hour X   price of one GPU hour: cost in results.json, needed by --budget-usd [USD_PER_GPU_HOUR]
  --max-hours H          wall-clock training budget, across restarts               [MAX_HOURS]
  --budget-usd B         money budget (needs --usd-per-gpu-hour)                    [BUDGET_USD]
  --max-restarts N       torchrun restarts after a worker failure (default: 3)      [MAX_RESTARTS]
  --skip-data            skip the data phase: train on the data already there
  --demo                 CPU, 2 gloo workers, small synthetic data: the whole pipeline without a GPU
  --nnodes N             nodes in a multi-node run (default: 1)                     [NNODES]
  --node-rank R          this node's rank, 0..N-1                                   [NODE_RANK]
  --rdzv-endpoint H:P    rendezvous host:port (node 0's address) for --nnodes > 1   [RDZV_ENDPOINT]
  --dry-run              print each phase's commands without running them
  -h, --help             this help
Environment: TRAINERS_PYTHON (a Python that already has the kit installed), TORCH_SPEC,
TORCH_INDEX_URL (what the install phase uses for torch when it is missing).
EOF
}

common_flag() {  # common_flag ARGS...: parse one common flag; CONSUMED = words taken (0: not common)
  CONSUMED=2
  case "$1" in
    --trainer) need_value "$@"; TRAINER="$2" ;;
    --gpus) need_value "$@"; GPUS="$2" ;;
    --out) need_value "$@"; OUT="$2" ;;
    --usd-per-gpu-hour) need_value "$@"; USD_PER_GPU_HOUR="$2" ;;
    --max-hours) need_value "$@"; MAX_HOURS="$2" ;;
    --budget-usd) need_value "$@"; BUDGET_USD="$2" ;;
    --max-restarts) need_value "$@"; MAX_RESTARTS="$2" ;;
    --nnodes) need_value "$@"; NNODES="$2" ;;
    --node-rank) need_value "$@"; NODE_RANK="$2" ;;
    --rdzv-endpoint) need_value "$@"; RDZV_ENDPOINT="$2" ;;
    --skip-data|--skip-fetch) SKIP_DATA=1; CONSUMED=1 ;;
    --demo) DEMO=1; CONSUMED=1 ;;
    --dry-run) DRY_RUN=1; CONSUMED=1 ;;
    *) CONSUMED=0 ;;
  esac
}

load_trainer() {  # load_trainer NAME: source its hooks, or die naming the trainers there are
  local hooks="$REPO/trainers/$1/deploy.sh" known
  if [[ ! "$1" =~ ^[a-z][a-z0-9_]*$ || ! -f "$hooks" ]]; then
    known=$(cd "$REPO/trainers" && for f in */deploy.sh; do printf '%s ' "${f%/deploy.sh}"; done)
    die "--trainer '$1' is not one of: ${known% }"
  fi
  # shellcheck source=/dev/null
  . "$hooks"
}

parse_flags() {  # parse_flags ARGS...: common flags, then the trainer's, then `--` and its options
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -h|--help) usage; exit 0 ;;
      --) shift; EXTRA=("$@"); break ;;
    esac
    common_flag "$@"
    [[ "$CONSUMED" -gt 0 ]] || trainer_flag "$@"
    [[ "$CONSUMED" -gt 0 ]] || die "unknown option '$1' for --trainer $TRAINER (see --help)"
    shift "$CONSUMED"
  done
}

check_common_flags() {
  [[ "$GPUS" == all ]] || { is_uint "$GPUS" && [[ "$GPUS" -ge 1 ]]; } || die "--gpus '$GPUS' must be 'all' or a number >= 1"
  is_uint "$NNODES" && [[ "$NNODES" -ge 1 ]] || die "--nnodes '$NNODES' must be a number >= 1"
  is_uint "$NODE_RANK" && [[ "$NODE_RANK" -lt "$NNODES" ]] || die "--node-rank '$NODE_RANK' must be in 0..$((NNODES - 1))"
  is_uint "$MAX_RESTARTS" || die "--max-restarts '$MAX_RESTARTS' must be a number >= 0"
  [[ "$NNODES" -eq 1 || -n "$RDZV_ENDPOINT" ]] || die "--nnodes $NNODES needs --rdzv-endpoint HOST:PORT (node 0's address)"
  [[ -z "$RDZV_ENDPOINT" || "$RDZV_ENDPOINT" =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]] || die "--rdzv-endpoint '$RDZV_ENDPOINT' must be HOST:PORT"
  [[ -z "$USD_PER_GPU_HOUR" ]] || is_decimal "$USD_PER_GPU_HOUR" || die "--usd-per-gpu-hour '$USD_PER_GPU_HOUR' must be a number >= 0, e.g. 2.99"
  [[ -z "$MAX_HOURS" ]] || is_positive "$MAX_HOURS" || die "--max-hours '$MAX_HOURS' must be a number > 0, e.g. 1.5"
  [[ -z "$BUDGET_USD" ]] || is_positive "$BUDGET_USD" || die "--budget-usd '$BUDGET_USD' must be a number > 0, e.g. 50"
  [[ -z "$BUDGET_USD" ]] || is_positive "${USD_PER_GPU_HOUR:-0}" || die "--budget-usd needs --usd-per-gpu-hour > 0 to turn hours into money"
  return 0
}

set_paths() {  # the output folder and everything in it that belongs to this trainer's job
  if [[ -z "$OUT" ]]; then
    if [[ -d /workspace ]]; then OUT=/workspace/output; else OUT="$PWD/output"; fi
  fi
  [[ ! -e "$OUT" || -d "$OUT" ]] || die "--out '$OUT' exists and is not a folder"
  mkdir -p "$OUT" 2>/dev/null || die "--out '$OUT' cannot be created (permissions? a read-only volume?)"
  [[ -w "$OUT" ]] || die "--out '$OUT' is not writable"
  OUT="$(cd "$OUT" && pwd)"
  LOG="$OUT/deploy-$TRAINER.log"
  RUN_DIR="$OUT/$TRAINER"
  TARBALL="$OUT/$TRAINER.tar.gz"
}

# ---- logging and phases --------------------------------------------------------------------------
start_log() {  # everything to the terminal and $LOG; stderr stays stderr
  exec > >(tee -a "$LOG") 2> >(tee -a "$LOG" >&2)
  trap on_exit EXIT
}

on_exit() {
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "$(basename "$0") FAILED in phase '$PHASE' (exit $rc); the full log is $LOG" >&2
  fi
}

run() {  # run a command, or print it under --dry-run
  if [[ "$DRY_RUN" -eq 1 ]]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

phase() {  # phase NAME FUNCTION: timed, logged
  PHASE="$1"
  local started=$SECONDS
  echo "==> [$1] $(date -u +%H:%M:%S)"
  "$2"
  echo "<== [$1] done in $((SECONDS - started)) s"
}

on_node0() { [[ "$NODE_RANK" -eq 0 ]]; }

gpu_count() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
  else
    echo 0
  fi
}

# ---- the phases every trainer goes through -------------------------------------------------------
phase_preflight() {  # the cheap checks, before minutes are spent installing: GPUs present, as many as asked
  local found
  found=$(gpu_count)
  if [[ "$DEMO" -eq 1 ]]; then
    NPROC=2
    echo "demo: CPU, $NPROC gloo workers ($found GPU(s) ignored)"
    return
  fi
  [[ "$found" -gt 0 ]] || die "no NVIDIA GPU found (nvidia-smi lists none); on a machine without GPUs add --demo"
  if [[ "$GPUS" == all ]]; then
    NPROC="$found"
  else
    [[ "$GPUS" -le "$found" ]] || die "--gpus $GPUS asked for, but this machine has $found GPU(s)"
    NPROC="$GPUS"
  fi
  nvidia-smi -L
  echo "using $NPROC of $found GPU(s)"
}

phase_install() {
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

phase_check() {  # the full preflight, sized for the trainer and options about to run
  if [[ "$DEMO" -eq 1 ]]; then
    echo "demo: GPU checks skipped"
    return
  fi
  run "$PY" -m trainers preflight --expect-gpus "$NPROC" --out "$OUT" --trainer "$TRAINER" \
    --json "$OUT/preflight-$TRAINER.json" -- "${TRAIN_ARGS[@]}" "${EXTRA[@]}"
}

phase_data() {
  if [[ "$SKIP_DATA" -eq 1 ]]; then echo "--skip-data: training on the data as it is"; return; fi
  if ! on_node0; then echo "node $NODE_RANK: data comes from node 0 (on storage every node shares)"; return; fi
  trainer_data
}

phase_train() {
  local launch=(--nproc_per_node="$NPROC" --max-restarts="$MAX_RESTARTS")
  if [[ "$NNODES" -gt 1 ]]; then
    launch+=(--nnodes="$NNODES" --node-rank="$NODE_RANK" --rdzv-backend=c10d --rdzv-endpoint="$RDZV_ENDPOINT"
             --rdzv-id="${RDZV_ID:-trainers-$TRAINER}")
  else
    launch+=(--standalone)
  fi
  local args=(--run-dir "$RUN_DIR")
  [[ "$DEMO" -eq 0 ]] || args+=(--device cpu)
  [[ -z "$USD_PER_GPU_HOUR" ]] || args+=(--usd-per-gpu-hour "$USD_PER_GPU_HOUR")
  [[ -z "$MAX_HOURS" ]] || args+=(--max-hours "$MAX_HOURS")
  [[ -z "$BUDGET_USD" ]] || args+=(--budget-usd "$BUDGET_USD")
  run "$PY" -m torch.distributed.run "${launch[@]}" -m trainers "$TRAINER" train "${args[@]}" "${TRAIN_ARGS[@]}" \
    "${EXTRA[@]}"
}

phase_export() {
  on_node0 || { echo "node $NODE_RANK: export runs on node 0"; return; }
  run "$PY" -m trainers "$TRAINER" export --run-dir "$RUN_DIR"
}

phase_package() {
  on_node0 || { echo "node $NODE_RANK: packaging runs on node 0"; return; }
  run "$PY" -m trainers package --run-dir "$RUN_DIR" --output "$TARBALL"
  [[ "$DRY_RUN" -eq 1 ]] || (cd "$OUT" && sha256sum -c "$(basename "$TARBALL").sha256")
  if [[ "$DRY_RUN" -eq 0 ]] && declare -F trainer_report >/dev/null; then trainer_report; fi
}

phase_download() {  # the scp line (RunPod's variables when present), also in DOWNLOAD-<trainer>.txt
  on_node0 || return 0
  local line
  if [[ -n "${RUNPOD_PUBLIC_IP:-}" && -n "${RUNPOD_TCP_PORT_22:-}" ]]; then
    line="scp -P ${RUNPOD_TCP_PORT_22} root@${RUNPOD_PUBLIC_IP}:${TARBALL} ."
  else
    line="scp -P <ssh-port> root@<this-machine's-public-ip>:${TARBALL} ."
  fi
  {
    echo "Download the results (run this on your own machine):"
    echo "  $line"
    if command -v runpodctl >/dev/null 2>&1; then
      echo "or, with RunPod's tool (prints a one-time code for 'runpodctl receive'):"
      echo "  runpodctl send ${TARBALL}"
    fi
    echo "then check it: sha256sum -c $(basename "$TARBALL").sha256 (copy that file too) and tar -xzf $(basename "$TARBALL")"
  } | tee "$OUT/DOWNLOAD-$TRAINER.txt"
}
