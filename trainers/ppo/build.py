"""The agents of a PPO run: their policy networks (`build_model`), the set the checkpoint holds, and
the snapshot of each that validation chose. Training, evaluation, export and sizing get them here.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from trainers.ppo import ppo
from trainers.ppo.config import PpoConfig
from trainers.ppo.features import FEATURES
from trainers.ppo.model import SquashedGaussianPolicy, TradingActorCritic


def build_model(cfg: PpoConfig, n_stocks: int | None = None, encoder: str | None = None) -> SquashedGaussianPolicy:
    net = TradingActorCritic(n_stocks or cfg.num_stocks, len(FEATURES), cfg.window, cfg.hidden,
                             encoder or cfg.encoder, cfg.heads, math.log(cfg.init_std))
    return SquashedGaussianPolicy(net)


@dataclass
class Agent:
    encoder: str
    seed: int
    policy: SquashedGaussianPolicy
    norms: torch.nn.ModuleList | None
    optimizer: torch.optim.Optimizer
    best: dict | None = None  # {"update", "val_score", "policy", "norms"}: the snapshot the report uses
    history: list | None = None  # [(update, val_score)]
    updates_done: int = 0


class AgentSet:
    """Every agent of the run, as one stateful object in the checkpoint."""

    def __init__(self, cfg: PpoConfig, n_stocks: int, device: torch.device):
        self.agents = []
        for encoder, seed in cfg.agents():
            torch.manual_seed(seed)  # identical init on every rank (DDP also broadcasts rank 0's)
            policy = build_model(cfg, n_stocks, encoder).to(device)
            norms = ppo.make_norms([len(FEATURES), n_stocks + 1], device) if cfg.norm_obs else None
            optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=1e-5)
            self.agents.append(Agent(encoder, seed, policy, norms, optimizer, None, []))

    def state_dict(self) -> dict:
        return {"agents": [{"policy": a.policy.state_dict(), "norms": a.norms.state_dict() if a.norms else None,
                            "optimizer": a.optimizer.state_dict(), "best": a.best,
                            "history": [list(h) for h in a.history], "updates_done": a.updates_done}
                           for a in self.agents]}

    def load_state_dict(self, state: dict) -> None:
        for a, s in zip(self.agents, state["agents"], strict=True):
            a.policy.load_state_dict(s["policy"])
            if a.norms is not None:
                a.norms.load_state_dict(s["norms"])
            a.optimizer.load_state_dict(s["optimizer"])
            a.best, a.history = s["best"], [tuple(h) for h in s["history"]]
            a.updates_done = s["updates_done"]

    def validated(self, a: Agent, update: int, score: float, min_delta: float = 0.0) -> bool:
        """Record a validation; True when it is the agent's new best (higher by more than `min_delta`)."""
        a.history.append((update, score))
        if not math.isfinite(score) or (a.best is not None and score <= a.best["val_score"] + min_delta):
            return False  # a NaN score never becomes the snapshot the report and export use
        a.best = {"update": update, "val_score": score,
                  "policy": {k: v.detach().clone() for k, v in a.policy.state_dict().items()},
                  "norms": {k: v.clone() for k, v in a.norms.state_dict().items()} if a.norms else None}
        return True


def chosen(agent) -> tuple[torch.nn.Module, torch.nn.ModuleList | None, int | None, float | None]:
    """The agent's snapshot with the best validation score (its current weights if never validated)."""
    if agent.best is None:
        return agent.policy, agent.norms, None, None
    policy = copy.deepcopy(agent.policy)
    policy.load_state_dict(agent.best["policy"])
    for module in policy.modules():  # a copy's LSTM weights are separate tensors: cuDNN would compact them at
        if isinstance(module, torch.nn.LSTM):  # every call (the H100's evaluation warned so); once here
            module.flatten_parameters()
    norms = None
    if agent.norms is not None:
        norms = copy.deepcopy(agent.norms)
        norms.load_state_dict(agent.best["norms"])
    return policy, norms, agent.best["update"], agent.best["val_score"]


def best_main_agent(agents, cfg: PpoConfig):
    """The agent export ships: the main encoder's seed with the best validation score."""
    main = [a for a in agents.agents if a.encoder == cfg.encoder and a.best is not None]
    return max(main, key=lambda a: a.best["val_score"]) if main else agents.agents[0]
