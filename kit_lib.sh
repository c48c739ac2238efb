#!/usr/bin/env bash
# Helpers shared by deploy_8gpu.sh and run_multigpu.sh (sourced, not run). Callers set OUT, LOG,
# DRY_RUN and PHASE before use.

die() { echo "error: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

start_log() {  # everything to the terminal and $LOG; stderr stays stderr
  mkdir -p "$OUT"
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

gpu_count() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
  else
    echo 0
  fi
}

pick_nproc() {  # pick_nproc GPUS DEMO -> sets NPROC, or dies with the fix
  local found
  found=$(gpu_count)
  if [[ "$2" -eq 1 ]]; then
    NPROC=2
    echo "demo: CPU, $NPROC gloo workers ($found GPU(s) ignored)"
    return
  fi
  [[ "$found" -gt 0 ]] || die "no NVIDIA GPU found (nvidia-smi lists none); on a machine without GPUs add --demo"
  if [[ "$1" == all ]]; then
    NPROC="$found"
  else
    [[ "$1" -le "$found" ]] || die "--gpus $1 asked for, but this machine has $found GPU(s)"
    NPROC="$1"
  fi
  nvidia-smi -L
  echo "using $NPROC of $found GPU(s)"
}

print_download() {  # print_download TARBALL: the scp line (RunPod's variables when present)
  local tarball="$1" line
  if [[ -n "${RUNPOD_PUBLIC_IP:-}" && -n "${RUNPOD_TCP_PORT_22:-}" ]]; then
    line="scp -P ${RUNPOD_TCP_PORT_22} root@${RUNPOD_PUBLIC_IP}:${tarball} ."
  else
    line="scp -P <ssh-port> root@<this-machine's-public-ip>:${tarball} ."
  fi
  {
    echo "Download the results (run this on your own machine):"
    echo "  $line"
    if command -v runpodctl >/dev/null 2>&1; then
      echo "or, with RunPod's tool (prints a one-time code for 'runpodctl receive'):"
      echo "  runpodctl send ${tarball}"
    fi
    echo "then check it: sha256sum -c $(basename "$tarball").sha256 (copy that file too) and tar -xzf $(basename "$tarball")"
  } | tee "$OUT/DOWNLOAD.txt"
}
