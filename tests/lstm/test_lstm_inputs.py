"""Bad input to `trainers lstm train`: one line naming the value and what would do, exit 2, nothing written."""

import pandas as pd
import pytest

from trainers.cli import main

TINY = ["--synthetic-tickers", "3", "--synthetic-days", "700", "--window", "16", "--hidden", "8", "--device", "cpu"]


def bars_file(path, tickers, freq="h", periods=200):
    ts = pd.date_range("2023-01-01", periods=periods, freq=freq)
    rows = [pd.DataFrame({"date": ts, "ticker": t, "open": 10.0, "high": 11.0, "low": 9.0, "close": 10.0 + i,
                          "volume": 100.0}) for i, t in enumerate(tickers)]
    pd.concat(rows).to_csv(path, index=False)
    return f"file:{path}"


@pytest.mark.parametrize("args,needle", [
    (["--symbols", "SYN000,NOPE"], "unknown symbol(s) NOPE: --source synthetic has no bars for them (it has SYN000"),
    (["--symbols", "../x"], "malformed symbol(s) '../x'"),
    (["--symbols", "SYN000,SYN000"], "duplicate symbol(s) SYN000"),
    (["--synthetic-days", "300"], "SYN000: too little history: 300 1d bars cannot hold train/val/test"),
    (["--window", "400"], "too little history"),
    (["--timeframes", "1h,4h"], "the first timeframe must be the base bars' interval, 1d for this data"),
    (["--timeframes", "1d,7h"], "'7h' does not divide a day"),
    (["--timeframes", "1d,1M,1w"], "each longer than the one before"),
    (["--horizon", "0"], "--horizon 0 is not allowed: need an integer >= 1"),
    (["--horizon", "-2"], "--horizon -2 is not allowed: need an integer >= 1"),
    (["--dead-zone", "nan"], "--dead-zone nan is not allowed: need a finite number >= 0"),
    (["--cost-bps", "inf"], "--cost-bps inf is not allowed"),
    (["--dead-zone", "0.5"], "no labelled window"),
    (["--jobs-per-gpu", "2"], "--jobs-per-gpu 2 packs workers onto GPUs; on CPU"),
    (["--symbols", "SYN000", "--tickers-file", "x.txt"], "give --symbols or --tickers-file, not both"),
    (["--source", "nasdaq"], "--source 'nasdaq' is not one of"),
    (["--symbols", ""], "--symbols '' names no symbol"),  # it once meant "every symbol"
    (["--symbols", " , "], "--symbols ' , ' names no symbol"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needle, capsys):
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", "--run-dir", str(run_dir), *TINY, *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not run_dir.exists()


def test_bad_files_are_refused_before_anything_is_written(tmp_path, capsys):
    run_dir = tmp_path / "job"
    cases = [
        (bars_file(tmp_path / "a.csv", ["BTC-USD", "../../etc"]), "malformed symbol(s) '../../etc'"),
        (bars_file(tmp_path / "b.csv", ["BTC-USD"], freq="7min"), "bars every 7 minutes do not divide a day"),
        (bars_file(tmp_path / "c.csv", ["BTC-USD"], periods=150), "BTC-USD: too little history: 150 1h bars"),
        ("file:" + str(tmp_path / "missing.csv"), "no such file"),
    ]
    mixed = tmp_path / "d.csv"
    pd.concat([pd.read_csv(bars_file(tmp_path / "d1.csv", ["BTC-USD"])[5:]),
               pd.read_csv(bars_file(tmp_path / "d2.csv", ["ETH-USD"], freq="D")[5:])]).to_csv(mixed, index=False)
    cases.append((f"file:{mixed}", "different bar intervals (1d, 1h): 1d: ETH-USD; 1h: BTC-USD;"))
    invalid = tmp_path / "e.csv"  # a named symbol whose every bar fails validation: why, not "no bars"
    pd.concat([pd.read_csv(bars_file(tmp_path / "e1.csv", ["BTC-USD"], periods=24 * 40)[5:]),
               pd.read_csv(bars_file(tmp_path / "e2.csv", ["BAD"], periods=24 * 40)[5:]).assign(close=-1.0)]
              ).to_csv(invalid, index=False)
    cases.append((f"file:{invalid} --symbols BTC-USD,BAD", "no valid bar in --source file:"))
    cases.append((f"file:{invalid} --symbols BTC-USD,BAD", "BAD (only 0 valid bars, need 1; rows dropped: 960"))
    names = tmp_path / "symbols.txt"
    names.write_text("BTC-USD\n# a comment\n../up\n")
    cases.append(("synthetic --tickers-file " + str(names), "malformed symbol(s) '../up'"))
    for source, needle in cases:
        extra = source.split(" ")
        assert main(["lstm", "train", "--run-dir", str(run_dir), "--window", "16", "--source", *extra]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (source, lines)
        assert not run_dir.exists()


def test_a_symbol_of_the_source_without_a_valid_bar_is_named_not_dropped_silently(tmp_path, capsys):
    """Every symbol of a file: one whose bars all fail validation is left out (the others train), named in a
    warning and in results.md; it once vanished, said only by a count deep in results.json."""
    import numpy as np

    ts = pd.date_range("2023-01-01", periods=24 * 40, freq="h")
    close = 100 * np.exp(np.cumsum(np.random.default_rng(0).normal(0, 0.004, len(ts))))
    path = tmp_path / "bars.csv"
    pd.concat([pd.DataFrame({"date": ts, "ticker": "BTC-USD", "close": close}),
               pd.DataFrame({"date": ts, "ticker": "BAD", "close": -close})]).to_csv(path, index=False)
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", "--run-dir", str(run_dir), "--source", f"file:{path}", "--window", "16",
                 "--hidden", "8", "--epochs", "1", "--no-export", "--device", "cpu"]) == 0
    assert "left out, no valid bar: BAD (only 0 valid bars" in capsys.readouterr().out
    md = (run_dir / "results.md").read_text()
    assert "1 of 1 symbols succeeded" in md and "Symbols left out, no valid bar in the data (1): BAD (" in md


def test_blank_ticker_cells_are_refused_not_trained_as_a_symbol_named_nan(tmp_path, capsys):
    """The LSTM's own reader once read empty ticker cells as the text 'nan' and trained a symbol NAN
    from them (the market reader, which it now uses, refuses the file)."""
    import numpy as np

    rng = np.random.default_rng(0)
    ts = pd.date_range("2023-01-01", periods=24 * 40, freq="h")
    series = []
    for ticker in ("BTC-USD", None):  # a whole second series without its name
        close = 100 * np.exp(np.cumsum(rng.normal(0, 0.004, len(ts))))
        series.append(pd.DataFrame({"date": ts, "ticker": ticker, "open": close, "high": close * 1.002,
                                    "low": close * 0.998, "close": close, "volume": 1e3}))
    path = tmp_path / "bars.csv"
    pd.concat(series).to_csv(path, index=False)
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", "--run-dir", str(run_dir), "--source", f"file:{path}", "--window", "16",
                 "--hidden", "8", "--epochs", "1", "--no-export", "--device", "cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "960 row(s) have no ticker (first: row 961 of the data, dated 2023-01-01 00:00:00); " \
        "give every row a symbol" in lines[0], lines
    assert not run_dir.exists()


def test_jobs_per_gpu_binds_k_workers_to_each_gpu(monkeypatch):
    import torch

    from trainers.errors import UsageError
    from trainers.lstm.config import LstmConfig
    from trainers.lstm.worker import worker_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda _device: None)
    cfg = LstmConfig(jobs_per_gpu=2)
    assert [worker_device(cfg, r).index for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(UsageError, match="start at most --jobs-per-gpu 2 x 4 = 8 workers per node"):
        worker_device(cfg, 8)
    assert worker_device(LstmConfig(device="cpu"), 5).type == "cpu"


def test_the_budget_bills_every_gpu_the_workers_use():
    """3 workers at --jobs-per-gpu 2 use GPUs 0 and 1: world // K billed one, and the job's --budget-usd let it
    spend twice what it was given."""
    import torch

    from trainers.lstm.worker import billed_devices

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert billed_devices(3, 3, 2, cuda) == 2 and billed_devices(8, 8, 2, cuda) == 4
    assert billed_devices(6, 3, 2, cuda) == 4  # two nodes of 3 workers: 2 GPUs each
    assert billed_devices(5, 5, 1, cuda) == 5 and billed_devices(3, 3, 2, cpu) == 3


def test_evaluate_and_export_pick_only_symbols_the_job_has():
    from trainers.errors import UsageError
    from trainers.lstm.config import job_symbols

    job = {"symbols": {"BTC-USD": {}, "ETH-USD": {}}}
    assert job_symbols(job, None) == ["BTC-USD", "ETH-USD"] and job_symbols(job, "eth-usd") == ["ETH-USD"]
    with pytest.raises(UsageError, match="--symbols SOL-USD: not in this job \\(it has BTC-USD, ETH-USD\\)"):
        job_symbols(job, "BTC-USD,SOL-USD")
    with pytest.raises(UsageError, match="--symbols '' names no symbol"):  # not "all of them"
        job_symbols(job, "")


def test_export_refuses_a_checkpoint_that_is_no_checkpoint_once_exit_2(tmp_path, capsys):
    """`lstm export --checkpoint foo` once failed every symbol in turn, exit 1 (evaluate says it once, exit 2)."""
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", "--run-dir", str(run_dir), *TINY, "--symbols", "SYN000", "--epochs", "1",
                 "--no-export"]) == 0
    capsys.readouterr()
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    for bad in ("foo", "²"):  # (a digit to str.isdigit, not to int())
        assert main(["lstm", "export", "--run-dir", str(run_dir), "--checkpoint", bad]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines == [f"error: --checkpoint {bad!r} is not best, latest or a step number"], lines
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before


def test_the_deploys_check_only_start_passes_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """deploy_8gpu.sh runs training once with TRAINERS_CHECK_ONLY=1 before torchrun. The LSTM's
    per-symbol error handler once caught the CheckPassed signal as each symbol's failure, wrote the
    job folder and stopped every LSTM deploy in phase 'train'."""
    monkeypatch.setenv("TRAINERS_CHECK_ONLY", "1")
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", "--run-dir", str(run_dir), *TINY]) == 0
    assert "check passed: lstm: every check before training passed" in capsys.readouterr().err
    assert not run_dir.exists()
    assert main(["lstm", "train", "--run-dir", str(run_dir), *TINY, "--window", "400"]) == 2  # a check still fails
    assert not run_dir.exists()


def test_the_same_job_folder_under_another_spelling_or_moved_resumes(tmp_path, monkeypatch, capsys):
    """`--run-dir x`, then `./x`, the absolute path, or the folder moved: the same job (the job's and
    each symbol's config once recorded the spelling and refused every other as "a different config")."""
    import json

    monkeypatch.chdir(tmp_path)
    args = ["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--epochs", "1", "--batch-size", "64",
            "--no-export"]
    monkeypatch.setenv("TRAINERS_FAULT_RAISE", "SYN001@step2:always")
    assert main([*args, "--run-dir", "x"]) == 1  # SYN001 failed: the next launch trains it again
    monkeypatch.delenv("TRAINERS_FAULT_RAISE")
    assert main([*args, "--run-dir", "./x"]) == 0  # the job's config, then SYN001's own folder's
    status = lambda folder: {s: r["status"] for s, r in json.loads((tmp_path / folder / "results.json")  # noqa: E731
                                                                   .read_text())["symbols"].items()}
    assert status("x") == {"SYN000": "ok", "SYN001": "ok"}
    assert main([*args, "--run-dir", str(tmp_path / "x")]) == 0
    (tmp_path / "x").rename(tmp_path / "moved")
    assert main([*args, "--run-dir", "moved"]) == 0
    assert status("moved") == {"SYN000": "ok", "SYN001": "ok"}
    assert "different config" not in capsys.readouterr().err
