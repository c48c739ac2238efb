"""`--walk-forward K`: K expanding-window folds, one complete run each, then the table across folds.

    <run-dir>/config.json        the walk-forward's config (a resume must match it)
    <run-dir>/fold_<k>/          fold k's own run: config (with --fold k), checkpoints, results, report
    <run-dir>/results.json       per-fold test metrics and their mean +- std
    <run-dir>/report.md          the same as a table, linking each fold's report

The design rests on the run boundary: each fold is a `Run` in its own folder, so resuming works
fold by fold with nothing new. A restart (torchrun's, or the user's) walks the folds again: a
fold whose results hold a finished evaluation is skipped; the first one that is not resumes from
its own newest checkpoint. The market is loaded once and split per fold (trainers.market.windows.
plan_walk_forward; each fold renormalises with its own training rows). A budget (--max-hours,
--budget-usd) covers all folds: each fold gets what earlier folds left. A signal or budget stop in
a fold ends the walk there, with the folds so far in results.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from trainers.errors import UsageError
from trainers.forecast.config import ForecastConfig, refuse_legacy_resume
from trainers.forecast.data import pin_dates, resolve, split_plan
from trainers.runtime import config as cfgmod
from trainers.runtime.dist import DistContext, broadcast_object
from trainers.runtime.files import atomic_write_json
from trainers.runtime.logs import get_logger
from trainers.runtime.remote_pull import restore_from_remote
from trainers.runtime.results import merge_results, read_results, run_record
from trainers.runtime.rundir import exclusive
from trainers.runtime.stops import StopReason
from trainers.runtime.written import write_result

FINISHED = ("completed", "early_stop")
# name -> path into a fold's test evaluation
FOLD_METRICS = {
    "model_ic": ("model", "ic", "mean"),
    "model_rank_ic": ("model", "rank_ic", "mean"),
    "model_rank_icir": ("model", "rank_ic", "icir"),
    "model_rank_ic_t_nw": ("model", "rank_ic", "t_nw"),
    "model_long_short_ann_return": ("model", "long_short", "ann_return"),
    "model_long_short_sharpe": ("model", "long_short", "sharpe"),
    "model_long_only_ann_return": ("model", "long_only", "ann_return"),
    "ridge_rank_ic": ("baselines", "ridge", "rank_ic", "mean"),
    "ridge_long_short_ann_return": ("baselines", "ridge", "long_short", "ann_return"),
    "lightgbm_rank_ic": ("baselines", "lightgbm", "rank_ic", "mean"),
    "lightgbm_long_short_ann_return": ("baselines", "lightgbm", "long_short", "ann_return"),
    "persistence_rank_ic": ("baselines", "persistence", "rank_ic", "mean"),
    "ensemble_rank_ic": ("baselines", "ensemble", "rank_ic", "mean"),
    "ensemble_long_short_ann_return": ("baselines", "ensemble", "long_short", "ann_return"),
    "model_minus_ridge_rank_ic": ("model_minus_rank_ic", "ridge", "mean"),
    "equal_weight_ann_return": ("equal_weight", "ann_return"),
}


def fold_dir(run_dir: Path, k: int) -> Path:
    return Path(run_dir) / f"fold_{k}"


def refuse_walk_forward_folder(run_dir: Path, cfg: ForecastConfig, verb: str) -> None:
    """evaluate and export work on one model: a walk-forward's top folder holds K of them."""
    if cfg.walk_forward and cfg.fold is None:
        raise UsageError(f"--run-dir {run_dir} is a walk-forward of {cfg.walk_forward} folds, each its own run: "
                         f"{verb} one of them, e.g. --run-dir {fold_dir(run_dir, cfg.walk_forward - 1)}")


def fold_finished(results: dict) -> bool:
    return (results.get("training", {}).get("stop_reason") in FINISHED
            and isinstance(results.get("evaluation"), dict) and "test" in results["evaluation"])


def _dig(d: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def fold_row(k: int, results: dict) -> dict:
    evaluation = results["evaluation"]
    test = evaluation["test"]
    return {"fold": k, "anchor_dates": results.get("data", {}).get("anchor_dates"),
            "cost_bps": evaluation.get("cost_bps"), "top_k": evaluation.get("top_k"),
            "verdict": test["verdict"], **{name: _dig(test, path) for name, path in FOLD_METRICS.items()}}


def pricing_mismatch(rows: list[dict]) -> str | None:
    """Folds whose portfolios were priced with different costs or sizes (a fold evaluated again with
    other --cost-bps/--top-k, or a walk resumed with them) cannot be averaged: say which."""
    priced = {(r["cost_bps"], r["top_k"]) for r in rows}
    if len(priced) <= 1:
        return None
    return ("folds priced differently (" + ", ".join(f"fold {r['fold']}: {_fmt(r['cost_bps'], 'g')} bp, top-k "
                                                     f"{r['top_k'] if r['top_k'] is not None else 'default'}"
                                                     for r in rows)
            + "): no mean across folds; run `trainers forecast evaluate --run-dir <run>/fold_<k> --cost-bps X "
              "--top-k N` on the odd ones, then this command again")


def summarise(rows: list[dict]) -> dict:
    """Mean and standard deviation (ddof 1; None for one fold) of every fold metric."""
    out = {}
    for name in FOLD_METRICS:
        values = np.array([r[name] for r in rows if r[name] is not None], dtype=np.float64)
        out[name] = {"mean": float(values.mean()) if len(values) else None,
                     "std": float(values.std(ddof=1)) if len(values) > 1 else None, "folds": int(len(values))}
    return out


def remaining_budget(cfg: ForecastConfig, spent_s: float, spent_usd: float) -> tuple[float | None, float | None]:
    hours = None if cfg.max_hours is None else cfg.max_hours - spent_s / 3600.0
    usd = None if cfg.budget_usd is None else cfg.budget_usd - spent_usd
    return hours, usd


def check_fold_folder(fold_cfg: ForecastConfig, ctx: DistContext) -> None:
    """Collective: a fold's folder holds that fold's run or none (a check: the job's settled config is not settled
    again), its record shared with every node first (restore_from_remote: a run folder apart on each node)."""
    folder = Path(fold_cfg.run_dir)
    restore_from_remote(fold_cfg.remote, folder, ctx, fold_cfg, pin_dates)  # (no --remote with folds: shared only)
    refuse_legacy_resume(folder, cfgmod.saved_config(folder))
    cfgmod.check_run_dir_compatible(folder, fold_cfg)


def walk_forward(cfg: ForecastConfig, ctx: DistContext, started_at: float, train_one: Callable) -> dict | None:
    """K folds, each trained by `train_one(fold_cfg, ctx, started_at, market=...)` -> (results, stop
    reason): the plain run's loop (trainers.forecast.train), handed in so this module never imports it."""
    run_dir = Path(cfg.run_dir)
    cfg, market = resolve(cfg, run_dir, log=print if ctx.is_main else (lambda _msg: None))  # settled once, here
    split_plan(cfg, len(market.arrays.dates))  # every fold fits the data, or one line before anything is written
    with exclusive(run_dir, ctx):  # one walk-forward job per folder; each fold also locks its own
        if ctx.is_main and not (run_dir / "config.json").exists():
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(run_dir / "config.json", cfgmod.to_dict(cfg))
        rows, stopped = [], None
        spent_s = spent_usd = 0.0
        for k in range(cfg.walk_forward):
            previous = read_results(fold_dir(run_dir, k)) if ctx.is_main else None
            previous = broadcast_object(ctx, previous if previous and fold_finished(previous) else None)
            if previous is not None:
                if ctx.is_main:
                    print(f"walk-forward: fold {k} finished earlier ({fold_dir(run_dir, k)}); skipped")
            else:
                hours, usd = remaining_budget(cfg, spent_s, spent_usd)
                if (hours is not None and hours <= 0) or (usd is not None and usd <= 0):
                    stopped = f"the budget was spent before fold {k}"
                    break
                fold_cfg = cfg.replaced(run_dir=str(fold_dir(run_dir, k)), fold=k, max_hours=hours, budget_usd=usd)
                check_fold_folder(fold_cfg, ctx)
                previous, reason = train_one(fold_cfg, ctx, time.time(), market=market)
                if reason not in (StopReason.COMPLETED, StopReason.EARLY_STOP):
                    stopped = f"fold {k} stopped: {reason.name.lower()}"
            if ctx.is_main and previous is not None and "evaluation" in previous and "test" in previous["evaluation"]:
                rows.append(fold_row(k, previous))
            training = (previous or {}).get("training", {})
            spent = (training.get("elapsed_s_all_attempts") or 0.0, training.get("cost_usd") or 0.0)
            spent = broadcast_object(ctx, spent)  # rank 0 holds the results: every rank budgets alike
            spent_s, spent_usd = spent_s + spent[0], spent_usd + spent[1]
            if stopped:
                break
        if not ctx.is_main:
            return None
        log = get_logger(ctx.rank, run_dir)
        mismatch = pricing_mismatch(rows)
        if mismatch:
            log.warning("walk-forward: %s", mismatch)
        summary = {"folds": cfg.walk_forward, "completed": len(rows), "stopped": stopped, "per_fold": rows,
                   "mean_std": None if mismatch else summarise(rows), "pricing_mismatch": mismatch,
                   "skill_folds": sum(r["verdict"] == "skill" for r in rows),
                   "elapsed_s": time.time() - started_at}
        results = merge_results(run_dir, {"trainer": "forecast", "config": cfgmod.to_dict(cfg),
                                          "data": {k: v for k, v in market.info.items() if k != "tickers"},
                                          "walk_forward": summary, "run": run_record()}, log.warning)
        text = walk_forward_markdown(results)
        write_result(run_dir / "report.md", lambda f: f.write(text), mode="w")
        for row in rows:
            log.info("walk-forward fold %d (test %s): %s; model Rank IC %s, t_nw %s; long-short %s a year",
                     row["fold"], row["anchor_dates"]["test"], row["verdict"], _fmt(row["model_rank_ic"], "+.4f"),
                     _fmt(row["model_rank_ic_t_nw"], "+.2f"), _fmt(row["model_long_short_ann_return"], "+.2%"))
        m = summary["mean_std"] or summarise([])
        log.info("walk-forward: %d/%d folds%s; model Rank IC %s +- %s, ridge %s +- %s; skill in %d fold(s); %s",
                 len(rows), cfg.walk_forward, f" ({stopped})" if stopped else "",
                 _fmt(m["model_rank_ic"]["mean"], "+.4f"), _fmt(m["model_rank_ic"]["std"], ".4f"),
                 _fmt(m["ridge_rank_ic"]["mean"], "+.4f"), _fmt(m["ridge_rank_ic"]["std"], ".4f"),
                 summary["skill_folds"], run_dir / "results.json")
        return results


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _spec(name: str) -> str:
    return "+.1%" if name.endswith("ann_return") else "+.2f" if name.endswith(("t_nw", "icir", "sharpe")) else "+.4f"


def walk_forward_markdown(results: dict) -> str:
    wf = results["walk_forward"]
    synthetic = " (SYNTHETIC market: not real prices)" if results.get("data", {}).get("synthetic") else ""
    names = list(FOLD_METRICS)
    header = "| fold | test dates | costs, top-k | verdict | " + " | ".join(n.replace("_", " ").replace("ann return", "a year")
                                                          for n in names) + " |"
    lines = [f"# Walk-forward report{synthetic}", "",
             f"{wf['completed']} of {wf['folds']} folds evaluated{'; ' + wf['stopped'] if wf['stopped'] else ''}; "
             f"skill (Newey-West t of the test Rank IC > 2 and long-short > 0 after costs) in {wf['skill_folds']}.",
             "", header, "|" + "---|" * (len(names) + 4)]
    for r in wf["per_fold"]:
        test = (r.get("anchor_dates") or {}).get("test", ["?", "?"])
        priced = f"{_fmt(r.get('cost_bps'), 'g')} bp, {r.get('top_k') or 'a fifth'}"
        lines.append(f"| [{r['fold']}](fold_{r['fold']}/report.md) | {test[0]} .. {test[1]} | {priced} | {r['verdict']} | "
                     + " | ".join(_fmt(r[n], _spec(n)) for n in names) + " |")
    ms = wf["mean_std"]
    if ms is None:
        return "\n".join(lines + ["", f"No mean across folds: {wf['pricing_mismatch']}."]) + "\n"
    lines.append("| mean +- std | | | | " + " | ".join(
        f"{_fmt(ms[n]['mean'], _spec(n))} +- {_fmt(ms[n]['std'], _spec(n).lstrip('+'))}" for n in names) + " |")
    return "\n".join(lines) + "\n"
