"""Regenerate trainers/market/sp500.csv and sp500_history.csv from the `index-constitution`
package (MIT licence).

    pip install index-constitution && python tools/build_sp500_universe.py

That package embeds the current S&P 500 members with the date each joined, and the membership
history (joined, left). We convert symbols to yfinance spelling (class shares use '-': BRK.B ->
BRK-B) and record the snapshot date (the newest date in the data). It carries no GICS sectors, so
`gics_sector` is left empty here; `trainers refresh-universe` fills it from the live constituents
table when online.

sp500_history.csv (symbol, name, added, removed, snapshot_date; `removed` empty for a current
member) is what `--universe sp500-pit` reads: shipped as a data file, so training needs neither
the package nor a network, and a change of the history shows up as a reviewable diff.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainers.market.pit import HISTORY_COLUMNS, validate_history  # noqa: E402
from trainers.market.symbols import to_yfinance_symbol  # noqa: E402
from trainers.market.universe import UNIVERSE_COLUMNS, validate_universe  # noqa: E402


def main() -> int:
    from importlib import metadata

    import index_constitution

    latest = index_constitution.latest("sp500")
    snapshot = pd.Timestamp(latest["opt-in"].max()).strftime("%Y-%m-%d")
    frame = pd.DataFrame({
        "symbol": latest["symbol"].map(to_yfinance_symbol),
        "name": latest["name"],
        "gics_sector": "",
        "added": pd.to_datetime(latest["opt-in"]).dt.strftime("%Y-%m-%d"),
        "snapshot_date": snapshot,
    })[list(UNIVERSE_COLUMNS)].sort_values("symbol")
    validate_universe(frame, "index-constitution")
    out = Path(__file__).resolve().parents[1] / "trainers" / "market" / "sp500.csv"
    frame.to_csv(out, index=False)
    print(f"wrote {len(frame)} symbols, snapshot {snapshot}, to {out}")

    history = index_constitution.history("sp500")
    last = max(pd.Timestamp(history["opt-in"].max()), pd.Timestamp(history["opt-out"].max()))
    removed = pd.to_datetime(history["opt-out"])
    past = pd.DataFrame({
        "symbol": history["symbol"].map(to_yfinance_symbol),
        "name": history["name"],
        "added": pd.to_datetime(history["opt-in"]).dt.strftime("%Y-%m-%d"),
        "removed": removed.dt.strftime("%Y-%m-%d").where(removed.notna(), ""),
        "snapshot_date": last.strftime("%Y-%m-%d"),
    })[list(HISTORY_COLUMNS)].sort_values(["symbol", "added"])
    validate_history(past, "index-constitution history")
    out = out.with_name("sp500_history.csv")
    past.to_csv(out, index=False)
    print(f"wrote {len(past)} membership spells of {past['symbol'].nunique()} symbols, snapshot "
          f"{last:%Y-%m-%d}, to {out} (index-constitution {metadata.version('index-constitution')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
