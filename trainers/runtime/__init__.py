"""The shared runtime: small pieces each trainer's loop calls (no base class, no loop of its own).

The run boundary
- run: `Run`, what every training loop calls at its edges (resume, step_done, finish)
- checkpointer: when and how checkpoints are written (cadence, behind the loop, commit)
- checkpoint: what a checkpoint is on disk (names, checksums, retention), verified resume
- async_save: the host copy and the background thread a write behind the loop uses
- stops: stops agreed by all ranks, their cadence, the validation record and early stopping
- budget: stop reasons, the wall-clock and money budget
- throughput: steady and effective rates, MFU, the time breakdown
- rundir: the run folder (lock, config, heartbeat, data fingerprint; reading a run back)

Processes, devices, numbers
- dist: torchrun environment, process group, DDP, the collectives the trainers use
- nodewatch: several nodes: each node's heartbeat through the c10d store; a silent node ends the others
- precision: autocast dtype, grad scaler, TF32, compile, fused AdamW
- sharded: FSDP2 states for torch.distributed.checkpoint
- sampling: every sample once per epoch across ranks, and the cursor a loop advances
- schedule: warmup + cosine learning rate
- rng: every RNG stream of a rank, captured and restored
- flops: peak FLOP/s by device name (MFU)
- faults: injected faults for the tests (TRAINERS_FAULT)

Files and records
- files: atomic writes, checksums (no torch)
- lock: one job per folder (flock)
- logs: rank-0 logger, metrics (JSONL + TensorBoard), progress bar
- results: results.json, merged section by section
- info: git commit, versions, memory, device facts
- config, options: dataclass configs on the command line, in the run folder, in every checkpoint
"""
