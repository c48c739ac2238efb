"""Color a graph file with the exported GNN (onnxruntime only, no torch needed at inference) and
the repair step, which guarantees a valid coloring."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from trainers.errors import UsageError
from trainers.gnn.decode import repair
from trainers.gnn.features import colors_offered, node_features
from trainers.gnn.graphs import conflicts, read_graph


def color_file(model_path: str, graph_path: str, output: str | None = None, seed: int = 0) -> dict:
    import onnxruntime as ort

    model_path = Path(model_path)
    info_path = model_path.with_name("export.json")
    if not model_path.is_file() or not info_path.is_file():
        raise UsageError(f"--model {model_path}: need model.onnx with its export.json beside it (from `trainers gnn export`)")
    info = json.loads(info_path.read_text())
    g = read_graph(graph_path)
    max_colors = info["inputs"]["color_mask"][1]
    t0 = time.perf_counter()
    x = node_features(g, info["random_features"], seed)
    k = colors_offered(g, max_colors)
    mask = np.zeros((g.n, max_colors), np.float32)
    mask[:, :k] = 1.0
    edge_index = np.concatenate([g.edges, g.edges[:, ::-1]]).T.astype(np.int64).copy()
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    raw = session.run(None, {"x": x, "edge_index": edge_index, "color_mask": mask})[0].argmax(-1)
    color = repair(g, raw)
    seconds = time.perf_counter() - t0
    if output:
        Path(output).write_text("".join(f"{v} {c}\n" for v, c in enumerate(color)))
    return {"graph": g.name, "nodes": g.n, "edges": g.n_edges, "colors": int(color.max() + 1) if g.n else 0,
            "conflicts_before_repair": conflicts(g.edges, raw), "conflicts": conflicts(g.edges, color),
            "seconds": round(seconds, 4), "output": output}
