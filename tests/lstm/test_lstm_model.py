"""The model gives a logit and the loss takes it (no double sigmoid), in the model, the loss function and
the training loop itself; ONNX parity; the queue's bookkeeping. In-process: one tiny job trained once."""

import json
import math
import tarfile

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from trainers.cli import main
from trainers.lstm import queue as jobqueue
from trainers.lstm.build import build_model
from trainers.lstm.config import LstmConfig
from trainers.lstm.features import build_symbol_data
from trainers.lstm.job import prepare_job
from trainers.lstm.model import DirectionLSTM, UpProbability, direction_loss
from trainers.runtime.rundir import load_checkpoint_states, load_run_config
from trainers.runtime.sampling import EpochCursor

TINY = ["--synthetic-tickers", "3", "--synthetic-days", "700", "--window", "16", "--hidden", "8", "--batch-size", "64",
        "--epochs", "1", "--dropout", "0", "--log-every", "1", "--device", "cpu"]


def test_the_model_outputs_a_logit_not_a_probability():
    model = DirectionLSTM(11, hidden=8, layers=2, dropout=0.0)
    assert not any(isinstance(m, nn.Sigmoid) for m in model.modules())
    with torch.no_grad():
        model.head.bias.fill_(5.0)
        high = model(torch.zeros(3, 16, 11))
        model.head.bias.fill_(-5.0)
        low = model(torch.zeros(3, 16, 11))
    assert high.shape == (3,) and (high > 1).all() and (low < 0).all()  # no probability does either


def test_the_loss_is_bce_on_the_logit_and_a_double_sigmoid_would_fail():
    model = DirectionLSTM(4, hidden=4, layers=1, dropout=0.0)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.fill_(-10.0)  # confidently "down"
    y = torch.ones(6)  # but every bar went up
    logits = model(torch.randn(6, 8, 4))
    loss = direction_loss(logits, y, torch.tensor(1.0))
    loss.backward()
    assert loss.item() == pytest.approx(math.log1p(math.exp(10.0)), rel=1e-6)  # softplus(10) = 10.0000454
    assert model.head.bias.grad.item() == pytest.approx(-1.0, abs=1e-4)  # sigmoid(-10) - 1: a full gradient
    # the seed's model ended in Sigmoid and fed that to BCEWithLogitsLoss: log 2 at most, a vanishing gradient
    double = nn.functional.binary_cross_entropy_with_logits(torch.sigmoid(logits), y)
    assert double.item() < math.log(2) + 1e-3 and loss.item() > 10 * double.item()
    # pos_weight scales the up bars' term
    assert direction_loss(logits, y, torch.tensor(2.0)).item() == pytest.approx(2 * loss.item(), rel=1e-6)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """SYN000 and SYN002 train (and export in their worker: SYN002's file is SYN000's graph with its own weights),
    SYN001 is made to fail on both tries."""
    root = tmp_path_factory.mktemp("lstm-job")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINERS_FAULT_RAISE", "SYN001@step2:always")
    try:
        rc = main(["lstm", "train", "--run-dir", str(root / "job"), *TINY, "--symbols", "SYN000,SYN001,SYN002"])
    finally:
        mp.undo()
    return root / "job", rc


def test_one_process_exits_1_when_a_symbol_failed_and_says_so(job):
    run_dir, rc = job
    assert rc == 1
    r = json.loads((run_dir / "results.json").read_text())
    assert r["training"]["symbols"] == {"ok": 2, "failed": 1, "stopped": 0, "pending": 0}
    assert r["symbols"]["SYN001"]["tries"] == 2 and "asked SYN001 to fail" in r["symbols"]["SYN001"]["error"]
    assert r["runs"] == {"SYN000": "symbols/SYN000", "SYN002": "symbols/SYN002"}
    md = (run_dir / "results.md").read_text()
    assert "2 of 3 symbols succeeded, 1 failed" in md and "SYN001: RuntimeError" in md
    log = (run_dir / "training.log").read_text()
    assert "SYN001: try 1 failed" in log and "SYN001: failed twice" in log


def test_the_training_loop_logs_bce_of_the_logits(job):
    """Step 1's logged loss is recomputed from the initial model and the first batch: BCE on the logit."""
    run_dir, _ = job
    folder = run_dir / "symbols" / "SYN000"
    scfg = load_run_config(folder, LstmConfig)
    plan = prepare_job(scfg)
    data = build_symbol_data(plan.bars["SYN000"], scfg, plan.timeframes)
    torch.manual_seed(scfg.seed)
    model = build_model(scfg, data.n_features)
    positions, _ = EpochCursor(len(data.ids["train"]), 1, 0, scfg.batch_size, scfg.seed).batch()
    x, y = data.gather(data.ids["train"][positions])
    expected = direction_loss(model(x), y, torch.tensor(data.pos_weight)).item()
    double = direction_loss(torch.sigmoid(model(x)), y, torch.tensor(data.pos_weight)).item()
    first = next(json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line)["kind"] == "train")
    assert first["step"] == 1 and first["loss"] == pytest.approx(expected, rel=1e-5)
    assert abs(first["loss"] - double) > 1e-3


@pytest.mark.parametrize("symbol", ["SYN000", "SYN002"])
def test_export_is_a_probability_and_matches_pytorch_at_other_batch_sizes(job, symbol):
    """Each symbol's file computes its own model: SYN002's graph is SYN000's with its weights put in, its CPU latency
    the one measured on SYN000's file (the same operations). A job's first symbol is its own export, whatever
    this process exported before (other tests' jobs)."""
    import onnxruntime as ort

    run_dir, _ = job
    folder = run_dir / "symbols" / symbol
    info = json.loads((folder / "export.json").read_text())
    first = json.loads((run_dir / "symbols" / "SYN000" / "export.json").read_text())
    assert info["graph"] == ("exported" if symbol == "SYN000" else "reused")
    assert info["latency_cpu"] == first["latency_cpu"] and first["latency_cpu"]["measured_on"] == "SYN000"
    assert (info["sha256"] == first["sha256"]) is (symbol == "SYN000")
    assert info["export_batch"] == 2 and 2 not in info["parity"]["batch_sizes"]
    assert info["parity"]["max_abs_error"] < 1e-4 and info["output"]["name"] == "probability"
    from trainers.runtime.files import sha256_file

    assert info["sha256"] == sha256_file(folder / "model.onnx")
    scfg = load_run_config(folder, LstmConfig)
    _, states = load_checkpoint_states(folder)
    model = build_model(scfg, info["input"]["shape"][2])
    model.load_state_dict(states["model"])
    x = torch.randn(5, scfg.window, info["input"]["shape"][2])
    got = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"features": x.numpy()})[0]
    with torch.no_grad():
        want = UpProbability(model.eval())(x).numpy()
    assert got.shape == (5,) and ((got > 0) & (got < 1)).all() and np.abs(got - want).max() < 1e-5
    r = json.loads((run_dir / "results.json").read_text())
    assert r["symbols"][symbol]["export"]["sha256"] == info["sha256"]


@pytest.mark.slow  # nothing in it depends on the SIMD width (CI's narrowed pass skips it)
@pytest.mark.parametrize("torch_threads", [1, 4])
def test_the_parity_check_runs_onnxruntime_on_one_thread_where_torch_has_several(job, tmp_path, monkeypatch,
                                                                                torch_threads):
    """onnxruntime's own pool (every core, spinning between runs) beside torch's threads made the parity check
    slower (bench/results/onnx_parity_threads_cpu.json); beside torch on one thread it is left its default."""
    import shutil

    from trainers.lstm.export import export_symbol

    run_dir, _ = job
    folder = tmp_path / "SYN002"
    shutil.copytree(run_dir / "symbols" / "SYN002", folder)
    monkeypatch.setattr(torch, "get_num_threads", lambda: torch_threads)
    info = export_symbol(folder)
    assert info["parity"]["onnxruntime_threads"] == (1 if torch_threads > 1 else 0)  # 0: onnxruntime's default
    assert info["parity"]["max_abs_error"] < 1e-4


def test_a_forced_export_of_the_job_exports_its_first_symbol_again_and_reuses_it(job):
    """`trainers lstm export` starts afresh (trainers.lstm.export.forget_exports): the training job's graph and
    latency, still in this process, are not what its records name; a new --latency-iters is measured anew. What an
    export killed mid-write left in a symbol's folder (a marked copy's file) is cleared."""
    run_dir, _ = job
    killed = run_dir / "symbols" / "SYN002" / ".onnx-markers-killed"
    killed.mkdir()
    (killed / "model.onnx").write_bytes(b"marker weights")
    assert main(["lstm", "export", "--run-dir", str(run_dir), "--force", "--latency-iters", "3"]) == 0
    infos = {s: json.loads((run_dir / "symbols" / s / "export.json").read_text()) for s in ("SYN000", "SYN002")}
    assert [infos[s]["graph"] for s in infos] == ["exported", "reused"]
    assert [infos[s]["latency_cpu"]["measured_on"] for s in infos] == ["SYN000", "SYN000"]
    assert infos["SYN002"]["latency_cpu"]["batch_1"]["onnxruntime"]["iters"] == 3
    assert not list((run_dir / "symbols").glob("*/.onnx-*"))


def test_evaluate_and_package_the_job(job, tmp_path):
    from trainers.ops.package import package_run

    run_dir, _ = job
    assert main(["lstm", "evaluate", "--run-dir", str(run_dir), "--device", "cpu"]) == 0
    assert main(["lstm", "export", "--run-dir", str(run_dir)]) == 0  # current: nothing to redo
    out = package_run(run_dir, tmp_path / "job.tar.gz")
    with tarfile.open(out["path"]) as tar:
        names = set(tar.getnames())
    assert {"job/results.md", "job/config.json", "job/symbols/SYN000/model.onnx", "job/symbols/SYN000/results.json",
            "job/SHA256SUMS"} <= names
    assert not any(n.startswith("job/symbols/SYN001/") for n in names)


def test_hourly_crypto_bars_from_a_file_train_with_4h_and_1d_features(tmp_path):
    rng = np.random.default_rng(0)
    ts = pd.date_range("2023-01-01", periods=24 * 40, freq="h")  # every hour, weekends too
    close = 20000 * np.exp(np.cumsum(rng.normal(0, 0.004, len(ts))))
    frame = pd.DataFrame({"date": ts.strftime("%Y-%m-%d %H:%M:%S"), "ticker": "btc-usd", "open": close,
                          "high": close * 1.002, "low": close * 0.998, "close": close, "volume": 1e3})
    frame.to_csv(tmp_path / "bars.csv", index=False)
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", "--run-dir", str(run_dir), "--source", f"file:{tmp_path / 'bars.csv'}",
                 "--window", "24", "--hidden", "8", "--epochs", "1", "--batch-size", "64", "--no-export",
                 "--device", "cpu"]) == 0
    r = json.loads((run_dir / "results.json").read_text())
    assert r["data"]["base_timeframe"] == "1h" and r["data"]["timeframes"] == ["1h", "4h", "1d"]
    assert r["data"]["calendars"] == {"BTC-USD": "7 days"} and r["symbols"]["BTC-USD"]["status"] == "ok"
    one = json.loads((run_dir / "symbols" / "BTC-USD" / "results.json").read_text())
    assert one["data"]["features"][-3:] == ["1d:ret", "1d:range_hl", "1d:gap"]


def test_the_queue_hands_out_each_pending_symbol_once_and_rescans_done_markers(tmp_path):
    import torch.distributed as dist

    for s, status in (("A", "ok"), ("B", "failed")):
        (tmp_path / "symbols" / s).mkdir(parents=True)
        jobqueue.write_marker(tmp_path / "symbols" / s, {"status": status})
    (tmp_path / "symbols" / "C").mkdir()
    (tmp_path / "symbols" / "C" / "done.json").write_text("{half-writ")  # garbage never counts as done
    assert jobqueue.pending_symbols(tmp_path, ["A", "B", "C", "D"], retry_failed=False) == (
        ["C", "D"], {"ok": 1, "failed": 1, "pending": 2})
    assert jobqueue.pending_symbols(tmp_path, ["A", "B", "C", "D"], retry_failed=True)[0] == ["B", "C", "D"]
    store = dist.HashStore()
    first, second = jobqueue.JobQueue(store, "t1", ["C", "D"]), jobqueue.JobQueue(store, "t1", ["C", "D"])
    assert [first.claim(), second.claim(), first.claim(), second.claim()] == [(0, "C"), (1, "D"), None, None]
    again = jobqueue.JobQueue(store, "t2", ["C", "D"])  # a restarted attempt counts under its own token
    assert again.claim() == (0, "C")
    assert first.request_stop({"reason": "signal", "worker": 0}) == {"reason": "signal", "worker": 0}
    assert second.request_stop({"reason": "time_budget", "worker": 1}) == {"reason": "signal", "worker": 0}
    assert second.stop_record(force=True)["reason"] == "signal" and again.stop_record(force=True) is None


def test_the_point_in_time_universe_keeps_each_symbols_samples_to_its_member_dates(tmp_path):
    """--universe sp500-pit on a file: TSLA joined the index on 2020-12-21, SIVB was in it from 2018-03-19
    to 2023-03-15, AAPL all along, BTC-USD never: every sample of a symbol is a date it was a member."""
    from trainers.lstm.job import prepare_job

    rng = np.random.default_rng(0)
    days = pd.bdate_range("2016-01-04", "2024-12-31")
    frame = pd.concat([pd.DataFrame({"date": days, "ticker": t, "close": 50 * np.exp(np.cumsum(rng.normal(0, 0.01,
                                                                                                          len(days))))})
                       for t in ("AAPL", "TSLA", "SIVB", "BTC-USD")])
    frame.to_csv(tmp_path / "prices.csv", index=False)
    args = ["--source", f"file:{tmp_path / 'prices.csv'}", "--universe", "sp500-pit", "--window", "16", "--hidden", "8",
            "--epochs", "1", "--batch-size", "256", "--timeframes", "1d,1w", "--no-export", "--device", "cpu"]
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", "--run-dir", str(run_dir), *args]) == 0
    r = json.loads((run_dir / "results.json").read_text())
    assert list(r["symbols"]) == ["AAPL", "SIVB", "TSLA"]  # BTC-USD was never a member: left out, reported
    universe = r["data"]["universe"]
    assert universe["name"] == "sp500-pit" and universe["never_members"] == ["BTC-USD"]
    assert universe["members_over_the_dates"] > 500 and "FRC" in universe["members_without_bars"]
    member = {"AAPL": ("2016-01-04", "2025-01-01"), "TSLA": ("2020-12-21", "2025-01-01"),
              "SIVB": ("2018-03-19", "2023-03-15")}
    cfg = load_run_config(run_dir, LstmConfig)
    plan = prepare_job(cfg, log=lambda _m: None)
    for symbol, (joined, left) in member.items():
        data = build_symbol_data(plan.bars[symbol], cfg, plan.timeframes)
        anchors = np.concatenate([data.ids[s].numpy() for s in ("train", "val", "test")] +
                                 [data.trade_ids[s] for s in ("train", "val", "test")])
        dates = pd.DatetimeIndex(data.ts[anchors])
        assert dates.min() >= pd.Timestamp(joined) and dates.max() < pd.Timestamp(left), symbol
        one = json.loads((run_dir / "symbols" / symbol / "results.json").read_text())
        assert one["data"]["member_bars"] == universe["member_bars"][symbol] == \
            ((days >= joined) & (days < left)).sum()
    tsla = pd.DatetimeIndex(plan.bars["TSLA"].ts)  # its first sample is the day it joined, not a later one
    data = build_symbol_data(plan.bars["TSLA"], cfg, plan.timeframes)
    assert tsla[data.ids["train"][0].item()] == pd.Timestamp("2020-12-21")
    assert main(["lstm", "train", "--run-dir", str(tmp_path / "syn"), "--universe", "sp500-pit"]) == 2  # no members
