"""gymnasium's CartPole-v1 through the trainer's PPO (trainers.ppo.ppo): the known task PPO is proven on."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from trainers.ppo.model import CategoricalPolicy
from trainers.ppo.ppo import Learner, PPOSettings, Rollout, advantages, anneal_lr, collect, make_norms, update
from trainers.runtime.precision import Precision, make_grad_scaler
from trainers.runtime.rundir import single_process_context


class TorchVecEnv:
    """gymnasium's vector CartPole (same-step autoreset, as CleanRL) returning tensors; records the
    return of every finished episode."""

    def __init__(self, num_envs: int, seed: int):
        self.env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync",
                                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
        obs, _ = self.env.reset(seed=seed)
        self.obs = (torch.as_tensor(obs, dtype=torch.float32),)
        self.running = np.zeros(num_envs)
        self.finished: list[float] = []

    def step(self, action: torch.Tensor):
        obs, reward, terminated, truncated, _ = self.env.step(action.numpy())
        done = terminated | truncated
        self.running += reward
        self.finished += self.running[done].tolist()
        self.running[done] = 0.0
        return (torch.as_tensor(obs, dtype=torch.float32),), torch.as_tensor(reward, dtype=torch.float32), \
            torch.as_tensor(done), {}


def train_cartpole(total_steps: int, seed: int = 0, num_envs: int = 8, settings: PPOSettings | None = None,
                   lr: float = 1e-3, norm_obs: bool = False, stop_at: float | None = None) -> tuple[list[float], int]:
    """(returns of every finished episode, environment steps taken). Stops early once the mean of
    the last 100 episodes reaches `stop_at`."""
    s = settings or PPOSettings(rollout_steps=32, gamma=0.98, gae_lambda=0.8, update_epochs=20, minibatch_size=256,
                                ent_coef=0.0, max_grad_norm=0.5)
    torch.manual_seed(seed)
    ctx = single_process_context()
    env = TorchVecEnv(num_envs, seed)
    policy = CategoricalPolicy(4, 2)
    norms = make_norms([4], ctx.device) if norm_obs else None
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr, eps=1e-5)
    scaler = make_grad_scaler(ctx.device, Precision("fp32", None))
    generator = torch.Generator().manual_seed(seed)
    buf = Rollout(s.rollout_steps, env.obs, (), torch.int64, ctx.device)
    learner = Learner(policy, policy, norms, lambda o: o, optimizer, scaler, Precision("fp32", None), ctx.device)
    num_updates = total_steps // (num_envs * s.rollout_steps)
    obs, done = env.obs, torch.zeros(num_envs, dtype=torch.bool)
    steps = 0
    for u in range(num_updates):
        anneal_lr(optimizer, lr, u, num_updates)
        obs, done = collect(learner, env, buf, obs, done, generator)
        steps += num_envs * s.rollout_steps
        with torch.no_grad():
            next_value = policy.act(*(normalise_obs(norms, obs)), generator=generator)[3]
        adv, ret = advantages(buf, next_value, done, s.gamma, s.gae_lambda)
        update(learner, buf, adv, ret, s, generator, ctx)
        if stop_at is not None and len(env.finished) >= 100 and np.mean(env.finished[-100:]) >= stop_at:
            break
    return env.finished, steps


def normalise_obs(norms, obs):
    return obs if norms is None else tuple(n(x) for n, x in zip(norms, obs))
