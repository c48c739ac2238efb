#!/usr/bin/env bash
# The CLSTM-PPO trading agent's part of the deploy kit (sourced by deploy_8gpu.sh; hooks described in kit_lib.sh).
# shellcheck disable=SC2034  # TRAIN_ARGS is read by the kit

PPO_YEARS="${PPO_YEARS:-}" PPO_EPISODES="${PPO_EPISODES:-}" PPO_SEEDS="${PPO_SEEDS:-}" PPO_STOCKS="${PPO_STOCKS:-}"

trainer_usage() {
  cat <<'EOF_USAGE'
  --years N              years of S&P 500 history to fetch (default: 25)                [PPO_YEARS]
  --num-episodes N       training episodes per agent (default: 2000; 20 with --demo)     [PPO_EPISODES]
  --seeds N              agents per encoder, reported as mean +- std (default: 3; 2 with --demo) [PPO_SEEDS]
  --num-stocks N         stocks in the portfolio (default: 30; 5 with --demo)             [PPO_STOCKS]
EOF_USAGE
}

trainer_flag() {
  CONSUMED=2
  case "$1" in
    --years) need_value "$@"; PPO_YEARS="$2" ;;
    --num-episodes) need_value "$@"; PPO_EPISODES="$2" ;;
    --seeds) need_value "$@"; PPO_SEEDS="$2" ;;
    --num-stocks) need_value "$@"; PPO_STOCKS="$2" ;;
    *) CONSUMED=0 ;;
  esac
}

trainer_defaults() {
  if [[ "$DEMO" -eq 1 ]]; then
    PPO_EPISODES="${PPO_EPISODES:-20}" PPO_SEEDS="${PPO_SEEDS:-2}" PPO_STOCKS="${PPO_STOCKS:-5}"
  else
    PPO_EPISODES="${PPO_EPISODES:-2000}" PPO_SEEDS="${PPO_SEEDS:-3}" PPO_STOCKS="${PPO_STOCKS:-30}"
  fi
  PPO_YEARS="${PPO_YEARS:-25}"
  is_positive "$PPO_YEARS" || die "--years '$PPO_YEARS' must be a positive number"
  is_uint "$PPO_EPISODES" && [[ "$PPO_EPISODES" -ge 1 ]] || die "--num-episodes '$PPO_EPISODES' must be a number >= 1"
  is_uint "$PPO_SEEDS" && [[ "$PPO_SEEDS" -ge 1 ]] || die "--seeds '$PPO_SEEDS' must be a number >= 1"
  is_uint "$PPO_STOCKS" && [[ "$PPO_STOCKS" -ge 2 ]] || die "--num-stocks '$PPO_STOCKS' must be a number >= 2"
}

trainer_data() {
  if [[ "$DEMO" -eq 1 ]]; then echo "demo: synthetic market, nothing to fetch"; return; fi
  # resumable: fetches only what the cache lacks (shared with the forecaster's cache)
  run "$PY" -m trainers fetch-sp500 --years "$PPO_YEARS" --cache-dir "$OUT/cache/sp500"
}

trainer_train_args() {
  TRAIN_ARGS=(--num-episodes "$PPO_EPISODES" --seeds "$PPO_SEEDS" --num-stocks "$PPO_STOCKS")
  if [[ "$DEMO" -eq 1 ]]; then
    TRAIN_ARGS+=(--source synthetic --synthetic-tickers 8 --synthetic-days 1000 --window 10 --episode-days 60
                 --num-envs 16 --rollout-steps 32 --batch-size 128 --hidden 32)
  else
    TRAIN_ARGS+=(--source cache --cache-dir "$OUT/cache/sp500" --years "$PPO_YEARS")
  fi
}

trainer_report() { cat "$RUN_DIR/results.md"; }
