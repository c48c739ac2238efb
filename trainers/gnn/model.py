"""Graph coloring GNN over edge lists (GraphSAGE-style). Imports only torch.

Why SAGE: mean aggregation with a separate self term is permutation-equivariant, needs only a
scatter-add over the edge list (no dense adjacency, exports to ONNX as ScatterElements), and keeps
a node's own state apart from its neighbours', which coloring needs: a node must end up
*different* from its neighbours. Node inputs never depend on node ids (degree features plus
random features that break the symmetry between look-alike nodes).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

MASKED_LOGIT = -1.0e4  # colors not offered to a graph (finite: exports and softmaxes cleanly)


class SAGELayer(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.self_lin = nn.Linear(d_in, d_out)
        self.neigh_lin = nn.Linear(d_in, d_out, bias=False)

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, inv_deg: torch.Tensor) -> torch.Tensor:
        agg = torch.zeros_like(h).index_add(0, dst, h.index_select(0, src)) * inv_deg
        return self.self_lin(h) + self.neigh_lin(agg)


class ColoringGNN(nn.Module):
    """x [N, in_dim], edge_index [2, E] (both directions), color_mask [N, K] -> logits [N, K]."""

    def __init__(self, in_dim: int, hidden: int, layers: int, max_colors: int, dropout: float = 0.0):
        super().__init__()
        self.max_colors = max_colors
        self.input = nn.Linear(in_dim, hidden)
        self.layers = nn.ModuleList(SAGELayer(hidden, hidden) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, max_colors)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, color_mask: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index[0], edge_index[1]
        deg = torch.zeros(x.shape[0], 1, dtype=x.dtype, device=x.device).index_add(
            0, dst, torch.ones(dst.shape[0], 1, dtype=x.dtype, device=x.device))
        inv_deg = 1.0 / deg.clamp(min=1.0)
        h = F.gelu(self.input(x))
        for layer, norm in zip(self.layers, self.norms):
            h = h + F.dropout(F.gelu(layer(norm(h), src, dst, inv_deg)), self.dropout, self.training)
        logits = self.head(h).float()
        return torch.where(color_mask > 0, logits, torch.full_like(logits, MASKED_LOGIT))


def potts_conflicts(probs: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """Expected number of conflicting edges per directed edge: sum_c p_u,c * p_v,c, one value per
    edge. Invariant to permuting colors; zero exactly when every edge joins different one-hot
    colors (a proper coloring)."""
    return (probs.index_select(0, edge_index[0]) * probs.index_select(0, edge_index[1])).sum(-1)
