#!/usr/bin/env bash
# The colouring GNN's part of the deploy kit (sourced by deploy_8gpu.sh; hooks described in kit_lib.sh).
# shellcheck disable=SC2034  # TRAIN_ARGS is read by the kit

GNN_TRAIN="" GNN_VAL="" GNN_MAX_NODES="" GNN_EPOCHS=""

trainer_usage() {
  cat <<'EOF_USAGE'
  --train N              training graphs to generate (default: 20000; 200 with --demo)
  --val N                validation graphs (default: 200; 32 with --demo)
  --max-nodes N          largest generated graph (default: 300; 100 with --demo)
  --epochs N             training epochs (default: 20; 3 with --demo)
EOF_USAGE
}

trainer_flag() {
  CONSUMED=2
  case "$1" in
    --train) need_value "$@"; GNN_TRAIN="$2" ;;
    --val) need_value "$@"; GNN_VAL="$2" ;;
    --max-nodes) need_value "$@"; GNN_MAX_NODES="$2" ;;
    --epochs) need_value "$@"; GNN_EPOCHS="$2" ;;
    *) CONSUMED=0 ;;
  esac
}

trainer_defaults() {
  if [[ "$DEMO" -eq 1 ]]; then
    GNN_TRAIN="${GNN_TRAIN:-200}" GNN_VAL="${GNN_VAL:-32}" GNN_MAX_NODES="${GNN_MAX_NODES:-100}" GNN_EPOCHS="${GNN_EPOCHS:-3}"
  else
    GNN_TRAIN="${GNN_TRAIN:-20000}" GNN_VAL="${GNN_VAL:-200}" GNN_MAX_NODES="${GNN_MAX_NODES:-300}" GNN_EPOCHS="${GNN_EPOCHS:-20}"
  fi
  local flag value
  for flag in train val max-nodes epochs; do
    value="GNN_${flag//-/_}"; value="${value^^}"
    is_uint "${!value}" && [[ "${!value}" -ge 1 ]] || die "--$flag '${!value}' must be a number >= 1"
  done
}

gnn_data_dir() { echo "$OUT/graphs_${GNN_TRAIN}_${GNN_VAL}_${GNN_MAX_NODES}"; }

trainer_data() {
  local data
  data="$(gnn_data_dir)"
  if [[ -f "$data/metadata.json" ]]; then echo "dataset already at $data"; return; fi
  run "$PY" -m trainers gnn data --out "$data" --train "$GNN_TRAIN" --val "$GNN_VAL" --max-nodes "$GNN_MAX_NODES"
}

trainer_train_args() {
  TRAIN_ARGS=(--data-dir "$(gnn_data_dir)" --epochs "$GNN_EPOCHS")
  # the demo's 200 small graphs hold ~12k nodes: smaller steps, so 3 epochs are more than 6 steps;
  # and a short search per graph in the final evaluation (a real run gives each graph up to 2 s)
  if [[ "$DEMO" -eq 1 ]]; then TRAIN_ARGS+=(--nodes-per-batch 1024 --search-iters 2000); fi
}

trainer_report() { cat "$RUN_DIR/results.md"; }
