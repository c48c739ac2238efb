"""PPO as CleanRL's `ppo.py` / `ppo_continuous_action.py` and Stable-Baselines3 do it, for any
environment that steps B copies at once and returns tensors (the trading market, gymnasium's
CartPole in the tests):

    rollout   T steps of B environments with the current policy (actions sampled, values kept)
    GAE(λ)    advantages and returns, with the value of the observation after the last step
    update    `epochs` passes over the T*B samples in shuffled minibatches: clipped surrogate,
              clipped value loss, entropy bonus, advantages normalised per minibatch, gradient
              clipping, optional KL early stop (agreed by every rank), micro-batches for --grad-accum
    normalise observations with running statistics, frozen during a rollout and its update (so the
              update sees the inputs the actions were sampled from) and merged afterwards from
              every rank's rollout, so every rank holds the same statistics

Observations are tuples of tensors; `inputs(obs)` turns them into the policy's inputs (the trading
environment stores a date index and gathers the feature window only when it is needed). The rollout and the
update act with a Learner (CleanRL passes its agent): the policy and what trains it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainers.ppo.model import RunningNorm
from trainers.runtime.dist import DistContext
from trainers.runtime.precision import CompiledOrEager, Precision, autocast


@dataclass(frozen=True)
class Learner:
    """What collect and update act with: the policy, the module that trains it (its DDP wrapper, or itself), the
    observation normalisers, how an observation becomes the policy's inputs, the optimizer and grad scaler, and
    the numerics and device they run in."""

    policy: torch.nn.Module
    train_policy: torch.nn.Module
    norms: torch.nn.ModuleList | None
    inputs: Callable
    optimizer: torch.optim.Optimizer
    scaler: Any  # torch.amp.GradScaler, or its stand-in that does nothing (trainers.runtime.precision)
    precision: Precision
    device: torch.device


@dataclass(frozen=True)
class PPOSettings:
    rollout_steps: int = 128
    gamma: float = 0.99
    gae_lambda: float = 0.95
    update_epochs: int = 4
    minibatch_size: int = 256
    grad_accum: int = 1
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    norm_adv: bool = True


def normalise(norms: torch.nn.ModuleList | None, inputs: tuple) -> tuple:
    return inputs if norms is None else tuple(n(x) for n, x in zip(norms, inputs))


class NormStats:
    """Sums of each input over all but its last dimension, gathered during a rollout."""

    def __init__(self, norms: torch.nn.ModuleList, device: torch.device):
        self.sums = [torch.zeros(3, n.mean.numel(), dtype=torch.float64, device=device) for n in norms]

    def add(self, inputs: tuple) -> None:
        for s, x in zip(self.sums, inputs):
            flat = x.reshape(-1, x.shape[-1]).double()
            s[0] += flat.shape[0]
            s[1] += flat.sum(0)
            s[2] += (flat * flat).sum(0)

    def reset(self) -> None:  # in place: one NormStats serves a phase's updates (a compiled step holds it)
        for s in self.sums:
            s.zero_()

    def merge_into(self, norms: torch.nn.ModuleList, ctx: DistContext) -> None:
        """One collective: every rank folds in every rank's rollout."""
        packed = torch.cat([s.flatten() for s in self.sums])
        if ctx.distributed:
            dist.all_reduce(packed)
        offset = 0
        for n, s in zip(norms, self.sums):
            count, total, squares = packed[offset:offset + s.numel()].view(3, -1)
            offset += s.numel()
            mean = total / count
            n.merge(count[0], mean, (squares / count - mean * mean).clamp(min=0.0))


class Rollout:
    """[T, B] storage of one rollout; observations as the environment returns them."""

    def __init__(self, steps: int, example_obs: tuple, action_shape: tuple, action_dtype: torch.dtype,
                 device: torch.device):
        n = example_obs[0].shape[0]
        self.obs = [torch.zeros((steps, *o.shape), dtype=o.dtype, device=device) for o in example_obs]
        self.actions = torch.zeros((steps, n, *action_shape), dtype=action_dtype, device=device)
        self.log_probs = torch.zeros(steps, n, device=device)
        self.rewards = torch.zeros(steps, n, device=device)
        self.dones = torch.zeros(steps, n, device=device)
        self.values = torch.zeros(steps, n, device=device)
        self.steps, self.num_envs = steps, n


# Eleven parameters, not a Learner: this is the function torch.compile traces as one graph, and a CUDA graph
# captures, so its arguments are the tensors and modules it reads, each a guard of its own.
def rollout_step(env, policy, norms, inputs: Callable, obs: tuple, noise: torch.Tensor | None, precision: Precision,
                 device: torch.device, on_step: Callable | None, stats: NormStats | None,
                 generator: torch.Generator | None = None):
    """One step of every environment. With `noise` (a Gaussian policy's standard normal draw, made by the
    caller) it is a function of tensors: the policy's sample, the environments' step (their state updated in
    place), the episode and normaliser sums (in place); no host read, no Python branch on a tensor's value:
    it compiles as one graph (fullgraph) and can be captured as a CUDA graph (`--compile-rollout`). Without
    (a categorical policy, CartPole's), the policy draws from `generator` itself, eagerly."""
    raw = inputs(obs)
    if stats is not None:
        stats.add(raw)
    with autocast(device, precision):
        normalised = normalise(norms, raw)
        u, env_action, log_prob, value = policy.act(*normalised, generator=generator) if noise is None else \
            policy.sample(*normalised, noise=noise)
    obs, reward, done, info = env.step(env_action)
    if on_step is not None:
        on_step(info)
    return obs, reward, done, u, log_prob, value


def collect(learner: Learner, env, buf: Rollout, obs: tuple, done: torch.Tensor, generator: torch.Generator,
            on_step: Callable | None = None, stats: NormStats | None = None, step: Callable = rollout_step):
    """Fill `buf` with T steps from (obs, done); returns the observation and done flags after them.
    `step`: rollout_step, or it compiled (the same draws: each step's noise comes from `generator` here,
    the very draw act() makes after the policy's forward, which uses no generator)."""
    policy = learner.policy
    policy.eval()
    gaussian = hasattr(policy, "sample")
    for i in range(buf.steps):
        for store, o in zip(buf.obs, obs):
            store[i] = o
        buf.dones[i] = done.float()
        noise = torch.randn(buf.actions.shape[1:], generator=generator, device=learner.device,
                            dtype=torch.float32) if gaussian else None
        obs, reward, done, u, log_prob, value = step(env, policy, learner.norms, learner.inputs, obs, noise,
                                                     learner.precision, learner.device, on_step, stats,
                                                     None if gaussian else generator)
        buf.actions[i], buf.log_probs[i], buf.values[i], buf.rewards[i] = u, log_prob, value, reward
    policy.train()
    return obs, done


def mark_static(tensors: list[torch.Tensor]) -> None:
    """`--compile-rollout graphs`: the tensors rollout_step writes in place (the environments' state, the
    normaliser and episode sums) marked as static inputs, as parameters are. CUDA graph trees record a graph
    that writes a static input at its fixed address; any other input they copy in, so a graph writing one
    would lose the write, and they skip capture instead ("mutated inputs": the H200, aadb2aa). Unguarded: a
    new phase's tensors (another agent's) re-record the graph rather than recompile it."""
    import torch._dynamo

    for t in tensors:
        torch._dynamo.mark_static_address(t, guard=False)


def rollout_stepper(mode: str, log=None) -> Callable:
    """`--compile-rollout`: rollout_step itself (`off`), compiled as one graph (`on`), or captured as a CUDA
    graph too (`graphs`: mode="reduce-overhead"; on a CPU it compiles as `on`). A compile that fails runs the
    step eager from there on and says so (CompiledOrEager: nothing has stepped when the compiler raises).
    Dynamo traces nn.LSTM (the CLSTM's cells) only with its allow_rnn switch (torch 2.13: "experimental"),
    turned on around the compiled call alone."""
    if mode == "off":
        return rollout_step
    import torch._dynamo

    compiled = torch.compile(rollout_step, fullgraph=True, mode="reduce-overhead" if mode == "graphs" else None)

    def step(*args):
        with torch._dynamo.config.patch(allow_rnn=True):
            out = compiled(*args)
        if mode != "graphs":
            return out
        # A CUDA graph's outputs live in its memory pool, and any use of one after the graph runs again raises
        # (the H200 at 1adc135: "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
        # run"). The observation is the next call's input, so it leaves the pool here; the other outputs are
        # copied into the rollout, and the done flags read, before the next call.
        obs, *rest = out
        return (tuple(o.clone() for o in obs), *rest)
    return CompiledOrEager(step, rollout_step, log, off_flag="--compile-rollout off")


@torch.no_grad()
def advantages(buf: Rollout, next_value: torch.Tensor, next_done: torch.Tensor, gamma: float,
               lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(λ). dones[t] marks obs[t] as the first of a new episode (nothing bootstraps across it)."""
    adv = torch.zeros_like(buf.rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(buf.steps)):
        if t == buf.steps - 1:
            not_done, next_v = 1.0 - next_done.float(), next_value
        else:
            not_done, next_v = 1.0 - buf.dones[t + 1], buf.values[t + 1]
        delta = buf.rewards[t] + gamma * next_v * not_done - buf.values[t]
        last = delta + gamma * lam * not_done * last
        adv[t] = last
    return adv, adv + buf.values


def update(learner: Learner, buf: Rollout, adv: torch.Tensor, returns: torch.Tensor, s: PPOSettings,
           generator: torch.Generator, ctx: DistContext) -> dict:
    """PPO epochs over this rank's rollout. Returns the update's statistics as tensors (read them at log points
    only)."""
    train_policy, policy, norms, inputs = learner.train_policy, learner.policy, learner.norms, learner.inputs
    optimizer, scaler, precision = learner.optimizer, learner.scaler, learner.precision
    n = buf.steps * buf.num_envs
    obs = [o.reshape(n, *o.shape[2:]) for o in buf.obs]
    actions = buf.actions.reshape(n, *buf.actions.shape[2:])
    old_log_probs, old_values = buf.log_probs.reshape(n), buf.values.reshape(n)
    adv, returns = adv.reshape(n), returns.reshape(n)
    device = adv.device
    totals = torch.zeros(6, dtype=torch.float64, device=device)  # pg, v, entropy, kl, clipfrac, minibatches
    epochs_run = 0
    for _epoch in range(s.update_epochs):
        epochs_run += 1
        perm = torch.randperm(n, generator=generator, device=generator.device).to(device)
        epoch_kl = torch.zeros((), dtype=torch.float64, device=device)
        epoch_batches = 0
        for start in range(0, n, s.minibatch_size):
            mb = perm[start:start + s.minibatch_size]
            mb_adv = adv[mb]
            if s.norm_adv and len(mb) > 1:
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            parts = [p for p in torch.tensor_split(torch.arange(len(mb), device=device), s.grad_accum) if len(p)]
            for i, part in enumerate(parts):
                idx = mb[part]
                sync = i == len(parts) - 1 or not ctx.distributed
                with contextlib.nullcontext() if sync else train_policy.no_sync():
                    with autocast(device, precision):
                        new_log_prob, entropy, new_value = train_policy(
                            *normalise(norms, inputs(tuple(o[idx] for o in obs))), actions[idx])
                    log_ratio = new_log_prob - old_log_probs[idx]
                    ratio = log_ratio.exp()
                    a = mb_adv[part]
                    pg_loss = torch.max(-a * ratio, -a * ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef)).mean()
                    v_unclipped = (new_value - returns[idx]) ** 2
                    if s.clip_vloss:
                        v_clipped = old_values[idx] + (new_value - old_values[idx]).clamp(-s.clip_coef, s.clip_coef)
                        v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - returns[idx]) ** 2).mean()
                    else:
                        v_loss = 0.5 * v_unclipped.mean()
                    loss = pg_loss - s.ent_coef * entropy.mean() + s.vf_coef * v_loss
                    scaler.scale(loss * (len(part) / len(mb))).backward()
                with torch.no_grad():
                    w = len(part) / len(mb)
                    kl = ((ratio - 1) - log_ratio).mean()
                    clipfrac = ((ratio - 1.0).abs() > s.clip_coef).float().mean()
                    totals[:5] += w * torch.stack([pg_loss.detach(), v_loss.detach(), entropy.mean().detach(), kl,
                                                   clipfrac]).double()
                    epoch_kl += w * kl.double()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(policy.parameters(), s.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            totals[5] += 1
            epoch_batches += 1
        if s.target_kl is not None:
            kl = epoch_kl / epoch_batches
            if ctx.distributed:  # every rank stops after the same epoch, or DDP would hang
                dist.all_reduce(kl)
                kl = kl / ctx.world_size
            if float(kl) > s.target_kl:
                break
    var_y = returns.var()  # explained variance, on the device (a `float(var_y) > 0` test was a host sync per update)
    explained = torch.where(var_y > 0, 1.0 - (returns - old_values).var() / var_y, torch.full_like(var_y, float("nan")))
    mean = totals[:5] / totals[5]
    return {"pg_loss": mean[0], "v_loss": mean[1], "entropy": mean[2], "approx_kl": mean[3], "clipfrac": mean[4],
            "explained_variance": explained, "epochs": epochs_run}


def anneal_lr(optimizer, lr: float, update_index: int, num_updates: int) -> float:
    """CleanRL's linear decay: the first update at `lr`, reaching lr/num_updates at the last."""
    now = lr * (1.0 - update_index / num_updates)
    for group in optimizer.param_groups:
        group["lr"] = now
    return now


def make_norms(sizes: list[int], device: torch.device) -> torch.nn.ModuleList:
    return torch.nn.ModuleList([RunningNorm(s) for s in sizes]).to(device)
