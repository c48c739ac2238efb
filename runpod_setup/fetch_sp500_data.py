"""Thin wrapper kept for the RunPod guide: same as `python -m trainers fetch-sp500 ...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(["fetch-sp500", *sys.argv[1:]]))
