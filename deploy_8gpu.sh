#!/usr/bin/env bash
# One-line deploy of any trainer on a rented GPU box (or, with --demo, on any CPU):
#
#   bash deploy_8gpu.sh                          # the forecaster on all GPUs: 151m preset, 25 years of S&P 500
#   bash deploy_8gpu.sh --trainer gnn            # the graph-colouring GNN
#   bash deploy_8gpu.sh --demo                   # CPU, 2 gloo workers, synthetic data, a few minutes
#
# Phases: preflight -> install -> nodes (several nodes: all met, --out shared) -> check (full preflight
# with NCCL, sized for the job) -> data -> train (torchrun) -> export (ONNX, checked) -> package ->
# download line. Non-interactive and idempotent: rerun it after a failure or a preemption and it skips
# what is done (install, data) and resumes training from the last checkpoint. Everything is logged to $OUT/deploy-<trainer>.log;
# a failure names its phase and the log. The common flags and phases live in kit_lib.sh, each
# trainer's own flags and data phase in trainers/<trainer>/deploy.sh.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=kit_lib.sh
. "$REPO/kit_lib.sh"

usage() {
  echo "usage: bash deploy_8gpu.sh [--trainer NAME] [options] [-- extra \`trainers NAME train\` options]"
  echo
  common_usage
  echo
  echo "--trainer $TRAINER:"
  trainer_usage
}

# status, attach and stop: the job-control verbs (kit_lib.sh), answered from the files a deploy writes.
case "${1:-}" in
  status|attach|stop) job_command "$@"; exit 0 ;;
esac

# --trainer picks the hooks that parse the trainer's own flags, so it is found first.
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ "${args[i]}" == -- ]] && break
  if [[ "${args[i]}" == --trainer ]]; then TRAINER="${args[i + 1]:-}"; fi
done
[[ -n "$TRAINER" ]] || die "--trainer needs a value"
load_trainer "$TRAINER"
parse_flags "$@"
read_launcher
check_common_flags
trainer_defaults
set_paths
if should_detach; then
  probe_job_lock
  OLD_STATE_PID=$(grep '^pid=' "$DEPLOY_FILES.state" 2>/dev/null | cut -d= -f2 || true)
  detach_job "$@"
  exit 0
fi
[[ "$DRY_RUN" -eq 1 ]] || lock_job
start_log
install_signal_traps
start_state

echo "deploy_8gpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) ($(uname -sm)); repo $REPO @ $(kit_commit)"
echo "trainer=$TRAINER out=$OUT demo=$DEMO gpus=$GPUS nnodes=$NNODES node_rank=$NODE_RANK dry_run=$DRY_RUN"
launcher_line
trainer_train_args
echo "training options: ${TRAIN_ARGS[*]} ${EXTRA[*]}"

PY="${TRAINERS_PYTHON:-python3}"
phase preflight phase_preflight
phase install phase_install
phase nodes phase_nodes
phase check phase_check
phase data phase_data
phase train phase_train
phase export phase_export
phase package phase_package
phase download phase_download
end_if_training_stopped  # (exit 143, state stopped: a rerun, or a restarted container, resumes it)
if declare -F trainer_verdict >/dev/null; then  # a job can finish and still have failed parts (lstm symbols)
  PHASE="verdict"
  trainer_verdict || die "the job finished with failures (above); what succeeded is in $TARBALL"
fi
PHASE="done"
echo "deploy finished; results in $RUN_DIR, tarball $TARBALL"
