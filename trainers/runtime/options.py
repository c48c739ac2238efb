"""Options every trainer's config shares: device, collective timeout, stops, checkpoints, logging."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainers.runtime.budget import Budget
from trainers.runtime.config import check_values, option

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
CKPT_AT_EVAL = ("always", "improved", "held")  # --ckpt-at-eval


@dataclass
class RunOptions:
    """The fields the run boundary reads (each trainer's config extends this; a trainer may redeclare
    `run_dir` and `seed` for its own default and help)."""

    run_dir: str = option("runs/run", "run folder: checkpoints, logs, results (resumed if it holds a run)",
                          resume_safe=True)  # where the folder is now: it may have been moved
    seed: int = option(0, "seed of init and shuffling (each rank offsets it by its rank)", min=0)
    device: str = option("auto", "auto (GPU when present), cpu or cuda", resume_safe=True, choices=DEVICES)
    collective_timeout_s: float = option(600.0, "seconds a collective may wait for a dead peer", resume_safe=True,
                                         min=10.0)
    patience: int = option(3, "early stop after this many evaluations without improvement (0: off)",
                           resume_safe=True, min=0)
    min_delta: float = option(0.0, "an improvement of the validation metric smaller than this does not count",
                              resume_safe=True, min=0)
    ckpt_every: int = option(200, "checkpoint every N optimizer steps (and at evaluations: --ckpt-at-eval)", resume_safe=True,
                             min=1)
    ckpt_at_eval: str = option("always", "which evaluations also checkpoint: always (a lost machine costs at most the "
                               "steps since the last evaluation), improved (only a new best, which the final "
                               "evaluation needs on disk: fewer writes, and a resume redoes the steps since the last "
                               "save) or held (a new best held in host memory and written with the next checkpoint: "
                               "the step or time cadence, a stop, the end; fewer writes still, and a kill redoes the "
                               "steps since the last checkpoint written; under --max-hours or --budget-usd as "
                               "improved)", resume_safe=True, choices=CKPT_AT_EVAL)
    ckpt_every_min: float | None = option(None, "also checkpoint every N minutes of wall clock (rank 0's clock, "
                                          "agreed)", resume_safe=True, gt=0)
    ckpt_async: bool | None = option(None, "write checkpoints in a background thread after a copy to host memory "
                                     "(the final one is waited for); default: on with CUDA, off on CPU",
                                     resume_safe=True)
    keep_last: int = option(3, "checkpoints kept besides the best", resume_safe=True, min=1)
    log_every: int = option(10, "log training metrics every N steps", resume_safe=True, min=1)
    max_hours: float | None = option(None, "wall-clock budget in hours, across restarts", resume_safe=True, gt=0)
    budget_usd: float | None = option(None, "money budget in USD (needs --usd-per-gpu-hour)", resume_safe=True, gt=0)
    usd_per_gpu_hour: float | None = option(None, "price of one GPU (or CPU worker) hour, for cost", resume_safe=True,
                                            min=0)
    agree_every: int | None = option(None, "agree on stops every N steps (0: adaptive, about once a second); "
                                     "default: every step on CPU, adaptive on CUDA, where each agreement is a "
                                     "host sync", resume_safe=True, min=0)
    gpu_defaults: bool = option(False, "rehearse on the CPU what a CUDA deploy turns on by default, where the "
                                "trainer has it: torch.compile (inductor; forecast, gpt, and gnn where the run is long "
                                "enough to pay for it), bf16 autocast "
                                "(forecast, gpt), fused AdamW (forecast, gpt, gnn), checkpoints written behind the "
                                "loop and the adaptive stop agreement (every trainer; lstm and ppo have only these) "
                                "(slow on a CPU: for trying a run's configuration before "
                                "renting a GPU; no effect on CUDA, where these are the defaults already). A resume "
                                "may turn it on or off: it changes how later steps compute (precision, compile), not "
                                "what the checkpoints hold", resume_safe=True)
    deterministic: bool = option(False, "deterministic kernels on CUDA (torch.use_deterministic_algorithms, cuDNN's "
                                 "deterministic mode, CUBLAS_WORKSPACE_CONFIG=:4096:8): a resume then repeats the "
                                 "uninterrupted run bit for bit on the same GPU and software, at some cost in speed; "
                                 "an op without a deterministic kernel says so in the log. A CPU run is bitwise "
                                 "repeatable without it", resume_safe=True)
    remote: str | None = option(None, "mirror the run folder to this fsspec URL as it is written (s3://bucket/prefix, "
                                "also S3-compatible stores through AWS_ENDPOINT_URL; gs://...; file:///mounted/volume/run; "
                                "needs pip install 'trainers[remote]'); a run whose local folder is empty resumes from "
                                "it, so a lost machine costs only the steps since the last checkpoint",
                                resume_safe=True)
    remote_wait_s: float = option(300.0, "at the end of a run, wait at most this long for the mirror to catch up "
                                  "(what is still missing is recorded in results.json)", resume_safe=True, min=0)
    restart: bool = option(False, "start this run folder over from step 0: its checkpoints are moved aside (kept), "
                           "not resumed", resume_safe=True)

    def validate_run_options(self) -> None:
        """Every field's type, range and choices (one rule for every trainer), then the budget."""
        check_values(self)
        from trainers.runtime.remote_store import check_remote_url  # (no fsspec import: string checks only)

        check_remote_url(self.remote)
        self.budget(1)  # --budget-usd without a price is checked by Budget itself

    def budget(self, billed_devices: int) -> Budget:
        return Budget(self.max_hours, self.budget_usd, self.usd_per_gpu_hour, billed_devices)

    def for_attempt(self, restart_count: int):
        """The options of torchrun's attempt `restart_count`: --restart starts over on the first only. torchrun
        restarts failed workers with the same arguments, and each restart once set the run's progress aside again."""
        return self.replaced(restart=False) if self.restart and restart_count else self

    # Settled: a trainer resolves its options once at its entry (dates pinned, the saved run's options checked) and
    # calls `settled()`; from there a write raises, so a reader knows every function sees the values the entry
    # settled. A changed copy is a new value (`replaced`), settled as its origin was.
    def settled(self):
        object.__setattr__(self, "_settled", True)
        return self

    @property
    def is_settled(self) -> bool:
        return self.__dict__.get("_settled", False)

    def replaced(self, **changes):
        copy = dataclasses.replace(self, **changes)
        return copy.settled() if self.is_settled else copy

    def __setattr__(self, name: str, value) -> None:
        if self.__dict__.get("_settled"):
            raise dataclasses.FrozenInstanceError(
                f"{type(self).__name__}.{name} = {value!r}: the config was settled at the trainer's entry and is "
                f"read-only; make a changed copy with .replaced({name}=...)")
        object.__setattr__(self, name, value)
