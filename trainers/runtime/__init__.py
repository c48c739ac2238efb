"""The shared distributed runtime: small pieces each trainer's loop calls.

- dist: torchrun environment, process-group init/teardown, collectives used for agreement
- precision: device, autocast dtype, grad scaler, TF32, compile, fused optimizer
- logs: rank-0 logger, metrics (JSONL + TensorBoard), progress bar
- checkpoint: step-numbered atomic checkpoints with checksums, keep-last-K + best, resume
- stops: stop decisions agreed by all ranks (signals, wall-clock and money budget, early stop)
- schedule: warmup + cosine learning rate
- config: dataclass configs to and from the command line
"""
