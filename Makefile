# Benchmarks are run by hand (not in CI); each writes JSON under bench/results/ with the command,
# device, versions and git commit. Commit the JSON and quote it in the README.
PYTHON ?= python

.PHONY: test bench-cpu bench-gpu

test:
	$(PYTHON) -m pytest -q

bench-cpu:
	$(PYTHON) bench/data_pipeline.py --out bench/results/data_pipeline_cpu.json
	$(PYTHON) bench/train_throughput.py --presets tiny --steps 30 --out bench/results/train_cpu.json
	$(PYTHON) bench/inference.py --presets tiny,small --iters 50 --out bench/results/inference_cpu.json
	OMP_NUM_THREADS=1 $(PYTHON) bench/gnn_coloring.py --nproc 2 --budget 5 --out bench/results/gnn_cpu.json  # needs: pip install gcol

bench-gpu:
	$(PYTHON) bench/train_throughput.py --presets small,base,151m --steps 50 --compile --out bench/results/train_gpu.json
