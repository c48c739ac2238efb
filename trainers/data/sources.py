"""Market data sources behind one call: a `--source` spec in, a long table out."""

from __future__ import annotations

import pandas as pd

from trainers.data.synthetic import synthetic_market
from trainers.errors import UsageError

SOURCES = ("synthetic",)


def load_source(source: str, *, synthetic_tickers: int, synthetic_days: int, seed: int,
                synthetic_momentum: float = 0.03) -> pd.DataFrame:
    """The long table for `source`; `frame.attrs['source']` says where it came from."""
    if source == "synthetic":
        return synthetic_market(n_tickers=synthetic_tickers, n_days=synthetic_days, seed=seed,
                                momentum=synthetic_momentum)
    raise UsageError(f"--source {source!r} is not one of: {', '.join(SOURCES)}")
