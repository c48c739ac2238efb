#!/usr/bin/env bash
# Container smoke test (opt-in, not part of CI): build docker/Dockerfile with podman on a stand-in CPU
# base image and run the image as a user would, to a verified tarball.
#
#   sudo bash docker/smoke.sh [--out FILE] [--work DIR] [--rebuild-base] [--no-gnn] [--verbose] [--cuda]
#
# --cuda: the base carries the CUDA build of torch from PyPI instead (torch==2.7.1, the kit's floor and the
# Dockerfile's default base's torch, unless TORCH_SPEC says otherwise), with the CUDA, cuDNN and NCCL libraries
# of its nvidia-* wheels: the image users pull, less the GPU. Inside it a step records torch.version.cuda, cuDNN's
# and NCCL's versions and that their libraries load (into the summary's "cuda"); the rest of the smoke runs as
# on the CPU base. Its summary goes to bench/results/docker_cuda_smoke.json.
#
# Steps: 1. the stand-in base (Debian bookworm via debootstrap + python3/pip + the CPU torch wheel),
# built once and cached as an image; 2. docker/Dockerfile built on it (--build-arg BASE_IMAGE=...);
# 3. inside the image: the entrypoint's dispatch (help, shell -c, a command, exit codes, SIGTERM through
# tini), sshd installed with no host keys baked in, `preflight` (no GPU: exit 1 and its --demo hint);
# 4. a pod as RunPod starts one, on loopback only: PUBLIC_KEY a key made for the test, port 22 published
# on 127.0.0.1, RUNPOD_PUBLIC_IP/RUNPOD_TCP_PORT_22 set as RunPod sets them; `deploy --demo` to its end,
# the container still up; over SSH with that key `deploy_8gpu.sh status` and the session's environment;
# the printed scp line run as printed, `sha256sum -c` on the host; password login and a stranger's key
# refused; `podman stop -t 10` ends it at once; 5. without PUBLIC_KEY (SSH off, said so): SIGTERM in the
# middle of training (checkpoint, results, a clean exit within the 10 s grace), restart resumes it,
# a failed deploy is not rerun on restart; `gnn --demo` with EXIT_WHEN_DONE=1 (exits when done). Each
# tarball: `sha256sum -c`, the SHA256SUMS inside it, results.json's world_size 2, device cpu. A summary
# goes to --out as JSON.
#
# It does not prove the real base image (pytorch/pytorch CUDA, conda), CUDA, NCCL, GPUs, multi-node or
# RunPod itself (its proxy to port 22, how it passes PUBLIC_KEY, its stop grace period).
# Needs root (rootful podman), podman + runc + debootstrap + openssh-client, python3 on the host, and
# network access to a Debian mirror and PyPI. Environment: TORCH_SPEC (default torch==2.13.0),
# TORCH_INDEX_URL (where pip finds it; default: the host's pip configuration), DEBIAN_MIRROR.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_JSON="$REPO/bench/results/docker_smoke.json"
WORK="${SMOKE_WORK:-/var/tmp/trainers-smoke}"
ARGS=("$@")
REBUILD_BASE=0
GNN=1
VERBOSE=0
CUDA=0
for arg in "$@"; do [[ "$arg" != --cuda ]] || CUDA=1; done
if [[ "$CUDA" -eq 1 ]]; then
  TORCH_SPEC="${TORCH_SPEC:-torch==2.7.1}"
  OUT_JSON="$REPO/bench/results/docker_cuda_smoke.json"
else
  TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
fi
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOTFS_IMAGE="localhost/trainers-smoke-rootfs:bookworm"
TORCH_TAG="${TORCH_SPEC//==/-}"
BASE_IMAGE="localhost/trainers-smoke-base:bookworm-${TORCH_TAG//[^A-Za-z0-9_.-]/-}-$([[ "$CUDA" -eq 1 ]] && echo cuda || echo cpu)"
IMAGE="localhost/trainers:smoke"
# Small data: the whole forecaster pipeline in a few minutes on 2 CPU cores.
FORECAST_ARGS=(--synthetic-tickers 16 --synthetic-days 800 --window 32 --horizon 5 --epochs 1)
GNN_ARGS=(--train 64 --val 16 --max-nodes 60 --epochs 1)

die() { echo "error: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) [[ $# -ge 2 && -n "$2" ]] || die "--out needs a file name"; OUT_JSON="$2"; shift 2 ;;
    --work) [[ $# -ge 2 && -n "$2" ]] || die "--work needs a folder"; WORK="$2"; shift 2 ;;
    --rebuild-base) REBUILD_BASE=1; shift ;;
    --no-gnn) GNN=0; shift ;;
    -v|--verbose) VERBOSE=1; shift ;;
    --cuda) shift ;;  # (read above: it picks the torch build)
    -h|--help) sed -n '2,/^set -euo pipefail/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (use --out FILE, --work DIR, --rebuild-base, --no-gnn, --verbose, --cuda)" ;;
  esac
done

[[ "$(id -u)" -eq 0 ]] || die "must be run as root (it drives rootful podman and debootstrap): sudo bash docker/smoke.sh"
for tool in podman runc debootstrap ssh scp ssh-keygen; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found: apt-get install podman runc debootstrap openssh-client"
done
command -v python3 >/dev/null 2>&1 || die "python3 not found on the host (it fetches the torch wheel and checks JSON): apt-get install python3 python3-pip"
[[ "$WORK" == /* && "$WORK" != / ]] || die "--work '$WORK' must be an absolute path other than /"
mkdir -p "$WORK" "$(dirname "$OUT_JSON")" 2>/dev/null || die "cannot create $WORK or $(dirname "$OUT_JSON")"
OUT_JSON="$(cd "$(dirname "$OUT_JSON")" && pwd)/$(basename "$OUT_JSON")"

# runc and cgroupfs: what works on machines without systemd (crun/systemd cgroups may not); the same
# ulimits for build and run (the defaults inherited here can be too low or too high for runc).
PODMAN=(podman --runtime runc --cgroup-manager=cgroupfs)
LIMITS=(--ulimit nofile=20000:20000 --ulimit nproc=4096:4096)
WS="$WORK/workspace"     # mounted at /workspace: what the container writes, checked from the host
LOGS="$WORK/logs"
CHECKS="$LOGS/checks.tsv"
BASE_RECORD="$WORK/base-image.tsv"  # how the cached base image was built (its steps, by the run that built it)
CONTAINERS=()
STARTED=$EPOCHREALTIME

# Fresh outputs every run (the cached base image is the only thing kept), so a rerun proves it again.
rm -rf "${WS:?}" "${WORK:?}/extract" "${LOGS:?}" "${WORK:?}/base"
mkdir -p "$WS" "$WORK/extract" "$LOGS"
: > "$CHECKS"

# ---- helpers -------------------------------------------------------------------------------------
quote() { local s; s=$(printf '%q ' "$@"); echo "${s% }"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
image_id() { "${PODMAN[@]}" image inspect --format '{{.Id}}' "$1" 2>/dev/null | cut -c1-12; }
image_size() { "${PODMAN[@]}" image inspect --format '{{.Size}}' "$1" 2>/dev/null; }

cleanup() {  # every container this run named, whatever state it is in
  local name
  for name in "${CONTAINERS[@]}"; do
    "${PODMAN[@]}" rm -f --ignore "$name" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT
trap 'echo "error: docker/smoke.sh stopped at line $LINENO ($BASH_COMMAND); logs in $LOGS" >&2' ERR

container() {  # container SUFFIX: C = a name for a container of this run (removed at exit; a leftover now)
  C="trainers-smoke-$1"
  "${PODMAN[@]}" rm -f --ignore "$C" >/dev/null 2>&1 || true
  CONTAINERS+=("$C")
}

record() {  # record NAME PASSED SECONDS EXIT COMMAND DETAIL: one row of the summary
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6//$'\t'/ }" >> "$CHECKS"
}

# step NAME WANT_EXIT COMMAND...: run it, output to $LOGS/NAME.log, and require that exit status.
# Sets STEP_LOG, STEP_S, STEP_CMD for the checks and the record that follow.
step() {
  local name="$1" want="$2" rc=0 t0
  shift 2
  STEP_LOG="$LOGS/$name.log" STEP_CMD="$(quote "$@")"
  echo "--> $name: $STEP_CMD"
  t0=$EPOCHREALTIME
  if [[ "$VERBOSE" -eq 1 ]]; then
    "$@" 2>&1 | tee "$STEP_LOG" || rc=${PIPESTATUS[0]}
  else
    "$@" > "$STEP_LOG" 2>&1 || rc=$?
  fi
  STEP_S=$(since "$t0")
  [[ "$rc" -eq "$want" ]] || fail "$name" "$rc" "exited $rc, expected $want"
  STEP_RC=$rc
}

expect() {  # expect NAME TEXT: the last step's output must contain TEXT
  grep -qF -- "$2" "$STEP_LOG" || fail "$1" "$STEP_RC" "output lacks '$2'"
}

pass() {  # pass NAME DETAIL: the last step passed
  record "$1" true "$STEP_S" "$STEP_RC" "$STEP_CMD" "$2"
  printf '    ok  %-22s %6s s  %s\n' "$1" "$STEP_S" "$2"
}

fail() {  # fail NAME EXIT WHY: record it, write the summary, stop
  record "$1" false "${STEP_S:-0}" "$2" "${STEP_CMD:-}" "$3"
  echo "--- last lines of ${STEP_LOG:-(no log)}:" >&2
  [[ -z "${STEP_LOG:-}" || ! -f "$STEP_LOG" ]] || tail -n 25 "$STEP_LOG" >&2
  summary false
  echo "error: smoke step '$1' failed: $3 (log: ${STEP_LOG:-none}; summary: $OUT_JSON)" >&2
  exit 1
}

json_get() {  # json_get FILE KEY...: a value from a JSON file, e.g. json_get results.json training device
  python3 -c 'import functools, json, sys; print(functools.reduce(lambda d, k: d[k], sys.argv[2:], json.load(open(sys.argv[1]))))' "$@"
}

summary() {  # summary PASSED: the JSON record of this run at $OUT_JSON
  S_PASSED="$1" S_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)" S_TOTAL="$(since "$STARTED")" \
  S_COMMAND="$(quote bash docker/smoke.sh "${ARGS[@]}")" S_COMMIT="$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)" \
  S_DIRTY="$(git -C "$REPO" status --porcelain 2>/dev/null | grep -c . || true)" \
  S_OS="$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}")" \
  S_PODMAN="$("${PODMAN[@]}" version --format '{{.Client.Version}}' 2>/dev/null || echo unknown)" \
  S_RUNTIME="$(runc --version 2>/dev/null | head -n1)" S_FLAGS="$(quote "${PODMAN[@]}") ... $(quote "${LIMITS[@]}")" \
  S_BASE="$BASE_IMAGE" S_BASE_ID="$(image_id "$BASE_IMAGE" || true)" S_BASE_SIZE="$(image_size "$BASE_IMAGE" || true)" \
  S_BASE_BUILT="$BASE_BUILT" S_BASE_S="$BASE_S" S_WHEEL="${WHEEL_NAME:-}" \
  S_IMAGE="$IMAGE" S_IMAGE_ID="$(image_id "$IMAGE" || true)" S_IMAGE_SIZE="$(image_size "$IMAGE" || true)" \
  S_IMAGE_S="${IMAGE_S:-0}" S_VERSIONS="${VERSIONS:-}" S_CUDA="${CUDA_FACTS:-}" S_CUDA_MODE="$CUDA" \
  python3 - "$CHECKS" "$OUT_JSON" "$BASE_RECORD" <<'PY'
import json, os, platform, sys

e = os.environ


def read_checks(path):
    rows = [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]
    return [{"name": r[0], "passed": r[1] == "true", "seconds": float(r[2]),
             "exit": int(r[3]) if r[3].lstrip("-").isdigit() else None, "command": r[4], "detail": r[5]}
            for r in rows if r[0] != "id"]


checks = read_checks(sys.argv[1])
built_by = None
if e["S_BASE_BUILT"] != "1" and os.path.exists(sys.argv[3]):
    _, _, seconds, date = open(sys.argv[3]).readline().rstrip("\n").split("\t")
    built_by = {"date": date, "build_seconds": float(seconds), "steps": read_checks(sys.argv[3])}
record = {
    "benchmark": "docker_smoke",
    "passed": e["S_PASSED"] == "true" and all(c["passed"] for c in checks),
    "date": e["S_DATE"],
    "total_seconds": float(e["S_TOTAL"]),
    "command": e["S_COMMAND"],
    "git_commit": e["S_COMMIT"],
    "git_changed_files": int(e["S_DIRTY"] or 0),  # the image holds the working tree: 0 means exactly git_commit
    "machine": {"os": e["S_OS"], "kernel": platform.release(), "arch": platform.machine(), "cpus": os.cpu_count()},
    "podman": e["S_PODMAN"],
    "runtime": e["S_RUNTIME"],
    "podman_flags": e["S_FLAGS"],
    "base_image": {"name": e["S_BASE"], "id": e["S_BASE_ID"] or None, "size_bytes": int(e["S_BASE_SIZE"] or 0) or None,
                   "built_this_run": e["S_BASE_BUILT"] == "1", "build_seconds": float(e["S_BASE_S"]),
                   "torch_wheel": e["S_WHEEL"], "built_by_an_earlier_run": built_by,
                   "what": "stand-in for pytorch/pytorch:*-cuda*: Debian bookworm (debootstrap minbase), python3, "
                           "pip, python-is-python3, " + ("the CUDA torch wheel from PyPI with its nvidia-* CUDA, cuDNN "
                           "and NCCL wheels" if e["S_CUDA_MODE"] == "1" else "the CPU torch wheel") +
                           ", PEP 668 marker removed"},
    "image": {"name": e["S_IMAGE"], "id": e["S_IMAGE_ID"] or None, "size_bytes": int(e["S_IMAGE_SIZE"] or 0) or None,
              "build_seconds": float(e["S_IMAGE_S"]), "dockerfile": "docker/Dockerfile", "versions": e["S_VERSIONS"]},
    "cuda": json.loads(e["S_CUDA"]) if e["S_CUDA"] else None,  # (--cuda: the CUDA stack inside the image)
    "checks": checks,
    "not_proven": ["the real base image pytorch/pytorch:*-cuda* (conda Python, CUDA libraries, Ubuntu packages)",
                   "RunPod itself: its proxy to port 22, how it passes PUBLIC_KEY and RUNPOD_* (set by hand here), "
                   "its restart policy and stop grace period (podman's default 10 s here)",
                   "CUDA, NCCL, GPUs, --gpus device passthrough, /dev/shm sizing under NCCL",
                   "multi-node rendezvous between containers",
                   "Docker Engine and BuildKit themselves (podman/buildah built and ran it)"],
}
with open(sys.argv[2], "w") as f:
    f.write(json.dumps(record, indent=2) + "\n")
PY
}

verify_tarball() {  # verify_tarball TRAINER: on the host, both checksum lists and results.json's run facts
  local name="$1" tarball="$WS/output/$1.tar.gz" extract="$WORK/extract/$1" world device
  STEP_LOG="$LOGS/verify-$name.log" STEP_CMD="(cd $WS/output && sha256sum -c $name.tar.gz.sha256); tar -xzf; (cd $name && sha256sum -c SHA256SUMS)"
  STEP_RC=0
  local t0=$EPOCHREALTIME
  [[ -f "$tarball" && -f "$tarball.sha256" ]] || fail "verify-$name" 1 "$tarball or its .sha256 is missing"
  (cd "$WS/output" && sha256sum -c "$name.tar.gz.sha256") > "$STEP_LOG" 2>&1 || fail "verify-$name" 1 "sha256sum -c $name.tar.gz.sha256 failed"
  mkdir -p "$extract"
  tar -xzf "$tarball" -C "$extract" >> "$STEP_LOG" 2>&1 || fail "verify-$name" 1 "tar -xzf $tarball failed"
  (cd "$extract/$name" && sha256sum -c SHA256SUMS) >> "$STEP_LOG" 2>&1 || fail "verify-$name" 1 "sha256sum -c SHA256SUMS inside $name.tar.gz failed"
  [[ -f "$extract/$name/model.onnx" ]] || fail "verify-$name" 1 "the tarball has no model.onnx"
  world=$(json_get "$extract/$name/results.json" training world_size) || fail "verify-$name" 1 "results.json unreadable"
  device=$(json_get "$extract/$name/results.json" training device) || fail "verify-$name" 1 "results.json unreadable"
  [[ "$world" == 2 && "$device" == cpu ]] || fail "verify-$name" 1 "results.json says world_size $world, device $device (wanted 2, cpu)"
  STEP_S=$(since "$t0")
  pass "verify-$name" "tarball $(stat -c %s "$tarball") B, $(wc -l < "$extract/$name/SHA256SUMS") files OK by sha256sum -c SHA256SUMS, world_size 2, device cpu"
}

# A check that is not one command: begin it, run what it needs, then pass (or fail) it.
begin() {  # begin NAME DESCRIPTION
  STEP_LOG="$LOGS/$1.log" STEP_CMD="$2" STEP_RC=0 STEP_T0=$EPOCHREALTIME
  : > "$STEP_LOG"
  echo "--> $1: $STEP_CMD"
}
done_ok() {  # done_ok NAME DETAIL: the check that began passed
  STEP_S=$(since "$STEP_T0")
  pass "$1" "$2"
}
running() { [[ "$("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$1" 2>/dev/null)" == true ]]; }
exit_of() { "${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$1" 2>/dev/null || echo unknown; }
save_logs() { "${PODMAN[@]}" logs "$C" >> "$STEP_LOG" 2>&1 || true; }

wait_for() {  # wait_for NAME SECONDS TEST...: until TEST succeeds; fails if the container $C ends first
  local name="$1" limit="$2" t0=$SECONDS
  shift 2
  until "$@"; do
    running "$C" || { save_logs; fail "$name" "$(exit_of "$C")" "the container ended (exit $(exit_of "$C")) before: $*"; }
    (( SECONDS - t0 < limit )) || { save_logs; fail "$name" 124 "not within $limit s: $*"; }
    sleep 1
  done
}
log_has() { "${PODMAN[@]}" logs "$C" 2>&1 | grep -qF -- "$1"; }
file_has() { grep -qF -- "$2" "$1" 2>/dev/null; }

# stop_pod NAME: what RunPod's "Stop pod" and docker stop do (SIGTERM, SIGKILL after the grace);
# sets STOP_S, STOP_RC. A clean stop ends before the grace, on the container's own terms.
stop_pod() {
  local t0=$EPOCHREALTIME
  "${PODMAN[@]}" stop -t 10 "$C" >> "$STEP_LOG" 2>&1 || true
  STOP_S=$(since "$t0") STOP_RC=$(exit_of "$C")
  save_logs
  [[ "$STOP_RC" != 137 ]] || fail "$1" 137 "killed after podman stop's 10 s grace (exit 137): the container did not end on SIGTERM"
  awk -v s="$STOP_S" 'BEGIN { exit !(s < 10) }' || fail "$1" "$STOP_RC" "took $STOP_S s to stop: not within the 10 s grace"
}

echo "trainers container smoke: repo $REPO, work $WORK, $("${PODMAN[@]}" --version)"

# ---- 1. the stand-in base image ----------------------------------------------------------------
BASE_BUILT=0 BASE_S=0
if [[ "$REBUILD_BASE" -eq 0 ]] && "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
  echo "--> base: $BASE_IMAGE cached ($(image_id "$BASE_IMAGE")); --rebuild-base to build it again"
  [[ "$(head -n1 "$BASE_RECORD" 2>/dev/null | cut -f2)" == "$(image_id "$BASE_IMAGE")" ]] || rm -f "$BASE_RECORD"
  WHEEL_NAME=$("${PODMAN[@]}" image inspect --format '{{index .Labels "trainers.smoke.torch-wheel"}}' "$BASE_IMAGE")
else
  t0=$EPOCHREALTIME
  ctx="$WORK/base"
  mkdir -p "$ctx/wheel" "$ctx/ca"
  # the wheel pip would install for the container's Python (bookworm: CPython 3.11) on this architecture
  pip_args=(download "$TORCH_SPEC" --no-deps --only-binary=:all: --python-version 3.11 --implementation cp
            --abi cp311 --platform "manylinux_2_28_$(uname -m)" -d "$ctx/wheel")
  [[ -z "$TORCH_INDEX_URL" ]] || pip_args+=(--index-url "$TORCH_INDEX_URL")
  step base-wheel 0 python3 -m pip "${pip_args[@]}"
  wheels=("$ctx"/wheel/torch-*.whl)
  WHEEL_NAME=$(basename "${wheels[0]}")
  [[ -f "${wheels[0]}" ]] || fail base-wheel 1 "pip download $TORCH_SPEC gave no torch wheel in $ctx/wheel"
  [[ "$WHEEL_NAME" == *+cpu* || "$CUDA" -eq 1 ]] || echo "warning: $WHEEL_NAME is not a +cpu build; its install pulls the CUDA libraries (set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu, or use --cuda)" >&2
  pass base-wheel "$WHEEL_NAME"

  step base-debootstrap 0 debootstrap --variant=minbase --include=python3,python3-pip,python-is-python3,ca-certificates \
    bookworm "$ctx/rootfs" "$DEBIAN_MIRROR"
  pass base-debootstrap "bookworm minbase + python3, python3-pip, python-is-python3 from $DEBIAN_MIRROR"
  old_rootfs=$(image_id "$ROOTFS_IMAGE" || true)
  step base-import 0 bash -c "set -o pipefail; tar -C $(quote "$ctx/rootfs") -c . | $(quote "${PODMAN[@]}") import - $(quote "$ROOTFS_IMAGE")"
  rm -rf "${ctx:?}/rootfs"
  [[ -z "$old_rootfs" || "$old_rootfs" == "$(image_id "$ROOTFS_IMAGE")" ]] || "${PODMAN[@]}" rmi "$old_rootfs" >/dev/null 2>&1 || true
  pass base-import "$ROOTFS_IMAGE $(image_id "$ROOTFS_IMAGE")"

  # Certificate authorities this host adds (e.g. a TLS-inspecting egress proxy) so pip in the
  # containers trusts what the host trusts; nothing is copied where the host adds none.
  find /usr/local/share/ca-certificates -maxdepth 1 -name '*.crt' -exec cp {} "$ctx/ca/" \; 2>/dev/null || true
  touch "$ctx/ca/.keep"
  cat > "$ctx/Containerfile" <<EOF
FROM $ROOTFS_IMAGE
LABEL trainers.smoke.torch-wheel="$WHEEL_NAME"
COPY ca/ /usr/local/share/ca-certificates/
COPY wheel/$WHEEL_NAME /tmp/
# The real base (conda) lets pip install into its Python; Debian's PEP 668 marker forbids that for
# the system Python, so the stand-in removes it to behave like the real base (stand-in only).
RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED /usr/local/share/ca-certificates/.keep \\
    && update-ca-certificates \\
    && pip install --no-cache-dir /tmp/$WHEEL_NAME \\
    && rm /tmp/$WHEEL_NAME \\
    && python -c "import torch; print('torch', torch.__version__)"
CMD ["bash"]
EOF
  old_id=$(image_id "$BASE_IMAGE" || true)
  step base-build 0 "${PODMAN[@]}" build --force-rm --format docker "${LIMITS[@]}" -t "$BASE_IMAGE" "$ctx"
  [[ -z "$old_id" || "$old_id" == "$(image_id "$BASE_IMAGE")" ]] || "${PODMAN[@]}" rmi "$old_id" >/dev/null 2>&1 || true
  rm -rf "${ctx:?}"
  BASE_BUILT=1 BASE_S=$(since "$t0")
  pass base-build "$BASE_IMAGE $(image_id "$BASE_IMAGE"), $(image_size "$BASE_IMAGE") B"
  { printf 'id\t%s\t%s\t%s\n' "$(image_id "$BASE_IMAGE")" "$BASE_S" "$(date -u +%Y-%m-%dT%H:%M:%SZ)"; grep '^base-' "$CHECKS"; } > "$BASE_RECORD"
fi

# The build below needs PyPI from inside a container: say so in one line if it cannot reach it.
container netcheck
step network 0 "${PODMAN[@]}" run --rm --name "$C" "${LIMITS[@]}" "$BASE_IMAGE" python -c \
  'import urllib.request as u; print(u.urlopen("https://pypi.org/simple/pip/", timeout=30).status)'
pass network "a container reaches https://pypi.org over TLS"

# ---- 2. docker/Dockerfile, exactly as users build it -------------------------------------------
old_id=$(image_id "$IMAGE" || true)
t0=$EPOCHREALTIME
# --format docker: keep Docker's behaviour for SHELL (the OCI format would ignore it). --no-cache: the
# Dockerfile is what is under test, so apt and PyPI are asked again every run.
step image-build 0 "${PODMAN[@]}" build --no-cache --force-rm --format docker "${LIMITS[@]}" -f "$REPO/docker/Dockerfile" \
  --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$IMAGE" "$REPO"
IMAGE_S=$(since "$t0")
[[ -z "$old_id" || "$old_id" == "$(image_id "$IMAGE")" ]] || "${PODMAN[@]}" rmi "$old_id" >/dev/null 2>&1 || true
pass image-build "$IMAGE $(image_id "$IMAGE"), $(image_size "$IMAGE") B"

# ---- 3. the image as users run it --------------------------------------------------------------
# as the README runs it (--ipc=host; /workspace a host folder); --gpus is left out: there are none
RUN_KEEP=("${PODMAN[@]}" run "${LIMITS[@]}" --ipc=host -v "$WS:/workspace")
RUN=("${RUN_KEEP[@]}" --rm)

container help
step entry-help 0 "${RUN[@]}" --name "$C" "$IMAGE" help
expect entry-help "deploy [deploy_8gpu.sh options]"
pass entry-help "help lists the commands"

container shell
# shellcheck disable=SC2016  # $PWD is the container's, expanded there
step entry-shell 0 "${RUN[@]}" --name "$C" "$IMAGE" shell -c \
  'echo "shell ok in $PWD"; python -c "import sys, torch, onnxruntime, trainers; print(\"python\", sys.version.split()[0], \"torch\", torch.__version__, \"onnxruntime\", onnxruntime.__version__, \"trainers\", trainers.__version__)"'
expect entry-shell "shell ok in /workspace"
VERSIONS=$(grep '^python ' "$STEP_LOG" | head -n1)
pass entry-shell "$VERSIONS"

CUDA_FACTS=""
if [[ "$CUDA" -eq 1 ]]; then  # the CUDA stack inside the image: versions as torch reports them, libraries loaded
  container cuda
  step cuda-inside 0 "${RUN[@]}" --name "$C" --entrypoint python "$IMAGE" -c '
import ctypes, glob, json, os, sys, torch
import nvidia
found = {}
for lib in ("libcudart.so.*", "libcublas.so.*", "libcudnn.so.*", "libnccl.so.*"):
    paths = sorted(p for root in nvidia.__path__ for p in glob.glob(os.path.join(root, "*", "lib", lib)))
    assert paths, f"no {lib} in the nvidia-* wheels"
    ctypes.CDLL(paths[0])  # loads, with its own dependencies
    found[lib.split(".")[0]] = os.path.basename(paths[0])
facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
         "nccl": ".".join(map(str, torch.cuda.nccl.version())), "libraries_loaded": found,
         "cuda_available": torch.cuda.is_available()}
print("CUDA_FACTS " + json.dumps(facts, sort_keys=True))'
  expect cuda-inside '"cuda": "'
  CUDA_FACTS=$(grep '^CUDA_FACTS ' "$STEP_LOG" | head -n1 | cut -d' ' -f2-)
  pass cuda-inside "$CUDA_FACTS"
fi

container command
step entry-command 0 "${RUN[@]}" --name "$C" "$IMAGE" trainers --help
expect entry-command "usage: trainers"
pass entry-command "any other word runs as a command (trainers --help)"

container exit
step entry-exit 3 "${RUN[@]}" --name "$C" "$IMAGE" bash -c 'exit 3'
pass entry-exit "a command's exit status comes through tini and the entrypoint"

container deploy-help
step entry-deploy-help 0 "${RUN[@]}" --name "$C" "$IMAGE" deploy --help
expect entry-deploy-help "--demo"
pass entry-deploy-help "deploy passes its flags to deploy_8gpu.sh"

# A pod stop is SIGTERM to PID 1 (tini): it must reach the command, which then exits on its own terms.
container sigterm
STEP_LOG="$LOGS/entry-sigterm.log" STEP_CMD="podman run -d ... bash -c 'trap \"exit 42\" TERM; sleep 600 & wait'; podman stop -t 30"
echo "--> entry-sigterm: $STEP_CMD"
t0=$EPOCHREALTIME
"${RUN_KEEP[@]}" -d --name "$C" "$IMAGE" bash -c 'trap "echo got SIGTERM; exit 42" TERM; echo ready; sleep 600 & wait' \
  > "$STEP_LOG" 2>&1 || fail entry-sigterm 1 "podman run -d failed"
for _ in $(seq 60); do "${PODMAN[@]}" logs "$C" 2>/dev/null | grep -q ready && break; sleep 0.5; done
"${PODMAN[@]}" stop -t 30 "$C" >> "$STEP_LOG" 2>&1 || true
STEP_RC=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$C" 2>/dev/null || echo unknown)
"${PODMAN[@]}" logs "$C" >> "$STEP_LOG" 2>&1 || true
STEP_S=$(since "$t0")
[[ "$STEP_RC" == 42 ]] || fail entry-sigterm "$STEP_RC" "after podman stop the command exited $STEP_RC, not 42 from its SIGTERM trap (137: killed, SIGTERM never reached it)"
"${PODMAN[@]}" rm -f --ignore "$C" >/dev/null 2>&1 || true
pass entry-sigterm "podman stop's SIGTERM reached the command (exit 42 from its trap)"

container image-ssh
step image-ssh 0 "${RUN[@]}" --name "$C" --entrypoint /bin/bash "$IMAGE" -c \
  'test -x /usr/sbin/sshd && ls /etc/ssh && if ls /etc/ssh/ssh_host_*key* 2>/dev/null; then echo "host keys baked in"; exit 1; fi'
pass image-ssh "sshd installed; no host keys in the image (each container makes its own)"

container preflight
step preflight 1 "${RUN[@]}" --name "$C" "$IMAGE" preflight
expect preflight "no NVIDIA GPU"
expect preflight "--demo"
awk -v s="$STEP_S" 'BEGIN { exit !(s < 60) }' || fail preflight 1 "took $STEP_S s, not fast"
pass preflight "no GPU: exit 1 with the --demo hint"

# ---- 4. a pod as RunPod starts it: the user's key, port 22, the job, the container kept up -----
SSH_WORK="$WORK/ssh"
rm -rf "${SSH_WORK:?}"
mkdir -p "$SSH_WORK/fetched"
ssh-keygen -q -t ed25519 -N '' -C trainers-smoke-user -f "$SSH_WORK/id_user"
ssh-keygen -q -t ed25519 -N '' -C trainers-smoke-stranger -f "$SSH_WORK/id_stranger"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# -F /dev/null: none of this host's ssh configuration; a fresh known_hosts for this container's new host key
SSH_OPTS=(-F /dev/null -o IdentitiesOnly=yes -o BatchMode=yes -o ConnectTimeout=20 -o LogLevel=ERROR
          -o StrictHostKeyChecking=accept-new -o "UserKnownHostsFile=$SSH_WORK/known_hosts")
SSH_USER=(ssh "${SSH_OPTS[@]}" -i "$SSH_WORK/id_user" -p "$PORT" root@127.0.0.1)

container pod
begin deploy "podman run -d -e PUBLIC_KEY=<a key made for the test> -e TRAINER=forecast -e RUNPOD_PUBLIC_IP=127.0.0.1 -e RUNPOD_TCP_PORT_22=$PORT -p 127.0.0.1:$PORT:22 $IMAGE deploy --demo --out /workspace/output -- $(quote "${FORECAST_ARGS[@]}")"
"${RUN_KEEP[@]}" -d --name "$C" -e "PUBLIC_KEY=$(cat "$SSH_WORK/id_user.pub")" -e TRAINER=forecast \
  -e RUNPOD_PUBLIC_IP=127.0.0.1 -e "RUNPOD_TCP_PORT_22=$PORT" -p "127.0.0.1:$PORT:22" \
  "$IMAGE" deploy --demo --out /workspace/output -- "${FORECAST_ARGS[@]}" >> "$STEP_LOG" 2>&1 || fail deploy 1 "podman run -d failed"
wait_for deploy 1500 log_has "the container stays up"
save_logs
expect deploy "deploy finished"
expect deploy "entrypoint: SSH on: port 22"
done_ok deploy "forecast: train (torchrun, 2 gloo workers), export, package; the entrypoint said SSH on"
verify_tarball forecast

begin kept-up "5 s after the job: podman inspect .State.Running"
sleep 5
running "$C" || { save_logs; fail kept-up "$(exit_of "$C")" "the container ended after the job"; }
STEP_S=5.0
pass kept-up "the container is still up after the job, its log ends with the download line and how to stop it"

step ssh-status 0 "${SSH_USER[@]}" deploy_8gpu.sh status
expect ssh-status "forecast in /workspace/output: FINISHED"
expect ssh-status "download: scp -P $PORT root@127.0.0.1:/workspace/output/forecast.tar.gz ."
pass ssh-status "ssh with the test key: deploy_8gpu.sh status (found on the session's PATH) says FINISHED"

# shellcheck disable=SC2016  # expanded in the container
SESSION='echo "TRAINER=$TRAINER RUNPOD_TCP_PORT_22=$RUNPOD_TCP_PORT_22 python3=$(command -v python3) PATH=$PATH"'
step ssh-session 0 "${SSH_USER[@]}" "$SESSION; echo OUT=\$OUT; stat -c '%a %n' /root/.ssh /root/.ssh/authorized_keys"
# what the container's own processes see (podman exec, as RunPod's web terminal)
want=$("${PODMAN[@]}" exec "$C" bash -c "$SESSION" 2>&1) || fail ssh-session 1 "podman exec failed: $want"
[[ "$(head -n1 "$STEP_LOG")" == "$want" ]] || fail ssh-session 1 "an SSH session sees '$(head -n1 "$STEP_LOG")', the container '$want'"
expect ssh-session "OUT=/workspace/output"
expect ssh-session "700 /root/.ssh"
expect ssh-session "600 /root/.ssh/authorized_keys"
pass ssh-session "an SSH command sees the container's TRAINER, RUNPOD_*, PATH and python3, and OUT; /root/.ssh 700, authorized_keys 600"

# The download line exactly as the deploy printed it, with the test's key and known_hosts added
line=$("${PODMAN[@]}" logs "$C" 2>&1 | grep -o 'scp -P [0-9]* root@[^ ]*forecast\.tar\.gz \.$' | tail -n1 || true)
[[ -n "$line" ]] || fail scp 1 "no scp line in the container's log"
read -r -a words <<< "$line"
begin scp "(cd $SSH_WORK/fetched && $line && ${line/.tar.gz/.tar.gz.sha256} && sha256sum -c forecast.tar.gz.sha256)"
(cd "$SSH_WORK/fetched" && scp "${SSH_OPTS[@]}" -i "$SSH_WORK/id_user" "${words[@]:1}" \
  && scp "${SSH_OPTS[@]}" -i "$SSH_WORK/id_user" "${words[1]}" "${words[2]}" "${words[3]}.sha256" . \
  && sha256sum -c forecast.tar.gz.sha256) >> "$STEP_LOG" 2>&1 || fail scp 1 "the printed line '$line' did not fetch a tarball that sha256sum -c accepts"
cmp "$SSH_WORK/fetched/forecast.tar.gz" "$WS/output/forecast.tar.gz" >> "$STEP_LOG" 2>&1 || fail scp 1 "the fetched tarball differs from the one in /workspace"
done_ok scp "the printed line '$line' fetched it over SSH; sha256sum -c OK on the host"

step ssh-password 255 ssh "${SSH_OPTS[@]}" -o PubkeyAuthentication=no -o PreferredAuthentications=password,keyboard-interactive \
  -p "$PORT" root@127.0.0.1 true
expect ssh-password "Permission denied (publickey)."
pass ssh-password "password and keyboard-interactive login refused: the server offers publickey only"

step ssh-stranger 255 ssh "${SSH_OPTS[@]}" -i "$SSH_WORK/id_stranger" -p "$PORT" root@127.0.0.1 true
expect ssh-stranger "Permission denied (publickey)."
pass ssh-stranger "a key that is not PUBLIC_KEY is refused"

begin stop-kept-up "podman stop -t 10 (the pod's Stop, after the job)"
stop_pod stop-kept-up
STEP_RC=$STOP_RC
expect stop-kept-up "entrypoint: SIGTERM: stopping"
[[ "$STOP_RC" == 0 ]] || fail stop-kept-up "$STOP_RC" "exit $STOP_RC after a finished job, not 0"
STEP_S=$STOP_S
pass stop-kept-up "SIGTERM ended the kept-up container in $STOP_S s, exit 0 (sshd stopped, nothing killed)"

# ---- 5. without PUBLIC_KEY: SIGTERM in the middle of training, restart resumes; a failure is not rerun -
container stop
# more epochs than the pipeline test, so training is still going when the stop comes
begin stop-training "podman run -d $IMAGE deploy --demo --out /workspace/stopped -- ... --epochs 40; at the first training row: podman stop -t 10"
"${RUN_KEEP[@]}" -d --name "$C" "$IMAGE" deploy --demo --out /workspace/stopped -- "${FORECAST_ARGS[@]}" --epochs 40 \
  >> "$STEP_LOG" 2>&1 || fail stop-training 1 "podman run -d failed"
wait_for stop-training 1200 file_has "$WS/stopped/forecast/metrics.jsonl" '"kind": "train"'
stop_pod stop-training
STEP_RC=$STOP_RC
expect stop-training "entrypoint: SSH off: no PUBLIC_KEY given"
expect stop-training "deploy: got SIGTERM in phase 'train'"
grep -qx 'state=stopped' "$WS/stopped/deploy-forecast.state" || fail stop-training "$STOP_RC" "the state file does not say stopped"
reason=$(json_get "$WS/stopped/forecast/results.json" training stop_reason 2>/dev/null || echo none)
[[ "$reason" == signal ]] || fail stop-training "$STOP_RC" "results.json's stop_reason is '$reason', not signal"
metas=("$WS"/stopped/forecast/checkpoints/meta_*.json)
[[ -f "${metas[0]}" ]] || fail stop-training "$STOP_RC" "no complete checkpoint (meta_*.json) after the stop"
STEP_S=$STOP_S
pass stop-training "SSH off, said so; SIGTERM mid-training: $(basename "${metas[-1]}"), results.json stop_reason signal, state stopped; the container exited $STOP_RC (the deploy's code) in $STOP_S s"

begin resume "podman start (the pod started again): the stopped job resumes"
"${PODMAN[@]}" start "$C" >> "$STEP_LOG" 2>&1 || fail resume 1 "podman start failed"
wait_for resume 600 log_has "was stopped in phase train: resuming it"
wait_for resume 900 file_has "$WS/stopped/forecast/training.log" "resumed from checkpoint step"
STEP_S=$(since "$STEP_T0")
resumed=$(grep -o 'resumed from checkpoint step [0-9]*' "$WS/stopped/forecast/training.log" | tail -n1)
RESUME_S=$STEP_S
stop_pod resume
STEP_RC=$STOP_RC STEP_S=$RESUME_S
pass resume "on start the state file said stopped: the deploy ran again and $resumed (in $RESUME_S s); stopped again in $STOP_S s"

container failed
begin failed-not-rerun "podman run -d $IMAGE deploy --demo --out /workspace/failed -- ... --epochs 0; podman stop; podman start"
"${RUN_KEEP[@]}" -d --name "$C" "$IMAGE" deploy --demo --out /workspace/failed -- "${FORECAST_ARGS[@]}" --epochs 0 \
  >> "$STEP_LOG" 2>&1 || fail failed-not-rerun 1 "podman run -d failed"
wait_for failed-not-rerun 600 log_has "the deploy of forecast FAILED in phase train"
sleep 3
running "$C" || { save_logs; fail failed-not-rerun "$(exit_of "$C")" "the container ended after the failed job"; }
stop_pod failed-not-rerun
"${PODMAN[@]}" start "$C" >> "$STEP_LOG" 2>&1 || fail failed-not-rerun 1 "podman start failed"
wait_for failed-not-rerun 120 log_has "FAILED earlier in phase train (exit 2"
sleep 3
running "$C" || { save_logs; fail failed-not-rerun "$(exit_of "$C")" "the container ended after saying the job failed"; }
runs=$(grep -cE '^deploy_8gpu.sh [0-9]{4}-' "$WS/failed/deploy-forecast.log" || true)  # its first line, once per run
[[ "$runs" == 1 ]] || fail failed-not-rerun 1 "the deploy ran $runs times, not once"
stop_pod failed-not-rerun
STEP_RC=$STOP_RC
[[ "$STOP_RC" == 2 ]] || fail failed-not-rerun "$STOP_RC" "exit $STOP_RC, not the failed deploy's 2"
done_ok failed-not-rerun "failed in phase train, container kept up; restarted: not rerun (one deploy in its log), still up; stopped: exit 2"

if [[ "$GNN" -eq 1 ]]; then
  container gnn
  step gnn 0 "${RUN[@]}" --name "$C" -e EXIT_WHEN_DONE=1 "$IMAGE" gnn --demo --out /workspace/output "${GNN_ARGS[@]}"
  expect gnn "deploy finished"
  expect gnn "entrypoint: SSH off: no PUBLIC_KEY given"
  pass gnn "gnn with EXIT_WHEN_DONE=1: data, train (2 gloo workers), export, package, then the container exited 0"
  verify_tarball gnn
fi

summary true
echo "passed in $(since "$STARTED") s: image $IMAGE $(image_id "$IMAGE") ($(image_size "$IMAGE") B) on base $BASE_IMAGE; summary $OUT_JSON"
