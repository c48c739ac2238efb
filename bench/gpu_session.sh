#!/usr/bin/env bash
# A lent GPU session's device checks in priority order, in two calls of under 10 minutes each (a session
# has 15 device-minutes, the machine's start included; the first H100 session's figures sized them):
#   bash bench/gpu_session.sh 1 OUT_DIR   # ~8 min: the disk's durable write (bench/disk_write.py, seconds); the
#                                         # plan's predictions; the forecaster's real loop at the
#                                         # deploy's default preset (151m); PPO at its GPU-sized defaults;
#                                         # the LSTM job in cohorts vs one symbol at a time (64; 500 in cohorts)
#   bash bench/gpu_session.sh 2 OUT_DIR   # ~8 min: the forecaster's whole deploy on the GPU (preflight,
#                                         # install, check, train, ONNX export with onnxruntime parity, package)
#                                         # on synthetic data, small preset, 30 s budget; the GNN's (compiled)
#                                         # and the LSTM job's real loops; a real kernel fault in an LSTM
#                                         # cohort, survived by torchrun's restart; PPO with its rollout step captured;
#                                         # PPO's backtest both ways (bench/ppo_backtest.py); PPO's update
#                                         # under torch.profiler (bench/profile_job.py --ops); a 64-symbol
#                                         # LSTM cohort job under cProfile (bench/profile_job.py)
#   bash bench/gpu_session.sh 33 OUT_DIR  # ~9.5-10 min (run it under `timeout 575`: the last steps, measured
#                                         # before, may be cut; 533 s at 1adc135), for a session with one call's
#                                         # time: the LSTM export's parity threads (seconds), then issue 33's
#                                         # GPU targets (the plan; the LSTM job in cohorts,
#                                         # 64 and 500 symbols; PPO at its GPU-sized defaults; the GNN at its GPU
#                                         # step), then the 500-symbol cohort job with its ONNX exports, PPO with
#                                         # its rollout step captured, the 64-symbol cohort
#                                         # job with its checkpoints written in the loop, the GIL's convoy, the
#                                         # cohort job with launches blocking (its true share outside the steps)
#                                         # and profiled, the real kernel fault in an LSTM cohort
#   bash bench/gpu_session.sh 34 OUT_DIR  # part 33's steps with what the H200 at 1adc135 left open first: the
#                                         # parity threads, the 500-symbol job with its exports and the same job
#                                         # without (both on every core: what the exports cost, clean), PPO's
#                                         # captured rollout (its fix), the blocking cohort job's parts and its
#                                         # profile; then the GPU targets measured there again (run it under
#                                         # `timeout 575`; the last may be cut)
#   bash bench/gpu_session.sh 35 OUT_DIR  # ~2.5 min, for a session's last 4-5 device-minutes: the GNN's job
#                                         # compiled (then the CUDA default) and eager, same data, same machine (does
#                                         # the compile pay on the default job?), and PPO eager at the 2,048
#                                         # environments part 34's captured rollout ran at
#   bash bench/gpu_session.sh 36 OUT_DIR  # ~7 min: the 500-symbol job --no-export with its new bests written
#                                         # (--ckpt-at-eval improved: 63.9 s on the H200 at eab6a5d) and held (the
#                                         # default since --ckpt-at-eval held; bench/lstm_ckpt_at_eval.py), then
#                                         # the same job --no-export, exporting in the worker (--no-export-behind:
#                                         # 97.7 s there) and behind the training (the GPU default since
#                                         # --export-behind), one command apart (bench/lstm_export_behind.py),
#                                         # then the GNN's GPU step once more (a third run for the plan's median)
#   bash bench/gpu_session.sh 37 OUT_DIR  # ~8 min (under `timeout 575`): the 64-symbol job three ways (one cohort: every
#                                         # export after its training, where the plan says behind is the slower), the
#                                         # 500-symbol job as a deploy runs it (held, exports behind; the plan: 75 s),
#                                         # the plan's GPU targets again (plan, run_gnn, run_ppo), then lstm_cohort
#   bash bench/gpu_session.sh 38 OUT_DIR  # ~12.5 min (under `timeout 575`: its last steps, from the plan's targets
#                                         # on, are cut; each was measured in earlier sessions): the
#                                         # LSTM job's end of budget on the GPU (bench/lstm_budget_end.py --jobs gpu:
#                                         # the 500-symbol job with a 45-s budget, cohorts sized for the card and of
#                                         # 64: does it end inside it?), PPO's probability ratio before its first
#                                         # step in fp32, TF32 and bf16 (bench/ppo_ratio_noise.py), then part 37's
#                                         # steps
# Each call leaves in OUT_DIR bench/gpu.py's record, JSONs and logs (and the deploy's small files) and one
# tarball of them, gpu_session.tar.gz (a call brings back at most 8 files).
set -euo pipefail
part="${1:?usage: bash bench/gpu_session.sh 1|2|33|34|35|36|37|38 OUT_DIR}"
out="${2:?usage: bash bench/gpu_session.sh 1|2|33|34|35|36|37|38 OUT_DIR}"
[[ "$part" =~ ^(1|2|33|34|35|36|37|38)$ ]] || { echo "bench/gpu_session.sh: part '$part' must be 1, 2, 33, 34, 35, 36, 37 or 38" >&2; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
mkdir -p "$out/bench"
# the tarball of what finished, however the call ends: run it as `timeout 570 bash bench/gpu_session.sh N OUT`
# inside a device call's 600 s, and a cut session still brings back every step done before the cut
trap 'tar -C "$out" -czf "$out/gpu_session.tar.gz" bench' EXIT
# A step under its own time limit runs in the background and is waited for: a TERM to this script (the call's
# `timeout`) interrupts the wait at once and the trap passes it to the step's `timeout`, which ends the step's
# whole process group. Run in the foreground, a step (its own process group, out of the TERM's reach) held the
# trap until its own limit, so the tarball could come after the device call was gone.
step_pid=""
step() { timeout -k 10 "$@" & step_pid=$!; wait "$step_pid"; }
trap 'if [[ -n "$step_pid" ]]; then kill -TERM "$step_pid" 2>/dev/null || true; fi; exit 143' TERM INT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/bench/nvidia_smi.txt"
status=0
bench() { python3 bench/gpu.py --out-dir "$out/bench" "$@" || status=1; }
# a durable small write on this host's disk (~15 a symbol in the LSTM job; under 1 ms on the dev VM): seconds
disk_write() {
  step 60 python3 bench/disk_write.py --dir "$out" --out "$out/bench/disk_write_gpu.json" \
    >/dev/null 2>&1 || { echo "disk_write failed: exit $?"; status=1; }
}
lost_context() {
  step 90 env TRAINERS_FAULT_RAISE=SYN001@step2:lost python3 -m torch.distributed.run --standalone --nproc_per_node=1 \
    --max-restarts=1 -m trainers lstm train --run-dir "$out/lstm_lost" --synthetic-tickers 4 --synthetic-days 600 \
    --window 16 --hidden 8 --epochs 2 --no-export --cohort 4 --device auto >"$out/bench/lstm_lost.log" 2>&1 \
    || { echo "lstm broken-context job failed: exit $?"; status=1; }
  python3 bench/lost_context_check.py --run-dir "$out/lstm_lost" --log "$out/bench/lstm_lost.log" \
    --out "$out/bench/lstm_lost_check.json" || { echo "lstm broken-context check failed"; status=1; }
}
ppo_graphs() {
  step 150 python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m trainers ppo train \
    --run-dir "$out/ppo_graphs" --total-steps 2097152 --no-baseline-mlp --log-every 1 --eval-every 4 \
    --compile-rollout graphs >"$out/bench/ppo_graphs.log" 2>&1 || { echo "ppo --compile-rollout graphs failed: exit $?"; status=1; }
  cp "$out/ppo_graphs/results.json" "$out/bench/ppo_graphs_results.json" 2>/dev/null || true
}
# the same 64-symbol cohort job with every launch synchronous (CUDA_LAUNCH_BLOCKING=1): the job times its steps
# on the host, which otherwise does not wait for the device, so its share outside the steps counts the steps'
# device work the host waits for later; serialised, each part holds its own device work (both slower than usual).
# Its row's phase_s splits the time outside the steps by the parts of the cohort's loop (trainers.lstm.cohort.PHASES:
# 67 % of the job was outside the steps on the H200 at 1adc135, which part unknown)
cohort_blocking() {
  step 90 env CUDA_LAUNCH_BLOCKING=1 python3 bench/lstm_pack.py --symbols 64 --cohorts auto --baseline-max 0 \
    --shape default --epochs 5 --device auto --out "$out/bench/cohort_packing_blocking_gpu.json" \
    >"$out/bench/cohort_packing_blocking_gpu.log" 2>&1 || { echo "lstm cohort job, launches blocking, failed: exit $?"; status=1; }
}
# the same 64-symbol cohort job with its checkpoints written in the loop (--no-ckpt-async): on the H200 (aadb2aa) the
# profile of the default (each member's write behind the loop in a thread of its own, all at once then) put its main
# thread's largest times in calls that wait for the GIL while those threads pickle; the writes now take turns
# (bench/gil_convoy.py, below). Its job wall (results.json) against the lstm_cohort step's 64-symbol cohort row
# (cohort_packing_gpu.json, the same job with its writes behind the loop) says which is faster on a GPU
cohort_saves_in_loop() {
  step 60 python3 -m trainers lstm train --synthetic-tickers 64 --epochs 5 --patience 0 --no-export --device auto \
    --no-ckpt-async --run-dir "$out/lstm_saves_in_loop" >"$out/bench/cohort_saves_in_loop.log" 2>&1 \
    || { echo "lstm cohort job, saves in the loop, failed: exit $?"; status=1; }
  cp "$out/lstm_saves_in_loop/results.json" "$out/bench/cohort_saves_in_loop_results.json" 2>/dev/null || true
}
# the 500-symbol cohort job with its ONNX exports on (the default, behind the training on a GPU since --export-behind;
# the lstm_cohort step's jobs are --no-export): its
# job wall against that step's 500-symbol cohort row is what the exports cost on this host's CPU (the first symbol's
# torch.onnx.export and the one that works out the reuse, then each symbol's reused graph and parity check;
# bench/results/lstm_export_default_cpu.json on the dev VM), beside the plan's 162 s for it on an H200
# (bench/results/plan_lstm500_h200_export.json; the H200 at 1adc135: 157.9 s, before the parity check's one thread)
cohort_export() {
  step 200 python3 -m trainers lstm train --synthetic-tickers 500 --epochs 5 --patience 0 --device auto \
    --run-dir "$out/lstm_exported" >"$out/bench/cohort_export.log" 2>&1 \
    || { echo "lstm cohort job with exports failed: exit $?"; status=1; }
  cp "$out/lstm_exported/results.json" "$out/bench/cohort_export_results.json" 2>/dev/null || true
  cp "$out/lstm_exported/symbols/SYN000/export.json" "$out/bench/cohort_export_SYN000.json" 2>/dev/null || true
  cp "$out/lstm_exported/symbols/SYN001/export.json" "$out/bench/cohort_export_SYN001.json" 2>/dev/null || true
}
# the 500-symbol job --no-export with its new bests written (improved) or held in host memory until each symbol's
# next checkpoint (held, the default since --ckpt-at-eval held); every symbol's final evaluation compared
ckpt_held() {
  step 240 python3 bench/lstm_ckpt_at_eval.py --ways improved,held --out "$out/bench/lstm_ckpt_at_eval_gpu.json" -- \
    --synthetic-tickers 500 --epochs 5 --patience 0 --device auto --no-export \
    >"$out/bench/lstm_ckpt_at_eval_gpu.log" 2>&1 || { echo "lstm_ckpt_at_eval failed: exit $?"; status=1; }
}
# the 500-symbol job three ways, one command apart (bench/lstm_export_behind.py: its record after each): --no-export,
# exporting in the worker (--no-export-behind: what every GPU job did before) and behind the training (the GPU
# default since --export-behind); the model.onnx files of the two exporting ways compared byte for byte
export_behind() {
  step 420 python3 bench/lstm_export_behind.py --out "$out/bench/lstm_export_behind_gpu.json" -- \
    --synthetic-tickers 500 --epochs 5 --patience 0 --device auto >"$out/bench/lstm_export_behind_gpu.log" 2>&1 \
    || { echo "lstm_export_behind failed: exit $?"; status=1; }
}
# the 64-symbol job three ways, one command apart: one cohort, so every export comes after its training, where the
# plan says the exporter (one thread) is slower than the worker (bench/results/plan_lstm64_h200_export_behind.json:
# 29 s behind, 26 s in the worker, 10 s without; made at f342003)
export_behind_64() {
  step 150 python3 bench/lstm_export_behind.py --out "$out/bench/lstm_export_behind64_gpu.json" -- \
    --synthetic-tickers 64 --epochs 5 --patience 0 --device auto >"$out/bench/lstm_export_behind64_gpu.log" 2>&1 \
    || { echo "lstm_export_behind (64) failed: exit $?"; status=1; }
}
# the 500-symbol job as a GPU deploy runs it (held checkpoints, exports behind): its job wall beside the plan's 75 s
# (bench/results/plan_lstm500_h200_export_behind.json) and the 78.6 s of the behind way (gpu_h200/lstm_export_behind_gpu.json)
cohort_default() {
  step 200 python3 -m trainers lstm train --synthetic-tickers 500 --epochs 5 --patience 0 --device auto \
    --run-dir "$out/lstm_default" >"$out/bench/cohort_default.log" 2>&1 \
    || { echo "lstm cohort job (the defaults) failed: exit $?"; status=1; }
  cp "$out/lstm_default/results.json" "$out/bench/cohort_default_results.json" 2>/dev/null || true
}
# the same 500-symbol job with --no-export, as the CLI runs it (torch on every core; the lstm_cohort step's row
# runs torch on one thread): cohort_export's wall less this one is what the exports cost, clean
cohort_noexport() {
  step 120 python3 -m trainers lstm train --synthetic-tickers 500 --epochs 5 --patience 0 --device auto --no-export \
    --run-dir "$out/lstm_noexport" >"$out/bench/cohort_noexport.log" 2>&1 \
    || { echo "lstm cohort job without exports failed: exit $?"; status=1; }
  cp "$out/lstm_noexport/results.json" "$out/bench/cohort_noexport_results.json" 2>/dev/null || true
}
# the GNN's job (run_gnn's data and options, 6 epochs) eager and compiled: at 65,536 nodes a step the H200 spent
# 16-18 s of a 22-24 s run compiling for ~0.35 s of steady steps (gpu_h200/run_gnn_gpu.runs.json, runs 2 and 3): whether
# the compile pays on a job of this length. Each job's command wall (process start to exit) in gnn_walls.txt
gnn_compile_or_not() {
  step 60 python3 -m trainers gnn data --out "$out/graphs" --train 7000 --val 32 --no-progress --overwrite \
    >"$out/bench/gnn_data.log" 2>&1 || { echo "gnn data failed: exit $?"; status=1; return; }
  local mode started
  for mode in no-compile compile; do
    started=$(date +%s.%N)
    step 120 python3 -m trainers gnn train --data-dir "$out/graphs" --run-dir "$out/gnn_$mode" --epochs 6 \
      --search-iters 2000 --search-seconds 0.2 --log-every 10 "--$mode" >"$out/bench/gnn_$mode.log" 2>&1 \
      || { echo "gnn train --$mode failed: exit $?"; status=1; }
    echo "$mode $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$started" "$(date +%s.%N)")" \
      >>"$out/bench/gnn_walls.txt"
    cp "$out/gnn_$mode/results.json" "$out/bench/gnn_${mode}_results.json" 2>/dev/null || true
  done
}
# PPO eager at the environments ppo_graphs ran at (2,048: sized from the same --total-steps), its comparison
ppo_eager_2048() {
  step 120 python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m trainers ppo train \
    --run-dir "$out/ppo_eager" --total-steps 2097152 --no-baseline-mlp --log-every 1 --eval-every 4 \
    >"$out/bench/ppo_eager.log" 2>&1 || { echo "ppo eager failed: exit $?"; status=1; }
  cp "$out/ppo_eager/results.json" "$out/bench/ppo_eager_results.json" 2>/dev/null || true
}
# the LSTM export's parity check with onnxruntime on its default threads and on one, beside torch on one thread
# and on every core (the H200 at 1adc135: 0.16-0.2 s a reused symbol, the dev VM 0.043 s; seconds)
parity_threads() {
  step 90 python3 bench/onnx_parity_threads.py --out "$out/bench/onnx_parity_threads_gpu.json" \
    >"$out/bench/onnx_parity_threads_gpu.log" 2>&1 || { echo "onnx_parity_threads failed: exit $?"; status=1; }
}
# the GIL's convoy on this host: a main-thread op beside checkpoint writers at once and taking turns (seconds)
gil_convoy() {
  step 60 python3 bench/gil_convoy.py --dir "$out" --out "$out/bench/gil_convoy_gpu.json" \
    >"$out/bench/gil_convoy_gpu.log" 2>&1 || { echo "gil_convoy failed: exit $?"; status=1; }
}
profile_lstm_cohort() {
  step 120 python3 bench/profile_job.py --out "$out/bench/profile_lstm_cohort_gpu.json" -- lstm train \
    --synthetic-tickers 64 --epochs 5 --patience 0 --no-export --device auto --run-dir "$out/lstm_profiled" \
    >"$out/bench/profile_lstm_cohort_gpu.log" 2>&1 || { echo "profile_job failed: exit $?"; status=1; }
}
if [[ "$part" == 1 ]]; then
  disk_write
  bench --only plan,run_forecast,run_ppo --total-min 3.3
  bench --only lstm_cohort --timeout lstm_cohort=270 --total-min 4.6
elif [[ "$part" == 33 ]]; then
  disk_write
  parity_threads
  bench --only plan --total-min 0.5
  bench --only lstm_cohort --timeout lstm_cohort=240 --total-min 4
  bench --only run_ppo,run_gnn --total-min 2
  # (by priority: a cut at the call's limit loses the last; the broken-context check passed on the H200 at aadb2aa)
  cohort_export
  ppo_graphs
  cohort_saves_in_loop
  gil_convoy
  cohort_blocking
  profile_lstm_cohort
  lost_context
elif [[ "$part" == 34 ]]; then
  disk_write
  parity_threads
  cohort_export
  cohort_noexport
  ppo_graphs
  cohort_blocking
  profile_lstm_cohort
  bench --only plan --total-min 0.5
  bench --only run_ppo,run_gnn --total-min 2
  cohort_saves_in_loop
  gil_convoy
  bench --only lstm_cohort --timeout lstm_cohort=240 --total-min 4
elif [[ "$part" == 35 ]]; then
  gnn_compile_or_not
  ppo_eager_2048
elif [[ "$part" == 36 ]]; then
  ckpt_held
  export_behind
  bench --only run_gnn --total-min 1.2
elif [[ "$part" == 37 || "$part" == 38 ]]; then
  if [[ "$part" == 38 ]]; then  # two 500-symbol jobs of a 45-s budget each, their set-up and ends (~2.5 min)
    step 200 python3 bench/lstm_budget_end.py --jobs gpu --out "$out/bench/lstm_budget_end_gpu.json" \
      >"$out/bench/lstm_budget_end_gpu.log" 2>&1 || { echo "lstm budget end failed: exit $?"; status=1; }
    # PPO's probability ratio before its first step, fp32 / the card's TF32 / bf16 / the compiled rollout, beside
    # the CPU's emulation of each (does TF32, on for the policy's matmuls, make the ratio noisy? 16 rows of one
    # rollout and its first epoch each, at 1,024 environments to keep it to a minute or two: unmeasured there)
    step 150 python3 bench/ppo_ratio_noise.py --device cuda --compiled --num-envs 1024 \
      --out "$out/bench/ppo_ratio_noise_gpu.json" \
      >"$out/bench/ppo_ratio_noise_gpu.log" 2>&1 || { echo "ppo_ratio_noise failed: exit $?"; status=1; }
  fi
  export_behind_64
  cohort_default
  bench --only plan,run_gnn,run_ppo --total-min 3.5
  bench --only lstm_cohort --timeout lstm_cohort=240 --total-min 4
else
  deploy="$out/deploy"
  step 180 env TRAINERS_PYTHON=python3 bash deploy_8gpu.sh --trainer forecast --foreground --skip-data \
    --preset small --max-hours 0.008 --usd-per-gpu-hour 3 --out "$deploy" -- --source synthetic \
    >"$out/bench/deploy-forecast.out" 2>&1 || { echo "deploy failed: exit $?"; status=1; }
  tail -5 "$out/bench/deploy-forecast.out"
  if [[ -d "$deploy" ]]; then  # its small files (the checkpoints and the ONNX file stay behind)
    (cd "$out" && find deploy -maxdepth 4 -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.sha256' \) \
      -size -4M -exec cp --parents {} bench \;)
  fi
  bench --only run_gnn,run_lstm --total-min 2
  # a real kernel fault in an LSTM cohort (TRAINERS_FAULT_RAISE's `lost` on CUDA: an index out of bounds, a
  # device-side assert that breaks the context): the worker records no failure and exits 1, torchrun restarts it
  # with a fresh context, and the job completes. torchrun's exit says little (failed symbols exit 0 under it):
  # bench/lost_context_check.py reads the log and the folder (CUDA's own words recognised, not the CPU's
  # simulation; 4 symbols ok, none failed; SYN001 on restart 1, try 1) and writes its verdict
  lost_context
  # PPO's rollout step captured as a CUDA graph (--compile-rollout graphs, off by default until measured): the
  # run_ppo step's job, its results.json beside run_ppo_gpu.json (per_s_steady under training.throughput)
  ppo_graphs
  # PPO's backtest (every validation and the final test) both ways on the GPU, one run: the market's part in
  # batched passes against the day-by-day loop it replaced (204 -> 74 aten ops a simulated day on the CPU)
  step 90 python3 bench/ppo_backtest.py --device cuda --out "$out/bench/ppo_backtest_gpu.json" \
    >"$out/bench/ppo_backtest_gpu.log" 2>&1 || { echo "ppo_backtest failed: exit $?"; status=1; }
  # where PPO's update at 1,024 environments spends its time on the GPU (79,401 env steps/s on the first H100,
  # 100,000 asked): torch.profiler's top operations by device and by host time over 3 updates
  step 100 python3 bench/profile_job.py --ops --out "$out/bench/profile_ppo_ops_gpu.json" -- ppo train \
    --run-dir "$out/ppo_ops" --num-envs 1024 --batch-size 8192 --total-steps 196608 --no-baseline-mlp \
    --eval-every 1000 --random-runs 1 >"$out/bench/profile_ppo_ops_gpu.log" 2>&1 || { echo "profile_job --ops failed: exit $?"; status=1; }
  # where the LSTM job's per-symbol time outside the steps goes on a GPU (~0.2 s a symbol on the first H100):
  # 64 symbols in one cohort, the default model, under cProfile (host waits show in the calls that wait)
  profile_lstm_cohort
fi
exit "$status"
