# Benchmarks are run by hand (not in CI); each writes JSON under bench/results/ with the command,
# device, versions and git commit. Commit the JSON and quote it in the README.
PYTHON ?= python

.PHONY: test bench-cpu bench-gpu bench-gpu-dry

test:
	$(PYTHON) -m pytest -q

bench-cpu:
	$(PYTHON) bench/data_pipeline.py --out bench/results/data_pipeline_cpu.json
	$(PYTHON) bench/train_throughput.py --presets tiny --steps 30 --out bench/results/train_cpu.json
	$(PYTHON) bench/inference.py --presets tiny,small --iters 50 --out bench/results/inference_cpu.json
	OMP_NUM_THREADS=1 $(PYTHON) bench/gnn_coloring.py --nproc 2 --budget 5 --out bench/results/gnn_cpu.json  # needs: pip install gcol
	$(PYTHON) bench/lstm_pack.py --out bench/results/lstm_pack_cpu.json
	$(PYTHON) bench/lstm_pack.py --steps-only --out bench/results/lstm_step_cpu.json
	OMP_NUM_THREADS=1 $(PYTHON) bench/gpt_throughput.py --device cpu --nproc 2 --depths 1,2 --head-dim 32 --seq-len 128 --device-batch-size 4 --compile off,on --parallel ddp,fsdp --steps 30 --out bench/results/gpt_throughput_cpu.json
	$(PYTHON) bench/gpt_serve.py --clients 8 --requests 20 --max-new-tokens 16,64 --threads 1 --out bench/results/gpt_serve_cpu.json
	OMP_NUM_THREADS=1 $(PYTHON) bench/checkpoint_save.py --presets small,base --out bench/results/checkpoint_cpu.json
	$(PYTHON) bench/forecast_signal.py --out bench/results/forecast_signal_cpu.json
	$(PYTHON) bench/forecast_readout.py --epochs 4 --out bench/results/forecast_readout_cpu.json
	$(PYTHON) bench/forecast_ablation.py --out bench/results/forecast_ablation_cpu.json  # ~30 min on one core; the small preset's row takes hours
	$(PYTHON) bench/forecast_robustness.py --out bench/results/forecast_robustness_cpu.json
	$(PYTHON) bench/gpt_size.py --out bench/results/gpt_size.json
	$(PYTHON) bench/deploy_demo.py --out bench/results/deploy_demo_forecast_cpu.json
	$(PYTHON) bench/deploy_demo.py --trainer gpt --out bench/results/deploy_demo_gpt_cpu.json
	$(PYTHON) bench/pytest_wall.py --out bench/results/tests_leaks_cpu.json -- -q tests/leaks

# One command for the whole GPU set, on the machine it meets: processes = the visible GPUs, each step under
# its own timeout (a step that fails or hangs is recorded so and the rest go on), the whole set within
# --total-min (28 by default); JSON under bench/results/*_gpu.json and the one page gpu_summary.md.
# python3, not $(PYTHON): a GPU image's Python is python3 and nothing is installed there (PYTHONPATH=repo).
# Where one command may run at most 10 minutes: BENCH_GPU_ARGS="--resume --total-min 9", repeated.
# bench-gpu-dry: every step at tiny sizes on the CPU into a temporary folder (what CI runs).
BENCH_PYTHON ?= python3
BENCH_GPU_ARGS ?=

bench-gpu:
	$(BENCH_PYTHON) bench/gpu.py $(BENCH_GPU_ARGS)

bench-gpu-dry:
	$(BENCH_PYTHON) bench/gpu.py --dry-run $(BENCH_GPU_ARGS)
