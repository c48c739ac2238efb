"""--walk-forward K: expanding folds with their own splits, embargo and normalisation; a kill in one
fold resumes that fold from its checkpoint and skips the ones that finished."""

import pytest

from conftest import TINY_DATA, read_results, run_cli
from trainers.errors import UsageError
from trainers.forecast.config import ForecastConfig
from trainers.market.windows import LOOKBACK, plan_splits, plan_walk_forward

W, H = 32, 5


def test_folds_expand_tile_the_end_and_keep_their_embargo():
    plans = plan_walk_forward(800, W, H, 0.15, 0.15, 20, folds=3)
    assert plans[-1].ranges == plan_splits(800, W, H, 0.15, 0.15, 20).ranges  # the last fold is the plain split
    tests = [p.ranges["test"] for p in plans]
    assert all(a[1] == b[0] for a, b in zip(tests, tests[1:]))  # contiguous, no overlap
    for p in plans:
        (a0, a1), (b0, b1), (c0, c1) = (p.ranges[s] for s in ("train", "val", "test"))
        assert a0 == plans[0].ranges["train"][0] and b0 - a1 == c0 - b1 == p.embargo == W + H + LOOKBACK
        assert b1 - b0 == plans[-1].ranges["val"][1] - plans[-1].ranges["val"][0]
    assert [p.ranges["train"][1] for p in plans] == sorted({p.ranges["train"][1] for p in plans})  # expanding
    with pytest.raises(UsageError, match="earliest fold would train on"):
        plan_walk_forward(800, W, H, 0.15, 0.15, 20, folds=6)


def test_fold_needs_walk_forward():
    with pytest.raises(UsageError, match="--fold 2 needs --walk-forward"):
        ForecastConfig(walk_forward=2, fold=2).validate()
    ForecastConfig(walk_forward=3, fold=2).validate()


@pytest.mark.slow
def test_walk_forward_resumes_fold_by_fold(tmp_path):
    run_dir = tmp_path / "wf"
    args = ["forecast", "train", *TINY_DATA, "--epochs", "1", "--batch-size", "128", "--ckpt-every", "4",
            "--walk-forward", "2", "--run-dir", str(run_dir)]
    # one process: fold 0 has 5568 / 128 = 44 steps, fold 1 7072 / 128 = 56; step 50 is in fold 1 only
    killed = run_cli(args, env={"TRAINERS_FAULT": "sigkill@rank0:step50"})
    assert killed.returncode == -9
    assert read_results(run_dir / "fold_0")["training"]["steps"] == 44 and not (run_dir / "results.json").exists()
    fold0_before = (run_dir / "fold_0" / "results.json").read_text()

    run_cli(args, check=True)
    assert (run_dir / "fold_0" / "results.json").read_text() == fold0_before  # not trained again
    assert "resumed from checkpoint step 48" in (run_dir / "fold_1" / "training.log").read_text()
    r = read_results(run_dir)
    wf = r["walk_forward"]
    assert wf["completed"] == 2 and wf["stopped"] is None and [f["fold"] for f in wf["per_fold"]] == [0, 1]
    folds = [read_results(run_dir / f"fold_{k}") for k in (0, 1)]
    assert folds[1]["training"]["steps"] == 56 and folds[1]["config"]["fold"] == 1
    assert folds[0]["data"]["anchor_dates"]["test"][1] < folds[1]["data"]["anchor_dates"]["test"][0]
    assert folds[0]["data"]["samples"]["train"] < folds[1]["data"]["samples"]["train"]
    assert folds[0]["preprocessing"]["feature_mean"] != folds[1]["preprocessing"]["feature_mean"]  # refit per fold
    rank_ics = [f["evaluation"]["test"]["model"]["rank_ic"]["mean"] for f in folds]
    assert wf["mean_std"]["model_rank_ic"]["mean"] == pytest.approx(sum(rank_ics) / 2)
    assert wf["per_fold"][1]["verdict"] == folds[1]["evaluation"]["test"]["verdict"]
    assert "fold_1/report.md" in (run_dir / "report.md").read_text()
    # the folder holds a walk-forward: another config is refused, the finished walk is not redone
    refused = run_cli([*args[:-4], "--walk-forward", "3", "--run-dir", str(run_dir)])
    assert refused.returncode == 2 and "different config" in refused.stderr


def test_too_many_folds_is_refused_before_anything_is_written(tmp_path):
    from trainers.forecast.train import train

    run_dir = tmp_path / "wf"
    with pytest.raises(UsageError, match="earliest fold"):
        train(ForecastConfig(run_dir=str(run_dir), synthetic_tickers=16, synthetic_days=800, window=W, horizon=H,
                             walk_forward=12))
    assert not (run_dir / "config.json").exists()  # a walk with fewer folds may use the folder next


def test_folds_priced_differently_are_not_averaged_and_the_top_folder_points_at_a_fold(tmp_path):
    from trainers.forecast.walk_forward import (
        FOLD_METRICS,
        pricing_mismatch,
        refuse_walk_forward_folder,
        walk_forward_markdown,
    )
    from trainers.ops.package import package_files

    rows = [{"fold": 0, "cost_bps": 10.0, "top_k": None}, {"fold": 1, "cost_bps": 50.0, "top_k": None}]
    why = pricing_mismatch(rows)
    assert "fold 0: 10 bp" in why and "fold 1: 50 bp" in why and pricing_mismatch(rows[:1]) is None
    wf = {"folds": 2, "completed": 2, "stopped": None, "skill_folds": 0, "mean_std": None, "pricing_mismatch": why,
          "per_fold": [{**r, "anchor_dates": None, "verdict": "no skill detected",
                        **{n: None for n in FOLD_METRICS}}
                       for r in rows]}
    text = walk_forward_markdown({"walk_forward": wf, "data": {}})
    assert "No mean across folds" in text and "50 bp" in text and "mean +- std" not in text
    with pytest.raises(UsageError, match="walk-forward of 3 folds.*fold_2"):
        refuse_walk_forward_folder(tmp_path, ForecastConfig(walk_forward=3), "evaluate")
    refuse_walk_forward_folder(tmp_path, ForecastConfig(walk_forward=3, fold=1), "evaluate")  # a fold is a run
    (tmp_path / "fold_0").mkdir()
    (tmp_path / "results.json").write_text('{"walk_forward": {}}')
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="is a walk-forward"):
        package_files(tmp_path)

