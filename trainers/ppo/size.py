"""The CLSTM-PPO agent for the planner. Items are environment steps: each is one acting forward
(on the whole batch of environments) plus, per update epoch, a training forward and backward of its
sample. Counted on the real model on the CPU (it is small); the rollout buffer and the features
tensor are the batch-independent memory."""

from __future__ import annotations

from trainers.ops.plan import PLAN_GPU_MEMORY, Workload, forward_flops, saved_bytes_per_item
from trainers.ppo.config import PpoConfig
from trainers.ppo.features import FEATURES

CPU_ENVS = 64  # the CPU default: the environments' ~60 small float64 kernels a step are cheap there
MAX_AUTO_ENVS = 4096  # a GPU's default at most. The training loop's operations per env step fall with the batch
# (16x fewer at 1,024 than at 64 environments, bench/results/ppo_ops_batch8192_cpu.json), and on an H200 the
# env steps/s in training with it: 83,514 at 1,024, 111,961 at 2,048, 125,804 at 4,096, each 16 updates of one
# agent (bench/results/gpu_h200/run_ppo*_gpu.json). MIN_UPDATES_PER_AGENT keeps a job's updates: a larger
# batch is only chosen for a job long enough to give it 16 of them
MIN_UPDATES_PER_AGENT = 16  # a GPU's default never leaves an agent fewer PPO updates than this: more environments
# per update means fewer updates for the same env steps (the 8-GPU deploy default of 504,000 env steps an agent
# had 15 at 64 environments; 1,024 would have left it 1)
ROLLOUT_MEMORY_SHARE = 0.25  # of a GPU's memory, for the rollouts and their update's minibatches (the rest: the
# features, the models, the environments)
MINIBATCHES_PER_EPOCH = 8  # the default minibatch cuts a rollout in this many (512 at 64 x 64, as before)
SMALL_STEP_S = 0.003  # an eager optimizer step of a small model on a GPU (assumed): launches, not FLOPs
ACT_STEP_S = 0.001  # one acting forward + one environment step of every environment (assumed)


def rollout_bytes_per_env(cfg: PpoConfig) -> int:
    """One environment's rollout as trainers.ppo.ppo.Rollout holds it, --rollout-steps steps of: the observation
    (the date, int64, and the portfolio's n + 1 weights: the market window is gathered from the features when
    used), the action (n), log-probability, reward, done, value, then the advantage and return (float32)."""
    return cfg.rollout_steps * (8 + 4 * (cfg.num_stocks + 1) + 4 * cfg.num_stocks + 6 * 4)


def window_bytes(cfg: PpoConfig) -> int:
    """One sample's market window as an update gathers it from the features: [window, stocks, features] float32."""
    return cfg.window * cfg.num_stocks * len(FEATURES) * 4


def update_bytes_per_env(cfg: PpoConfig, per_sample: float) -> float:
    """One environment's share of its update's minibatch (a rollout cut in MINIBATCHES_PER_EPOCH): the market
    windows gathered for its samples, and what autograd saves for each (`per_sample`, the policy's)."""
    return cfg.rollout_steps / MINIBATCHES_PER_EPOCH * (window_bytes(cfg) + per_sample)


def policy_saved_bytes(cfg: PpoConfig) -> float:
    """What autograd saves for one sample of the policy (its forward in an update), counted on the CPU."""
    import torch

    from trainers.ppo.build import build_model

    with torch.random.fork_rng(devices=[]):
        return saved_bytes_per_item(build_model(cfg).train(), _inputs(cfg.num_stocks, cfg.window))


SIZES = ("num_envs", "batch_size")  # decided by the device when left out (a resume keeps the folder's)


def env_batch(cfg: PpoConfig, memory_bytes: int | None, world_size: int = 1,
              per_sample: float | None = None) -> tuple[int, int]:
    """(environments per rank, minibatch): the user's, else CPU_ENVS on a CPU (`memory_bytes` None) and on a
    GPU as many as ROLLOUT_MEMORY_SHARE of its memory holds rollouts and update minibatches for (`per_sample`:
    the policy's saved bytes a sample, counted when not given) and the job leaves each agent
    MIN_UPDATES_PER_AGENT updates with (a power of two, CPU_ENVS to MAX_AUTO_ENVS); the minibatch, unless
    given, cuts a rollout in MINIBATCHES_PER_EPOCH."""
    envs = cfg.num_envs
    if envs is None:
        envs = CPU_ENVS
        if memory_bytes:
            per_sample = policy_saved_bytes(cfg) if per_sample is None else per_sample
            per_env = rollout_bytes_per_env(cfg) + update_bytes_per_env(cfg, per_sample)
            fits = int(memory_bytes * ROLLOUT_MEMORY_SHARE // per_env)
            by_job = cfg.steps_per_agent() // (world_size * cfg.rollout_steps * MIN_UPDATES_PER_AGENT)
            most = max(1, min(fits, by_job))
            envs = max(CPU_ENVS, min(MAX_AUTO_ENVS, 1 << (most.bit_length() - 1)))
    batch = cfg.batch_size if cfg.batch_size is not None else max(1, envs * cfg.rollout_steps // MINIBATCHES_PER_EPOCH)
    return envs, batch


def whole_updates(steps_per_agent: int, per_update: int) -> int:
    """An agent's env steps as the run trains them: whole updates of every rank's environments, rounded up
    (trainers.ppo.train.updates_per_agent); the plan once counted --total-steps as given."""
    return -(-steps_per_agent // per_update) * per_update


def sized_for_device(cfg: PpoConfig, device, world_size: int) -> PpoConfig:
    """A copy with --num-envs and --batch-size, where they are still left out (after the run folder's, SIZES), this
    device's (the run's config.json keeps the numbers used); a minibatch larger than a rollout is refused."""
    from trainers.runtime import device as device_mod

    envs, batch = env_batch(cfg, device_mod.total_memory(device), world_size)
    sized = cfg.replaced(num_envs=envs, batch_size=batch)
    sized.check_rollout()
    return sized


def _inputs(n_stocks: int, window: int):
    import torch

    def inputs(b: int) -> tuple:
        return torch.randn(b, window, n_stocks, len(FEATURES)), torch.randn(b, n_stocks + 1), torch.randn(b, n_stocks)
    return inputs


def flops_per_env_step(cfg: PpoConfig, n_stocks: int) -> float:
    """Matmul FLOPs of one environment step, the mean over the run's agents (each makes as many): an
    agent's acting forward, then a forward and backward (3 forwards) of its sample in each update epoch.
    Counted on CPU copies of the models, the global RNG untouched."""
    import torch

    from trainers.ppo.build import build_model

    encoders = [encoder for encoder, _seed in cfg.agents()]
    with torch.random.fork_rng(devices=[]):
        forwards = {e: forward_flops(build_model(cfg, n_stocks, e).train(), _inputs(n_stocks, cfg.window)(1))
                    for e in set(encoders)}
    return sum(forwards[e] * (1 + 3 * cfg.update_epochs) for e in encoders) / len(encoders)


def workload(cfg: PpoConfig, memory_bytes: int = PLAN_GPU_MEMORY, world_size: int = 1,
             counted: tuple | None = None) -> Workload:
    """The run of these options on GPUs of `memory_bytes` (one 80 GB card until the plan names its GPU:
    Workload.for_device sizes the environment batch again for it and its ranks, as the run would)."""
    import dataclasses

    from trainers.ppo.build import build_model

    given = cfg
    n, f, w = cfg.num_stocks, len(FEATURES), cfg.window
    if counted is None:  # the model's own numbers, whatever the batch: counted once
        policy = build_model(cfg).train()
        counted = (saved_bytes_per_item(policy, _inputs(n, w)), flops_per_env_step(cfg, n),
                   sum(p.numel() for p in policy.parameters()))
    per_sample, flops, parameters = counted
    envs, batch = env_batch(cfg, memory_bytes, world_size, per_sample)
    cfg = dataclasses.replace(cfg, num_envs=envs, batch_size=batch)
    cfg.check_rollout()  # the run would refuse it: so does the plan

    rollout = cfg.num_envs * rollout_bytes_per_env(cfg)
    windows = cfg.batch_size * window_bytes(cfg)  # a minibatch's market windows
    features = cfg.synthetic_days * n * f * 4
    # A planner "step" is one PPO update: a rollout of every environment, then the update epochs over
    # minibatches of it (activations are held for one minibatch at a time).
    per_update = cfg.num_envs * cfg.rollout_steps
    minibatches = -(-per_update // cfg.batch_size)
    floor = cfg.rollout_steps * ACT_STEP_S + cfg.update_epochs * minibatches * SMALL_STEP_S
    return Workload(
        trainer="ppo", parameters=parameters, n_blocks=1, block_parameters=parameters, unit="env steps",
        items_per_micro=per_update, grad_accum=1, flops_per_item=flops,
        activation_bytes=lambda _micro, _ck: int(per_sample * cfg.batch_size), kind="small", strategies=("ddp",),
        items_total=float(whole_updates(cfg.steps_per_agent(), per_update * world_size) * len(cfg.agents())),
        extra_bytes=rollout + windows + features, min_step_s=floor,
        for_device=lambda memory, ranks, items=None: workload(given if items is None else dataclasses.replace(
            given, total_steps=max(1, int(items // len(given.agents())))), memory, ranks, counted),  # (--items)
        shape={"encoder": cfg.encoder, "hidden": cfg.hidden, "stocks": n, "window": w, "envs": cfg.num_envs},
        notes=[f"an env step costs one acting forward and {cfg.update_epochs} training passes of its sample (FLOPs: the "
               f"mean over the run's agents, {', '.join(dict.fromkeys(e for e, _ in cfg.agents()))}); "
               f"the rollout buffer ({rollout / 2**20:.1f} MiB) stays on the device"])
