#!/usr/bin/env bash
# One lent GPU session's device checks, in priority order, inside one `run` call (about 9 minutes):
#   bash bench/gpu_session.sh OUT_DIR
# 1. the plan's predictions, the forecaster's real loop at the deploy's default preset (151m; it died at its
#    first CUDA step at a09b8e2) and PPO at its GPU-sized defaults;
# 2. the LSTM job in cohorts vs one symbol at a time (64 symbols; 500 in cohorts);
# 3. the forecaster's whole deploy on the GPU (preflight, install, check, train, ONNX export with
#    onnxruntime parity, package) on synthetic data, the small preset, a 30-second budget;
# 4. the GNN's and the LSTM job's real loops.
# Everything lands in OUT_DIR: bench/gpu.py's record, JSONs and logs, the deploy's log and results, one tarball.
set -euo pipefail
out="${1:?usage: bash bench/gpu_session.sh OUT_DIR}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
mkdir -p "$out/bench"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/bench/nvidia_smi.txt"
status=0
bench() { python3 bench/gpu.py --out-dir "$out/bench" "$@" || status=1; }
bench --only plan,run_forecast,run_ppo --total-min 2.6
bench --only lstm_cohort --timeout lstm_cohort=190 --total-min 3.4
deploy="$out/deploy"
timeout -k 10 140 env TRAINERS_PYTHON=python3 bash deploy_8gpu.sh --trainer forecast --foreground --skip-data \
  --preset small --max-hours 0.008 --usd-per-gpu-hour 3 --out "$deploy" -- --source synthetic \
  >"$out/bench/deploy-forecast.out" 2>&1 || { echo "deploy failed: exit $?"; status=1; }
tail -5 "$out/bench/deploy-forecast.out"
if [[ -d "$deploy" ]]; then  # its small files (the checkpoints and the ONNX file stay behind)
  (cd "$out" && find deploy -maxdepth 4 -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.sha256' \) \
    -size -4M -exec cp --parents {} bench \;)
fi
bench --only run_gnn,run_lstm --total-min 1.1
tar -C "$out" -czf "$out/gpu_session.tar.gz" bench
cp "$out/bench/gpu_steps.json" "$out/bench/gpu_summary.md" "$out/" 2>/dev/null || true
exit "$status"
