import pytest
import torch

from trainers.forecast.config import PRESETS
from trainers.forecast.export import EXPORT_BATCH, batch_cases, export_forecaster
from trainers.forecast.model import Forecaster, ReturnPredictor
from trainers.onnx import ExportMismatch, check_parity, measure_latency


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = Forecaster(**vars(PRESETS["tiny"]), n_features=5, window=12)
    model.target_mean.fill_(0.002)
    model.target_std.fill_(0.04)
    module = ReturnPredictor(model).eval()
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    written = export_forecaster(module, 12, path)
    return module, path, written


def test_small_models_export_to_one_self_contained_file(exported):
    _, path, written = exported
    assert written == [path]
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.onnx"]  # no temp or external-data leftovers


def test_onnx_matches_pytorch_at_batch_sizes_other_than_the_export(exported):
    module, path, _ = exported
    report = check_parity(module, path, batch_cases(12, [1, 7, 33]), ["features"], tolerance=1e-5)
    assert f"batch_{EXPORT_BATCH}" not in report["cases"]
    assert report["max_abs_error"] < 1e-5 and set(report["per_case"]) == {"batch_1", "batch_7", "batch_33"}
    assert report["onnxruntime_threads"] == 0  # onnxruntime's default (every core)
    one = check_parity(module, path, batch_cases(12, [7]), ["features"], tolerance=1e-5, threads=1)
    assert one["onnxruntime_threads"] == 1 and one["max_abs_error"] < 1e-5


def test_parity_check_fails_when_the_models_differ(exported, tmp_path):
    _, exported_path, _ = exported
    path = tmp_path / "m.onnx"
    path.write_bytes(exported_path.read_bytes())
    other = ReturnPredictor(Forecaster(**vars(PRESETS["tiny"]), n_features=5, window=12)).eval()
    with pytest.raises(ExportMismatch, match="differs from PyTorch"):
        check_parity(other, path, batch_cases(12, [3]), ["features"], tolerance=1e-6)
    assert not path.exists()  # a file that failed its check is never left for a consumer


def test_latency_report_has_percentiles(exported):
    module, path, _ = exported
    lat = measure_latency(module, path, batch_cases(12, [1, 4]), ["features"], iters=5, warmup=1)
    for b in ("batch_1", "batch_4"):
        for engine in ("onnxruntime", "pytorch_eager"):
            r = lat[b][engine]
            assert r["iters"] == 5 and 0 < r["p50_ms"] <= r["p99_ms"]


def lstm_probability(seed: int) -> torch.nn.Module:
    from trainers.lstm.model import DirectionLSTM, UpProbability

    torch.manual_seed(seed)
    return UpProbability(DirectionLSTM(5, 8, 2, 0.0)).eval()


def export_of(module, path, reuse: bool):
    from trainers.onnx import export_program, export_reusing

    args = (torch.zeros(2, 6, 5),)
    shapes = {"x": {0: torch.export.Dim("batch", min=1, max=1 << 20)}}
    if not reuse:
        return export_program(module, args, path, ["features"], ["probability"], shapes)
    return export_reusing(module, args, path, ["features"], ["probability"], shapes, architecture=("test",))


def test_a_second_model_of_one_architecture_gets_the_first_graph_with_its_own_weights(tmp_path, monkeypatch):
    """export_reusing: the first model is exported; the next ones get that graph with their own parameters put in
    (the LSTM's exporter reorders its gates into initializers: markers say which parameter each value is). The
    file is the graph torch.onnx.export makes for that model, its initializers bit for bit, and onnxruntime
    computes that model, not the first."""
    import onnx
    from onnx import numpy_helper

    import trainers.onnx as onnx_mod

    monkeypatch.setattr(onnx_mod, "_TEMPLATES", {})
    first, second, third = (lstm_probability(seed) for seed in (0, 1, 2))
    assert export_of(first, tmp_path / "first.onnx", reuse=True) is False
    assert export_of(second, tmp_path / "second.onnx", reuse=True) is True
    assert export_of(third, tmp_path / "third.onnx", reuse=True) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.onnx", "second.onnx", "third.onnx"]  # no leftovers
    export_of(third, tmp_path / "direct.onnx", reuse=False)
    reused, direct = onnx.load(tmp_path / "third.onnx"), onnx.load(tmp_path / "direct.onnx")
    assert onnx_mod._without_initializers(reused) == onnx_mod._without_initializers(direct)
    for a, b in zip(reused.graph.initializer, direct.graph.initializer, strict=True):
        assert a.name == b.name and numpy_helper.to_array(a).tobytes() == numpy_helper.to_array(b).tobytes()
    x = (torch.randn(9, 6, 5),)
    for module, name in ((second, "second.onnx"), (third, "third.onnx")):
        check_parity(module, tmp_path / name, {"batch_9": x}, ["features"], tolerance=1e-5)
    with pytest.raises(ExportMismatch):  # the third's file is not the first model's
        check_parity(first, tmp_path / "third.onnx", {"batch_9": x}, ["features"], tolerance=1e-5)


class Summed(torch.nn.Module):
    """A graph with one initializer copied from a parameter (w) and one the exporter computes from two (it folds
    a + b): the second model's file would hold the first model's a + b, so no graph of it is reused."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(torch.randn(3, 30, generator=g))
        self.b = torch.nn.Parameter(torch.randn(3, 30, generator=g))
        self.w = torch.nn.Parameter(torch.randn(30, 2, generator=g))

    def forward(self, x):
        return (x.flatten(1) @ (self.a + self.b).T).sum(-1) + (x.flatten(1) @ self.w).sum(-1)


class Copied(torch.nn.Module):
    """A graph whose one initializer is its parameter: reusable (quick to export)."""

    def __init__(self, seed: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(30, 1, generator=torch.Generator().manual_seed(seed)))

    def forward(self, x):
        return (x.flatten(1) @ self.w).squeeze(-1)


def test_a_graph_that_computes_from_its_parameters_is_exported_for_every_model(tmp_path, monkeypatch):
    import trainers.onnx as onnx_mod

    monkeypatch.setattr(onnx_mod, "_TEMPLATES", {})
    models = [Summed(seed).eval() for seed in range(3)]
    assert [export_of(m, tmp_path / f"{k}.onnx", reuse=True) for k, m in enumerate(models)] == [False] * 3
    assert [t.reusable for t in onnx_mod._TEMPLATES.values()] == [False]  # worked out once, on the second model
    for k, m in enumerate(models):
        check_parity(m, tmp_path / f"{k}.onnx", {"batch_4": (torch.randn(4, 6, 5),)}, ["features"], tolerance=1e-5)


def graph_of(w: list, op: str = "MatMul"):
    """A one-node graph y = op(x, W), W [2, 2] an initializer."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node(op, ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                              [numpy_helper.from_array(np.array(w, dtype=np.float32), "W")])
    return helper.make_model(graph)


@pytest.mark.parametrize("case", ["copies", "copies a NaN", "another graph", "computed"])
def test_a_template_is_reused_only_where_the_markers_and_its_own_values_agree(case):
    """GraphTemplate.work_out on hand-made graphs: W holds parameters 2, 0, 3, 1 (markers say so). Reused only
    when the rest of the graph is the marked export's and the first model's parameters, put back in, give the
    template's W bit for bit; a W computed from the parameters (here + 1) that the markers cannot tell from a
    copy is caught by the second check. A first model that diverged (a NaN) still gives its graph to the next."""
    from onnx import numpy_helper

    from trainers.onnx import MARKER_BASE, GraphTemplate

    flat = torch.tensor([0.5, float("nan") if case == "copies a NaN" else -1.0, 2.0, 3.0])
    order = [[2, 0], [3, 1]]
    mine = [[float(flat[i]) + (1.0 if case == "computed" else 0.0) for i in row] for row in order]
    template = GraphTemplate(graph_of(mine), flat)
    template.work_out(graph_of([[MARKER_BASE + i for i in row] for row in order],
                               "Add" if case == "another graph" else "MatMul"))
    assert template.reusable is case.startswith("copies")
    if template.reusable:
        put_in = template.with_parameters(torch.tensor([10.0, 11.0, 12.0, 13.0]))
        assert numpy_helper.to_array(put_in.graph.initializer[0]).tolist() == [[12.0, 10.0], [13.0, 11.0]]


def test_when_the_export_with_markers_fails_every_model_is_exported_and_it_is_not_tried_again(tmp_path, monkeypatch,
                                                                                            caplog):
    import trainers.onnx as onnx_mod

    monkeypatch.setattr(onnx_mod, "_TEMPLATES", {})
    real, calls = onnx_mod.export_program, []

    def failing_for_markers(module, *args):
        calls.append(args[1].parent.name.startswith(".onnx-markers-"))
        if calls[-1]:
            raise RuntimeError("exporter broke on the marked copy")
        return real(module, *args)

    monkeypatch.setattr(onnx_mod, "export_program", failing_for_markers)
    models = [Copied(seed).eval() for seed in range(3)]
    assert [export_of(m, tmp_path / f"{k}.onnx", reuse=True) for k, m in enumerate(models)] == [False] * 3
    assert calls == [False, True, False, False]  # tried once, then each model exported in full
    assert "export with markers failed (RuntimeError: exporter broke on the marked copy)" in caplog.text
    for k, m in enumerate(models):
        check_parity(m, tmp_path / f"{k}.onnx", {"batch_3": (torch.randn(3, 6, 5),)}, ["features"], tolerance=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.onnx", "1.onnx", "2.onnx"]


def test_an_export_without_torchvision_prints_no_notice_about_it(tmp_path):
    """torch's exporter warned four times per export that torchvision is not installed (issue 66: a newcomer read
    them as a failure); no model of the kit uses a torchvision op. A handler on the exporter's own logger sees
    what its handlers would print, after the logger's filters."""
    import importlib.util
    import logging

    from trainers.onnx import export_program

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the exporter has nothing to say about it")
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    handler = Collect(level=logging.DEBUG)
    logger.addHandler(handler)
    try:
        export_program(torch.nn.Linear(3, 2), (torch.randn(2, 3),), tmp_path / "m.onnx", ["x"], ["y"],
                       {"input": {0: torch.export.Dim("batch", min=1)}})
    finally:
        logger.removeHandler(handler)
    assert not [m for m in seen if "torchvision" in m], seen
