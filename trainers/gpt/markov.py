"""A synthetic text source whose best possible validation loss is known exactly.

Text is drawn from a seeded order-k Markov chain over a small alphabet: each context of k
characters has its own next-character distribution (Dirichlet-distributed, so some contexts are
nearly deterministic and others nearly uniform). Every transition probability is positive, so the
chain over contexts is irreducible and aperiodic, with one stationary distribution pi.

    entropy rate  H = sum over contexts c of pi(c) x H(next | c)       (nats per character)

is the loss of the true distribution: no model can beat it on average. A model that reads each
validation window from scratch also lacks context at the window's first positions. The trainer
scores a window w of seq_len + 1 characters as inputs x = w[:-1] and targets y = w[1:]
(trainers/gpt/evaluate.py), so its first prediction already sees one character and no prediction
is made without context: `window_floor` averages H(X_{m+1} | X_1..X_m) over the contexts m =
1..seq_len the predictions really have (H(X2 | X1), ..., H(Xk | X1..Xk-1), then H), which is the
floor the trainer's validation loss is measured against. H(X1), a prediction from no context, is
not part of it: counting it overstated the floor (1.5713 instead of 1.5633 nats/char at seq_len 64
for the defaults), so a perfect model looked 0.008 nats better than "the floor".
Pure NumPy, no torch.
"""

from __future__ import annotations

import bisect
import random
import string
from dataclasses import dataclass

import numpy as np

MAX_CONTEXTS = 1 << 16  # alphabet ** order: the exact computation solves a system this large


@dataclass(frozen=True)
class MarkovSource:
    alphabet_size: int = 8
    order: int = 2
    concentration: float = 0.5
    seed: int = 0

    def __post_init__(self):
        if not 2 <= self.alphabet_size <= 27:
            raise ValueError(f"alphabet size {self.alphabet_size} must be in 2..27")
        if self.order < 0 or self.alphabet_size ** self.order > MAX_CONTEXTS:
            raise ValueError(f"alphabet {self.alphabet_size} ** order {self.order} contexts exceed {MAX_CONTEXTS}")
        if not self.concentration > 0:
            raise ValueError(f"concentration {self.concentration} must be > 0")

    @property
    def symbols(self) -> str:
        """Letters, then a newline last, so sampled text comes in lines."""
        return string.ascii_lowercase[: self.alphabet_size - 1] + "\n"

    @property
    def n_contexts(self) -> int:
        return self.alphabet_size ** self.order

    def transitions(self) -> np.ndarray:
        """P[context, next]: row c is the next-character distribution after context c (its k
        characters as base-A digits, oldest first). Float64, rows sum to 1, every entry > 0."""
        rng = np.random.default_rng(self.seed)
        p = rng.dirichlet(np.full(self.alphabet_size, self.concentration), size=self.n_contexts)
        p = np.maximum(p, 1e-6)  # Dirichlet draws can underflow to 0; keep the chain irreducible
        return p / p.sum(axis=1, keepdims=True)

    def stationary(self, p: np.ndarray | None = None) -> np.ndarray:
        """pi over contexts, solved exactly (a linear system, not a simulation): pi = pi M, sum 1,
        where M moves context (c1..ck) to (c2..ck, x) with probability P[c, x]."""
        p = self.transitions() if p is None else p
        n, a = self.n_contexts, self.alphabet_size
        if self.order == 0:
            return np.ones(1)
        m = np.zeros((n, n))
        nxt = (np.arange(n)[:, None] * a) % n + np.arange(a)[None, :]
        np.add.at(m, (np.repeat(np.arange(n), a), nxt.ravel()), p.ravel())
        system = m.T - np.eye(n)
        system[-1, :] = 1.0  # replace one (redundant) balance equation by the normalisation
        rhs = np.zeros(n)
        rhs[-1] = 1.0
        pi = np.linalg.solve(system, rhs)
        if not np.allclose(pi @ m, pi, atol=1e-12) or pi.min() < 0:
            raise ArithmeticError("stationary distribution did not solve to machine precision")
        return pi

    def entropy_rate(self) -> float:
        """Nats per character: the loss of the true conditional distribution."""
        p = self.transitions()
        return float(self.stationary(p) @ (-(p * np.log(p)).sum(axis=1)))

    def prefix_entropies(self) -> list[float]:
        """[H(X1), H(X2 | X1), ..., H(Xk | X1..Xk-1)] under the stationary chain (nats)."""
        p = self.transitions()
        a, k = self.alphabet_size, self.order
        if k == 0:
            return []
        joint = self.stationary(p)  # distribution of k-grams
        out = []
        for j in range(1, k + 1):
            # distribution over the first j characters: sum out the last k - j of each k-gram
            pj = joint.reshape(a ** j, a ** (k - j)).sum(axis=1)
            if j == 1:
                out.append(float(-(pj * np.log(pj)).sum()))
            else:
                prev = pj.reshape(a ** (j - 1), a).sum(axis=1)
                cond = pj.reshape(a ** (j - 1), a) / prev[:, None]
                out.append(float(-(pj * np.log(cond.ravel())).sum()))
        return out

    def conditional(self, m: int) -> np.ndarray:
        """P(X_{m+1} = x | X_1..X_m = c) as [A ** min(m, k), A]: row c is the context's characters as
        base-A digits, oldest first; for m >= k only the last k characters matter (the transitions).
        What a perfect model predicts after m characters of a stationary text."""
        if m < 0:
            raise ValueError(f"context length {m} must be >= 0")
        p = self.transitions()
        a, k = self.alphabet_size, self.order
        if m >= k:
            return p
        # the first m + 1 characters' distribution: sum the k-grams' stationary mass over the rest
        first = self.stationary(p).reshape(a ** (m + 1), a ** (k - m - 1)).sum(axis=1).reshape(a ** m, a)
        return first / first.sum(axis=1, keepdims=True)

    def context_entropy(self, m: int) -> float:
        """H(X_{m+1} | X_1..X_m): the best mean loss of a prediction that sees m characters of a
        stationary text (m >= k: the entropy rate; m = 0: no context at all)."""
        if m < 0:
            raise ValueError(f"context length {m} must be >= 0")
        prefix = self.prefix_entropies()
        return prefix[m] if m < len(prefix) else self.entropy_rate()

    def window_floor(self, seq_len: int) -> float:
        """The lowest mean loss over the `seq_len` predictions of one window read from scratch, as
        the trainer makes them: prediction j (0-based) sees the window's first j + 1 characters,
        so the contexts are 1..seq_len characters long; only the first k - 1 see less than k."""
        if seq_len < 1:
            raise ValueError(f"seq_len {seq_len} must be >= 1")
        prefix, rate = self.prefix_entropies(), self.entropy_rate()
        short = prefix[1: seq_len + 1]  # contexts 1..k-1 (fewer when the window is shorter than that)
        return (sum(short) + (seq_len - len(short)) * rate) / seq_len

    def generate(self, n_chars: int) -> str:
        """`n_chars` characters of one chain, started from the stationary distribution (so the
        whole text is stationary), deterministic for the seed."""
        p = self.transitions()
        a, k, n = self.alphabet_size, self.order, self.n_contexts
        cumulative = [list(np.cumsum(row)) for row in p]
        for row in cumulative:
            row[-1] = 1.0 + 1e-12
        rnd = random.Random(self.seed * 1_000_003 + 7)
        state = int(np.searchsorted(np.cumsum(self.stationary(p)), rnd.random())) if k else 0
        state = min(state, n - 1)
        history = []
        for _ in range(k):  # the starting context's characters come first
            history.append(state // a ** (k - 1 - len(history)) % a)
        out = bytearray()
        symbols = self.symbols.encode()
        out.extend(symbols[c] for c in history)
        for _ in range(n_chars - k):
            c = bisect.bisect_right(cumulative[state], rnd.random())
            out.append(symbols[c])
            state = (state * a + c) % n
        return out[:n_chars].decode()
