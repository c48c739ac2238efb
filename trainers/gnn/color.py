"""Colour a graph file with the exported GNN: onnxruntime for the model (no torch needed), then
repair, the colour schedule and the tabu search (trainers.gnn.decode). With `finetune_steps`, the
PyTorch checkpoint the ONNX file was exported from is fine-tuned on this graph first (that needs
torch, and the run folder's checkpoints beside model.onnx). With `search="population"` the search
is the population search (trainers.gnn.population, torch on `device`), seeded by colourings
sampled from the model (or by randomised DSATUR: `seed_from="dsatur"`, or when the model offers
too few colours for the graph)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from trainers.errors import UsageError
from trainers.gnn.config import N_DEGREE_FEATURES
from trainers.gnn.decode import color_with_model
from trainers.gnn.features import color_mask, node_features
from trainers.gnn.graphs import conflicts, read_graph
from trainers.runtime.config import check_folder_writable
from trainers.runtime.files import atomic_write, sha256_file


def read_export(model_path: Path) -> dict:
    """export.json beside model.onnx, checked to be a GNN export of exactly this file: a garbled or
    truncated model.onnx, another trainer's ONNX (its export records no colour mask) or an edited
    export.json is one line, not an onnxruntime or KeyError traceback."""
    info_path = model_path.with_name("export.json")
    again = "export it again with `trainers gnn export --run-dir RUN`"
    if not model_path.is_file() or not info_path.is_file():
        raise UsageError(f"--model {model_path}: need model.onnx with its export.json beside it (from `trainers gnn export`)")
    try:
        info = json.loads(info_path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not JSON, or not UTF-8
        raise UsageError(f"--model {model_path}: {info_path} is unreadable ({exc}); {again}") from None
    inputs = info.get("inputs") if isinstance(info, dict) else None
    mask = inputs.get("color_mask") if isinstance(inputs, dict) else None
    k = mask[1] if isinstance(mask, list) and len(mask) == 2 else None
    features = info.get("random_features") if isinstance(info, dict) else None
    if not (_count(k) and k >= 2 and _count(features) and _count(info.get("checkpoint_step"))):
        raise UsageError(f"--model {model_path}: {info_path} is not the record of a colouring GNN's export (it lacks "
                         f"the colour-mask width, random features or checkpoint step: another trainer's model?); "
                         f"give the model.onnx of `trainers gnn export`")
    if info.get("sha256") != sha256_file(model_path):
        raise UsageError(f"--model {model_path} is not the file its export checked (its SHA-256 differs from "
                         f"{info_path.name}'s: truncated, replaced or corrupted); {again}")
    return info


def _torch_device(device: str) -> str:
    try:
        import torch  # noqa: F401 (whether it is installed)
    except ImportError:
        raise UsageError("--search population needs PyTorch (pip install torch); without it, --search tabu (the "
                         "default) runs on NumPy alone") from None
    from trainers.runtime import device as device_mod

    if device == "cpu":
        return device
    if device_mod.accelerator_available():
        return str(device_mod.accelerator(0))
    if device == "cuda":
        raise UsageError("--device cuda: PyTorch sees no CUDA device here; use --device cpu")
    return "cpu"


@dataclass(frozen=True)
class Search:
    """How `gnn color` searches after the model's pass (its flags): `method` tabu or population; `iters` (None: tabu
    2M moves, population the clock alone) and `seconds` bound it; the population search's size, device and first
    members (`seed_from` gnn: sampled from the model; dsatur); `finetune_steps` > 0 fine-tunes the checkpoint on the
    graph first, from `finetune_restarts` starts."""
    method: str = "tabu"
    iters: int | None = None
    seconds: float = 10.0
    population: int = 32
    device: str = "cpu"
    seed_from: str = "gnn"
    finetune_steps: int = 0
    finetune_restarts: int = 3


def _population(g, color: np.ndarray, lower: int, sampled, max_colors: int, seed: int,
                search: Search) -> tuple[np.ndarray, dict]:
    """The population search from the better of the model's repaired colouring and DSATUR's, its
    first members sampled from the model when it offers enough colours (else randomised DSATUR)."""
    from trainers.gnn.dsatur import dsatur
    from trainers.gnn.population import heuristic_starts, model_starts, population_search

    greedy = dsatur(g)
    start = color if color.max() <= greedy.max() else greedy
    k = int(start.max()) + 1
    source = "gnn" if search.seed_from == "gnn" and k - 1 <= max_colors else "dsatur"
    starts = model_starts(sampled, max_colors, seed=seed) if source == "gnn" else heuristic_starts(g, seed)
    found = population_search(g, start, starts, search.population, iters=search.iters, seconds=search.seconds,
                              device=search.device, seed=seed, lower=lower)
    why = None
    if source != search.seed_from:
        why = f"the model offers at most {max_colors} colours; the search starts at {k - 1}"
    return found.coloring, {"method": "population", "colors": found.colors, "start_colors": found.start_colors,
                            "start_from": "gnn_repaired" if start is color else "dsatur", "seeded_by": source,
                            "seeded_by_why": why, "iterations": found.iterations, "generations": found.generations,
                            "population": found.population, "device": found.device, "stopped": found.stopped,
                            "levels": found.levels, "seconds": round(found.seconds, 4)}


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_output(output: Path, graph: Path, model: Path) -> None:
    """Before the search (seconds to minutes): --output must be a file we can write, and none of the files read."""
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder; give a file name, e.g. {output / 'coloring.txt'}")
    read = {graph.resolve(): "the --graph it colours", model.resolve(): "the --model",
            (model.parent / "export.json").resolve(): "the --model's export.json"}
    if output.resolve() in read:
        raise UsageError(f"--output {output} is {read[output.resolve()]}; give another file")
    if not output.resolve().parent.is_dir():
        raise UsageError(f"--output {output}: its folder {output.resolve().parent} does not exist")
    check_folder_writable(output.resolve().parent, "--output")


def color_file(model_path: str, graph_path: str, output: str | None = None, seed: int = 0,
               search: Search = Search()) -> dict:
    import onnxruntime as ort

    t0 = time.perf_counter()
    if output:
        check_output(Path(output), Path(graph_path), Path(model_path))
    model_path = Path(model_path)
    info = read_export(model_path)
    if search.method == "population":
        search = replace(search, device=_torch_device(search.device))
    if search.iters is None:  # tabu: 2M moves (the clock usually ends it first); population: the clock alone
        search = replace(search, iters=2_000_000 if search.method == "tabu" else 10**15)
    if search.finetune_steps:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UsageError("--finetune-steps needs PyTorch (pip install torch) and the run's checkpoints; "
                             "without them, leave --finetune-steps out") from None
        if not (model_path.parent / "checkpoints").is_dir():
            raise UsageError(f"--finetune-steps needs the training run's checkpoints beside {model_path.name} "
                             f"({model_path.parent / 'checkpoints'} is missing)")
    g = read_graph(graph_path)
    max_colors = info["inputs"]["color_mask"][1]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # the model pass is a small share of the time; one thread, like the search
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    # the file is the one its export checked; its record must also describe it (an edited export.json
    # would feed it inputs of the wrong width)
    shapes = {i.name: i.shape for i in session.get_inputs()}
    expected = {"x": ["nodes", N_DEGREE_FEATURES + info["random_features"]], "edge_index": [2, "edges"],
                "color_mask": ["nodes", max_colors]}
    if shapes != expected:
        raise UsageError(f"--model {model_path} takes inputs {shapes}, not the {expected} its export.json describes; "
                         f"export it again with `trainers gnn export --run-dir RUN`")
    x = node_features(g, info["random_features"], seed)
    edge_index = np.concatenate([g.edges, g.edges[:, ::-1]]).T.astype(np.int64).copy()

    def logits_for(k: int, features: np.ndarray = x) -> np.ndarray:
        return session.run(None, {"x": features, "edge_index": edge_index,
                                  "color_mask": color_mask(g.n, k, max_colors)})[0]

    tabu = search.method == "tabu"
    color, report = color_with_model(g, logits_for, max_colors, search.iters if tabu else 0, search.seconds, seed)
    if not tabu:
        sampled = lambda k, s: logits_for(k, node_features(g, info["random_features"], s))  # noqa: E731
        color, report["searched"] = _population(g, color, report["lower_bound"], sampled, max_colors, seed, search)
        report["colors"] = report["searched"]["colors"]
        report["seconds"]["search"] = report["searched"]["seconds"]
    if search.finetune_steps:
        from trainers.gnn.finetune import finetune_stage, load_trained

        model, cfg, _ = load_trained(model_path.parent, str(info["checkpoint_step"]))
        color, report["finetuned"] = finetune_stage(model, g, cfg.max_colors, cfg.random_features, color,
                                                    report["lower_bound"], search.finetune_steps,
                                                    search.finetune_restarts, search.iters, search.seconds, seed)
        report["colors"] = int(color.max()) + 1
    if output:
        atomic_write(Path(output), lambda f: f.write("".join(f"{v} {c}\n" for v, c in enumerate(color))), mode="w")
    report.update(graph=g.name, conflicts=conflicts(g.edges, color), output=output)
    report["seconds"]["total"] = round(time.perf_counter() - t0, 4)
    return report
