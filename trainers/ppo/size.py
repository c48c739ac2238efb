"""The CLSTM-PPO agent for the planner. Items are environment steps: each is one acting forward
(on the whole batch of environments) plus, per update epoch, a training forward and backward of its
sample. Counted on the real model on the CPU (it is small); the rollout buffer and the features
tensor are the batch-independent memory."""

from __future__ import annotations

from trainers.ops.plan import PLAN_GPU_MEMORY, Workload, forward_flops, saved_bytes_per_item
from trainers.ppo.config import PpoConfig
from trainers.ppo.features import FEATURES

CPU_ENVS = 64  # the CPU default: the environments' ~60 small float64 kernels a step are cheap there
MAX_AUTO_ENVS = 4096  # a GPU's default at most (its rollouts fill a quarter of a ~22 GB card). The training loop's operations per env step fall with the batch
# (16x fewer at 1,024 than at 64 environments, bench/results/ppo_ops_batch8192_cpu.json), and on an H200 the
# env steps/s in training with it: 83,514 at 1,024, 111,961 at 2,048, 125,804 at 4,096, each 16 updates of one
# agent (bench/results/gpu_h200_aadb2aa/run_ppo*_gpu.json). MIN_UPDATES_PER_AGENT keeps a job's updates: a larger
# batch is only chosen for a job long enough to give it 16 of them
MIN_UPDATES_PER_AGENT = 16  # a GPU's default never leaves an agent fewer PPO updates than this: more environments
# per update means fewer updates for the same env steps (the 8-GPU deploy default of 504,000 env steps an agent
# had 15 at 64 environments; 1,024 would have left it 1)
ROLLOUT_MEMORY_SHARE = 0.25  # of a GPU's memory, for the rollout buffer (the rest: features, the update's work)
MINIBATCHES_PER_EPOCH = 8  # the default minibatch cuts a rollout in this many (512 at 64 x 64, as before)
SMALL_STEP_S = 0.003  # an eager optimizer step of a small model on a GPU (assumed): launches, not FLOPs
ACT_STEP_S = 0.001  # one acting forward + one environment step of every environment (assumed)


def rollout_bytes_per_env(cfg: PpoConfig) -> int:
    """One environment's rollout in the buffer: observations, actions and statistics of --rollout-steps steps."""
    n, f, w = cfg.num_stocks, len(FEATURES), cfg.window
    return cfg.rollout_steps * (w * n * f + 3 * n + 8) * 4


SIZES = ("num_envs", "batch_size")  # decided by the device when left out (a resume keeps the folder's)


def env_batch(cfg: PpoConfig, memory_bytes: int | None, world_size: int = 1) -> tuple[int, int]:
    """(environments per rank, minibatch): the user's, else CPU_ENVS on a CPU (`memory_bytes` None) and on a
    GPU as many as ROLLOUT_MEMORY_SHARE of its memory holds rollouts for and the job leaves each agent
    MIN_UPDATES_PER_AGENT updates with (a power of two, CPU_ENVS to MAX_AUTO_ENVS); the minibatch, unless
    given, cuts a rollout in MINIBATCHES_PER_EPOCH."""
    envs = cfg.num_envs
    if envs is None:
        envs = CPU_ENVS
        if memory_bytes:
            fits = int(memory_bytes * ROLLOUT_MEMORY_SHARE // rollout_bytes_per_env(cfg))
            by_job = cfg.steps_per_agent() // (world_size * cfg.rollout_steps * MIN_UPDATES_PER_AGENT)
            most = max(1, min(fits, by_job))
            envs = max(CPU_ENVS, min(MAX_AUTO_ENVS, 1 << (most.bit_length() - 1)))
    batch = cfg.batch_size if cfg.batch_size is not None else max(1, envs * cfg.rollout_steps // MINIBATCHES_PER_EPOCH)
    return envs, batch


def whole_updates(steps_per_agent: int, per_update: int) -> int:
    """An agent's env steps as the run trains them: whole updates of every rank's environments, rounded up
    (trainers.ppo.train.updates_per_agent); the plan once counted --total-steps as given."""
    return -(-steps_per_agent // per_update) * per_update


def size_for_device(cfg: PpoConfig, device, world_size: int) -> None:
    """Fill --num-envs and --batch-size where they are still left out (after the run folder's, SIZES) with this
    device's (the run's config.json keeps the numbers used); then refuse a minibatch larger than a rollout."""
    from trainers.runtime import device as device_mod

    cfg.num_envs, cfg.batch_size = env_batch(cfg, device_mod.total_memory(device), world_size)
    cfg.check_rollout()


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
    envs, batch = env_batch(cfg, memory_bytes, world_size)
    cfg = dataclasses.replace(cfg, num_envs=envs, batch_size=batch)
    cfg.check_rollout()  # the run would refuse it: so does the plan

    n, f, w = cfg.num_stocks, len(FEATURES), cfg.window
    if counted is None:  # the model's own numbers, whatever the batch: counted once
        policy = build_model(cfg).train()
        counted = (saved_bytes_per_item(policy, _inputs(n, w)), flops_per_env_step(cfg, n),
                   sum(p.numel() for p in policy.parameters()))
    per_sample, flops, parameters = counted
    rollout = cfg.num_envs * cfg.rollout_steps * (w * n * f + 3 * n + 8) * 4  # observations, actions, stats
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
        extra_bytes=rollout + features, min_step_s=floor,
        for_device=lambda memory, ranks: workload(given, memory, ranks, counted),
        shape={"encoder": cfg.encoder, "hidden": cfg.hidden, "stocks": n, "window": w, "envs": cfg.num_envs},
        notes=[f"an env step costs one acting forward and {cfg.update_epochs} training passes of its sample (FLOPs: the "
               f"mean over the run's agents, {', '.join(dict.fromkeys(e for e, _ in cfg.agents()))}); "
               f"the rollout buffer ({rollout / 2**20:.1f} MiB) stays on the device"])
