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
