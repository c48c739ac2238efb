"""The graph-coloring GNN (seed 002)."""
