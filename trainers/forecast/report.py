"""report.md and its pictures in the run folder (rank 0, after the evaluation):

    loss.png      training and validation loss by step (metrics.jsonl)
    ic.png        cumulative Rank IC by date on validation and test: the model, ridge, LightGBM
                  and their ensemble
    equity.png    test equity of the long-short and long-only portfolios, net of costs, beside
                  equal-weight (and ridge's long-short)
    deciles.png   test mean forward return by forecast decile: the model and ridge

report.md holds the tables (every number also in results.json) and links the pictures. Without
matplotlib the report says so in one line and keeps its tables.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from trainers.runtime.written import write_result

PICTURES = ("loss.png", "ic.png", "equity.png", "deciles.png")
SPLITS = ("val", "test")


PREDICTORS = ("model", "ridge", "lightgbm", "persistence", "ensemble")


def table_rows(e: dict) -> list[tuple[str, dict]]:
    """(name, metrics) of the model and every baseline that forecasts, in table order."""
    rows = [("model", e["model"])]
    rows += [(name, e["baselines"][name]) for name in PREDICTORS[1:] if name in e["baselines"]]
    return rows


def _pct(value, spec: str = "+.2%") -> str:
    return "n/a" if value is None else format(value, spec)


def _num(value, spec: str = "+.4f") -> str:
    return "n/a" if value is None else format(value, spec)


def signal_table(e: dict) -> list[str]:
    lines = ["| forecast | IC | Rank IC | Rank IC std | Rank ICIR | t | t (Newey-West) | days > 0 | "
             "long-short a year | L/S Sharpe | L/S max drawdown | L/S turnover | long-only a year | L/O Sharpe |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in table_rows(e):
        if "skipped" in m:
            lines.append(f"| {name} | {m['skipped']} |" + " |" * 12)
            continue
        r, ls, lo = m["rank_ic"], m["long_short"], m["long_only"]
        lines.append(f"| {name} | {_num(m['ic']['mean'])} | {_num(r['mean'])} | {_num(r['std'], '.4f')} | "
                     f"{_num(r['icir'], '+.3f')} | {_num(r['t'], '+.2f')} | {_num(r['t_nw'], '+.2f')} | "
                     f"{_pct(r['positive_share'], '.0%')} | {_pct(ls['ann_return'])} | {_num(ls['sharpe'], '+.2f')} | "
                     f"{_pct(ls['max_drawdown'], '.1%')} | {_num(ls['turnover'], '.2f')} | "
                     f"{_pct(lo['ann_return'])} | {_num(lo['sharpe'], '+.2f')} |")
    ew = e["equal_weight"]
    lines.append(f"| equal-weight (all names) | | | | | | | | | | | | {_pct(ew['ann_return'])} | "
                 f"{_num(ew['sharpe'], '+.2f')} |")
    return lines


def comparison_lines(e: dict, members: list[str] | None) -> list[str]:
    """The model's Rank IC minus each other forecast's, per date (paired), with its Newey-West
    standard error: "ahead" means more than one standard error ahead."""
    diffs = e.get("model_minus_rank_ic") or {}
    if not diffs:
        return []
    parts = [f"{name} {_num(d['mean'])} (se {_num(d['se_nw'], '.4f')})" for name, d in diffs.items()]
    ensemble = (f" The ensemble is the equal-weight average of the within-date ranks of: {', '.join(members)}; "
                f"it is a row of this report, the exported model is the Transformer alone." if members else "")
    return [f"Model's Rank IC minus, date by date: {'; '.join(parts)}.{ensemble}", ""]


def label_table(e: dict) -> list[str]:
    b = e["baselines"]
    lines = ["| | MSE (label units) | directional accuracy |", "|---|---|---|",
             f"| model | {e['model']['mse']:.4e} | {e['model']['directional_accuracy']:.4f} |"]
    for name in ("ridge", "lightgbm", "persistence"):
        if name in b and "skipped" not in b[name]:
            lines.append(f"| {name} | {b[name]['mse']:.4e} | {b[name]['directional_accuracy']:.4f} |")
    lines += [f"| always up | | {b['always_up']['directional_accuracy']:.4f} |",
              f"| zero | {b['zero_return']['mse']:.4e} | |", f"| train mean | {b['train_mean']['mse']:.4e} | |"]
    return lines


def _held(e: dict) -> str:
    """How many names a side were really held on the test split, when --top-k asked for more than
    half the names of a date (the cap) or when it varied."""
    held = (((e.get("test") or {}).get("model") or {}).get("long_short") or {}).get("names_held")
    if not held or (e.get("top_k") is not None and held["min"] == held["max"] == e["top_k"]):
        return ""
    span = f"{held['min']}" if held["min"] == held["max"] else f"{held['min']}-{held['max']}"
    capped = "; capped at half the names on a date" if e.get("top_k") and held["max"] < e["top_k"] else ""
    return f" (held {span} a side on test{capped})"


def markdown(results: dict, pictures: str | None) -> str:
    e = results["evaluation"]
    data = results.get("data", {})
    cfg = results.get("config", {})
    synthetic = " (SYNTHETIC market: not real prices)" if data.get("synthetic") else ""
    out = [f"# Forecaster report{synthetic}", "",
           f"Data: {data.get('source', '?')}{synthetic}; {data.get('n_tickers', '?')} tickers x "
           f"{data.get('n_dates', '?')} dates; label: {e.get('label')}; horizon {cfg.get('horizon')} days; "
           f"features {', '.join(data.get('features', []))}"
           + "".join(f"; {f} left out ({why})" for f, why in data.get("features_left_out", {}).items()) + ".",
           f"Checkpoint step {e.get('checkpoint_step')}; portfolios: top/bottom "
           f"{e.get('top_k') or 'a fifth of the names'}{_held(e)}, rebalanced every {cfg.get('horizon')} days, "
           f"{e.get('cost_bps'):g} bp per unit traded.", ""]
    universe = data.get("universe") or {}
    if universe.get("name") == "sp500-pit":
        out += [f"Universe sp500-pit: {universe['members']} members over these dates; the prices used cover "
                f"{_pct(universe['covered_share'], '.1%')} of index-days ({len(universe['missing'])} members lack "
                f"prices: the survivorship that remains).", ""]
    for split in SPLITS:
        s = e[split]
        dates = data.get("anchor_dates", {}).get(split, ["?", "?"])
        out += [f"## {split}: {dates[0]} .. {dates[1]} ({s['rows']} rows, {s['dates']} dates)", "",
                f"**{s['verdict']}**: {s['verdict_reason']}.", "", *signal_table(s), "",
                *comparison_lines(s, e.get("ensemble_members")), *label_table(s), ""]
    if pictures:
        out += ["## Pictures", "", pictures, ""]
    else:
        out += ["## Pictures", "", "![loss](loss.png)", "", "![cumulative Rank IC](ic.png)", "",
                "![equity](equity.png)", "", "![deciles](deciles.png)", ""]
    out += ["Definitions: IC and Rank IC are the Pearson and Spearman correlations across tickers of the forecast "
            "with the realised forward log return, per date; t = mean / std x sqrt(dates); the Newey-West t allows "
            "for the overlap of consecutive dates' forward returns (horizon - 1 lags) and is the one the verdict "
            "uses (skill: > 2 with a long-short return above 0 after costs). Portfolio returns are per year "
            "(252 trading days), net of costs; turnover is the notional traded per rebalance.", ""]
    return "\n".join(out)


def _read_losses(run_dir: Path) -> tuple[list, list]:
    train, val = [], []
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                m = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill: the rest still plots
            if m.get("kind") == "train" and isinstance(m.get("loss"), (int, float)):
                train.append((m["step"], m["loss"]))
            elif m.get("kind") == "val" and isinstance(m.get("loss"), (int, float)):
                val.append((m["step"], m["loss"]))
    return sorted(train), sorted(val)


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:  # an empty split draws no line: no empty legend box either
        ax.legend()


def draw(run_dir: Path, results: dict, series: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    synthetic = " (synthetic market)" if results.get("data", {}).get("synthetic") else ""
    dates = pd.to_datetime(pd.Series(series["dates"]))

    fig, ax = plt.subplots(figsize=(7, 4))
    train, val = _read_losses(run_dir)
    if train:
        ax.plot(*zip(*train), label="train (window mean)")
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.set(xlabel="optimizer step", ylabel="MSE, standardised label", title=f"Loss{synthetic}")
    _legend(ax)
    fig.tight_layout()
    write_result(run_dir / "loss.png", lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)

    fig, axes = plt.subplots(1, len(SPLITS), figsize=(11, 4))
    for ax, split in zip(axes, SPLITS):
        for name in ("model", "ridge", "lightgbm", "ensemble"):
            got = series[split].get(name)
            if got is not None and len(got["rank_ic"]):
                ric = got["rank_ic"]
                ax.plot(dates.iloc[ric.index.to_numpy()], np.cumsum(ric.to_numpy()), label=name)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(title=f"{split}: cumulative Rank IC{synthetic}", ylabel="sum of daily Rank IC")
        _legend(ax)
        ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    write_result(run_dir / "ic.png", lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    test = series["test"]
    lines = [("model", "long_short", "model long-short"), ("model", "long_only", "model long-only"),
             ("ridge", "long_short", "ridge long-short"), ("equal_weight", "equal_weight", "equal-weight")]
    for name, book, label in lines:
        curve = test.get(name, {}).get("curves", {}).get(book)
        if curve and curve["dates"]:
            when = dates.iloc[np.minimum(curve["dates"], len(dates) - 1)]
            ax.plot(when, curve["equity"], label=label, ls="--" if name == "ridge" else "-")
    ax.axhline(1, color="grey", lw=0.5)
    ax.set(title=f"test: equity net of costs{synthetic}", ylabel="growth of 1")
    _legend(ax)
    ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    write_result(run_dir / "equity.png", lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    e = results["evaluation"]["test"]
    width = 0.4
    for i, (name, m) in enumerate([("model", e["model"]), ("ridge", e["baselines"].get("ridge", {}))]):
        deciles = m.get("decile_returns")
        if deciles:
            x = np.arange(1, len(deciles) + 1) + (i - 0.5) * width
            ax.bar(x, [np.nan if d is None else 100 * d for d in deciles], width, label=name)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(xlabel="forecast decile (1 = lowest)", ylabel="mean forward return, %",
           title=f"test: forward return by forecast decile{synthetic}")
    _legend(ax)
    fig.tight_layout()
    write_result(run_dir / "deciles.png", lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)


def write_report(run_dir: Path, results: dict, series: dict, log: logging.Logger | None = None) -> None:
    """The pictures (when matplotlib is there) and report.md; `log`: the run's (its training.log hears why a
    picture is missing)."""
    run_dir = Path(run_dir)
    note = None
    if importlib.util.find_spec("matplotlib") is None:
        note = "No pictures: matplotlib is not installed (`pip install matplotlib`)."
    else:
        try:
            draw(run_dir, results, series)
        except Exception as exc:  # noqa: BLE001 - a picture must never cost the run its tables and metrics
            first = (str(exc).splitlines() or [""])[0]
            note = f"No pictures: drawing them failed ({type(exc).__name__}: {first}); the tables below are complete."
            (log or logging.getLogger("trainers")).warning("report: %s", note)
    text = markdown(results, note)
    write_result(run_dir / "report.md", lambda f: f.write(text), mode="w")
