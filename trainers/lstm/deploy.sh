#!/usr/bin/env bash
# The per-symbol LSTM's part of the deploy kit (sourced by deploy_8gpu.sh; hooks described in kit_lib.sh).
# shellcheck disable=SC2034  # TRAIN_ARGS is read by the kit

LSTM_SYMBOLS="${SYMBOLS:-}" LSTM_TICKERS_FILE="" LSTM_SOURCE="${SOURCE:-}" LSTM_EPOCHS=""
LSTM_YEARS="${YEARS:-10}" LSTM_JOBS_PER_GPU="${JOBS_PER_GPU:-1}"

trainer_usage() {
  cat <<'EOF_USAGE'
  --symbols A,B,C        one model per symbol (default: the S&P 500 list; 8 synthetic ones with --demo) [SYMBOLS]
  --tickers-file FILE    symbols from a file, one per line
  --source SPEC          yfinance (default: daily bars, cached under OUT/cache/lstm), cache, or file:PATH
                         (minute, hour or daily bars: date[+time], ticker, close; open, high,
                         low, volume optional: features needing one it lacks are left out)   [SOURCE]
  --years N              years of daily history (default: 10)                                   [YEARS]
  --epochs N             epochs per symbol (default: 20; 2 with --demo)
  --jobs-per-gpu K       workers sharing each GPU: torchrun starts K x GPUs per node (default: 1) [JOBS_PER_GPU]
EOF_USAGE
}

trainer_flag() {
  CONSUMED=2
  case "$1" in
    --symbols) need_value "$@"; LSTM_SYMBOLS="$2" ;;
    --tickers-file) need_value "$@"; LSTM_TICKERS_FILE="$2" ;;
    --source) need_value "$@"; LSTM_SOURCE="$2" ;;
    --years) need_value "$@"; LSTM_YEARS="$2" ;;
    --epochs) need_value "$@"; LSTM_EPOCHS="$2" ;;
    --jobs-per-gpu) need_value "$@"; LSTM_JOBS_PER_GPU="$2" ;;
    *) CONSUMED=0 ;;
  esac
}

trainer_defaults() {
  if [[ "$DEMO" -eq 1 ]]; then
    LSTM_EPOCHS="${LSTM_EPOCHS:-2}" LSTM_SOURCE="${LSTM_SOURCE:-synthetic}"
  else
    LSTM_EPOCHS="${LSTM_EPOCHS:-20}" LSTM_SOURCE="${LSTM_SOURCE:-yfinance}"
  fi
  is_uint "$LSTM_EPOCHS" && [[ "$LSTM_EPOCHS" -ge 1 ]] || die "--epochs '$LSTM_EPOCHS' must be a number >= 1"
  is_uint "$LSTM_JOBS_PER_GPU" && [[ "$LSTM_JOBS_PER_GPU" -ge 1 ]] || die "--jobs-per-gpu '$LSTM_JOBS_PER_GPU' must be a number >= 1"
  is_positive "$LSTM_YEARS" || die "--years '$LSTM_YEARS' must be a positive number"
  [[ -z "$LSTM_SYMBOLS" || -z "$LSTM_TICKERS_FILE" ]] || die "give --symbols or --tickers-file, not both"
  [[ "$LSTM_SOURCE" =~ ^(synthetic|yfinance|cache|file:.+)$ ]] || die "--source '$LSTM_SOURCE' must be yfinance, cache, synthetic or file:PATH"
}

trainer_data() {
  # Every worker reads the source itself; with yfinance the first one fetches what the cache lacks
  # (under the cache's lock) and the others find it fresh.
  echo "data: read by the training workers from --source $LSTM_SOURCE"
}

trainer_train_args() {
  TRAIN_ARGS=(--epochs "$LSTM_EPOCHS" --source "$LSTM_SOURCE")
  [[ -z "$LSTM_SYMBOLS" ]] || TRAIN_ARGS+=(--symbols "$LSTM_SYMBOLS")
  [[ -z "$LSTM_TICKERS_FILE" ]] || TRAIN_ARGS+=(--tickers-file "$LSTM_TICKERS_FILE")
  if [[ "$LSTM_SOURCE" == yfinance || "$LSTM_SOURCE" == cache ]]; then
    TRAIN_ARGS+=(--cache-dir "$OUT/cache/lstm" --years "$LSTM_YEARS")
  fi
  [[ "$DEMO" -eq 1 ]] || TRAIN_ARGS+=(--jobs-per-gpu "$LSTM_JOBS_PER_GPU")
}

trainer_workers_per_gpu() { echo "$LSTM_JOBS_PER_GPU"; }

trainer_report() { cat "$RUN_DIR/results.md"; }

trainer_verdict() {  # the deploy's exit code says whether every symbol succeeded (torchrun's cannot: see train.py)
  [[ "$DRY_RUN" -eq 0 ]] || return 0
  "$PY" - "$RUN_DIR/results.json" <<'EOF_PY'
import json, sys
results = json.load(open(sys.argv[1]))
failed = results.get("training", {}).get("failed_asked")  # this launch's symbols (earlier launches' are shown)
if failed is None:
    failed = sorted(s for s, r in (results.get("symbols") or {}).items() if r.get("status") == "failed")
print(f"symbols failed: {len(failed)}" + (f" ({', '.join(failed)})" if failed else ""))
sys.exit(1 if failed else 0)
EOF_PY
}
