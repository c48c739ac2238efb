"""Regenerate trainers/market/sp500.csv from the `index-constitution` package (MIT licence).

    pip install index-constitution && python tools/build_sp500_universe.py

That package embeds the current S&P 500 members with the date each joined. We convert symbols to
yfinance spelling (class shares use '-': BRK.B -> BRK-B) and record the snapshot date (the newest
join date in the data). It carries no GICS sectors, so `gics_sector` is left empty here;
`trainers refresh-universe` fills it from the live constituents table when online.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainers.market.symbols import to_yfinance_symbol  # noqa: E402
from trainers.market.universe import UNIVERSE_COLUMNS, validate_universe  # noqa: E402


def main() -> int:
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
