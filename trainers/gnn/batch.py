"""Many graphs as one block-diagonal graph: node features, both-direction edges, color masks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trainers.gnn.features import colors_offered, node_features
from trainers.gnn.graphs import Graph
from trainers.gnn.model import potts_conflicts


@dataclass
class GraphBatch:
    x: torch.Tensor  # [N, F]
    edge_index: torch.Tensor  # [2, 2E] both directions
    color_mask: torch.Tensor  # [N, K]
    edge_graph: torch.Tensor  # [2E] graph id of each directed edge
    edges_per_graph: torch.Tensor  # [G] undirected edges
    node_offsets: list[int]
    offered: list[int]


def make_batch(graphs: list[Graph], max_colors: int, random_dims: int, seeds: list[int],
               device: torch.device) -> GraphBatch:
    xs, edges, edge_graph, offsets, offered = [], [], [], [0], []
    masks = []
    for gi, (g, seed) in enumerate(zip(graphs, seeds)):
        k = colors_offered(g, max_colors)
        offered.append(k)
        xs.append(node_features(g, random_dims, seed))
        m = np.zeros((g.n, max_colors), np.float32)
        m[:, :k] = 1.0
        masks.append(m)
        e = g.edges + offsets[-1]
        edges.append(np.concatenate([e, e[:, ::-1]]))
        edge_graph.append(np.full(2 * g.n_edges, gi))
        offsets.append(offsets[-1] + g.n)
    ei = np.concatenate(edges).T.copy() if edges else np.zeros((2, 0), np.int64)
    return GraphBatch(
        x=torch.from_numpy(np.concatenate(xs)).to(device),
        edge_index=torch.from_numpy(ei.astype(np.int64)).to(device),
        color_mask=torch.from_numpy(np.concatenate(masks)).to(device),
        edge_graph=torch.from_numpy(np.concatenate(edge_graph).astype(np.int64)).to(device),
        edges_per_graph=torch.tensor([g.n_edges for g in graphs], dtype=torch.float32, device=device),
        node_offsets=offsets, offered=offered)


def batch_loss(model, graphs: list[Graph], max_colors: int, random_dims: int, seeds: list[int],
               device: torch.device, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over graphs of (expected conflicting edges / edges), times `scale`; and that sum unscaled."""
    b = make_batch(graphs, max_colors, random_dims, seeds, device)
    probs = torch.softmax(model(b.x, b.edge_index, b.color_mask), dim=-1)
    per_edge = potts_conflicts(probs, b.edge_index)  # each undirected edge appears twice
    per_graph = torch.zeros(len(graphs), device=device).index_add(0, b.edge_graph, per_edge) / 2.0
    frac = per_graph / b.edges_per_graph.clamp(min=1.0)
    return frac.sum() * scale, frac.detach().sum()
