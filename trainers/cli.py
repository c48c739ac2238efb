"""`trainers <trainer> <verb>` and the shared commands.

    trainers forecast train|evaluate|export      trainers gnn data|train|evaluate|export|color
    trainers fetch-sp500 | refresh-universe | preflight | package

Building the parser imports only each trainer's light `cli` module (its config dataclass and
flags); torch and the data libraries load when a verb runs, so every --help answers at once and
`trainers gnn color` runs where only NumPy and onnxruntime are installed.
Under torchrun: `torchrun ... -m trainers forecast train ...`.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from trainers.errors import CheckFailed, CheckPassed, RunEnded, RunFailed, UsageError
from trainers.registry import SHARED_COMMANDS, TRAINERS
from trainers.runtime.config import OneLineParser

FILESYSTEM_ERRORS = {
    errno.ENOSPC: "free space on that volume or point the run at a bigger one; earlier files are intact",
    errno.EDQUOT: "raise the quota or use another volume; earlier files are intact",
    errno.EACCES: "fix its permissions or pick a path you own",
    errno.EPERM: "fix its permissions or pick a path you own",
    errno.EROFS: "that volume is read-only: pick a writable path",
    errno.ENOTDIR: "a part of that path is a file, not a folder",
    errno.EISDIR: "that path is a folder where a file is needed",
    errno.ENOENT: "that path does not exist (moved or deleted while running?)",
}


# The verbs that load torch and the ONNX stack (`gnn color` runs where only NumPy and onnxruntime are, `gpt size` and
# the data verbs need no model): each checks their versions first (trainers/versions.py).
TORCH_VERBS = ("train", "evaluate", "export", "sample", "serve")


def out_of_memory(exc: BaseException) -> str | None:
    """What a failed host allocation said (NumPy raises MemoryError, torch's CPU allocator a
    RuntimeError in its own words), in one line; None for any other error."""
    if isinstance(exc, MemoryError):
        return str(exc).splitlines()[0] if str(exc) else "MemoryError"
    marker = "DefaultCPUAllocator: can't allocate memory: "
    text = str(exc)
    if marker in text:
        return text.split(marker, 1)[1].split(". Error code")[0]
    return None


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
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = [x for x in extra if x != "--"]
    try:
        if args.command in TRAINERS and args.verb in TORCH_VERBS:  # before data is fetched or a step trained
            from trainers.versions import check

            check()
        return args.func(args)
    except (UsageError, CheckFailed, RunFailed, RunEnded) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if isinstance(exc, (RunEnded, UsageError)) and "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's restarts
            from trainers.runtime.dist import remember_terminal_stop  # must not train again, nor meet it 3 times more

            remember_terminal_stop(str(exc))
        return exc.exit_code
    except CheckPassed as exc:
        print(f"check passed: {exc}", file=sys.stderr)
        return 0
    except (MemoryError, RuntimeError) as exc:
        detail = out_of_memory(exc)
        if detail is None:
            raise
        # Sizes each within their bounds can still ask for more than this machine holds (--batch-size
        # 2**31 - 1, --hidden 10**6): the allocation fails at once, before anything is written.
        print(f"error: not enough memory for what the options ask ({detail}); use smaller sizes (batch, model "
              f"width or depth, counts)", file=sys.stderr)
        return UsageError.exit_code
    except BrokenPipeError:  # `trainers status --json | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if exc.errno not in FILESYSTEM_ERRORS:
            raise
        # A place the user pointed us at: one line naming it and the fix (what was written stays).
        where = f" {exc.filename}" if exc.filename else ""
        print(f"error: cannot use{where}: {exc.strerror}; {FILESYSTEM_ERRORS[exc.errno]}", file=sys.stderr)
        return UsageError.exit_code


def run() -> None:
    """The `trainers` command and `python -m trainers` (what torchrun starts): main, then the process ends
    without the interpreter's teardown once torch is loaded (runtime/leave.py says why)."""
    from trainers.runtime.leave import leave

    leave(main())


if __name__ == "__main__":
    run()
