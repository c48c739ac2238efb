"""Each trainer settles its config once, at its entry (`resolve`, issue 61): dates, features and sizes pinned, the
saved run's options checked, and from there every write raises (RunOptions.settled). The loop's Run is handed the
settled config, so a write anywhere after the entry would fail the run; the caller's own object is never the one
settled. The LSTM job's own tests: tests/lstm/test_lstm_settled.py."""

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import GPT_TINY, TINY_DATA
from trainers.cli import main
from trainers.errors import UsageError

RUNS = {
    "forecast": ["forecast", "train", *TINY_DATA, "--max-steps", "2", "--batch-size", "64"],
    "walk-forward": ["forecast", "train", *TINY_DATA, "--walk-forward", "2", "--max-steps", "1", "--batch-size", "64"],
    "gnn": ["gnn", "train", "--epochs", "1", "--nodes-per-batch", "80", "--hidden", "8", "--layers", "1",
            "--search-iters", "10"],
    "gpt": ["gpt", "train", *GPT_TINY, "--batch-tokens", "512", "--max-steps", "2"],
    "ppo": ["ppo", "train", "--synthetic-tickers", "5", "--num-stocks", "4", "--synthetic-days", "600", "--window", "8",
            "--episode-days", "20", "--rollout-steps", "16", "--hidden", "8", "--total-steps", "256",
            "--random-runs", "1", "--seeds", "1", "--no-baseline-mlp"],  # --num-envs, --batch-size: the device's
}


@pytest.mark.parametrize("trainer", RUNS)
def test_every_trainer_runs_its_loop_on_a_settled_config(trainer, tmp_path, monkeypatch):
    import trainers.runtime.run as run_mod

    seen = []
    run_init = run_mod.Run.__init__

    def spy(self, cfg, *args, **kwargs):
        with pytest.raises(dataclasses.FrozenInstanceError, match="settled at the trainer's entry"):
            cfg.seed = cfg.seed + 1
        seen.append(cfg)
        run_init(self, cfg, *args, **kwargs)
    monkeypatch.setattr(run_mod.Run, "__init__", spy)
    args = [*RUNS[trainer], "--run-dir", str(tmp_path / "run")]
    if trainer == "gnn":
        from trainers.gnn.graphs import write_dataset

        write_dataset(tmp_path / "graphs", 8, 4, seed=0, min_nodes=10, max_nodes=30, workers=1, progress=False)
        args += ["--data-dir", str(tmp_path / "graphs")]
    assert main(args) == 0
    assert seen and all(cfg.is_settled for cfg in seen), seen
    if trainer == "walk-forward":
        assert [cfg.fold for cfg in seen] == [0, 1]
    if trainer in ("forecast", "walk-forward"):  # what the settled config pinned is what each folder keeps
        for cfg in seen:
            saved = json.loads((Path(cfg.run_dir) / "config.json").read_text())
            assert cfg.features and saved["features"] == cfg.features  # (the data's columns, pinned once)
    if trainer == "ppo":
        assert seen[0].num_envs is not None and seen[0].batch_size is not None
    if trainer == "gnn":
        assert seen[0].nodes_per_batch == 80


def test_resolve_hands_back_a_settled_copy_and_refuses_another_config(tmp_path):
    from trainers.forecast.config import ForecastConfig
    from trainers.forecast.data import resolve as resolve_forecast
    from trainers.gnn.config import GnnConfig
    from trainers.gnn.train import resolve as resolve_gnn
    from trainers.ppo.config import PpoConfig
    from trainers.ppo.train import resolve as resolve_ppo

    forecast = ForecastConfig(run_dir=str(tmp_path / "f"), synthetic_tickers=8, synthetic_days=400, window=16)
    settled, market = resolve_forecast(forecast, tmp_path / "f", log=lambda _m: None)
    assert settled.is_settled and not forecast.is_settled and forecast.features is None
    assert settled.features == ",".join(market.info["features"])
    forecast.features = "ret_1d"  # (the caller's object is its own)
    ppo = PpoConfig(run_dir=str(tmp_path / "p"))
    sized = resolve_ppo(ppo, tmp_path / "p", "cpu", 1)
    assert sized.is_settled and sized.num_envs and ppo.num_envs is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        sized.num_envs = 1
    gnn = GnnConfig(run_dir=str(tmp_path / "g"))
    assert resolve_gnn(gnn, tmp_path / "g", None, 1).nodes_per_batch and gnn.nodes_per_batch is None
    assert not ppo.is_settled and not gnn.is_settled
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "config.json").write_text(json.dumps(dataclasses.asdict(sized)))
    assert resolve_ppo(PpoConfig(run_dir=str(tmp_path / "p")), tmp_path / "p", "cpu", 1) == sized  # resumed alike
    with pytest.raises(UsageError, match="different config"):
        resolve_ppo(PpoConfig(run_dir=str(tmp_path / "p"), hidden=ppo.hidden + 1), tmp_path / "p", "cpu", 1)


def test_a_walk_forward_checks_each_fold_folder_against_the_fold_it_trains(tmp_path, capsys):
    """The job settles its config once; a fold it hands on is not settled again, but its folder is still checked:
    a fold folder holding another run is refused, nothing trained into it."""
    args = [*RUNS["walk-forward"], "--run-dir", str(tmp_path / "run")]
    assert main(args) == 0
    fold = tmp_path / "run" / "fold_1"
    (fold / "results.json").unlink()  # (unfinished: the job trains it again)
    saved = json.loads((fold / "config.json").read_text())
    (fold / "config.json").write_text(json.dumps({**saved, "dropout": saved["dropout"] + 0.25}))
    before = sorted(p.name for p in fold.rglob("*"))
    capsys.readouterr()
    assert main(args) == 2
    assert "fold_1 holds a run with a different config (dropout" in capsys.readouterr().err
    assert sorted(p.name for p in fold.rglob("*")) == before
