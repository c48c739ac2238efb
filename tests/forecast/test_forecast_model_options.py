"""The model options (--linear-skip, --past-returns, --readout, --encoder): each does what it says, is
counted by the planner, exports, and a run folder written before they existed is still read as the
model it holds (and refused for a resume)."""

import itertools
import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from conftest import TINY_DATA, read_results, run_cli
from trainers.errors import UsageError
from trainers.forecast import config as fconfig
from trainers.forecast import model as fmodel
from trainers.forecast.config import ForecastConfig
from trainers.forecast.model import Forecaster, flops_per_sample
from trainers.forecast.size import activation_bytes_per_sample
from trainers.ops.plan import saved_bytes_per_item

SHAPE = dict(d_model=32, n_layers=2, n_heads=4, d_ff=64, n_features=5, window=12)


def test_the_linear_skip_holds_a_linear_model_of_the_window():
    torch.manual_seed(0)
    model = Forecaster(**SHAPE, linear_skip=True, dropout=0.0).eval()
    x = torch.randn(6, 12, 5)
    assert torch.count_nonzero(model.skip.weight) == 0  # starts as no linear forecast at all
    with torch.no_grad():
        model.skip.weight.normal_()
        model.head.weight.zero_()
        model.head.bias.zero_()
    # with the Transformer's head silent the model is exactly ridge's form: w . flatten(window) + b
    torch.testing.assert_close(model(x), x.flatten(1) @ model.skip.weight[0] + model.skip.bias[0])
    alone = Forecaster(**SHAPE, linear_skip=True, encoder="none")
    assert [n for n, _ in alone.named_parameters()] == ["skip.weight", "skip.bias"]
    with pytest.raises(ValueError, match="linear skip"):
        Forecaster(**SHAPE, encoder="none")


def test_past_returns_are_each_days_return_to_the_anchor_from_the_ret_1d_channel():
    model = Forecaster(**SHAPE, past_returns=2)
    x = torch.randn(3, 12, 5)
    got = model.with_past_returns(x)
    assert got.shape == (3, 12, 6) and torch.equal(got[..., :5], x)
    for j in (0, 5, 11):  # day j: the sum of days j..11 (the anchor) of feature 2, in sqrt(days) units
        torch.testing.assert_close(got[:, j, 5], x[:, j:, 2].sum(1) / (12 - j) ** 0.5)
    later = x.clone()
    later[:, 7, 2] += 1.0  # a return on day 7 reaches days 0..7's sums, never a later day's
    moved = (model.with_past_returns(later)[..., 5] != got[..., 5]).any(0)
    assert moved.tolist() == [True] * 8 + [False] * 4


def test_past_returns_read_ret_1d_wherever_features_put_it():
    from trainers.forecast.build import build_model

    cfg = ForecastConfig(features="vol_20d,ret_1d", window=12, past_returns=True)
    cfg.validate()
    assert build_model(cfg).past_returns == 1
    with pytest.raises(UsageError, match="--past-returns sums ret_1d"):
        ForecastConfig(features="vol_20d,range_hl", past_returns=True).validate()
    with pytest.raises(UsageError, match="--encoder none"):
        ForecastConfig(encoder="none", linear_skip=False).validate()
    with pytest.raises(UsageError, match="--synthetic-effect regime"):
        ForecastConfig(source="file:x.csv", synthetic_effect="regime").validate()


def test_an_attention_pool_with_no_preference_is_the_window_mean():
    torch.manual_seed(0)
    pool = Forecaster(**SHAPE, readout="attention", dropout=0.0).eval()
    mean = Forecaster(**SHAPE, readout="mean", dropout=0.0).eval()
    last = Forecaster(**SHAPE, readout="last", dropout=0.0).eval()
    state = {k: v for k, v in pool.state_dict().items() if not k.startswith("pool.")}
    mean.load_state_dict(state)
    last.load_state_dict(state)
    x = torch.randn(4, 12, 5)
    with torch.no_grad():
        pool.pool.weight.zero_()  # equal scores: uniform weights
    torch.testing.assert_close(pool(x), mean(x))
    with torch.no_grad():
        pool.pool.bias.fill_(0.0)
        pool.pool.weight.normal_()
    assert not torch.allclose(pool(x), mean(x)) and not torch.allclose(mean(x), last(x))


def test_the_options_are_named_alike_where_torch_and_pandas_cannot_be_imported():
    from trainers.market.synthetic import EFFECTS

    assert fconfig.READOUTS == fmodel.READOUTS and fconfig.ENCODERS == fmodel.ENCODERS
    assert fconfig.SYNTHETIC_EFFECTS == EFFECTS
    assert set(fconfig.LEGACY_MODEL) <= {f for f in ForecastConfig.__dataclass_fields__}


OPTIONS = [(r, s, p, "transformer") for r, s, p in itertools.product(("last", "mean", "attention"), (False, True),
                                                                     (False, True))]
OPTIONS += [("last", True, False, "none"), ("last", True, True, "none")]


@pytest.mark.parametrize("readout,skip,past,encoder", OPTIONS)
def test_the_planner_counts_each_option(readout, skip, past, encoder):
    """FLOPs as PyTorch's counter sees them; saved activations as autograd saves them (fp32 and bf16)."""
    kw = dict(readout=readout, linear_skip=skip, past_returns=0 if past else None, encoder=encoder)
    model = Forecaster(32, 2, 4, 64, 5, 16, dropout=0.1, **kw)
    opts = dict(readout=readout, linear_skip=skip, past_returns=past, encoder=encoder)
    model.eval()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.randn(3, 16, 5))
    assert counter.get_total_flops() / 3 == flops_per_sample(16, 5, 32, 2, 64, training=False, **opts)
    model.train()
    for dtype, compute_bytes in ((None, 4), (torch.bfloat16, 2)):
        measured = saved_bytes_per_item(model, lambda b: (torch.randn(b, 16, 5),), batches=(2, 6), autocast_dtype=dtype)
        estimate = activation_bytes_per_sample(16, 5, 32, 2, 4, 64, 0.1, compute_bytes, **opts)
        assert estimate == pytest.approx(measured, rel=0.05), (dtype, estimate, measured)


def test_the_151m_plan_counts_the_default_model():
    """`trainers plan` sizes the model the defaults build: the past-returns channel and the skip
    included (a few thousand parameters on 151M), its FLOPs those of model_flops."""
    from trainers.forecast.build import build_model, model_flops
    from trainers.ops.commands import load_workload

    w = load_workload("forecast", ["--preset", "151m", "--batch-size", "1024", "--window", "120"])
    cfg = ForecastConfig(preset="151m", batch_size=1024, window=120)
    with torch.device("meta"):
        model = build_model(cfg)
    assert w.parameters == sum(p.numel() for p in model.parameters()) and 150e6 < w.parameters < 153e6
    assert w.flops_per_item == model_flops(cfg, 5)


@pytest.mark.slow  # CLI runs about what a run folder accepts: not float-sensitive (CI's second pass skips it)
def test_a_run_folder_from_before_the_options_is_evaluated_and_exported_as_its_own_model(tmp_path):
    """A config.json without the model options (written before they existed) is read as the model
    its checkpoints hold, not today's defaults; resuming it is refused in one line."""
    run = tmp_path / "old"
    legacy = ["--readout", "last", "--no-linear-skip", "--no-past-returns", "--encoder", "transformer"]
    run_cli(["forecast", "train", *TINY_DATA, "--run-dir", str(run), "--max-steps", "3", *legacy], check=True)
    saved = json.loads((run / "config.json").read_text())
    for name in fconfig.LEGACY_MODEL:
        del saved[name]
    (run / "config.json").write_text(json.dumps(saved))
    assert run_cli(["forecast", "evaluate", "--run-dir", str(run)]).returncode == 0
    assert read_results(run)["evaluation"]["test"]["model"]["rank_ic"]["dates"] > 0
    proc = run_cli(["forecast", "export", "--run-dir", str(run), "--latency-iters", "2"], check=True)
    assert "max abs error" in proc.stdout and read_results(run)["export"]["parity"]["max_abs_error"] < 1e-4
    proc = run_cli(["forecast", "train", *TINY_DATA, "--run-dir", str(run), "--max-steps", "6", *legacy])
    assert proc.returncode == 2 and "trained before --readout" in proc.stderr and "new --run-dir" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # CLI runs about what a run folder accepts: not float-sensitive (CI's second pass skips it)
def test_a_new_option_on_an_existing_run_is_refused_and_the_same_options_resume(tmp_path):
    run = tmp_path / "r"
    base = ["forecast", "train", *TINY_DATA, "--run-dir", str(run), "--linear-skip", "--past-returns", "--readout",
            "last", "--max-steps", "2"]
    run_cli(base, check=True)
    proc = run_cli([*base, "--readout", "attention"])
    assert proc.returncode == 2 and "readout: saved 'last', now 'attention'" in proc.stderr
    proc = run_cli([*base, "--no-linear-skip"])
    assert proc.returncode == 2 and "linear_skip: saved True, now False" in proc.stderr
    proc = run_cli(base, check=True)  # the same options: resumed (at its last step), not refused
    assert "resumed from checkpoint step 2" in (run / "training.log").read_text()
    r = read_results(run)
    assert r["training"]["steps"] == 2 and r["model"]["linear_skip"] is True and r["model"]["past_returns"] is True


@pytest.mark.parametrize("options", [dict(readout="attention", linear_skip=True, past_returns=2),
                                     dict(readout="mean", past_returns=0),
                                     dict(linear_skip=True, past_returns=1, encoder="none")],
                         ids=["attention-skip-past", "mean-past", "skip-alone"])
def test_each_option_exports_to_onnx_matching_pytorch(tmp_path, options):
    pytest.importorskip("onnxruntime")
    from trainers.forecast.export import batch_cases, export_forecaster
    from trainers.forecast.model import ReturnPredictor
    from trainers.onnx import check_parity

    torch.manual_seed(0)
    model = Forecaster(**SHAPE, dropout=0.0, **options)
    if model.skip is not None:  # a skip that is not zero, so the parity sees it
        with torch.no_grad():
            model.skip.weight.normal_(std=0.1)
    module = ReturnPredictor(model).eval()
    path = tmp_path / "model.onnx"
    export_forecaster(module, SHAPE["window"], path, SHAPE["n_features"], "rank_score")
    parity = check_parity(module, path, batch_cases(SHAPE["window"], (1, 7), n_features=SHAPE["n_features"]),
                          ["features"], 1e-4)
    assert parity["max_abs_error"] < 1e-4 and set(parity["per_case"]) == {"batch_1", "batch_7"}
