"""`trainers <trainer> <verb>` and the shared commands.

    trainers forecast train|evaluate|export      trainers gnn data|train|export|color
    trainers fetch-sp500 | refresh-universe | preflight | package

Building the parser imports only each trainer's light `cli` module (its config dataclass and
flags); torch and the data libraries load when a verb runs, so every --help answers at once and
`trainers gnn color` runs where only NumPy and onnxruntime are installed.
Under torchrun: `torchrun ... -m trainers forecast train ...`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from trainers.errors import CheckFailed, CheckPassed, UsageError
from trainers.registry import SHARED_COMMANDS, TRAINERS
from trainers.runtime.config import OneLineParser


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="trainers", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    listing = []
    for name, package in TRAINERS.items():
        module = importlib.import_module(f"{package}.cli")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        verbs = p.add_subparsers(dest="verb", required=True, metavar="verb")
        module.add_verbs(verbs)
        listing.append(f"  {name:<18} {'|'.join(verbs.choices)}")
    for module in SHARED_COMMANDS:
        importlib.import_module(module).add_commands(sub)
    shared = [name for name in sub.choices if name not in TRAINERS]
    parser.epilog = ("trainers and their verbs (`trainers <trainer> <verb> --help`):\n" + "\n".join(listing) +
                     "\nshared commands: " + ", ".join(shared))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, CheckFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except CheckPassed as exc:
        print(f"check passed: {exc}", file=sys.stderr)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
