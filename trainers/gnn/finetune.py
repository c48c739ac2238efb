"""Per-instance fine-tuning (PI-GNN style, Schuetz et al. 2022): the trained model is optimised on
the one graph being coloured, with the Potts loss and `target` colours offered, then its argmax is
repaired and searched like any other start.

- Restarts: each starts from the trained weights with different random node features; the random
  feature columns are trained too (PI-GNN learns its node embeddings).
- Annealing: loss = expected conflicting-edge fraction + gamma(t) * mean_v (1 - sum_c p_vc^2),
  gamma rising linearly from -ANNEAL to +ANNEAL: early on the term rewards spread-out
  probabilities (exploration, no early commitment), late it pushes every node to one colour, so
  the argmax the search receives is what the loss optimised (Ichikawa 2023's annealed relaxation).
- The argmax with fewest conflicting edges seen during each restart is kept (the loss is smooth;
  the argmax is not).
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch

from trainers.gnn.build import build_model
from trainers.gnn.config import GnnConfig
from trainers.gnn.decode import repair
from trainers.gnn.features import color_mask, degree_features, random_features
from trainers.gnn.graphs import Graph
from trainers.gnn.model import potts_conflicts
from trainers.gnn.search import reduce_colors
from trainers.runtime.rundir import load_checkpoint_states, load_run_config

ANNEAL = 0.2
LR = 3e-3


def finetune(model: torch.nn.Module, g: Graph, max_colors: int, random_dims: int, target: int, steps: int,
             restarts: int, seed: int = 0) -> list[dict]:
    """For each restart: the argmax (offering `target` colours) with fewest conflicts, and its count."""
    device = next(model.parameters()).device
    degree = torch.from_numpy(degree_features(g)).to(device)
    edge_index = torch.from_numpy(np.concatenate([g.edges, g.edges[:, ::-1]]).T.copy()).to(device)
    mask = torch.from_numpy(color_mask(g.n, target, max_colors)).to(device)
    src, dst = edge_index
    out = []
    for r in range(restarts):
        t0 = time.perf_counter()
        torch.manual_seed(seed * 7919 + r)
        tuned = copy.deepcopy(model).eval()  # eval: no dropout noise; gradients still flow
        rnd = torch.from_numpy(random_features(g.n, random_dims, seed * 7919 + r + 1)).to(device).requires_grad_()
        opt = torch.optim.AdamW([*tuned.parameters(), rnd], lr=LR, weight_decay=0.0)
        best_conflicts, best = None, None
        for step in range(steps):
            gamma = ANNEAL * (2.0 * step / max(steps - 1, 1) - 1.0)
            logits = tuned(torch.cat([degree, rnd], 1), edge_index, mask)
            probs = torch.softmax(logits, -1)
            expected = potts_conflicts(probs, edge_index).sum() / 2.0 / max(g.n_edges, 1)
            loss = expected + gamma * (1.0 - (probs * probs).sum(-1)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                assign = logits.argmax(-1)
                n_conf = int((assign[src] == assign[dst]).sum()) // 2
            if best_conflicts is None or n_conf < best_conflicts:
                best_conflicts, best = n_conf, assign.cpu().numpy()
            if n_conf == 0:
                break
        out.append({"restart": r, "coloring": best, "conflicts": best_conflicts, "steps": step + 1,
                    "seconds": round(time.perf_counter() - t0, 4)})
    return out


# Eleven parameters: the graph, the model and the colouring it starts from, and the stage's four budgets; called by
# `gnn color` (from its Search) and by the tests, which set each budget apart.
def finetune_stage(model: torch.nn.Module, g: Graph, max_colors: int, random_dims: int, best: np.ndarray, lower: int,
                   steps: int, restarts: int, search_iters: int, search_seconds: float,
                   seed: int = 0) -> tuple[np.ndarray, dict]:
    """Fine-tune for one colour fewer than `best` (a proper colouring) has, then repair + search
    from the best of `best` and the repaired fine-tuned argmaxes, with those argmaxes as hints.
    Never returns more colours than `best`."""
    t0 = time.perf_counter()
    current = int(len(np.unique(best)))
    if current <= max(lower, 1):
        return best, {"skipped": f"the colouring already has {current} colours, the clique lower bound: optimal",
                      "colors": current}
    target = max(lower, current - 1)
    if target > max_colors:
        return best, {"skipped": f"{target} colours would be the target; the model offers at most {max_colors} "
                                 f"(--max-colors of its training run)", "colors": current}
    runs = finetune(model, g, max_colors, random_dims, target, steps, restarts, seed)
    repaired = [repair(g, r["coloring"]) for r in runs]
    start = min([best, *repaired], key=lambda c: int(c.max()) + 1)
    report = {"target": target, "steps": steps,
              "restarts": [{k: r[k] for k in ("restart", "conflicts", "steps", "seconds")} for r in runs],
              "raw_conflicts": min(r["conflicts"] for r in runs),
              "repaired_colors": min(int(c.max()) + 1 for c in repaired)}
    if search_iters > 0 and search_seconds > 0:
        found = reduce_colors(g, start, search_iters, search_seconds, seed, lower, hints=[r["coloring"] for r in runs])
        start = found.coloring
        report["searched"] = {"colors": found.colors, "iterations": found.iterations, "stopped": found.stopped}
    report.update(colors=int(start.max()) + 1, seconds=round(time.perf_counter() - t0, 4))
    return start, report


def load_trained(run_dir, checkpoint: str = "best") -> tuple[torch.nn.Module, object, int]:
    """(model on the CPU in eval mode, its GnnConfig, checkpoint step) from a training run's folder."""
    cfg = load_run_config(run_dir, GnnConfig)
    step, states = load_checkpoint_states(run_dir, checkpoint)
    model = build_model(cfg)
    model.load_state_dict(states["model"])
    return model.eval(), cfg, step
