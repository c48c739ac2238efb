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
#   trainer_check_args     (optional) fill CHECK_ARGS: the options the check phase plans with, where the data the
#                          job will train on is not there yet (the check runs before the data phase)
#   trainer_report         (optional) print a summary after packaging
#   trainer_workers_per_gpu  (optional) print K: torchrun starts K workers per GPU (jobs packed per device)

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
MAX_RESTARTS="${MAX_RESTARTS:-}"  # (empty: 3 on one node, 0 on several: see phase_train)
NNODES="${NNODES:-}"        # (empty until read_launcher: a launcher's environment may say)
NODE_RANK="${NODE_RANK:-}"
RDZV_ENDPOINT="${RDZV_ENDPOINT:-}"
REMOTE="${TRAINERS_REMOTE:-}"  # the job's mirror: the run folder goes to $REMOTE/<trainer>
SKIP_DATA=0
DEMO=0
DRY_RUN=0
MODE=auto          # auto: detach when started from a terminal; foreground; detached (the relaunched child)
NO_PACKAGE=0
EXTRA=()
TRAIN_ARGS=()
CHECK_ARGS=()
PHASE="start"
NPROC=0

common_usage() {
  cat <<'EOF'
  --trainer NAME         forecast (default) | gnn | gpt | lstm | ppo                [TRAINER]
  --gpus N               GPUs to use on this node (default: all visible)            [GPUS]
  --out DIR              output folder (default: /workspace/output if /workspace exists, else ./output) [OUT]
  --usd-per-gpu-hour X   price of one GPU hour: cost in results.json, needed by --budget-usd [USD_PER_GPU_HOUR]
  --max-hours H          wall-clock training budget, across restarts               [MAX_HOURS]
  --budget-usd B         money budget (needs --usd-per-gpu-hour)                    [BUDGET_USD]
  --max-restarts N       torchrun restarts after a worker failure (default: 3, and  [MAX_RESTARTS]
                         0 on several nodes: there a restart waits 10 min for a lost node)
  --skip-data            skip the data phase: train on the data already there
  --demo                 CPU, 2 gloo workers, small synthetic data: the whole pipeline without a GPU
  --nnodes N             nodes in a multi-node run (default: the launcher's, else 1) [NNODES]
  --node-rank R          this node's rank, 0..N-1 (default: the launcher's, else 0)  [NODE_RANK]
  --rdzv-endpoint H:P    rendezvous host:port (node 0's address) for --nnodes > 1   [RDZV_ENDPOINT]
                         Under SLURM (srun), SkyPilot, Kubeflow (TrainJob, PyTorchJob) or dstack the three
                         come from the launcher's environment: no flag needed (launch/ has a file for each)
  --remote URL           mirror the run to object storage as it trains (s3://bucket/prefix, gs://..., or
                         file:///mounted/volume); a fresh machine resumes from it with the same command;
                         the tarball goes to URL/<trainer>/package/ (needs pip install 'trainers[remote]') [TRAINERS_REMOTE]
  --dry-run              print each phase's commands without running them
  --foreground           stay attached to this terminal (a hang-up then stops the job with a checkpoint);
                         the default when not started from a terminal (container, SLURM, scripts)
  --detach               leave the terminal even when not started from one
  -h, --help             this help
Job control (any trainer; --out and --trainer as for the deploy):
  bash deploy_8gpu.sh status [--out DIR] [--trainer NAME] [--json]   where it stands: phase, step, losses,
                         speed, money, ETA, GPUs, alive or not, and the tarball when done
  bash deploy_8gpu.sh status --remote URL/TRAINER [--json]   the same from any machine, read from the remote
  bash deploy_8gpu.sh attach [--out DIR] [--trainer NAME]            follow the log (Ctrl-C detaches only)
  bash deploy_8gpu.sh stop [--out DIR] [--trainer NAME] [--no-package]
                         stop training with a checkpoint; export and package still run unless --no-package
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
    --remote) need_value "$@"; REMOTE="$2" ;;
    --skip-data|--skip-fetch) SKIP_DATA=1; CONSUMED=1 ;;
    --foreground) [[ "$MODE" == detached ]] || MODE=foreground; CONSUMED=1 ;;
    --detach) [[ "$MODE" == detached ]] || MODE=detach; CONSUMED=1 ;;
    --detached-child) MODE=detached; CONSUMED=1 ;;
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

LAUNCHER=""
LAUNCHER_JOB_ID=""
LAUNCHER_SUMMARY=""
read_launcher() {  # the topology a cluster launcher gives this node, under the flags (trainers/launchers.py)
  local out key value gpus_per_node=""
  # the system's python3 and the standard library only: this runs before the install phase
  out=$(PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" python3 -m trainers.launchers --nnodes "$NNODES" \
        --node-rank "$NODE_RANK" --rdzv-endpoint "$RDZV_ENDPOINT") || exit 2
  while IFS='=' read -r key value; do
    case "$key" in
      launcher) LAUNCHER="$value" ;;
      nnodes) NNODES="$value" ;;
      node_rank) NODE_RANK="$value" ;;
      rdzv_endpoint) RDZV_ENDPOINT="$value" ;;
      gpus_per_node) gpus_per_node="$value" ;;
      job_id) LAUNCHER_JOB_ID="$value" ;;
      summary) LAUNCHER_SUMMARY="$value" ;;
    esac
  done <<<"$out"
  NNODES="${NNODES:-1}"
  NODE_RANK="${NODE_RANK:-0}"
  # the GPUs the launcher gave this node, unless --gpus says otherwise (nvidia-smi may list the whole machine's)
  [[ -z "$gpus_per_node" || "$GPUS" != all ]] || GPUS="$gpus_per_node"
}

launcher_line() { [[ -z "$LAUNCHER" ]] || echo "launcher $LAUNCHER_SUMMARY"; }

check_common_flags() {
  [[ "$GPUS" == all ]] || { is_uint "$GPUS" && [[ "$GPUS" -ge 1 ]]; } || die "--gpus '$GPUS' must be 'all' or a number >= 1"
  is_uint "$NNODES" && [[ "$NNODES" -ge 1 ]] || die "--nnodes '$NNODES' must be a number >= 1"
  is_uint "$NODE_RANK" && [[ "$NODE_RANK" -lt "$NNODES" ]] || die "--node-rank '$NODE_RANK' must be in 0..$((NNODES - 1))"
  is_uint "${MAX_RESTARTS:-0}" || die "--max-restarts '$MAX_RESTARTS' must be a number >= 0"
  [[ -z "${TRAINERS_NODE_SILENCE_S:-}" ]] || { is_decimal "$TRAINERS_NODE_SILENCE_S" &&
    awk -v s="$TRAINERS_NODE_SILENCE_S" 'BEGIN { exit !(s >= 10) }'; } ||  # (two beats: trainers/runtime/nodewatch.py)
    die "TRAINERS_NODE_SILENCE_S='$TRAINERS_NODE_SILENCE_S' must be a number of seconds >= 10, e.g. 60"
  [[ "$NNODES" -eq 1 || -n "$RDZV_ENDPOINT" ]] || die "--nnodes $NNODES needs --rdzv-endpoint HOST:PORT (node 0's address)"
  [[ -z "$RDZV_ENDPOINT" || "$RDZV_ENDPOINT" =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]] || die "--rdzv-endpoint '$RDZV_ENDPOINT' must be HOST:PORT"
  [[ -z "$USD_PER_GPU_HOUR" ]] || is_decimal "$USD_PER_GPU_HOUR" || die "--usd-per-gpu-hour '$USD_PER_GPU_HOUR' must be a number >= 0, e.g. 2.99"
  [[ -z "$MAX_HOURS" ]] || is_positive "$MAX_HOURS" || die "--max-hours '$MAX_HOURS' must be a number > 0, e.g. 1.5"
  [[ -z "$BUDGET_USD" ]] || is_positive "$BUDGET_USD" || die "--budget-usd '$BUDGET_USD' must be a number > 0, e.g. 50"
  [[ -z "$BUDGET_USD" ]] || is_positive "${USD_PER_GPU_HOUR:-0}" || die "--budget-usd needs --usd-per-gpu-hour > 0 to turn hours into money"
  if [[ -n "$REMOTE" ]]; then  # (never echoed when it holds credentials: they would land in the log)
    local authority="${REMOTE#*://}"; authority="${authority%%/*}"
    [[ "$authority" != *@* ]] || die "--remote: credentials do not go in the URL (they would be written into the logs); set them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
    [[ "$REMOTE" =~ ^[a-z][a-z0-9+.-]*://[^[:space:]]+$ ]] || die "--remote '$REMOTE' must be a URL like s3://bucket/prefix or file:///mnt/volume/runs"
  fi
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
  # Several nodes on one shared folder: each node's deploy has its own log, state and lock (node 0's keep the
  # plain names, which status, attach and stop read); the run folder itself is the job's, written by its ranks.
  NODE_TAG=""
  [[ "$NNODES" -eq 1 || "$NODE_RANK" -eq 0 ]] || NODE_TAG=".node$NODE_RANK"
  DEPLOY_FILES="$OUT/deploy-$TRAINER$NODE_TAG"  # .log, .state, .launch.log
  JOB_LOCK="$OUT/.deploy-$TRAINER$NODE_TAG.lock"
  LOG="$DEPLOY_FILES.log"
  RUN_DIR="$OUT/$TRAINER"
  TARBALL="$OUT/$TRAINER.tar.gz"
  RUN_REMOTE="${REMOTE:+${REMOTE%/}/$TRAINER}"  # the run folder's mirror (empty without --remote)
}

# ---- one deploy per trainer and output folder ----------------------------------------------------
lock_job() {  # held for the whole deploy (and by the processes it starts): a second one is refused
  if ! command -v flock >/dev/null 2>&1; then
    echo "warning: flock (util-linux) not found: a second deploy into $OUT is refused only when it reaches training" >&2
    return 0
  fi
  exec 9<>"$JOB_LOCK"
  if ! flock -n 9; then
    local holder
    holder=$(cat "$JOB_LOCK" 2>/dev/null || true)
    die "a deploy of $TRAINER into $OUT is already running (${holder:-pid unknown}); follow it with \`bash deploy_8gpu.sh status --trainer $TRAINER --out $OUT\` or stop it with \`... stop\`"
  fi
  printf 'pid %s on %s since %s\n' "$$" "$(hostname)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$JOB_LOCK"
}

probe_job_lock() {  # refuse before detaching when a deploy already runs (the same test lock_job makes)
  command -v flock >/dev/null 2>&1 || return 0
  [[ -f "$JOB_LOCK" ]] || return 0
  flock -n "$JOB_LOCK" true ||
    die "a deploy of $TRAINER into $OUT is already running ($(cat "$JOB_LOCK" 2>/dev/null)); follow it with \`bash deploy_8gpu.sh status --trainer $TRAINER --out $OUT\`"
}

# ---- the job's state, for `status` (one key=value file, replaced atomically) ---------------------------
declare -A STATE=()
set_state() {  # set_state KEY VALUE [KEY VALUE...]
  while [[ $# -ge 2 ]]; do STATE[$1]="$2"; shift 2; done
  [[ "$DRY_RUN" -eq 1 ]] && return 0
  local file="$DEPLOY_FILES.state" key
  {
    for key in "${!STATE[@]}"; do printf '%s=%s\n' "$key" "${STATE[$key]//$'\n'/ }"; done
  } > "$file.tmp.$$" && mv -f "$file.tmp.$$" "$file"
}

state_value() {  # state_value FILE KEY: the value of KEY= in a state file, empty when the line is missing
  sed -n "s/^$2=//p" "$1" 2>/dev/null | tail -n 1  # (sed succeeds without a match: no `set -e` exit on an
}                                                  # older kit's or an edited file, as a failed grep was)

start_state() {
  set_state trainer "$TRAINER" pid "$$" host "$(hostname)" started "$(date +%s)" state running phase start \
    detached "$([[ "$MODE" == detached ]] && echo 1 || echo 0)" out "$OUT" run_dir "$RUN_DIR" log "$LOG" \
    tarball "$TARBALL" usd_per_gpu_hour "$USD_PER_GPU_HOUR" budget_usd "$BUDGET_USD" max_hours "$MAX_HOURS" \
    exit_code "" ended "" download "" nnodes "$NNODES" node_rank "$NODE_RANK"
}

# ---- signals ---------------------------------------------------------------------------------------
# A foreground job: SIGTERM/SIGINT/SIGHUP stop training with a checkpoint (the workers are signalled,
# since they run in sessions of their own), then the deploy ends without exporting. A detached job
# ignores hang-ups (nohup + TORCHELASTIC_SIGNALS_TO_HANDLE without SIGHUP + TRAINERS_ON_HANGUP=ignore).
STOP_SIGNAL=""
training_pid() {  # rank 0's worker pid from the run folder's lock note (else the torchrun agent's)
  local pid=""
  [[ -f "$RUN_DIR/.lock" ]] && pid=$(grep -o '"pid": *[0-9]*' "$RUN_DIR/.lock" 2>/dev/null | grep -o '[0-9]*$' || true)
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; else echo "${TRAIN_PID:-}"; fi
}

on_stop_signal() {  # on_stop_signal NAME
  STOP_SIGNAL="$1"
  echo "deploy: got SIG$1 in phase '$PHASE': stopping training with a checkpoint" >&2
  set_state stop_signal "SIG$1"
  local pid
  pid=$(training_pid)
  # the same signal, so results.json names the real cause (a worker stops on each of them)
  if [[ -n "$pid" ]]; then kill -"$1" "$pid" 2>/dev/null || true; else exit 143; fi
}

install_signal_traps() {
  if [[ "$MODE" == detached ]]; then
    trap '' HUP
    # no progress bars in a log nobody watches live (status and metrics.jsonl say where it is)
    export TRAINERS_ON_HANGUP=ignore TORCHELASTIC_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGQUIT" TRAINERS_PROGRESS=0
  else
    trap 'on_stop_signal HUP' HUP
    export TRAINERS_ON_HANGUP=stop
  fi
  trap 'on_stop_signal TERM' TERM
  trap 'on_stop_signal INT' INT
}

# ---- logging and phases --------------------------------------------------------------------------
start_log() {  # everything to the terminal (foreground) and $LOG
  if [[ "$MODE" == detached ]]; then
    exec >>"$LOG" 2>&1
  else
    # The console copy must never take the job down: tee ignores hang-ups and SIGPIPE, and with -p
    # (warn-nopipe) writes on to the log when the terminal or the reader of a pipe goes away (an SSH
    # session without a terminal, `| head`), so the deploy itself never writes into a closed pipe.
    exec > >(trap '' HUP INT PIPE; exec tee -p -a "$LOG") 2> >(trap '' HUP INT PIPE; exec tee -p -a "$LOG" >&2)
  fi
  trap on_exit EXIT
  # shellcheck disable=SC2064  # $sig is meant to expand now, once per trap
  for sig in PIPE QUIT USR1 USR2 ALRM; do trap "on_fatal_signal $sig" "$sig"; done  # recorded, then the end
}

on_fatal_signal() {  # a signal the deploy does not handle as a stop: record it (on_exit runs next)
  FATAL_SIGNAL="$1"
  exit $((128 + $(kill -l "$1")))
}

on_exit() {  # the state says what really happened: finished only when the last phase completed
  local rc=$? how=finished why=""
  if [[ -n "$STOP_SIGNAL" ]]; then
    echo "$(basename "$0") stopped by SIG$STOP_SIGNAL in phase '$PHASE' (exit $rc); rerun the same command to resume; the full log is $LOG" >&2
  elif [[ -n "$TRAINING_STOPPED" && $rc -eq $STOPPED_EXIT ]]; then :
  elif [[ $rc -ne 0 ]]; then
    echo "$(basename "$0") FAILED in phase '$PHASE' (exit $rc); the full log is $LOG" >&2
  fi
  if [[ "${STATE[state]:-}" == running ]]; then
    if [[ -n "$STOP_SIGNAL" ]]; then how=stopped why="SIG$STOP_SIGNAL in phase $PHASE"
    elif [[ -n "$TRAINING_STOPPED" && $rc -eq $STOPPED_EXIT ]]; then how=stopped why="training stopped at $TRAINING_STOPPED"
    elif [[ -n "${FATAL_SIGNAL:-}" ]]; then how=failed why="killed by SIG$FATAL_SIGNAL in phase $PHASE"
    elif [[ $rc -ne 0 ]]; then how=failed why="exit $rc in phase $PHASE"
    elif [[ "$PHASE" != "done" ]]; then how=failed why="ended in phase $PHASE before finishing"; rc=1
    fi
    set_state state "$how" exit_code "$rc" ended "$(date +%s)" reason "$why"
    push_state
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
  set_state phase "$1" phase_started "$(date +%s)"
  push_state
  local started=$SECONDS
  echo "==> [$1] $(date -u +%H:%M:%S)"
  "$2"
  echo "<== [$1] done in $((SECONDS - started)) s"
}

push_state() {  # --remote: the deploy's state beside the run, for `status --remote` from any machine
  [[ -n "$RUN_REMOTE" && "$DRY_RUN" -eq 0 && -n "${PY:-}" ]] || return 0
  on_node0 || return 0  # (the job's state is node 0's: another node's would overwrite it)
  [[ "$PHASE" != preflight && "$PHASE" != install ]] || return 0  # (the kit may not be installed yet)
  "$PY" -m trainers remote push --state "$DEPLOY_FILES.state" --remote "$RUN_REMOTE" >/dev/null 2>&1 ||
    echo "warning: could not upload the deploy's state to $RUN_REMOTE (training goes on; see the run's log)" >&2
}

on_node0() { [[ "$NODE_RANK" -eq 0 ]]; }

kit_commit() {  # the kit's commit only when $REPO is the top of its own git work tree: a copy without .git
  local top            # inside another repository (the first GPU run's) would name that repository's commit
  if top="$(git -C "$REPO" rev-parse --show-toplevel 2>/dev/null)" && [[ "$(cd "$top" && pwd -P)" == "$(cd "$REPO" && pwd -P)" ]]; then
    git -C "$REPO" rev-parse --short HEAD
  else
    echo "${TRAINERS_GIT_COMMIT:-unknown}"
  fi
}

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
        local torch_spec="${TORCH_SPEC:-torch>=2.7,<3}"  # (trainers/versions.py: the tested range)
        if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
          run "$PY" -m pip install --quiet "$torch_spec" --index-url "$TORCH_INDEX_URL"
        else
          run "$PY" -m pip install --quiet "$torch_spec"
        fi
      fi
      # the lightgbm extra: the forecaster's LightGBM baseline (without it that row of the report is skipped)
      run "$PY" -m pip install --quiet -e "${REPO}[lightgbm]"
      [[ "$DRY_RUN" -eq 1 ]] || touch "$stamp"
    fi
  fi
  # A torch (or ONNX stack) outside the tested range stops here, in one line with the pip command, not ten minutes
  # into training. The box's own CUDA build is kept, never replaced behind the user's back: a torch upgraded in place
  # may not match the driver, and the user picks the CUDA build (trainers/versions.py).
  [[ "$DRY_RUN" -eq 1 ]] || "$PY" -m trainers.versions || die "the Python at $PY has versions the kit is not tested with (above); nothing was run"
  [[ "$DRY_RUN" -eq 1 ]] || "$PY" -c 'import trainers, torch; print("trainers", trainers.__version__, "torch", torch.__version__)'
}

phase_check() {  # the full preflight, sized for the trainer and options about to run
  if [[ "$DEMO" -eq 1 ]]; then
    echo "demo: GPU checks skipped"
    return
  fi
  local price=()
  [[ -z "$USD_PER_GPU_HOUR" ]] || price=(--usd-per-gpu-hour "$USD_PER_GPU_HOUR")
  CHECK_ARGS=("${TRAIN_ARGS[@]}")
  if declare -F trainer_check_args >/dev/null; then trainer_check_args; fi
  # Also the plan: does the job fit these GPUs, and what will it take and cost (shown again at the end)
  run "$PY" -m trainers preflight --expect-gpus "$NPROC" --out "$OUT" --trainer "$TRAINER" \
    --json "$OUT/preflight-$TRAINER.json" --plan-json "$OUT/plan-$TRAINER.json" -- "${CHECK_ARGS[@]}" "${price[@]}" \
    "${EXTRA[@]}"
}

DISK_APART=0  # several nodes without a shared --out: node 0's run folder is the job's, its remote a fresh node 0's source
RANKS_BY_NODE=0  # every node runs as many workers: node R's are ranks R*L.., so rank 0 is on node 0 (c10d sorts hosts)

phase_nodes() {  # several nodes: all of them met, and --out one folder for all or --remote (trainers/ops/nodes.py)
  if [[ "$NNODES" -eq 1 ]]; then echo "one node"; return; fi
  local cmd=("$PY" -m trainers nodes meet --out "$OUT" --nnodes "$NNODES" --node-rank "$NODE_RANK"
             --rdzv-endpoint "$RDZV_ENDPOINT" --remote "$RUN_REMOTE" --workers "$NPROC")
  if [[ "$DRY_RUN" -eq 1 ]]; then run "${cmd[@]}"; return; fi
  local said
  said=$("${cmd[@]}") || exit $?  # (its one-line refusal is on stderr already)
  echo "${said%$'\n'disk: *}"
  [[ "$said" != *$'\n'"disk: apart" ]] || DISK_APART=1
  [[ "$said" != "ranks: by node"* ]] || RANKS_BY_NODE=1
  if [[ "$DISK_APART" -eq 1 && "$TRAINER" == lstm ]]; then
    die "--trainer lstm on several nodes needs a shared --out: its workers each write their own symbols' folders"
  fi
}

phase_data() {
  if [[ "$SKIP_DATA" -eq 1 ]]; then echo "--skip-data: training on the data as it is"; return; fi
  if ! on_node0 && [[ "$DISK_APART" -eq 0 ]]; then
    echo "node $NODE_RANK: data comes from node 0 (on storage every node shares)"; return
  fi  # (no shared disk: every node fetches the same data, and training refuses to start unless every rank's matches)
  trainer_data
}

phase_train() {
  local nproc="$NPROC"
  if [[ "$DEMO" -eq 0 ]] && declare -F trainer_workers_per_gpu >/dev/null; then
    nproc=$((NPROC * $(trainer_workers_per_gpu)))
  fi
  # On several nodes torchrun's restart re-forms the group of every node, and a lost node holds the others in that
  # rendezvous for its join timeout (10 min): so no restart there unless asked for. A lost node ends the survivors
  # (trainers/runtime/nodewatch.py), and the same command rerun on every node resumes.
  local restarts="${MAX_RESTARTS:-3}"
  [[ "$NNODES" -eq 1 || -n "$MAX_RESTARTS" ]] || restarts=0
  local launch=(--nproc_per_node="$nproc" --max-restarts="$restarts")
  if [[ "$NNODES" -gt 1 ]]; then
    # Node 0 hosts the rendezvous store, said outright: torchrun's guess compares the endpoint with this
    # machine's names, and a Kubernetes service name or a second interface's address matches none of them.
    local is_host=false
    on_node0 && is_host=true
    launch+=(--nnodes="$NNODES" --node-rank="$NODE_RANK" --rdzv-backend=c10d --rdzv-endpoint="$RDZV_ENDPOINT"
             --rdzv-id="${RDZV_ID:-trainers-$TRAINER${LAUNCHER_JOB_ID:+-$LAUNCHER_JOB_ID}}" --rdzv-conf="is_host=$is_host")
  else
    launch+=(--standalone)
  fi
  local args=(--run-dir "$RUN_DIR")
  [[ "$DEMO" -eq 0 ]] || args+=(--device cpu)
  [[ -z "$RUN_REMOTE" ]] || args+=(--remote "$RUN_REMOTE")
  [[ -z "$USD_PER_GPU_HOUR" ]] || args+=(--usd-per-gpu-hour "$USD_PER_GPU_HOUR")
  [[ -z "$MAX_HOURS" ]] || args+=(--max-hours "$MAX_HOURS")
  [[ -z "$BUDGET_USD" ]] || args+=(--budget-usd "$BUDGET_USD")
  if on_node0 && [[ "$DRY_RUN" -eq 0 ]]; then
    # Every check training makes before its first write (options, data, the run folder's config and
    # lock), in one process: a usage error stops here instead of being retried --max-restarts times.
    TRAINERS_CHECK_ONLY=1 "$PY" -m trainers "$TRAINER" train "${args[@]}" "${TRAIN_ARGS[@]}" "${EXTRA[@]}" \
      || die "training would refuse to start (above); nothing was launched"
  fi
  local cmd=("$PY" -m torch.distributed.run "${launch[@]}" -m trainers "$TRAINER" train "${args[@]}" "${TRAIN_ARGS[@]}"
             "${EXTRA[@]}")
  if [[ "$DRY_RUN" -eq 1 ]]; then run "${cmd[@]}"; return; fi
  # In the background and waited for, so a signal to the deploy is handled at once (forwarded to the
  # workers as a graceful stop) instead of after training ends.
  set_state nproc "$NPROC"
  TRAIN_STARTED=$(date +%s)
  TRAINERS_NODE_RANK="$NODE_RANK" TRAINERS_NODES_DIR="$RUN_DIR/nodes" TRAINERS_RUN_DIR_APART="$DISK_APART" \
    TRAINERS_RANKS_BY_NODE="$RANKS_BY_NODE" "${cmd[@]}" &
  TRAIN_PID=$!
  local rc
  while true; do
    rc=0
    wait "$TRAIN_PID" || rc=$?
    kill -0 "$TRAIN_PID" 2>/dev/null || break  # else a trapped signal interrupted the wait: wait again
  done
  if [[ -n "$STOP_SIGNAL" ]]; then  # a stop, not a failure: 128 + the signal, as a shell reports one
    local saved="before its first checkpoint"
    [[ -z "$(find "$RUN_DIR" -name 'meta_*.json' -print -quit 2>/dev/null)" ]] || saved="with a checkpoint"
    echo "training stopped by SIG$STOP_SIGNAL $saved (rc $rc); rerun the same command to resume" >&2
    exit $((128 + $(kill -l "$STOP_SIGNAL")))
  fi
  if [[ "$rc" -ne 0 && "$NNODES" -gt 1 ]]; then  # a node lost: say which, and end this one (every node's rerun resumes)
    local lost
    lost=$("$PY" -m trainers nodes lost --out "$OUT" --trainer "$TRAINER" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
           --run-dir "$RUN_DIR" --since "$TRAIN_STARTED") || true
    if [[ -n "$lost" ]]; then
      set_state training_end node_lost
      echo "error: training stopped on node $NODE_RANK (rc $rc): $lost; rerun the same command on every node to resume" >&2
      exit 75
    fi
  fi
  training_ended_well  # (a run that diverged or filled the disk: its reason, whatever torchrun's status)
  return "$rc"
}

training_ended_well() {  # results.json says how training really ended: the reason of a failed train phase
  on_node0 || return 0
  local ended
  ended=$("$PY" - "$RUN_DIR" "$TRAIN_STARTED" <<'EOF_PY'
import calendar, json, os, sys, time
run_dir, started = sys.argv[1], float(sys.argv[2])
try:
    results = json.load(open(os.path.join(run_dir, "results.json")))
    written = calendar.timegm(time.strptime(results["run"]["written_at"], "%Y-%m-%dT%H:%M:%SZ"))
    training = results["training"]
except (OSError, ValueError, KeyError, TypeError):
    results, written, training = None, 0.0, {}
if results is None or written < started - 5:
    free = os.statvfs(run_dir)
    if free.f_bavail * free.f_frsize < (64 << 20):
        print(f"disk_full: training wrote no results: {run_dir} has {free.f_bavail * free.f_frsize >> 20} MiB free")
    else:
        print("no_results: training ended without recording its results (see the log above)")
elif training.get("stop_reason") in ("diverged", "disk_full"):
    print(f"{training['stop_reason']}: {results.get('evaluation', {}).get('skipped', '')}")
elif training.get("stop_reason") == "signal":  # `deploy_8gpu.sh stop` (or a signal straight at the workers)
    print(f"stopped: step {training.get('steps')} of {training.get('total_steps')} ({training.get('signal')})")
EOF_PY
)
  if [[ "$ended" == stopped:* ]]; then  # not finished: export and package go on (unless --no-package), then
    TRAINING_STOPPED="${ended#stopped: }"  # the deploy ends "stopped", non-zero, and a rerun resumes it
    set_state training_end stopped
    echo "training was stopped at $TRAINING_STOPPED before its end; a rerun of the same command resumes it"
    return 0
  fi
  [[ -z "$ended" ]] || { set_state training_end "${ended%%:*}"; die "training did not succeed: ${ended#*: }"; }
}

TRAINING_STOPPED=""
STOPPED_EXIT=143  # a deploy whose training was stopped ends as a stop by SIGTERM does (128 + 15)

end_if_training_stopped() {  # the deploy's last word when training was stopped before its end: never "finished"
  [[ -n "$TRAINING_STOPPED" ]] || return 0
  PHASE="stopped"
  local kept="the tarball of the model so far is $TARBALL"
  [[ ! -f "$OUT/.deploy-$TRAINER.no-package" ]] || kept="export and package were skipped (stop --no-package)"
  echo "deploy stopped: training was stopped at $TRAINING_STOPPED; $kept; rerun the same command to resume"
  exit "$STOPPED_EXIT"
}

skip_if_no_package() {  # `stop --no-package` leaves a marker: the job ends after training
  if [[ -f "$OUT/.deploy-$TRAINER.no-package" ]]; then
    echo "stop --no-package: skipping $PHASE"
    return 0
  fi
  return 1
}

phase_export() {
  on_node0 || { echo "node $NODE_RANK: export runs on node 0"; return; }
  skip_if_no_package && return
  run "$PY" -m trainers "$TRAINER" export --run-dir "$RUN_DIR"
  [[ -z "$RUN_REMOTE" ]] || run "$PY" -m trainers remote push --run-dir "$RUN_DIR" --remote "$RUN_REMOTE"
}

phase_package() {
  on_node0 || { echo "node $NODE_RANK: packaging runs on node 0"; return; }
  skip_if_no_package && return
  run "$PY" -m trainers package --run-dir "$RUN_DIR" --output "$TARBALL"
  [[ "$DRY_RUN" -eq 1 ]] || (cd "$OUT" && sha256sum -c "$(basename "$TARBALL").sha256")
  # the tarball and its checksum in the bucket: the deploy is not finished until they are there
  [[ -z "$RUN_REMOTE" ]] || run "$PY" -m trainers remote push --run-dir "$RUN_DIR" --remote "$RUN_REMOTE" \
    --file "$TARBALL" --file "$TARBALL.sha256" || die "the tarball is here ($TARBALL) but not in $RUN_REMOTE (above)"
  if [[ "$DRY_RUN" -eq 0 ]] && declare -F trainer_report >/dev/null; then trainer_report; fi
}

phase_download() {  # the scp line (RunPod's variables when present), also in DOWNLOAD-<trainer>.txt
  on_node0 || return 0
  skip_if_no_package && return
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
    [[ -z "$RUN_REMOTE" ]] || echo "or from the bucket, even once this machine is gone: $RUN_REMOTE/package/$(basename "$TARBALL")"
  } | tee "$OUT/DOWNLOAD-$TRAINER.txt"
  set_state download "$line"
  "$PY" -m trainers status --out "$OUT" --trainer "$TRAINER" | grep -E "plan|real" || true
}

# ---- detach, status, attach, stop ------------------------------------------------------------------
should_detach() {
  [[ "$DRY_RUN" -eq 0 ]] || return 1
  case "$MODE" in
    detach) return 0 ;;
    auto) [[ -t 0 && -t 1 ]] ;;
    *) return 1 ;;
  esac
}

detach_job() {  # detach_job ARGS...: relaunch this deploy in a session of its own and return the prompt
  local cmd=(bash "$REPO/deploy_8gpu.sh" --detached-child "$@")
  rm -f "$DEPLOY_FILES.state.launch"
  if [[ -n "${TMUX:-}" ]] && command -v tmux >/dev/null 2>&1; then
    tmux new-window -d -n "deploy-$TRAINER" "$(printf '%q ' "${cmd[@]}")"
    echo "started in tmux window deploy-$TRAINER (it runs in the tmux server: the SSH session may end)"
  else
    setsid nohup "${cmd[@]}" </dev/null >>"$DEPLOY_FILES.launch.log" 2>&1 &
  fi
  local waited=0 state=""
  while [[ $waited -lt 100 ]]; do  # up to 10 s for the job to take its lock and say it runs
    if [[ -f "$DEPLOY_FILES.state" ]] && grep -q "^pid=" "$DEPLOY_FILES.state" &&
       ! grep -q "^pid=${OLD_STATE_PID:-none}$" "$DEPLOY_FILES.state"; then
      state=$(state_value "$DEPLOY_FILES.state" state); break
    fi
    sleep 0.1; waited=$((waited + 1))
  done
  if [[ -z "$state" ]]; then
    cat "$DEPLOY_FILES.launch.log" >&2 2>/dev/null || true
    die "the detached deploy did not start (see above and $DEPLOY_FILES.launch.log)"
  fi
  cat <<EOF_DETACHED
deploy of $TRAINER running in the background (detached from this terminal: closing it or losing SSH is safe)
  run folder  $OUT/$TRAINER
  log         $LOG
  status      bash $REPO/deploy_8gpu.sh status --trainer $TRAINER --out $OUT
  attach      bash $REPO/deploy_8gpu.sh attach --trainer $TRAINER --out $OUT   (Ctrl-C leaves it running)
  stop        bash $REPO/deploy_8gpu.sh stop --trainer $TRAINER --out $OUT     (checkpoint, then export + package)
EOF_DETACHED
}

job_command() {  # job_command status|attach|stop ARGS...
  local verb="$1" want_json=0
  shift
  TRAINER=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --out) need_value "$@"; OUT="$2"; shift 2 ;;
      --trainer) need_value "$@"; TRAINER="$2"; shift 2 ;;
      --json) want_json=1; shift ;;
      --no-package) NO_PACKAGE=1; shift ;;
      --remote) need_value "$@"; REMOTE="$2"; shift 2 ;;
      -h|--help) usage_job; exit 0 ;;
      *) die "unknown option '$1' for $verb (see --help)" ;;
    esac
  done
  if [[ -n "$REMOTE" ]]; then  # from any machine: read from the remote, nothing local needed
    [[ "$verb" == status ]] || die "--remote works with status only ($verb acts on the machine running the job)"
    resolve_python
    local args=(--remote "$REMOTE")
    [[ "$want_json" -eq 0 ]] || args+=(--json)
    exec "$PY" -m trainers remote status "${args[@]}"
  fi
  if [[ -z "$OUT" ]]; then
    if [[ -d /workspace/output ]]; then OUT=/workspace/output; else OUT="$PWD/output"; fi
  fi
  if [[ ! -d "$OUT" ]]; then  # (the default: the quick start's --out runs is the usual one given instead)
    local found
    found=$(find . -maxdepth 2 -name 'deploy-*.state' -printf '%h\n' 2>/dev/null | sed 's|^\./||' | sort -u | paste -sd' ' -)
    [[ -z "$found" ]] || die "--out '$OUT' is not a folder a deploy wrote; deploys wrote here: $found (e.g. --out ${found%% *})"
    die "--out '$OUT' is not a folder a deploy wrote (give the --out the deploy was given)"
  fi
  OUT="$(cd "$OUT" && pwd)"
  if [[ -z "$TRAINER" ]]; then
    local states=("$OUT"/deploy-*.state)
    [[ -e "${states[0]}" || -L "${states[0]}" ]] || die "no deploy in $OUT (no deploy-<trainer>.state); give the --out a deploy used"
    if [[ "$verb" != status ]]; then
      [[ ${#states[@]} -eq 1 ]] || die "$OUT holds several jobs: add --trainer NAME"
      TRAINER="$(basename "${states[0]}" .state)"; TRAINER="${TRAINER#deploy-}"
    fi
  fi
  case "$verb" in
    status)
      resolve_python
      local args=(--out "$OUT")
      [[ -z "$TRAINER" ]] || args+=(--trainer "$TRAINER")
      [[ "$want_json" -eq 0 ]] || args+=(--json)
      exec "$PY" -m trainers status "${args[@]}" ;;
    attach)
      local log="$OUT/deploy-$TRAINER.log" pid
      [[ -f "$log" ]] || die "no log at $log"
      pid=$(grep '^pid=' "$OUT/deploy-$TRAINER.state" 2>/dev/null | cut -d= -f2 || true)
      if ! command -v flock >/dev/null 2>&1 || flock -n "$OUT/.deploy-$TRAINER.lock" true 2>/dev/null ||
         ! kill -0 "${pid:-0}" 2>/dev/null; then  # the job has ended: its log's end, and how it ended
        tail -n 40 "$log"
        resolve_python
        exec "$PY" -m trainers status --out "$OUT" --trainer "$TRAINER"
      fi
      echo "following $log (Ctrl-C stops following; the job goes on)"
      tail -n 40 -F --pid="$pid" "$log" &  # ends with the job
      ATTACH_TAIL=$!
      trap 'kill "$ATTACH_TAIL" 2>/dev/null; echo; echo "stopped following the log; the job goes on"; exit 0' INT TERM
      wait "$ATTACH_TAIL" ;;
    stop) stop_job ;;
  esac
}

usage_job() {
  echo "usage: bash deploy_8gpu.sh status|attach|stop [--out DIR] [--trainer NAME] [--json] [--no-package]"
  echo "       bash deploy_8gpu.sh status --remote URL/TRAINER [--json]   (from any machine)"
}

stop_job() {
  local state="$OUT/deploy-$TRAINER.state" pid phase run_dir
  [[ -f "$state" ]] || die "no deploy of $TRAINER in $OUT"
  pid=$(state_value "$state" pid)
  phase=$(state_value "$state" phase)
  run_dir=$(state_value "$state" run_dir)  # missing in an older kit's state file: the deploy itself is stopped
  if ! flock -n "$OUT/.deploy-$TRAINER.lock" true 2>/dev/null; then :; else
    die "the deploy of $TRAINER in $OUT is not running (see \`bash deploy_8gpu.sh status --out $OUT\`)"
  fi
  [[ "$pid" =~ ^[0-9]+$ ]] || die "$state has no pid= line (an older kit's or an edited file): stop the job by hand (its processes: pgrep -af deploy_8gpu.sh)"
  [[ "$NO_PACKAGE" -eq 0 ]] || : > "$OUT/.deploy-$TRAINER.no-package"
  local target=""
  if [[ "$phase" == train && -n "$run_dir" && -f "$run_dir/.lock" ]]; then
    target=$(grep -o '"pid": *[0-9]*' "$run_dir/.lock" | grep -o '[0-9]*$' || true)
  fi
  if [[ -n "$target" ]] && kill -0 "$target" 2>/dev/null; then
    echo "stopping training (rank 0's worker, pid $target): it checkpoints and writes results$([[ "$NO_PACKAGE" -eq 1 ]] || echo ', then export and package run')"
    kill -TERM "$target"
  else
    echo "stopping the deploy (pid $pid, phase $phase)"
    kill -TERM "$pid" 2>/dev/null || true
  fi
  local waited=0
  while ! flock -n "$OUT/.deploy-$TRAINER.lock" true 2>/dev/null; do
    sleep 1; waited=$((waited + 1))
    [[ $((waited % 15)) -ne 0 ]] || echo "  ... still finishing (phase $(state_value "$state" phase))"
    [[ $waited -lt 3600 ]] || die "the job did not end within an hour of the stop; see its log"
  done
  rm -f "$OUT/.deploy-$TRAINER.no-package"
  resolve_python
  "$PY" -m trainers status --out "$OUT" --trainer "$TRAINER" || true
}

resolve_python() {  # the Python that has the kit (as the install phase chose it)
  if [[ -n "${TRAINERS_PYTHON:-}" ]]; then PY="$TRAINERS_PYTHON"
  elif python3 -c 'import trainers' >/dev/null 2>&1; then PY=python3
  elif [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"
  else die "the kit is not installed yet (no $REPO/.venv); run a deploy first"
  fi
}
