"""The final report of a run: each agent's snapshot chosen on validation, run once on the test
period beside the baselines; results.md, the equity-curve PNG, and `trainers ppo evaluate`."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from trainers.ppo.config import PpoConfig
from trainers.ppo.evaluate import backtest, markdown, plot_equity, verdict
from trainers.runtime.dist import DistContext
from trainers.runtime.files import atomic_write

EQUITY_PNG = "equity_test.png"


def chosen(agent) -> tuple[torch.nn.Module, torch.nn.ModuleList | None, int | None, float | None]:
    """The agent's snapshot with the best validation score (its current weights if never validated)."""
    if agent.best is None:
        return agent.policy, agent.norms, None, None
    policy = copy.deepcopy(agent.policy)
    policy.load_state_dict(agent.best["policy"])
    norms = None
    if agent.norms is not None:
        norms = copy.deepcopy(agent.norms)
        norms.load_state_dict(agent.best["norms"])
    return policy, norms, agent.best["update"], agent.best["val_score"]


def best_main_agent(agents, cfg: PpoConfig):
    """The agent export ships: the main encoder's seed with the best validation score."""
    main = [a for a in agents.agents if a.encoder == cfg.encoder and a.best is not None]
    return max(main, key=lambda a: a.best["val_score"]) if main else agents.agents[0]


def report(agents, cfg: PpoConfig, data, market, spec, run_dir: Path, ctx: DistContext,
           checkpoint_step: int | None) -> dict | None:
    if not ctx.is_main:
        return None
    rows = []
    for a in agents.agents:
        policy, norms, update, val = chosen(a)
        if a.updates_done == 0:
            continue  # never trained (the run stopped before this agent's turn)
        rows.append({"encoder": a.encoder, "seed": a.seed, "policy": policy, "norms": norms, "selected_update": update,
                     "val_score": val})
    result = backtest(rows, market, spec, data.splits, data.close, cfg.random_runs, cfg.seed)
    test = data.splits["test"]
    main = f"ppo_{cfg.encoder}"
    evaluation = {"checkpoint_step": checkpoint_step, "test_dates": [data.dates[test[0]], data.dates[test[1]]],
                  "test_days": test[1] - test[0], "cost_bps": cfg.cost_bps, "action": cfg.action,
                  "selection": f"per seed, the update with the best validation {cfg.select_by} (deterministic policy)",
                  "table": result["table"], "verdict": verdict(result["table"], main),
                  "untrained_agents": [f"{a.encoder}/seed{a.seed}" for a in agents.agents if a.updates_done == 0]}
    (run_dir / "results.md").write_text(markdown(evaluation))
    dates = data.dates[test[0]:test[1] + 1]
    png = run_dir / EQUITY_PNG
    atomic_write(png, lambda f: plot_equity(result["curves"], dates, f, f"test period, net of {cfg.cost_bps:g} bp"))
    evaluation["equity_curve_png"] = EQUITY_PNG
    print(evaluation["verdict"])
    return evaluation


def evaluate_run(run_dir: str, checkpoint: str = "latest", device: str = "cpu") -> dict:
    """Rebuild the run's data and agents from a checkpoint and write the report again."""
    from trainers.ppo.data import env_spec, load_trading_data
    from trainers.ppo.env import Market
    from trainers.ppo.train import AgentSet
    from trainers.runtime.results import merge_results
    from trainers.runtime.rundir import load_checkpoint_states, load_run_config, single_process_context

    run_path = Path(run_dir)
    cfg = load_run_config(run_path, PpoConfig)
    step, states = load_checkpoint_states(run_path, checkpoint, device)
    ctx = single_process_context(device)
    data, _info = load_trading_data(cfg, log=lambda _m: None)
    market = Market(data.close, data.features, ctx.device)
    agents = AgentSet(cfg, data.n_stocks, ctx.device)
    agents.load_state_dict(states["agents"])
    evaluation = report(agents, cfg, data, market, env_spec(cfg), run_path, ctx, step)
    merge_results(run_path, {"evaluation": evaluation})
    return evaluation
