"""How a PPO evaluation reads: the test table as markdown (results.md) and the equity curves as a PNG."""

from __future__ import annotations

import numpy as np

EQUITY_PNG = "equity_test.png"
METRICS = ("cumulative_return", "annualised_return", "annualised_vol", "sharpe", "sortino", "max_drawdown",
           "calmar", "turnover", "trades")


def _fmt(summary: dict, key: str, pct: bool) -> str:
    m = summary.get(key)
    if m is None:
        return "n/a"
    if key == "trades":
        return f"{m['mean']:.0f}" + (f" ± {m['std']:.0f}" if summary["n"] > 1 else "")
    f = (lambda x: f"{x:+.2%}") if pct else (lambda x: f"{x:.3f}")
    return f(m["mean"]) + (f" ± {f(m['std']).lstrip('+')}" if summary["n"] > 1 else "")


def markdown(evaluation: dict) -> str:
    pct = {"cumulative_return", "annualised_return", "annualised_vol", "max_drawdown", "turnover"}
    lines = [f"Test period {evaluation['test_dates'][0]} .. {evaluation['test_dates'][1]} "
             f"({evaluation['test_days']} trading days), net of {evaluation['cost_bps']:g} bp costs; "
             "mean ± std over seeds (random policy: over runs).", "",
             "| policy | n | " + " | ".join(METRICS) + " |", "|" + " --- |" * (len(METRICS) + 2)]
    for name, entry in evaluation["table"].items():
        s = entry["summary"]
        lines.append(f"| {name} | {s['n']} | " + " | ".join(_fmt(s, k, k in pct) for k in METRICS) + " |")
    lines += ["", evaluation["verdict"], ""]
    return "\n".join(lines)


def plot_equity(curves: dict, dates: list[str], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    x = np.arange(len(dates))
    for name, values in curves.items():
        style = {"lw": 0.8, "alpha": 0.7} if name.startswith("ppo") else {"lw": 1.8}
        ax.plot(x, values / values[0], label=name, **style)
    ticks = np.linspace(0, len(dates) - 1, min(6, len(dates))).astype(int)
    ax.set_xticks(ticks, [dates[i] for i in ticks])
    ax.set_ylabel("portfolio value / initial")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
