#!/usr/bin/env bash
# Build the kit's image, tagged with the git commit and `latest`; push only with --push.
#   bash build_and_push.sh --image docker.io/me/trainers [--push] [--base-image IMAGE]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
IMAGE="${IMAGE:-}"
BASE_IMAGE="${BASE_IMAGE:-}"
PUSH=0
DRY_RUN=0

die() { echo "error: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --image) [[ $# -ge 2 ]] || die "--image needs a value"; IMAGE="$2"; shift 2 ;;
    --base-image) [[ $# -ge 2 ]] || die "--base-image needs a value"; BASE_IMAGE="$2"; shift 2 ;;
    --push) PUSH=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (use --image NAME [--push] [--base-image IMAGE] [--dry-run])" ;;
  esac
done
[[ -n "$IMAGE" ]] || die "no image name: pass --image NAME or set IMAGE (e.g. docker.io/you/trainers)"
command -v docker >/dev/null 2>&1 || die "docker is not installed or not on PATH; build on a machine with Docker"

COMMIT="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo nogit)"
if [[ -n "$(git -C "$REPO" status --porcelain 2>/dev/null)" ]]; then COMMIT="$COMMIT-dirty"; fi

run() { if [[ "$DRY_RUN" -eq 1 ]]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi; }

build_args=(--build-arg "GIT_COMMIT=$COMMIT")
[[ -z "$BASE_IMAGE" ]] || build_args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
run docker build -f "$REPO/docker/Dockerfile" "${build_args[@]}" -t "$IMAGE:$COMMIT" -t "$IMAGE:latest" "$REPO"
if [[ "$PUSH" -eq 1 ]]; then
  run docker push "$IMAGE:$COMMIT"
  run docker push "$IMAGE:latest"
else
  echo "built $IMAGE:$COMMIT and $IMAGE:latest (not pushed; add --push)"
fi
