"""Benchmark: cached parquet (500 tickers x 25 years, synthetic stand-in) -> training tensors.

    python bench/data_pipeline.py [--tickers 500] [--days 6300] [--out bench/results/data_pipeline.json]

Stages timed separately: reading the cache into the long table, validation, pivot to the panel,
features + splits + window store. Writes a JSON record with the machine, versions and command.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

from trainers.forecast.data import build_store  # noqa: E402
from trainers.market.fetch import PriceCache, fill_cache  # noqa: E402
from trainers.market.panel import to_panel  # noqa: E402
from trainers.market.synthetic import synthetic_market  # noqa: E402
from trainers.market.validate import validate_long_table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tickers", type=int, default=500)
    parser.add_argument("--days", type=int, default=6300)
    parser.add_argument("--window", type=int, default=120)
    parser.add_argument("--horizon", type=int, default=20)
    parser.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cache = PriceCache(Path(tmp))
        fill_cache(synthetic_market(args.tickers, args.days, seed=0), cache, "synthetic", 252)
        size = sum(p.stat().st_size for p in cache.prices.iterdir())
        t = {}
        t0 = time.perf_counter()
        frame = cache.read()
        t["read_cache_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        frame, _ = validate_long_table(frame, 252)
        t["validate_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        panel = to_panel(frame)
        t["pivot_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        store = build_store(panel, args.window, args.horizon)
        t["features_splits_store_s"] = time.perf_counter() - t0
    total = sum(t.values())
    record = {
        "benchmark": "data_pipeline", "tickers": args.tickers, "days": args.days, "rows": int(len(frame)),
        "cache_bytes": size, "samples": store.stats, "seconds": {k: round(v, 3) for k, v in t.items()},
        "total_s": round(total, 3),
    }
    write_record(record, args.out)
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
