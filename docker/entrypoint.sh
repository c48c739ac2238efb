#!/usr/bin/env bash
# Container entrypoint: the first argument picks what to run, the rest are passed through.
# In the image (TRAINERS_IN_CONTAINER=1), before any command but help:
#   SSH     PUBLIC_KEY (RunPod passes your account's public key) is added to /root/.ssh/authorized_keys,
#           this container's host keys are made, sshd listens on port 22: key login only, no passwords.
#           Without a key SSH stays off (one line says so); the job runs either way.
# deploy and gnn, in the image:
#   start   the job's state file decides: no job yet, or one stopped or interrupted: run it (it resumes);
#           finished or failed: not run again (the download line or the failure is printed). A rerun is
#           an explicit command: deploy_8gpu.sh [options] from the web terminal or SSH.
#   end     the container stays up, printing the download line (or the failure), until it is stopped.
#           EXIT_WHEN_DONE=1: run the job whatever its state file says and exit with its code (docker run, CI).
#   stop    SIGTERM (RunPod's "Stop pod", docker stop) goes to the job: it checkpoints and writes results,
#           then sshd stops and the container exits with the job's code.
# Commands:
#   deploy [deploy_8gpu.sh options]   a trainer's whole pipeline ($TRAINER or --trainer NAME; default forecast)
#   gnn [run_multigpu.sh options]     the graph-colouring pipeline (deploy --trainer gnn)
#   preflight [options]               machine checks only
#   tensorboard [--logdir DIR]        TensorBoard on port 6006 over the output folder
#   shell                             an interactive shell (RunPod's web terminal, debugging)
#   <anything else>                   run as a command
set -euo pipefail

KIT_DIR="${KIT_DIR:-/opt/trainers}"
OUT="${OUT:-/workspace/output}"
export OUT
IN_CONTAINER="${TRAINERS_IN_CONTAINER:-0}"
# Outside the image nobody restarts the entrypoint and there is no pod to keep up: exit when done.
if [[ "$IN_CONTAINER" == 1 ]]; then EXIT_WHEN_DONE="${EXIT_WHEN_DONE:-0}"; else EXIT_WHEN_DONE="${EXIT_WHEN_DONE:-1}"; fi
# Where SSH lives. The image uses the defaults; the tests point them at a temporary folder and fakes.
SSHD="${TRAINERS_SSHD:-/usr/sbin/sshd}"
SSH_DIR="${TRAINERS_SSH_DIR:-/root/.ssh}"
SSHD_RUN_DIR="${TRAINERS_SSHD_RUN_DIR:-/run/sshd}"
SSH_ENV_FILE="${TRAINERS_SSH_ENV_FILE:-/etc/trainers-env.sh}"

say() { echo "entrypoint: $*" >&2; }
die() { say "error: $*"; exit 2; }

# ---- signals: remembered, and passed to the job (it checkpoints), never acted on here first --------
STOP_SIGNAL="" JOB_PID="" IDLE_PID="" SSHD_PID=""
on_signal() {  # on_signal NAME: forward to the job; wake the idle wait
  STOP_SIGNAL="$1"
  [[ -z "$JOB_PID" ]] || kill -"$1" "$JOB_PID" 2>/dev/null || true
  [[ -z "$IDLE_PID" ]] || kill "$IDLE_PID" 2>/dev/null || true
}
# SIGINT becomes SIGTERM: bash starts background jobs with SIGINT ignored, so the deploy could not trap it.
trap 'on_signal TERM' TERM INT
trap 'on_signal HUP' HUP

# ---- SSH: the user's key, this container's host keys, sshd in the background ----------------------
KEY_TYPE_RE='^(ssh-(rsa|dss|ed25519)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)$'
is_public_key() {  # a plain public key: type, base64 blob, optional comment (no options: nothing runs on login)
  local words
  read -r -a words <<< "$1"
  [[ ${#words[@]} -ge 2 && "${words[0]}" =~ $KEY_TYPE_RE && "${words[1]}" =~ ^[A-Za-z0-9+/]{16,}={0,3}$ ]]
}

add_key() {  # add_key KEY: into authorized_keys once (a restarted container keeps its disk and PUBLIC_KEY)
  local file="$SSH_DIR/authorized_keys"
  if ! is_public_key "$1"; then KEYS_IGNORED=$((KEYS_IGNORED + 1)); return 0; fi
  KEYS_ADDED=$((KEYS_ADDED + 1))
  grep -qxF -- "$1" "$file" 2>/dev/null || (umask 077 && printf '%s\n' "$1" >> "$file")
}

add_public_keys() {  # PUBLIC_KEY's keys into authorized_keys; sets KEYS_ADDED, KEYS_IGNORED
  local file="$SSH_DIR/authorized_keys" line key word words
  KEYS_ADDED=0 KEYS_IGNORED=0
  # sshd refuses keys in a folder or file others can write (StrictModes): 700 and 600
  (umask 077 && mkdir -p "$SSH_DIR") && chmod 700 "$SSH_DIR" || return 1
  while IFS= read -r line || [[ -n "$line" ]]; do
    read -r -a words <<< "${line//$'\r'/ }"
    [[ ${#words[@]} -gt 0 ]] || continue
    # a line that does not start with a key type (options such as command="...", or garbage) is skipped whole
    if [[ ! "${words[0]}" =~ $KEY_TYPE_RE ]]; then KEYS_IGNORED=$((KEYS_IGNORED + 1)); continue; fi
    # RunPod may pass an account's keys on one line, space-separated: a key type word starts the next key
    key=""
    for word in "${words[@]}"; do
      if [[ "$word" =~ $KEY_TYPE_RE && -n "$key" ]]; then add_key "$key" || return 1; key="$word"
      else key="${key:+$key }$word"
      fi
    done
    add_key "$key" || return 1
  done <<< "$PUBLIC_KEY"
  [[ ! -f "$file" ]] || chmod 600 "$file"
}

# The container's environment for SSH sessions, which sshd starts with a clean one: without it PATH
# lacks the image's Python (conda in the real base) and the kit, and TRAINER, OUT and RUNPOD_* (the
# download line) are unset. Read by login shells (/etc/profile.d), by `ssh host command` (bash reads
# root's .bashrc when sshd starts it; both hooks are in the Dockerfile) and through BASH_ENV otherwise.
write_session_env() {
  local name
  {
    echo "# Written by the entrypoint at container start: the container's environment for SSH sessions"
    echo "# (PATH with the image's Python, TRAINER, OUT, RUNPOD_* for the download line). Applied once"
    echo "# per session, so a variable changed in a session reaches the commands run from it."
    # shellcheck disable=SC2016  # written as is: expanded in the session
    echo 'if [ -z "${TRAINERS_SESSION_ENV:-}" ]; then'
    echo '  export TRAINERS_SESSION_ENV=1'
    while IFS= read -r name; do
      case "$name" in
        HOME|HOSTNAME|PWD|OLDPWD|SHLVL|_|TERM|USER|LOGNAME|SHELL|MAIL|PUBLIC_KEY|BASH_ENV|SSH_*|TRAINERS_SESSION_ENV) continue ;;
      esac
      [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
      printf '  export %s=%q\n' "$name" "${!name}"
    done < <(compgen -e)
    echo 'fi'
  } > "$SSH_ENV_FILE.tmp" && chmod 600 "$SSH_ENV_FILE.tmp" && mv -f "$SSH_ENV_FILE.tmp" "$SSH_ENV_FILE"
}

ssh_hint() {  # how to connect, from RunPod's variables when there are any
  if [[ -n "${RUNPOD_PUBLIC_IP:-}" && -n "${RUNPOD_TCP_PORT_22:-}" ]]; then
    echo "ssh -p $RUNPOD_TCP_PORT_22 root@$RUNPOD_PUBLIC_IP"
  else
    echo "ssh -p <the port published for 22> root@<this machine>"
  fi
}

start_ssh() {  # everything SSH needs; never stops the job: any failure is one line saying SSH is off
  local keys="$SSH_DIR/authorized_keys" out
  # outside the image this is someone's machine: its sshd and /root/.ssh are not ours to touch
  [[ "$IN_CONTAINER" == 1 ]] || return 0
  if [[ -n "${PUBLIC_KEY:-}" ]]; then
    add_public_keys || { say "SSH off: cannot write $keys"; return 0; }
    if [[ "$KEYS_ADDED" -eq 0 ]]; then
      say "SSH off: PUBLIC_KEY is set but holds no public key (one 'ssh-ed25519 AAAA... comment' per line); the job runs without SSH"
      return 0
    fi
  elif [[ ! -s "$keys" ]]; then
    say "SSH off: no PUBLIC_KEY given (RunPod passes your account's SSH public key; docker run: -e PUBLIC_KEY=\"\$(cat ~/.ssh/id_ed25519.pub)\" -p 2222:22); the job runs without SSH"
    return 0
  fi
  [[ -x "$SSHD" ]] || { say "SSH off: no sshd at $SSHD in this image"; return 0; }
  # host keys made here, per container: the image ships none, or every pod would share them
  out=$(ssh-keygen -A 2>&1) || { say "SSH off: ssh-keygen -A failed: ${out//$'\n'/ }"; return 0; }
  # sshd's privilege separation folder (a service script makes it elsewhere; /run starts empty)
  if ! { mkdir -p "$SSHD_RUN_DIR" && chmod 755 "$SSHD_RUN_DIR"; }; then say "SSH off: cannot create $SSHD_RUN_DIR"; return 0; fi
  write_session_env || { say "SSH off: cannot write $SSH_ENV_FILE"; return 0; }
  # The policy on the command line, so it holds whatever the distribution's sshd_config says.
  local opts=(-o Port=22 -o PubkeyAuthentication=yes -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no
              -o PermitEmptyPasswords=no -o PermitRootLogin=prohibit-password
              -o "AuthorizedKeysFile=$SSH_DIR/authorized_keys" -o "SetEnv=BASH_ENV=$SSH_ENV_FILE")
  out=$("$SSHD" -t "${opts[@]}" 2>&1) || { say "SSH off: sshd refuses its configuration: ${out//$'\n'/ }"; return 0; }
  # -D: our child, so it is stopped after the job; -e: its log (logins) in the container's log
  "$SSHD" -D -e "${opts[@]}" &
  SSHD_PID=$!
  sleep 0.3
  if ! kill -0 "$SSHD_PID" 2>/dev/null; then
    wait "$SSHD_PID" 2>/dev/null || true
    SSHD_PID=""
    say "SSH off: sshd exited at start (its error is above)"
    return 0
  fi
  local count
  count=$(grep -c . "$keys" 2>/dev/null || true)
  say "SSH on: port 22, root, key login only ($count key(s) in $keys$([[ "${KEYS_IGNORED:-0}" -eq 0 ]] || echo "; $KEYS_IGNORED PUBLIC_KEY line(s) ignored: not a public key")); connect: $(ssh_hint)"
}

stop_ssh() {
  [[ -n "$SSHD_PID" ]] || return 0
  kill -TERM "$SSHD_PID" 2>/dev/null || true
  wait "$SSHD_PID" 2>/dev/null || true
  SSHD_PID=""
}

# ---- the job: its state, run and waited for, then kept up ------------------------------------------
job_names() {  # job_names ARGS...: JOB_TRAINER and JOB_OUT as deploy_8gpu.sh will read them; JOB_KIND
  JOB_KIND=run
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --) break ;;
      --trainer) JOB_TRAINER="${2:-}"; shift ;;
      --out) JOB_OUT="${2:-}"; shift ;;
      -h|--help|--dry-run) JOB_KIND=once ;;  # prints and ends: nothing to keep up
    esac
    shift
  done
}

# The job's record as `deploy_8gpu.sh status --json` reads it (the state file, its lock, results).
# Fields separated by \x1f, not a tab: read splits on runs of whitespace and would lose empty fields.
FIELD_NAMES=(trainer state phase exit_code download log alive pid host reason)
status_fields() {  # status_fields [--trainer NAME]: one line of FIELD_NAMES per job in $JOB_OUT
  local json
  json=$(bash "$KIT_DIR/deploy_8gpu.sh" status --json --out "$JOB_OUT" "$@" 2>&1) || { echo "$json" >&2; return 1; }
  python3 -c '
import json, sys
data = json.loads(sys.argv[1])
for job in data if isinstance(data, list) else [data]:
    print("\x1f".join("" if job.get(k) is None else str(job[k]).replace("\x1f", " ") for k in sys.argv[2:]))
' "$json" "${FIELD_NAMES[@]}"
}

job_verdict() {  # job_verdict: FIELDS (as FIELD_NAMES) of this job now; empty when they cannot be read
  FIELDS=()
  local line
  line=$(status_fields --trainer "$JOB_TRAINER" 2>/dev/null | head -n1) || return 0
  IFS=$'\x1f' read -r -a FIELDS <<< "$line" || true
}

stop_hint() {
  echo "stop the pod when you are done (RunPod: Stop; docker: docker stop <container>): it bills until then"
}

report_end() {  # report_end RC: what the job left, as the last lines of the container's log
  local rc="$1"
  job_verdict
  local state="${FIELDS[1]:-}" phase="${FIELDS[2]:-?}" download="${FIELDS[4]:-}"
  local log="${FIELDS[5]:-$JOB_OUT/deploy-$JOB_TRAINER.log}"
  if [[ "$rc" -eq 0 ]]; then
    say "the deploy of $JOB_TRAINER finished; the container stays up so you can fetch the results"
  elif [[ "$state" == stopped ]]; then
    say "the deploy of $JOB_TRAINER was stopped by a signal in phase $phase (exit $rc); log $log"
    say "the container stays up; resume with: deploy_8gpu.sh --trainer $JOB_TRAINER [options]"
  else
    say "the deploy of $JOB_TRAINER FAILED in phase $phase (exit $rc${FIELDS[9]:+: ${FIELDS[9]}}); log $log"
    say "the container stays up and does not rerun it (it would fail again while the pod bills): look with the web terminal or SSH, then rerun with: deploy_8gpu.sh --trainer $JOB_TRAINER [options]"
  fi
  [[ -z "$download" ]] || say "download: $download"
  say "$(stop_hint)"
}

wait_for() {  # wait_for PID: its exit code; a trapped signal interrupts `wait`, so wait again until it is gone
  local rc
  while true; do
    rc=0
    wait "$1" 2>/dev/null || rc=$?
    kill -0 "$1" 2>/dev/null || break
  done
  return "$rc"
}

stop_other_deploys() {  # a deploy started from a terminal in this container is not our child: stop it too
  local rows trainer state phase code download log alive pid host reason me waited
  me="$HOSTNAME"  # what kit_lib.sh records (hostname), without needing the command
  rows=$(status_fields 2>/dev/null) || return 0
  # shellcheck disable=SC2034  # reason: read to keep the fields in place, not used here
  while IFS=$'\x1f' read -r trainer state phase code download log alive pid host reason; do
    [[ "$alive" == True && "$host" == "$me" && "$pid" =~ ^[0-9]+$ ]] || continue
    say "stopping the deploy of $trainer started from a terminal (pid $pid, phase $phase): it checkpoints first"
    kill -TERM "$pid" 2>/dev/null || continue
    waited=0  # polled, as it is not our child; torchrun allows its workers 30 s
    while kill -0 "$pid" 2>/dev/null && [[ $waited -lt 1200 ]]; do sleep 0.1; waited=$((waited + 1)); done
  done <<< "$rows"
}

idle_until_stopped() {  # the container stays up; tini (PID 1) goes on reaping whatever ends meanwhile
  while [[ -z "$STOP_SIGNAL" ]]; do
    sleep 86400 &
    IDLE_PID=$!
    # on_signal kills the sleep, so a signal that came just before this wait ends it too
    [[ -n "$STOP_SIGNAL" ]] || wait "$IDLE_PID" 2>/dev/null || true
    kill "$IDLE_PID" 2>/dev/null || true
    IDLE_PID=""
  done
}

start_job() {  # start_job SCRIPT ARGS...: the deploy as our child; its exit code, after a stop too
  local script="$1" rc=0
  shift
  # --foreground: the container lives as long as this process, so the job must not detach
  bash "$KIT_DIR/$script" --foreground "$@" &
  JOB_PID=$!
  [[ -z "$STOP_SIGNAL" ]] || kill -"$STOP_SIGNAL" "$JOB_PID" 2>/dev/null || true  # came while it started
  wait_for "$JOB_PID" || rc=$?
  JOB_PID=""
  return "$rc"
}

run_job() {  # run_job SCRIPT ARGS...: the job as the container's life (JOB_TRAINER: the default trainer)
  local script="$1" rc=0
  shift
  JOB_OUT="$OUT"
  job_names "$@"
  if [[ "$JOB_KIND" == once ]]; then start_job "$script" "$@" || rc=$?; exit "$rc"; fi
  start_ssh
  if [[ "$EXIT_WHEN_DONE" == 1 ]]; then  # batch: the command as given, its code; a rerun resumes or skips
    [[ -n "$STOP_SIGNAL" ]] || start_job "$script" "$@" || rc=$?
    stop_ssh
    exit "$rc"
  fi
  local start=1 state="" phase code download log
  if [[ -f "$JOB_OUT/deploy-$JOB_TRAINER.state" ]]; then
    job_verdict
    state="${FIELDS[1]:-}" phase="${FIELDS[2]:-?}" code="${FIELDS[3]:-}" download="${FIELDS[4]:-}" log="${FIELDS[5]:-?}"
    case "$state" in
      finished)
        start=0 rc=0
        say "the deploy of $JOB_TRAINER in $JOB_OUT finished earlier: not run again (a rerun: deploy_8gpu.sh --trainer $JOB_TRAINER [options] from the web terminal or SSH)"
        [[ -z "$download" ]] || say "download: $download" ;;
      failed)
        start=0 rc="$code"
        [[ "$rc" =~ ^[0-9]+$ && "$rc" -ne 0 ]] || rc=1
        say "the deploy of $JOB_TRAINER in $JOB_OUT FAILED earlier in phase $phase (exit ${code:-?}; log $log): not run again, so a failing job does not restart in a loop while the pod bills"
        say "look with the web terminal or SSH, then rerun with: deploy_8gpu.sh --trainer $JOB_TRAINER [options]" ;;
      running)  # alive: started from a terminal here before us, or by another pod on a shared volume
        start=0 rc=0
        say "a deploy of $JOB_TRAINER into $JOB_OUT is already running (pid ${FIELDS[7]:-?} on ${FIELDS[8]:-?}): not starting another; deploy_8gpu.sh status follows it" ;;
      stopped|lost) say "the deploy of $JOB_TRAINER was ${state/lost/interrupted} in phase $phase: resuming it" ;;
      *) say "the deploy of $JOB_TRAINER is in state '${state:-unreadable}' (phase $phase): running it (it resumes)" ;;
    esac
    [[ "$start" -eq 1 ]] || say "$(stop_hint)"
  fi
  if [[ "$start" -eq 1 && -z "$STOP_SIGNAL" ]]; then
    start_job "$script" "$@" || rc=$?
    # after a stop the container ends (the job checkpointed; the next start resumes it)
    [[ -n "$STOP_SIGNAL" ]] || report_end "$rc"
  fi
  idle_until_stopped
  say "SIG$STOP_SIGNAL: stopping"
  stop_other_deploys
  stop_ssh
  exit "$rc"
}

cmd="${1:-deploy}"
[[ $# -gt 0 ]] && shift
[[ "$EXIT_WHEN_DONE" == 0 || "$EXIT_WHEN_DONE" == 1 ]] || die "EXIT_WHEN_DONE='$EXIT_WHEN_DONE' must be 0 (stay up after the job) or 1 (exit with the job's code)"
case "$cmd" in
  -h|--help|help)
    sed -n '2,/^set -euo pipefail/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
    exit 0 ;;
esac
# SSH for every command (a pod started as `shell` or `tensorboard` is reachable too); deploy and gnn
# start it themselves, but not for --help or --dry-run.
[[ "$cmd" == deploy || "$cmd" == gnn ]] || start_ssh
case "$cmd" in
  deploy) JOB_TRAINER="${TRAINER:-forecast}"; run_job deploy_8gpu.sh "$@" ;;
  gnn) JOB_TRAINER=gnn; run_job run_multigpu.sh "$@" ;;
  preflight) exec python -m trainers preflight --out "$OUT" "$@" ;;
  tensorboard)
    mkdir -p "$OUT"
    exec tensorboard --logdir "$OUT" --host 0.0.0.0 --port 6006 "$@" ;;
  shell) exec bash "$@" ;;
  *) exec "$cmd" "$@" ;;
esac
