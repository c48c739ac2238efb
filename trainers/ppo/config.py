"""The CLSTM-PPO trading agent's options (seed 001): one dataclass, the command line, config.json
and every checkpoint. No torch here: `trainers ppo train --help` must answer at once.

Seed 001's names map over: --num-episodes (or --total-steps), --batch-size (the PPO minibatch),
--grad-accum, --precision; its --num_gpus is torchrun's --nproc_per_node.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainers.errors import UsageError
from trainers.runtime.config import MAX_YEARS, SYNTHETIC_MAX_CELLS, SYNTHETIC_MAX_DAYS, check_product, option
from trainers.runtime.options import PRECISIONS, RunOptions

ACTIONS = ("trades", "weights")
REWARDS = ("pnl", "log_return")
ENCODERS = ("clstm", "mlp")
HEADS = ("lstm", "mlp")
MAX_ENVS = 1 << 16  # environments stepped together (per rank, and for the random baseline)


@dataclass
class PpoConfig(RunOptions):
    run_dir: str = option("runs/ppo", "run folder: checkpoints, logs, results, equity curves (resumed if it holds a run)",
                          resume_safe=True)  # where the folder is now: it may have been moved
    # data
    source: str = option("synthetic", "market data: synthetic, yfinance (fetch missing into the cache), cache, "
                         "or file:PATH (long-format CSV/parquet)")
    universe: str = option("sp500", "ticker universe for yfinance when no --tickers are given")
    tickers: str | None = option(None, "comma-separated symbols, e.g. AAPL,MSFT,BRK-B")
    tickers_file: str | None = option(None, "file of symbols, one per line (or a CSV with a symbol column)")
    cache_dir: str = option("cache/sp500", "parquet price cache of the yfinance and cache sources", resume_safe=True)
    years: float = option(25.0, "history to use when --start is not given", gt=0, max=MAX_YEARS)
    start: str | None = option(None, "first date (YYYY-MM-DD); fixed in config.json on the first run", date=True)
    end: str | None = option(None, "end date, exclusive (default: today); fixed in config.json on the first run",
                             after="start")
    min_history_days: int = option(252, "tickers with fewer valid bars are excluded", min=1)
    num_stocks: int = option(30, "stocks in the portfolio: those with a bar on every date and the highest dollar "
                             "volume (the paper trades 30)", min=2)
    synthetic_tickers: int = option(30, "tickers in the synthetic market", min=2)
    synthetic_days: int = option(2520, "trading days in the synthetic market", min=2, max=SYNTHETIC_MAX_DAYS)
    data_seed: int = option(0, "seed of the synthetic market", min=0)
    synthetic_momentum: float = option(0.03, "strength of the synthetic market's momentum effect (0: none; < 0: "
                                       "reversal)", min=-10, max=10)
    window: int = option(30, "days of features the agent sees", min=2)
    val_frac: float = option(0.15, "share of decision dates for validation", gt=0, lt=1)
    test_frac: float = option(0.15, "share of decision dates for the test (touched once, by the final report)",
                              gt=0, lt=1)
    min_split_dates: int = option(20, "fewest decision dates each split may have", min=1)
    # environment
    # each environment's state is a handful of tensors allocated up front (zero-filled: the memory is
    # touched at once, so too many would not fail cleanly but wake the kernel's OOM killer)
    num_envs: int | None = option(None, "environments per rank, stepped together as tensors (default: 64 on a CPU; "
                                  "on a GPU as many as a quarter of its memory holds rollouts for, at most 4096 and "
                                  "never so many that an agent gets under 16 updates: ppo/size.py)", min=1, max=MAX_ENVS)
    episode_days: int = option(252, "trading days per training episode (each starts at a random training date)",
                               min=1)
    action: str = option("trades", "trades: buy/sell up to --h-max shares per stock; weights: target portfolio weights",
                         choices=ACTIONS)
    h_max: float = option(100.0, "most shares one trade action buys or sells per stock (the paper's h_max)", min=1)
    initial_cash: float = option(1_000_000.0, "cash each episode starts with", gt=0)
    cost_bps: float = option(10.0, "transaction cost in basis points of the traded value (10 = 0.1 percent)", min=0,
                              max=1000)  # 10 % of every trade: past that the wealth update loses its meaning
    reward: str = option("pnl", "pnl: change in portfolio value times --reward-scale; log_return: log of its ratio",
                         choices=REWARDS)
    reward_scale: float = option(1e-4, "multiplies the pnl reward (FinRL's 1e-4)", gt=0)
    # model
    encoder: str = option("clstm", "clstm: the cascaded LSTM; mlp: CleanRL's MLPs on the flattened window",
                          choices=ENCODERS)
    heads: str = option("lstm", "actor and critic heads on the cascade: lstm (the paper's) or mlp", choices=HEADS)
    hidden: int = option(64, "hidden width of every layer", min=1)
    init_std: float = option(0.6, "initial standard deviation of the Gaussian policy (before tanh)", gt=0, max=5)
    baseline_mlp: bool = option(True, "also train the same PPO with --encoder mlp for each seed (the MLP baseline)")
    # PPO
    total_steps: int | None = option(None, "environment steps per agent, all ranks together (default: from "
                                     "--num-episodes)", min=1)
    num_episodes: int = option(200, "episodes per agent, all ranks together (used when --total-steps is not given)",
                               min=1)
    rollout_steps: int = option(64, "steps per environment per rollout (one PPO update per rollout)", min=1)
    batch_size: int | None = option(None, "PPO minibatch: samples per rank per optimizer step (default: a rollout in "
                                    "8 minibatches, 512 at 64 environments x 64 steps)", min=1)
    grad_accum: int = option(1, "micro-batches each minibatch is split into (same gradient, less memory)", min=1)
    update_epochs: int = option(4, "passes over each rollout", min=1)
    lr: float = option(3e-4, "Adam learning rate (annealed linearly to 0 with --anneal-lr)", gt=0)
    anneal_lr: bool = option(True, "decay the learning rate linearly over the updates")
    gamma: float = option(0.99, "discount", min=0, max=1)
    gae_lambda: float = option(0.95, "GAE lambda", min=0, max=1)
    clip_coef: float = option(0.2, "PPO clip range of the ratio (and of the value change)", gt=0)
    clip_vloss: bool = option(True, "clip the value loss as PPO2/CleanRL do")
    ent_coef: float = option(0.0, "entropy bonus coefficient", min=0)
    vf_coef: float = option(0.5, "value loss coefficient", min=0)
    max_grad_norm: float = option(0.5, "clip the gradient norm to this", gt=0)
    target_kl: float | None = option(None, "stop an update's epochs once the mean approximate KL exceeds this",
                                     gt=0)
    norm_obs: bool = option(True, "normalise observations with running statistics (kept in checkpoints)")
    seed: int = option(0, "seed of the first agent (init, environments, sampling); --seeds counts up from it", min=0)
    seeds: int = option(1, "agents trained per encoder, seeds --seed, --seed+1, ... (mean +- std reported); at "
                        "most 64: every checkpoint holds every agent", min=1, max=64)
    select_by: str = option("return", "validation score that picks each agent's snapshot: return (cumulative, net "
                            "of costs: the agent's objective) or sharpe (blind to how much is in cash)",
                            choices=("return", "sharpe"))
    eval_every: int = option(10, "validate every N updates (the agent kept is the best on validation)",
                             resume_safe=True, min=1)
    random_runs: int = option(10, "random-policy runs the baseline row averages (stepped together as environments)",
                              resume_safe=True, min=1, max=MAX_ENVS)
    precision: str = option("auto", "auto: fp32 on every device (the policy and value networks are small: bf16 buys "
                            "no speed and makes PPO's probability ratio noisy); bf16 or fp16 autocast when asked",
                            choices=PRECISIONS)
    patience: int = option(0, "unused by PPO (agents are chosen on validation, not stopped early)", resume_safe=True,
                           min=0)
    compile_rollout: str = option("off", "the rollout's step (policy sample, environments, episode sums) compiled as "
                                  "one graph (on) and captured as a CUDA graph too (graphs: reduce-overhead; on a "
                                  "CPU the same as on); off until a GPU has measured it", resume_safe=True,
                                  choices=("off", "on", "graphs"))

    def validate(self) -> None:
        self.validate_run_options()
        from trainers.market.sources import check_source

        check_source(self.source)
        if self.val_frac + self.test_frac >= 1:
            raise UsageError(f"--val-frac {self.val_frac} and --test-frac {self.test_frac} must sum to less than 1")
        if self.source == "synthetic" and self.num_stocks > self.synthetic_tickers:
            raise UsageError(f"--num-stocks {self.num_stocks} is more than --synthetic-tickers {self.synthetic_tickers}")
        if self.source == "synthetic":
            check_product(self, ("synthetic_tickers", "synthetic_days"), SYNTHETIC_MAX_CELLS, "prices to generate")
        if self.num_envs is not None and self.batch_size is not None:
            self.check_rollout()  # both given: refused before anything starts (else once sized for the device)

    def check_rollout(self) -> None:
        rollout = self.num_envs * self.rollout_steps
        if self.batch_size > rollout:  # the minibatch is cut from one rollout: a larger one was silently the rollout
            raise UsageError(f"--batch-size {self.batch_size} is more than one rollout holds (--num-envs "
                             f"{self.num_envs} x --rollout-steps {self.rollout_steps} = {rollout} samples per rank); "
                             f"use --batch-size {rollout} or less, or more environments or steps")
        if self.grad_accum > self.batch_size:  # micro-batches of no sample
            raise UsageError(f"--grad-accum {self.grad_accum} splits a --batch-size {self.batch_size} minibatch into "
                             f"more micro-batches than it has samples; use --grad-accum {self.batch_size} or less")

    def agents(self) -> list[tuple[str, int]]:
        """(encoder, seed) of every agent this run trains, in training order."""
        encoders = [self.encoder] + (["mlp"] if self.baseline_mlp and self.encoder != "mlp" else [])
        return [(enc, self.seed + i) for enc in encoders for i in range(self.seeds)]

    def steps_per_agent(self) -> int:
        return self.total_steps if self.total_steps is not None else self.num_episodes * self.episode_days
