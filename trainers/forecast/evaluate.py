"""Evaluation: the model's forecasts beside the baselines, on exactly the same rows.

For every split: the label metrics of the past (MSE, directional accuracy against the label,
always-up, zero, train-mean, persistence), the signal (IC and Rank IC per date) and the
portfolios built on each forecast (trainers.forecast.metrics), for the model, ridge, LightGBM,
persistence and their ensemble (the rank average of the model, ridge and LightGBM: a row of the
report; what trains, exports and ships is the model alone), the equal-weight portfolio on the same
dates, the model's Rank IC minus each other forecast's with its standard error, and a verdict.
`split_report` is pure NumPy; the rest predicts with the model (sharded over ranks) and fits the
baselines on rank 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from trainers.forecast.baselines import fit_lightgbm, fit_ridge
from trainers.forecast.build import build_model, load_trained_config
from trainers.forecast.data import WindowStore, load_market, make_store
from trainers.forecast.metrics import (
    backtest,
    decile_returns,
    ic_summary,
    paired_difference,
    per_date_ic,
    rank_average,
    verdict,
)
from trainers.forecast.report import table_rows, write_report
from trainers.forecast.walk_forward import refuse_walk_forward_folder
from trainers.runtime.dist import (
    DistContext,
    all_gather_object,
    all_reduce_sum,
    barrier,
    distributed,
)
from trainers.runtime.logs import get_logger
from trainers.runtime.results import merge_results
from trainers.runtime.rundir import check_data_unchanged, exclusive, fingerprint_to_check, load_checkpoint_states

# The ensemble row: the equal-weight average of these forecasts' within-date ranks. Fixed here, before
# any number of any split was looked at; no weight is fitted, so it cannot be tuned on the test.
ENSEMBLE_MEMBERS = ("model", "ridge", "lightgbm")
# Forecasts whose scores are not in the label's units: no MSE or directional accuracy for them.
RANK_SCORES = ("ensemble",)


def forecast_metrics(date_index: np.ndarray, ticker_index: np.ndarray, pred: np.ndarray, label: np.ndarray,
                     fwd_return: np.ndarray, horizon: int, top_k: int | None, cost_bps: float,
                     label_units: bool = True) -> tuple[dict, dict]:
    """One forecast's metrics (label MSE and direction, IC, Rank IC, portfolios, deciles) and the
    per-date series the pictures need. `label_units` False: a score on another scale (a rank
    average), whose MSE and sign say nothing (None)."""
    ic = per_date_ic(date_index, pred, fwd_return)
    rank_ic = per_date_ic(date_index, pred, fwd_return, rank=True)
    books = backtest(date_index, ticker_index, pred, fwd_return, horizon, top_k, cost_bps)
    metrics = {"mse": float(np.mean((pred - label) ** 2)) if label_units else None,
               "directional_accuracy": float(np.mean((pred > 0) == (label > 0))) if label_units else None,
               "ic": ic_summary(ic.to_numpy(), horizon), "rank_ic": ic_summary(rank_ic.to_numpy(), horizon),
               **{book: {k: v for k, v in got.items() if k != "curve"} for book, got in books.items()},
               "decile_returns": decile_returns(date_index, pred, fwd_return)}
    series = {"ic": ic, "rank_ic": rank_ic, "curves": {book: got["curve"] for book, got in books.items()}}
    return metrics, series


def split_report(date_index: np.ndarray, ticker_index: np.ndarray, label: np.ndarray, fwd_return: np.ndarray,
                 predictions: dict[str, np.ndarray], skipped: dict[str, str], horizon: int, top_k: int | None,
                 cost_bps: float, train_label_mean: float) -> tuple[dict, dict]:
    """Every metric of one split. `predictions`: name -> forecast in label units, one per row (the
    model's under "model"); `skipped`: name -> why a baseline is missing. `up_rate` is the share
    of rows whose label is > 0."""
    up = label > 0
    series: dict = {}
    results = {}
    for name, pred in predictions.items():
        results[name], series[name] = forecast_metrics(date_index, ticker_index, pred, label, fwd_return, horizon,
                                                       top_k, cost_bps, label_units=name not in RANK_SCORES)
    equal = backtest(date_index, ticker_index, None, fwd_return, horizon, top_k, cost_bps)["equal_weight"]
    series["equal_weight"] = {"curves": {"equal_weight": equal.pop("curve")}}
    # the model's Rank IC minus each other forecast's, date by date, with its standard error
    model_minus = {name: paired_difference(series["model"]["rank_ic"], got["rank_ic"], horizon)
                   for name, got in series.items() if name not in ("model", "equal_weight")}
    model = results.pop("model")
    baselines = {"always_up": {"directional_accuracy": float(np.mean(up))},
                 "zero_return": {"mse": float(np.mean(label ** 2))},
                 "train_mean": {"mse": float(np.mean((label - train_label_mean) ** 2))},
                 **results, **{name: {"skipped": why} for name, why in skipped.items()}}
    word, why = verdict(model["rank_ic"], model["long_short"])
    report = {"rows": int(len(label)), "dates": int(len(np.unique(date_index))), "up_rate": float(np.mean(up)),
              "model": model, "baselines": baselines, "equal_weight": equal,
              "long_short_minus_equal_weight": _difference(model["long_short"], equal),
              "model_minus_rank_ic": model_minus,
              "verdict": word, "verdict_reason": why}
    return report, series


def _difference(a: dict, b: dict) -> float | None:
    if a.get("ann_return") is None or b.get("ann_return") is None:
        return None
    return a["ann_return"] - b["ann_return"]


@torch.no_grad()
def predict_split(model, store: WindowStore, split: str, ctx: DistContext,
                  batch_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Predictions in label units for every sample of `split`, sharded over ranks, gathered on rank 0.
    In fp32 whatever the training precision: bf16 keeps 8 bits of mantissa, and scores that round to the
    same value tie in rank (Rank IC, the top-k portfolios)."""
    model.eval()
    ids = store.sample_ids[split][ctx.rank::ctx.world_size]
    preds = []
    for start in range(0, len(ids), batch_size):
        x, _ = store.gather(ids[start:start + batch_size])
        preds.append(model.predict_return(x).float())
    local = (ids.cpu().numpy(), torch.cat(preds).cpu().numpy() if preds else np.zeros(0, np.float32))
    parts = all_gather_object(ctx, local)
    model.train()
    if not ctx.is_main:
        return None
    all_ids = np.concatenate([p[0] for p in parts])
    all_pred = np.concatenate([p[1] for p in parts])
    order = np.argsort(all_ids)
    return all_ids[order], all_pred[order]


def evaluate_splits(model, store: WindowStore, ctx: DistContext, batch_size: int, top_k: int | None,
                    cost_bps: float, splits=("val", "test"), log=None) -> tuple[dict, dict] | None:
    """Collective; (evaluation, per-date series for the report) on rank 0, None elsewhere. The
    baselines are fitted on rank 0 while the other ranks wait."""
    got = {split: predict_split(model, store, split, ctx, batch_size) for split in splits}
    if not ctx.is_main:
        return None
    ridge_info, ridge = fit_ridge(store, splits)
    lightgbm_info, lightgbm = fit_lightgbm(store, splits)
    if log is not None and "skipped" in lightgbm_info:
        log.info("%s", lightgbm_info["skipped"])
    members = [m for m in ENSEMBLE_MEMBERS if m != "lightgbm" or "skipped" not in lightgbm_info]
    evaluation: dict = {"baselines_fitted": {"ridge": ridge_info, "lightgbm": lightgbm_info},
                        "ensemble_members": members,
                        "label": store.preprocessing()["target"], "top_k": top_k, "cost_bps": cost_bps}
    series: dict = {"dates": store.dates}
    for split in splits:
        ids, pred = got[split]
        expected = store.sample_ids[split].cpu().numpy()
        assert np.array_equal(ids, expected), "model and baselines must be scored on the same rows"
        t, n = ids // store.n_tickers, ids % store.n_tickers
        label = store.target.cpu().numpy()[t, n].astype(np.float64)
        predictions = {"model": pred.astype(np.float64), "ridge": ridge[split],
                       "persistence": store.past_label[t, n]}
        skipped = {}
        if "skipped" in lightgbm_info:
            skipped["lightgbm"] = lightgbm_info["skipped"]
        else:
            predictions["lightgbm"] = lightgbm[split]
        predictions["ensemble"] = rank_average(t, [predictions[m] for m in members])
        evaluation[split], series[split] = split_report(t, n, label, store.forward_return[t, n], predictions, skipped,
                                                        store.horizon, top_k, cost_bps, store.target_mean)
    return evaluation, series


@torch.no_grad()
def validation_loss(model, store: WindowStore, ctx: DistContext, batch_size: int) -> float:
    """Mean squared error in standardised units over the whole validation split (all ranks agree), in
    fp32 like every evaluation (the metric that picks the best checkpoint)."""
    model.eval()
    ids = store.sample_ids["val"][ctx.rank::ctx.world_size]
    sse = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for start in range(0, len(ids), batch_size):
        x, y = store.gather(ids[start:start + batch_size])
        pred = model(x).float()
        sse += ((pred - (y - store.target_mean) / store.target_std) ** 2).sum()
    total_sse, count = all_reduce_sum(ctx, [float(sse), float(len(ids))])
    model.train()
    return total_sse / count


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def log_summary(log, evaluation: dict, splits=("val", "test")) -> None:
    for split in splits:
        e = evaluation[split]
        log.info("%s (%d rows, %d dates): %-11s %8s %8s %6s %6s %9s %7s %9s", split, e["rows"], e["dates"], "forecast",
                 "IC", "RankIC", "ICIR", "t_nw", "L/S ann", "Sharpe", "long ann")
        for name, m in table_rows(e):
            if "skipped" in m:
                log.info("%s   %-11s %s", split, name, m["skipped"])
                continue
            log.info("%s   %-11s %8s %8s %6s %6s %9s %7s %9s", split, name, _fmt(m["ic"]["mean"], "+.4f"),
                     _fmt(m["rank_ic"]["mean"], "+.4f"), _fmt(m["rank_ic"]["icir"], "+.2f"),
                     _fmt(m["rank_ic"]["t_nw"], "+.2f"), _fmt(m["long_short"]["ann_return"], "+.2%"),
                     _fmt(m["long_short"]["sharpe"], "+.2f"), _fmt(m["long_only"]["ann_return"], "+.2%"))
        ew = e["equal_weight"]
        log.info("%s   %-11s %42s %7s %9s", split, "equal-wt", "", _fmt(ew["sharpe"], "+.2f"),
                 _fmt(ew["ann_return"], "+.2%"))
        diffs = e.get("model_minus_rank_ic") or {}
        if diffs:
            log.info("%s: model Rank IC minus %s", split, "; ".join(
                f"{name} {_fmt(d['mean'], '+.4f')} (se {_fmt(d['se_nw'], '.4f')})" for name, d in diffs.items()))
        log.info("%s: %s: %s (after %g bp costs)", split, e["verdict"].upper(), e["verdict_reason"],
                 evaluation["cost_bps"])
        held = (e["model"].get("long_short") or {}).get("names_held")
        if evaluation.get("top_k") and held and held["max"] < evaluation["top_k"]:
            log.warning("%s: --top-k %d is more than half the names: the portfolios held %s a side", split,
                        evaluation["top_k"], held["min"] if held["min"] == held["max"] else
                        f"{held['min']}-{held['max']}")


def evaluate_run(run_dir: str, checkpoint: str = "best", device: str = "auto", top_k: int | None = None,
                 cost_bps: float | None = None) -> dict | None:
    """`trainers forecast evaluate`: re-evaluate a run's checkpoint (one process or under torchrun),
    rewriting results.json's evaluation, report.md and the pictures."""
    cfg = load_trained_config(Path(run_dir))
    refuse_walk_forward_folder(Path(run_dir), cfg, "evaluate")
    top_k = cfg.top_k if top_k is None else top_k
    cost_bps = cfg.cost_bps if cost_bps is None else cost_bps
    with distributed(device, cfg.collective_timeout_s) as ctx, exclusive(Path(run_dir), ctx):
        log = get_logger(ctx.rank, None)
        step, states = load_checkpoint_states(Path(run_dir), checkpoint, str(ctx.device))
        market = load_market(cfg, log=print if ctx.is_main else (lambda _msg: None))
        check_data_unchanged(Path(run_dir), fingerprint_to_check(Path(run_dir), market.fingerprint),
                             instead="its evaluation needs the data it trained on")
        store, _ = make_store(cfg, market)
        store.to(ctx.device)
        model = build_model(cfg).to(ctx.device)
        model.load_state_dict(states["model"])
        got = evaluate_splits(model, store, ctx, cfg.eval_batch_size, top_k, cost_bps, log=log)
        evaluation = None
        if ctx.is_main:
            evaluation, series = got
            evaluation["checkpoint_step"] = step
            log_summary(log, evaluation)
            results = merge_results(Path(run_dir), {"evaluation": evaluation}, log.warning)
            write_report(Path(run_dir), results, series, log)
        barrier(ctx)
        return evaluation
