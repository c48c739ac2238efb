"""The CLSTM-PPO agent for the planner. Items are environment steps: each is one acting forward
(on the whole batch of environments) plus, per update epoch, a training forward and backward of its
sample. Counted on the real model on the CPU (it is small); the rollout buffer and the features
tensor are the batch-independent memory."""

from __future__ import annotations

from trainers.ops.plan import Workload, forward_flops, saved_bytes_per_item
from trainers.ppo.config import PpoConfig
from trainers.ppo.features import FEATURES

SMALL_STEP_S = 0.003  # an eager optimizer step of a small model on a GPU (assumed): launches, not FLOPs
ACT_STEP_S = 0.001  # one acting forward + one environment step of every environment (assumed)


def workload(cfg: PpoConfig) -> Workload:
    import torch

    from trainers.ppo.build import build_model

    policy = build_model(cfg).train()
    n, f, w = cfg.num_stocks, len(FEATURES), cfg.window

    def inputs(b: int) -> tuple:
        return torch.randn(b, w, n, f), torch.randn(b, n + 1), torch.randn(b, n)

    per_sample = saved_bytes_per_item(policy, inputs)
    forward = forward_flops(policy, inputs(1))
    flops_per_env_step = forward + 3 * forward * cfg.update_epochs  # acting, then each update epoch
    parameters = sum(p.numel() for p in policy.parameters())
    rollout = cfg.num_envs * cfg.rollout_steps * (w * n * f + 3 * n + 8) * 4  # observations, actions, stats
    features = cfg.synthetic_days * n * f * 4
    # A planner "step" is one PPO update: a rollout of every environment, then the update epochs over
    # minibatches of it (activations are held for one minibatch at a time).
    per_update = cfg.num_envs * cfg.rollout_steps
    minibatches = -(-per_update // cfg.batch_size)
    floor = cfg.rollout_steps * ACT_STEP_S + cfg.update_epochs * minibatches * SMALL_STEP_S
    return Workload(
        trainer="ppo", parameters=parameters, n_blocks=1, block_parameters=parameters, unit="env steps",
        items_per_micro=per_update, grad_accum=1, flops_per_item=flops_per_env_step,
        activation_bytes=lambda _micro, _ck: int(per_sample * cfg.batch_size), kind="small", strategies=("ddp",),
        items_total=float(cfg.steps_per_agent() * len(cfg.agents())),  # every agent of the run, one after another
        extra_bytes=rollout + features, min_step_s=floor,
        shape={"encoder": cfg.encoder, "hidden": cfg.hidden, "stocks": n, "window": w, "envs": cfg.num_envs},
        notes=[f"an env step costs one acting forward and {cfg.update_epochs} training passes of its sample; "
               f"the rollout buffer ({rollout / 2**20:.1f} MiB) stays on the device"])
