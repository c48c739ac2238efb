"""The trading agent end to end: 2-rank DDP training on CPU to results (table, PNG, markdown),
`evaluate` again from the checkpoint, `export` checked by onnxruntime at other batch sizes; and bad
input refused in one line with exit code 2, writing nothing."""

from __future__ import annotations

import json

import pytest

from conftest import read_metrics, read_results, run_cli, run_torchrun
from trainers.cli import main
from trainers.ops.commands import load_workload

TINY = ["--synthetic-tickers", "6", "--num-stocks", "4", "--synthetic-days", "700", "--window", "8",
        "--episode-days", "30", "--num-envs", "8", "--rollout-steps", "16", "--batch-size", "64", "--hidden", "16",
        "--total-steps", "2048", "--eval-every", "2", "--seeds", "2", "--random-runs", "3", "--log-every", "2",
        "--device", "cpu"]


@pytest.mark.slow
def test_two_rank_ddp_training_to_results_evaluate_and_export(tmp_path):
    run_dir = tmp_path / "run"
    run_torchrun(["ppo", "train", *TINY, "--run-dir", str(run_dir), "--grad-accum", "2", "--target-kl", "0.5"])
    r = read_results(run_dir)
    t = r["training"]
    # 2048 steps / (8 envs x 16 steps x 2 ranks) = 8 updates per agent; 2 seeds x (clstm + mlp) = 4 agents
    assert t["world_size"] == 2 and t["stop_reason"] == "completed" and t["steps"] == 32
    assert t["updates_per_agent"] == 8 and t["env_steps_per_update"] == 256
    assert t["throughput"]["unit"] == "env_steps" and t["throughput"]["per_s_steady"] > 0
    # --target-kl may end an update's epochs early: its FLOPs, hence its MFU, are not known in advance
    assert r["model"]["flops_per_env_step"] is None and t["mfu"] is None
    table = r["evaluation"]["table"]
    assert set(table) == {"ppo_clstm", "ppo_mlp", "buy_and_hold_equal_weight", "equal_weight_market_rebalanced",
                          "random_policy"}
    assert table["ppo_clstm"]["summary"]["n"] == 2 and [row["seed"] for row in table["ppo_mlp"]["per_seed"]] == [0, 1]
    for row in table["ppo_clstm"]["per_seed"]:
        assert row["selected_update"] in (2, 4, 6, 8) and row["validation"]["days"] > 0
    assert "buy-and-hold" in r["evaluation"]["verdict"]
    assert (run_dir / "equity_test.png").read_bytes()[:4] == b"\x89PNG"
    assert "| ppo_clstm | 2 |" in (run_dir / "results.md").read_text()
    # metrics gathered from both ranks: 8 envs x 2 ranks finish an episode every 30 steps
    logged = [m for m in read_metrics(run_dir) if m.get("kind") == "train" or "episodes" in m]
    assert any(m.get("episodes", 0) >= 16 for m in logged), logged[:3]

    before = json.dumps(table, sort_keys=True)
    assert main(["ppo", "evaluate", "--run-dir", str(run_dir)]) == 0  # in-process: one interpreter start less
    assert json.dumps(read_results(run_dir)["evaluation"]["table"], sort_keys=True) == before  # deterministic

    run_cli(["ppo", "export", "--run-dir", str(run_dir), "--latency-iters", "3"], check=True)
    e = read_results(run_dir)["export"]
    assert e["parity"]["batch_sizes"] == [1, 5, 64] and e["export_batch"] == 2
    assert e["parity"]["max_abs_error"] <= 1e-4 and len(e["sha256"]) == 64
    assert e["agent"].startswith("clstm/seed") and (run_dir / "model.onnx").exists()
    assert e["inputs"]["market"] == ["batch", 8, 4, 6] and e["preprocessing"]["tickers"]


@pytest.mark.parametrize("args,needle", [
    (["--num-stocks", "1"], "--num-stocks 1 is not allowed: need an integer >= 2"),
    (["--synthetic-days", "900", "--window", "200"], "--window 200 is longer than the training period (138"),
    (["--synthetic-days", "500", "--window", "400"], "with window 400"),
    (["--cost-bps", "-5"], "--cost-bps -5.0 is not allowed: need a finite number >= 0"),
    (["--cost-bps", "nan"], "--cost-bps nan is not allowed"),
    (["--cost-bps", "20000"], "--cost-bps 20000.0 is not allowed: need a finite number >= 0 and <= 1000"),
    (["--synthetic-momentum", "1e10"], "--synthetic-momentum 10000000000.0 is not allowed"),
    (["--initial-cash", "inf"], "--initial-cash inf is not allowed"),
    (["--lr", "nan"], "--lr nan is not allowed"),
    (["--seeds", "1000000"], "--seeds 1000000 is not allowed: need an integer >= 1 and <= 64"),
    (["--episode-days", "5000"], "--episode-days 5000 is longer than the training period"),
    (["--action", "short"], "--action 'short' is not one of: trades, weights"),
    (["--num-stocks", "40"], "--num-stocks 40 is more than --synthetic-tickers 30"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needle, capsys):
    run_dir = tmp_path / "run"
    assert main(["ppo", "train", "--run-dir", str(run_dir), "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert not run_dir.exists()


def test_a_file_with_one_complete_stock_is_refused(tmp_path, capsys):
    from trainers.market.synthetic import synthetic_market

    frame = synthetic_market(n_tickers=3, n_days=600, seed=0)
    # two stocks miss a stretch of days longer than a gap the environment fills (MAX_FILLED_GAP) every 50
    # days; a day missed here and there is filled from the last close since c9fa64c and trained on
    days = frame.groupby("ticker").cumcount()
    frame = frame[~((frame["ticker"] != "SYN000") & (days % 50 < 10))]
    frame.to_csv(tmp_path / "prices.csv", index=False)
    run_dir = tmp_path / "run"
    assert main(["ppo", "train", "--run-dir", str(run_dir), "--source", f"file:{tmp_path / 'prices.csv'}",
                 "--min-history-days", "100", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--num-stocks 30: the data holds 1 stock(s) with a bar on every date" in err[0]
    assert "or --num-stocks" not in err[0] and not run_dir.exists()  # one stock is no portfolio


def _prices_file(tmp_path, gap_in: str | None = None):
    """A price file of 4 tickers (`gap_in` missing 10 days every 50: longer than a gap the environment fills)."""
    from trainers.market.synthetic import synthetic_market

    frame = synthetic_market(n_tickers=4, n_days=700, seed=0)
    if gap_in is not None:
        days = frame.groupby("ticker").cumcount()
        frame = frame[~((frame["ticker"] == gap_in) & (days % 50 < 10))]
    path = tmp_path / "prices.csv"
    frame.to_csv(path, index=False)
    return path, frame


@pytest.mark.parametrize("columns", [("date", "ticker", "close"), ("date", "ticker", "close", "volume")])
def test_a_close_only_price_file_trains_evaluates_and_exports(tmp_path, capsys, columns):
    """A regression (issue 65): a close-only file (date, ticker, close: the format the README offers for user data)
    was refused for every stock ("0 stock(s) with a bar on every date"), even with no gap. Its stocks now trade,
    their high and low taken from the close, and the run says so in data.json."""
    path, frame = _prices_file(tmp_path)
    frame[list(columns)].to_csv(path, index=False)
    run_dir = tmp_path / "run"
    args = ["ppo", "train", *TINY[TINY.index("--window"):], "--source", f"file:{path}", "--num-stocks", "4",
            "--min-history-days", "100", "--total-steps", "256", "--seeds", "1", "--no-baseline-mlp",
            "--run-dir", str(run_dir)]
    assert main(args) == 0, capsys.readouterr().err
    data = json.loads((run_dir / "data.json").read_text())
    assert data["fingerprint"]
    results = read_results(run_dir)
    assert results["training"]["stop_reason"] == "completed"
    assert sorted(results["data"]["high_low_from_close"]) == sorted(frame["ticker"].unique())
    assert main(["ppo", "evaluate", "--run-dir", str(run_dir)]) == 0


def test_a_file_holding_fewer_complete_stocks_than_num_stocks_is_refused(tmp_path, capsys):
    """A regression: --num-stocks 4 on a file where one of the 4 misses dates trained 3 stocks and exited 0
    (config.json said 4, results.json 3): a portfolio other than the one asked for, said only in a log line."""
    path, _ = _prices_file(tmp_path, gap_in="SYN002")
    run_dir = tmp_path / "run"
    assert main(["ppo", "train", "--run-dir", str(run_dir), "--source", f"file:{path}", "--num-stocks", "4",
                 "--min-history-days", "100", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--num-stocks 4: the data holds 3 stock(s) with a bar on every date" in err[0], err
    assert "SYN002" in err[0] and "or --num-stocks 3" in err[0] and not run_dir.exists()


def test_a_cache_yahoo_filled_again_on_a_fresh_machine_does_not_lose_the_run(tmp_path, capsys):
    """The deploy trains PPO from a cache `trainers fetch-sp500` fills. On a fresh machine after a lost pod its
    data phase fills the cache again, and Yahoo's adjusted closes have moved with every dividend since: the run
    resuming from the remote was refused as trained on other data, and lost. A cache holding a user's file
    imported keeps the check (an edit there is refused)."""
    import pandas as pd

    from trainers.market.fetch import PriceCache, fill_cache
    from trainers.market.synthetic import synthetic_market

    frame = synthetic_market(6, 700, seed=3)
    for label in ("yfinance", "file:/data/prices.csv"):
        cache_dir, run_dir = tmp_path / f"cache_{label[:4]}", tmp_path / f"run_{label[:4]}"
        fill_cache(frame, PriceCache(cache_dir), label, min_rows=100)
        args = ["ppo", "train", *TINY[TINY.index("--window"):], "--source", "cache", "--cache-dir", str(cache_dir),
                "--num-stocks", "4", "--total-steps", "256", "--seeds", "1", "--no-baseline-mlp",
                "--start", f"{frame['date'].min():%Y-%m-%d}", "--run-dir", str(run_dir)]
        assert main(args) == 0, capsys.readouterr().err
        capsys.readouterr()
        for path in cache_dir.iterdir():  # the machine's cache gone with its pod, filled again: a dividend since
            path.unlink() if path.is_file() else None
        moved = frame.copy()
        moved[[c for c in ("open", "high", "low", "close") if c in frame.columns]] *= 0.99
        fill_cache(pd.DataFrame(moved), PriceCache(cache_dir), label, min_rows=100)
        code = main(["ppo", "evaluate", "--run-dir", str(run_dir)])
        err = capsys.readouterr().err
        if label == "yfinance":
            assert code == 0, err
        else:
            assert code == 2 and "was trained on other data" in err, err


def test_a_price_file_edited_after_training_is_refused_by_evaluate_and_resume(tmp_path, capsys):
    """A regression: PPO recorded no fingerprint of its data. A file edited after training (a stock's last 40
    closes doubled) was evaluated as if it were the run's (buy-and-hold's test return moved from +6 % to +35 %,
    under results.json's old tickers), and one whose complete stocks changed died in a traceback."""
    path, frame = _prices_file(tmp_path)
    run_dir = tmp_path / "run"
    args = ["ppo", "train", *TINY[TINY.index("--window"):], "--source", f"file:{path}", "--num-stocks", "4",
            "--min-history-days", "100", "--total-steps", "256", "--seeds", "1", "--no-baseline-mlp",
            "--run-dir", str(run_dir)]
    assert main(args) == 0
    assert json.loads((run_dir / "data.json").read_text())["fingerprint"]
    capsys.readouterr()
    last = frame.groupby("ticker").cumcount(ascending=False) < 40
    edited = frame.copy()
    prices = [c for c in ("open", "high", "low", "close") if c in frame.columns]
    edited.loc[last & (frame["ticker"] == "SYN001"), prices] *= 2
    edited.to_csv(path, index=False)
    before = (run_dir / "results.json").read_bytes()
    for argv, advice in ((["ppo", "evaluate", "--run-dir", str(run_dir)], "its evaluation needs the data it trained on"),
                         (args, "resume with the data it started with")):  # (evaluate has no resume to offer)
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "was trained on other data" in err[0] and advice in err[0], err
    assert (run_dir / "results.json").read_bytes() == before
    frame.to_csv(path, index=False)  # the data it was trained on: evaluated again
    assert main(["ppo", "evaluate", "--run-dir", str(run_dir)]) == 0


def test_validations_checkpoint_as_ckpt_at_eval_says_and_min_delta_counts(tmp_path):
    """A regression: PPO's validations never reached the run, so --ckpt-at-eval (default always: "a lost machine
    costs at most the steps since the last evaluation") and --min-delta did nothing: 31 validations left
    checkpoints at steps 200 and 314 only, and results.json's best_val named a metric PPO never computes."""
    args = ["ppo", "train", *TINY, "--total-steps", "768", "--seeds", "1", "--no-baseline-mlp", "--keep-last", "50"]
    saved = {}
    for name, extra in (("always", []), ("improved", ["--ckpt-at-eval", "improved", "--min-delta", "1e9"])):
        run_dir = tmp_path / name
        assert main([*args, *extra, "--run-dir", str(run_dir)]) == 0  # 6 updates, validated at 2, 4 and 6
        saved[name] = sorted(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("meta_*.json"))
        results = read_results(run_dir)
        (best,) = results["training"]["best_val"]["per_agent"]
        (row,) = results["evaluation"]["table"]["ppo_clstm"]["per_seed"]
        assert best["agent"] == "clstm/seed0" and best["update"] == row["selected_update"], (best, row)
        if name == "improved":  # no later validation beats the first by 1e9: the first stays the agent's pick
            assert best["update"] == 2
    assert saved["always"] == [2, 4, 6], saved
    assert saved["improved"] == [2, 6], saved  # the first validation (a new best), and the last step


@pytest.mark.slow
def test_a_resume_on_fewer_workers_keeps_the_schedule_and_trains_no_agent_twice(tmp_path):
    """Resumed on 1 worker after 2, PPO once recomputed its updates per agent (8 -> 16) and mapped
    the step counter to other agents: it trained a finished agent again (32 steps ran instead of 16)."""
    run_dir = tmp_path / "run"
    args = ["ppo", "train", *TINY, "--total-steps", "1024", "--run-dir", str(run_dir), "--ckpt-every", "1"]
    run_torchrun(args, env={"TRAINERS_FAULT": "sigterm@rank1:step6"})  # 4 updates per agent, 4 agents: stops at 6
    first = read_results(run_dir)["training"]
    assert first["stop_reason"] == "signal" and first["steps"] == 6 and first["updates_per_agent"] == 4
    run_cli(args, check=True)  # one process now
    t = read_results(run_dir)["training"]
    assert t["stop_reason"] == "completed" and t["steps"] == 16 and t["updates_per_agent"] == 4
    assert t["env_steps_per_update"] == 8 * 16  # each remaining update: this one worker's environments
    log = (run_dir / "training.log").read_text()
    assert "started on 2 worker(s), now 1: it keeps its 4 updates per agent" in log
    from trainers.runtime.rundir import load_checkpoint_states

    _, states = load_checkpoint_states(run_dir, "latest")
    assert [a["updates_done"] for a in states["agents"]["agents"]] == [4, 4, 4, 4]
    assert [len(a["history"]) for a in states["agents"]["agents"]] == [2, 2, 2, 2]  # eval every 2: no update twice


def test_evaluate_and_export_wait_for_the_run_folder_and_a_moved_folder_resumes(tmp_path, monkeypatch, capsys):
    """`ppo evaluate` and `export` wrote into a folder training held; a folder named another way
    (relative, moved) was refused as "a different config"."""
    import os
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    args = ["ppo", "train", *TINY, "--total-steps", "256", "--seeds", "1", "--no-baseline-mlp"]
    assert main([*args, "--run-dir", str(run_dir)]) == 0
    # the FLOPs the plan counts for these options, so a GPU run's MFU (None on a CPU) calibrates `trainers plan`
    flops = read_results(run_dir)["model"]["flops_per_env_step"]
    assert flops == load_workload("ppo", args[2:]).flops_per_item > 0
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom trainers.runtime.lock import FolderLock\n"
                               f"FolderLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = (run_dir / "results.json").read_bytes()
        for verb in ("evaluate", "export"):
            assert main(["ppo", verb, "--run-dir", str(run_dir)]) == 2
            assert "is in use by" in capsys.readouterr().err.strip().splitlines()[-1]
        assert (run_dir / "results.json").read_bytes() == before and not (run_dir / "model.onnx").exists()
    finally:
        holder.kill()
        holder.wait()
    moved = tmp_path / "elsewhere"
    run_dir.rename(moved)
    monkeypatch.chdir(tmp_path)
    assert main([*args, "--run-dir", "./elsewhere"]) == 0  # resumed (nothing left to train), not refused
    assert "resumed from checkpoint" in (moved / "training.log").read_text()
    assert os.path.exists(moved / "results.json")


def test_export_of_a_run_killed_before_its_results_takes_the_statistics_from_its_data(tmp_path, capsys):
    """The model's `market` input is scaled with the training features' statistics, which export.json carries; a
    run killed before its results.json was exported with nulls there (exit 0) and no way to feed the model. Read from
    the run's data again (a file edited since is refused, as `evaluate` refuses it)."""
    import pandas as pd

    from trainers.market.synthetic import synthetic_market

    prices = tmp_path / "prices.csv"
    synthetic_market(6, 700, seed=3).to_csv(prices, index=False)
    run_dir = tmp_path / "run"
    args = ["ppo", "train", *TINY, "--source", f"file:{prices}", "--total-steps", "256", "--seeds", "1",
            "--no-baseline-mlp", "--run-dir", str(run_dir)]
    assert main(args) == 0
    trained = read_results(run_dir)["data"]
    (run_dir / "results.json").unlink()  # what a kill before `finish` leaves
    assert main(["ppo", "export", "--run-dir", str(run_dir)]) == 0
    shipped = json.loads((run_dir / "export.json").read_text())["preprocessing"]
    assert shipped["feature_mean"] == trained["feature_mean"] and shipped["tickers"] == trained["tickers"]
    assert shipped["feature_std"] == trained["feature_std"] and len(shipped["feature_std"]) == 6
    frame = pd.read_csv(prices)
    frame.loc[frame.index[-1], "close"] *= 1.01
    frame.to_csv(prices, index=False)
    capsys.readouterr()
    assert main(["ppo", "export", "--run-dir", str(run_dir)]) == 2
    assert "was trained on other data" in capsys.readouterr().err


def test_every_episode_is_logged_whatever_the_log_cadence(tmp_path):
    """An agent's last updates before the next agent began were never logged when --log-every did not fall on
    them: their episodes went with the agent's phase (136 logged of 144 in a run at --log-every 5)."""
    def episodes(log_every: str) -> int:
        run_dir = tmp_path / f"every{log_every}"
        assert main(["ppo", "train", *TINY, "--total-steps", "1024", "--seeds", "1", "--log-every", log_every,
                     "--run-dir", str(run_dir)]) == 0
        return sum(r["episodes"] for r in read_metrics(run_dir) if r["kind"] == "train")

    assert episodes("1000") == episodes("1") > 0
