"""Many graphs as one block-diagonal graph: node features, both-direction edges, colour masks.

Training keeps a whole split on the device (`DeviceGraphs`) and gathers a batch there with offsets:
no Python loop over graphs, no greedy colouring and no pageable host-to-device copy per step (the
degree features, colour bounds and both-direction edges were computed once by `trainers gnn data`).
`make_batch` builds the same inputs on the host from `Graph` objects, for evaluation, export and
`trainers gnn color`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trainers.gnn.features import color_mask, colors_offered, node_features, random_features
from trainers.gnn.graphs import Graph, GraphSplit
from trainers.gnn.model import potts_conflicts
from trainers.runtime.device import to_device


@dataclass
class GraphBatch:
    x: torch.Tensor  # [N, F]
    edge_index: torch.Tensor  # [2, 2E] both directions
    color_mask: torch.Tensor  # [N, K]
    edge_graph: torch.Tensor  # [2E] graph id (within the batch) of each directed edge
    edges_per_graph: torch.Tensor  # [G] undirected edges
    n_graphs: int
    edge_weight: torch.Tensor | None = None  # [2E] 1 for a real edge, 0 for padding (pad_batch); None: all real


def make_batch(graphs: list[Graph], max_colors: int, random_dims: int, seeds: list[int], device: torch.device,
               offered: list[int] | None = None) -> GraphBatch:
    """On the host, from Graph objects. `offered`: colours offered per graph (default: the greedy bound)."""
    offered = offered or [colors_offered(g, max_colors) for g in graphs]
    xs, masks, edges, edge_graph, base = [], [], [], [], 0
    for gi, (g, seed, k) in enumerate(zip(graphs, seeds, offered)):
        xs.append(node_features(g, random_dims, seed))
        masks.append(color_mask(g.n, k, max_colors))
        edges.append(np.concatenate([g.edges, g.edges[:, ::-1]]) + base)
        edge_graph.append(np.full(2 * g.n_edges, gi))
        base += g.n
    ei = np.concatenate(edges).T.copy() if edges else np.zeros((2, 0), np.int64)
    return GraphBatch(x=torch.from_numpy(np.concatenate(xs)).to(device),
                      edge_index=torch.from_numpy(ei.astype(np.int64)).to(device),
                      color_mask=torch.from_numpy(np.concatenate(masks)).to(device),
                      edge_graph=torch.from_numpy(np.concatenate(edge_graph).astype(np.int64)).to(device),
                      edges_per_graph=torch.tensor([g.n_edges for g in graphs], dtype=torch.float32, device=device),
                      n_graphs=len(graphs))


class DeviceGraphs:
    """A split held on the device once; `batch(graph indices)` gathers a block-diagonal batch there.

    Random node features are drawn on the device from a generator the caller seeds (training: fresh
    per step, a pure function of the data position, so a resume redraws the same ones), or fixed
    per graph (`fixed_random_seed`: graph i gets the features `node_features` gives with seed
    fixed_random_seed + i, as evaluation uses). With `fewer_colors` f > 0 and a generator, each
    graph is offered its bound minus a uniform share in [0, f) of it (at least 2): the model then
    learns to colour with fewer colours than greedy needs, which is what a search seeded near the
    chromatic number asks of it."""

    def __init__(self, split: GraphSplit, max_colors: int, random_dims: int, device: torch.device,
                 fixed_random_seed: int | None = None, fewer_colors: float = 0.0):
        self.device, self.max_colors, self.random_dims = device, max_colors, random_dims
        self.fewer_colors = fewer_colors  # training: offer up to this share fewer colours than the bound
        self.nodes = np.asarray(split.nodes, dtype=np.int64)
        self.directed = 2 * np.diff(np.asarray(split.offsets, dtype=np.int64))
        as_t = lambda a, dtype: torch.from_numpy(np.array(a)).to(device=device, dtype=dtype)  # noqa: E731 (a copy of the mmap)
        self.degree = as_t(split.degree_features, torch.float32)
        self.edge_index = as_t(split.edge_index, torch.int32)  # local node ids; int32 halves the memory
        self.node_start = as_t(split.node_offsets[:-1], torch.int64)
        self.edge_start = as_t(2 * np.asarray(split.offsets[:-1]), torch.int64)
        self.n_nodes = as_t(self.nodes, torch.int64)
        self.n_directed = as_t(self.directed, torch.int64)
        self.offered = as_t(np.minimum(np.asarray(split.color_bound), max_colors), torch.int64)
        self.colors = torch.arange(max_colors, device=device)
        self.fixed_random = None
        if fixed_random_seed is not None:
            self.fixed_random = as_t(np.concatenate(
                [random_features(int(n), random_dims, fixed_random_seed + i) for i, n in enumerate(self.nodes)]),
                torch.float32)

    def batch(self, graphs: np.ndarray, generator: torch.Generator | None = None) -> GraphBatch:
        """Graphs `graphs` (host indices) as one batch. Sizes come from host copies of the counts, so
        nothing here waits for the device."""
        n_total, e_total = int(self.nodes[graphs].sum()), int(self.directed[graphs].sum())
        idx = to_device(torch.from_numpy(np.asarray(graphs, dtype=np.int64)), self.device)  # no wait for the device
        count = torch.arange(len(graphs), device=self.device)
        n, e = self.n_nodes[idx], self.n_directed[idx]
        first_node = torch.cumsum(n, 0) - n  # where each graph's nodes start in the batch
        node_graph = torch.repeat_interleave(count, n, output_size=n_total)
        local_node = torch.arange(n_total, device=self.device) - first_node[node_graph]
        source_node = self.node_start[idx][node_graph] + local_node
        edge_graph = torch.repeat_interleave(count, e, output_size=e_total)
        local_edge = torch.arange(e_total, device=self.device) - (torch.cumsum(e, 0) - e)[edge_graph]
        columns = self.edge_start[idx][edge_graph] + local_edge
        edge_index = self.edge_index[:, columns].long() + first_node[edge_graph]
        if self.fixed_random is not None:
            rnd = self.fixed_random[source_node]
        else:
            rnd = torch.randn(n_total, self.random_dims, device=self.device, generator=generator)
        x = torch.cat([self.degree[source_node], rnd], dim=1)
        offered = self.offered[idx]
        if self.fewer_colors > 0 and generator is not None:
            # drawn after the features, so a run without it draws the very same features as before
            cut = torch.rand(len(graphs), device=self.device, generator=generator) * self.fewer_colors
            offered = (offered - (cut * offered).long()).clamp(min=2)
        mask = (self.colors[None, :] < offered[node_graph][:, None]).float()
        return GraphBatch(x, edge_index, mask, edge_graph, e.float() / 2.0, len(graphs))


def pad_batch(b: GraphBatch, capacity: tuple[int, int, int]) -> GraphBatch:
    """`b` padded to `capacity` (nodes, directed edges, graphs; each above the batch's own: there is always a
    padding node, edge and graph), for a compiled step that sees one shape in a run instead of one per
    batch. The padding edges join the last padding node to itself and belong to the last padding graph,
    weigh 0 in the loss and carry no message to a real node; padding nodes are offered no colour. The loss
    and every gradient are the unpadded batch's."""
    n, e, g = b.x.shape[0], b.edge_index.shape[1], b.n_graphs
    cap_n, cap_e, cap_g = capacity
    if not (n < cap_n and e < cap_e and g < cap_g):
        raise ValueError(f"a batch of {n} nodes, {e} directed edges and {g} graphs does not fit the padded "
                         f"capacity {capacity}")
    real = torch.ones(e, device=b.x.device)
    return GraphBatch(x=torch.cat([b.x, b.x.new_zeros(cap_n - n, b.x.shape[1])]),
                      edge_index=torch.cat([b.edge_index, b.edge_index.new_full((2, cap_e - e), cap_n - 1)], 1),
                      color_mask=torch.cat([b.color_mask, b.color_mask.new_zeros(cap_n - n, b.color_mask.shape[1])]),
                      edge_graph=torch.cat([b.edge_graph, b.edge_graph.new_full((cap_e - e,), cap_g - 1)]),
                      edges_per_graph=torch.cat([b.edges_per_graph, b.edges_per_graph.new_ones(cap_g - g)]),
                      n_graphs=cap_g, edge_weight=torch.cat([real if b.edge_weight is None else b.edge_weight,
                                                             real.new_zeros(cap_e - e)]))


def potts_loss(model, b: GraphBatch, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over graphs of (expected conflicting edges / edges), times `scale`; and that sum unscaled."""
    probs = torch.softmax(model(b.x, b.edge_index, b.color_mask), dim=-1)
    per_edge = potts_conflicts(probs, b.edge_index)  # each undirected edge appears twice
    if b.edge_weight is not None:
        per_edge = per_edge * b.edge_weight
    per_graph = torch.zeros(b.n_graphs, device=probs.device).index_add(0, b.edge_graph, per_edge) / 2.0
    frac = per_graph / b.edges_per_graph.clamp(min=1.0)
    return frac.sum() * scale, frac.detach().sum()
