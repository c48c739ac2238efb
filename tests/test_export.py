import pytest
import torch

from trainers.export import EXPORT_BATCH, ExportMismatch, check_parity, export_onnx, measure_latency
from trainers.models.forecaster import PRESETS, Forecaster, ReturnPredictor


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = Forecaster(PRESETS["tiny"], n_features=5, window=12)
    model.target_mean.fill_(0.002)
    model.target_std.fill_(0.04)
    module = ReturnPredictor(model).eval()
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    written = export_onnx(module, torch.zeros(EXPORT_BATCH, 12, 5), path)
    return module, path, written


def test_small_models_export_to_one_self_contained_file(exported):
    _, path, written = exported
    assert written == [path]
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.onnx"]  # no temp or external-data leftovers


def test_onnx_matches_pytorch_at_batch_sizes_other_than_the_export(exported):
    module, path, _ = exported
    report = check_parity(module, path, (12, 5), [1, 7, 33], tolerance=1e-5)
    assert EXPORT_BATCH not in report["batch_sizes"]
    assert report["max_abs_error"] < 1e-5 and set(report["per_batch"]) == {"1", "7", "33"}


def test_parity_check_fails_when_the_models_differ(exported):
    module, path, _ = exported
    other = ReturnPredictor(Forecaster(PRESETS["tiny"], n_features=5, window=12)).eval()
    with pytest.raises(ExportMismatch, match="differs from PyTorch"):
        check_parity(other, path, (12, 5), [3], tolerance=1e-6)


def test_latency_report_has_percentiles(exported):
    module, path, _ = exported
    lat = measure_latency(module, path, (12, 5), [1, 4], iters=5, warmup=1)
    for b in ("batch_1", "batch_4"):
        for engine in ("onnxruntime", "pytorch_eager"):
            r = lat[b][engine]
            assert r["iters"] == 5 and 0 < r["p50_ms"] <= r["p99_ms"]
