"""The CLSTM-PPO actor-critic (Zou et al.) and the plain policies PPO is proven with. Imports only torch.

Trading policy, on a window of W days of F features for N stocks and the portfolio's weights:
    stage one   each day's cross-section [N, F] -> Linear + tanh -> a day vector          (per day)
    stage two   an LSTM reads the W day vectors                  -> a sequence of states
    heads       actor and critic: each an LSTM over that sequence (`heads="lstm"`, the paper's
                LSTM-based actor and critic) or an MLP on its last state (`heads="mlp"`); the
                portfolio weights join the head's last state before its output layer
`encoder="mlp"` replaces the cascade with CleanRL's two MLPs on the flattened window: the baseline.

The policy is a Gaussian with a state-independent log-std, squashed by tanh into [-1, 1]. PPO
stores the pre-squash sample u; the log-probability of the action a = tanh(u) is
    log N(u; mean, std) - sum log(1 - tanh(u)^2),   log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))
(the stable form). Entropy is the Gaussian's (the squashed one has no closed form).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

LOG_2PI = math.log(2 * math.pi)


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """CleanRL's init: orthogonal weights, constant bias."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def lstm_init(lstm: nn.LSTM) -> nn.LSTM:
    for name, p in lstm.named_parameters():
        if "weight" in name:
            nn.init.orthogonal_(p, 1.0)
        else:
            nn.init.zeros_(p)
    return lstm


def mlp(n_in: int, hidden: int, n_out: int, out_gain: float) -> nn.Sequential:
    return nn.Sequential(layer_init(nn.Linear(n_in, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, hidden)),
                         nn.Tanh(), layer_init(nn.Linear(hidden, n_out), out_gain))


def squash_correction(u: torch.Tensor) -> torch.Tensor:
    """sum over the last dim of log(1 - tanh(u)^2), computed without tanh's saturation."""
    return (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)


def gaussian_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    return (-0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * LOG_2PI).sum(-1)


class Head(nn.Module):
    """Reads the stage-two sequence [B, W, H] and the portfolio [B, P] -> [B, n_out]."""

    def __init__(self, hidden: int, n_portfolio: int, n_out: int, kind: str, out_gain: float):
        super().__init__()
        self.kind = kind
        if kind == "lstm":
            self.lstm = lstm_init(nn.LSTM(hidden, hidden, batch_first=True))
            self.out = layer_init(nn.Linear(hidden + n_portfolio, n_out), out_gain)
        else:
            self.net = mlp(hidden + n_portfolio, hidden, n_out, out_gain)

    def forward(self, seq: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        return self.output(self.features(seq), portfolio)

    def features(self, seq: torch.Tensor) -> torch.Tensor:
        """[B, H]: what the head reads of the sequence, before the portfolio joins."""
        return torch.tanh(self.lstm(seq)[0][:, -1]) if self.kind == "lstm" else seq[:, -1]

    def output(self, features: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        joined = torch.cat([features, portfolio.to(features.dtype)], -1)
        return self.out(joined) if self.kind == "lstm" else self.net(joined)


class TradingActorCritic(nn.Module):
    """forward(market [B, W, N, F], portfolio [B, N+1]) -> (action mean [B, N], value [B])."""

    def __init__(self, n_stocks: int, n_features: int, window: int, hidden: int = 64, encoder: str = "clstm",
                 heads: str = "lstm", init_log_std: float = 0.0):
        super().__init__()
        if encoder not in ("clstm", "mlp") or heads not in ("lstm", "mlp"):
            raise ValueError(f"encoder {encoder!r} / heads {heads!r}")
        self.encoder = encoder
        n_portfolio = n_stocks + 1
        if encoder == "clstm":
            self.day = layer_init(nn.Linear(n_stocks * n_features, hidden))
            self.window_lstm = lstm_init(nn.LSTM(hidden, hidden, batch_first=True))
            self.actor = Head(hidden, n_portfolio, n_stocks, heads, 0.01)
            self.critic = Head(hidden, n_portfolio, 1, heads, 1.0)
        else:
            flat = window * n_stocks * n_features + n_portfolio
            self.actor_mlp = mlp(flat, hidden, n_stocks, 0.01)
            self.critic_mlp = mlp(flat, hidden, 1, 1.0)
        self.log_std = nn.Parameter(torch.full((n_stocks,), float(init_log_std)))

    def forward(self, market: torch.Tensor, portfolio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.encoder == "clstm":
            seq = self._sequence(market)
            return self.actor(seq, portfolio), self.critic(seq, portfolio).squeeze(-1)
        x = torch.cat([market.flatten(1), portfolio.to(market.dtype)], -1)
        return self.actor_mlp(x), self.critic_mlp(x).squeeze(-1)

    def _sequence(self, market: torch.Tensor) -> torch.Tensor:
        days = torch.tanh(self.day(market.flatten(2)))  # [B, W, H]: stage one, per day
        return self.window_lstm(days)[0]  # stage two: the window

    # The action mean in two parts, the same operations as forward's actor: what the market alone decides
    # (the cascade and the actor head's LSTM: all of the model's recurrent work) and what the portfolio joins.
    # A backtest runs the first over every day of its period at once: the market does not depend on the
    # agent's trades, so only the second waits for the day before (evaluate.run_policy).
    def actor_features(self, market: torch.Tensor) -> torch.Tensor:
        return self.actor.features(self._sequence(market)) if self.encoder == "clstm" else market.flatten(1)

    def actor_mean(self, features: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        if self.encoder == "clstm":
            return self.actor.output(features, portfolio)
        return self.actor_mlp(torch.cat([features, portfolio.to(features.dtype)], -1))


class SquashedGaussianPolicy(nn.Module):
    """A net returning (mean, value) and its log-std -> the policy PPO trains.

    forward(*inputs, u) -> (log-prob of tanh(u), entropy, value): the training path (DDP calls it).
    act(*inputs) -> (u, tanh(u), log-prob, value): sampling in the rollout.
    """

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    @property
    def log_std(self) -> torch.Tensor:
        return self.net.log_std

    def _dist(self, inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mean, value = self.net(*inputs)
        return mean.float(), self.log_std.float().expand_as(mean), value.float()

    def forward(self, *inputs_and_action):
        *inputs, u = inputs_and_action
        mean, log_std, value = self._dist(inputs)
        log_prob = gaussian_log_prob(u, mean, log_std) - squash_correction(u)
        entropy = (log_std + 0.5 + 0.5 * LOG_2PI).sum(-1)
        return log_prob, entropy, value

    @torch.no_grad()
    def act(self, *inputs, generator: torch.Generator | None = None):
        mean, log_std, value = self._dist(inputs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return self._sampled(mean, log_std, value, noise)

    @torch.no_grad()
    def sample(self, *inputs, noise: torch.Tensor):
        """act() with its standard normal draw given (the same draw act() would make from its generator):
        a pure function of tensors, which a compiled rollout step can capture."""
        return self._sampled(*self._dist(inputs), noise)

    @staticmethod
    def _sampled(mean, log_std, value, noise):
        u = mean + log_std.exp() * noise
        log_prob = gaussian_log_prob(u, mean, log_std) - squash_correction(u)
        return u, torch.tanh(u), log_prob, value

    def deterministic(self, market: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        """tanh of the action mean, without the critic (what ONNX exports and a backtest runs)."""
        return torch.tanh(self.net.actor_mean(self.net.actor_features(market), portfolio))


class CategoricalPolicy(nn.Module):
    """CleanRL's discrete-action agent (two tanh MLPs), with the same interface as above."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.actor = mlp(obs_dim, hidden, n_actions, 0.01)
        self.critic = mlp(obs_dim, hidden, 1, 1.0)

    def forward(self, obs: torch.Tensor, action: torch.Tensor):
        logits = self.actor(obs).float()
        log_p = torch.log_softmax(logits, -1)
        log_prob = log_p.gather(-1, action.long()[:, None]).squeeze(-1)
        entropy = -(log_p.exp() * log_p).sum(-1)
        return log_prob, entropy, self.critic(obs).squeeze(-1).float()

    @torch.no_grad()
    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        logits = self.actor(obs).float()
        action = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)
        log_prob = torch.log_softmax(logits, -1).gather(-1, action[:, None]).squeeze(-1)
        return action, action, log_prob, self.critic(obs).squeeze(-1).float()

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs).argmax(-1)


class RunningNorm(nn.Module):
    """Running mean and variance of one input over its last dimension (Welford, merged in batches),
    applied as clip((x - mean) / sqrt(var + eps), +-clip). Buffers, so they travel in state_dict
    and into the ONNX file."""

    def __init__(self, size: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip, self.eps = clip, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        std = (self.var + self.eps).sqrt().to(x.dtype)
        return ((x - self.mean.to(x.dtype)) / std).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def merge(self, count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> None:
        """Fold in a batch's (count, mean, population variance)."""
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + delta**2 * self.count * count / total
        self.mean += delta * count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)


class NormalisedPolicy(nn.Module):
    """Observation normalisers in front of a policy's deterministic action: what ONNX exports."""

    def __init__(self, norms: nn.ModuleList, policy: nn.Module):
        super().__init__()
        self.norms, self.policy = norms, policy

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.policy.deterministic(*(n(x) for n, x in zip(self.norms, inputs)))
