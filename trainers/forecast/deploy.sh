#!/usr/bin/env bash
# The forecaster's part of the deploy kit (sourced by deploy_8gpu.sh; hooks described in kit_lib.sh).
# shellcheck disable=SC2034  # PRESET, YEARS, UNIVERSE, TRAIN_ARGS and CHECK_ARGS are read by the kit

PRESET="${PRESET:-}"
YEARS="${YEARS:-25}"
UNIVERSE="${UNIVERSE:-sp500}"

trainer_usage() {
  cat <<'EOF_USAGE'
  --preset NAME          tiny | small | base | 151m (default: 151m, tiny with --demo) [PRESET]
  --years N              years of S&P 500 history to fetch (default: 25)           [YEARS]
  --universe NAME        sp500 (today's members) | sp500-pit (every member of the
                         index's history, each used only while it was in; default: sp500) [UNIVERSE]
EOF_USAGE
}

trainer_flag() {
  CONSUMED=2
  case "$1" in
    --preset) need_value "$@"; PRESET="$2" ;;
    --years) need_value "$@"; YEARS="$2" ;;
    --universe) need_value "$@"; UNIVERSE="$2" ;;
    *) CONSUMED=0 ;;
  esac
}

trainer_defaults() {
  if [[ "$DEMO" -eq 1 ]]; then PRESET="${PRESET:-tiny}"; else PRESET="${PRESET:-151m}"; fi
  [[ "$PRESET" =~ ^(tiny|small|base|151m)$ ]] || die "--preset '$PRESET' must be one of: tiny, small, base, 151m"
  is_positive "$YEARS" || die "--years '$YEARS' must be a positive number"
  [[ "$UNIVERSE" =~ ^(sp500|sp500-pit)$ ]] || die "--universe '$UNIVERSE' must be one of: sp500, sp500-pit"
}

trainer_data() {
  if [[ "$DEMO" -eq 1 ]]; then echo "demo: synthetic data, nothing to fetch"; return; fi
  # resumable: fetches only what the cache lacks
  run "$PY" -m trainers fetch-sp500 --years "$YEARS" --universe "$UNIVERSE" --cache-dir "$OUT/cache/sp500"
}

trainer_train_args() {
  TRAIN_ARGS=(--preset "$PRESET")
  if [[ "$DEMO" -eq 1 ]]; then
    TRAIN_ARGS+=(--source synthetic)
  else
    TRAIN_ARGS+=(--source cache --cache-dir "$OUT/cache/sp500" --years "$YEARS" --universe "$UNIVERSE")
  fi
}

trainer_check_args() {
  # The check plans before the data phase fills the cache (empty, or part of it after a lost pod): the job as the
  # fetch will leave it, which the plan estimates for yfinance; counted on the cache, a part of it was too little
  if [[ "$DEMO" -eq 0 ]]; then
    CHECK_ARGS=(--preset "$PRESET" --source yfinance --cache-dir "$OUT/cache/sp500" --years "$YEARS"
                --universe "$UNIVERSE")
  fi
}
