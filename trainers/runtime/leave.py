"""How a `python -m trainers` process ends once torch is loaded: without the interpreter's teardown.

Two reasons, both measured:

- The teardown of an interpreter holding torch (and the torch._dynamo that every optimizer imports) costs about
  0.8 s of CPU a process on the development machine (`python -c "import torch, torch._dynamo, pandas"`: 3.3 s of
  user+sys, 2.5 s ending in os._exit; three runs each); a deploy starts a process per phase and per worker, CI hundreds.
- gloo's worker threads outlive destroy_process_group (a DDP wrapper, even collected, keeps the group alive
  in torch 2.13), and one still letting go of a collective's tensor once teardown has begun must take the GIL,
  which a finalizing interpreter answers by ending the thread inside a C++ destructor: std::terminate
  ("terminate called without an active exception"), SIGABRT, and torchrun fails a run that had completed.
  CI saw it after a resumed run under load; a gloo reduce that finishes during teardown does it at will.

What a normal exit does before its teardown still runs: non-daemon threads joined, the atexit handlers
(logging's flush among them), and every Python file still open flushed (teardown would have flushed them as it
freed them); a file that cannot be flushed is named and the exit status is not 0.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import io
import os
import sys
import threading
from typing import NoReturn

_BUFFERED = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)


def flush_open_files() -> list[str]:
    """Flush every open Python file object (the standard streams among them), then C's stdio (what a library
    printed through it); the files that could not be flushed, named once each. A standard stream whose reader
    has gone (`trainers ... | head`) is not a failure of ours."""
    failed = {}
    for obj in gc.get_objects():
        if type(obj) not in _BUFFERED:
            continue
        try:
            if obj.closed or not obj.writable():
                continue
        except ValueError:  # a detached wrapper: its buffer is flushed on its own
            continue
        try:
            obj.flush()
        except BrokenPipeError:
            if getattr(obj, "name", None) not in ("<stdout>", "<stderr>", 1, 2):
                failed[str(getattr(obj, "name", "?"))] = "the reader closed the pipe"
        except OSError as exc:
            failed[str(getattr(obj, "name", "?"))] = exc.strerror or str(exc)
    ctypes.CDLL(None).fflush(None)
    return [f"{name}: {why}" for name, why in failed.items()]


def leave(code: int | None) -> NoReturn:
    """End this process with `code`; without the interpreter's teardown when torch is loaded."""
    code = 0 if code is None else code
    if "torch" not in sys.modules:
        raise SystemExit(code)  # nothing heavy to tear down, no gloo thread: the ordinary way
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's first step: join non-daemon threads
    atexit._run_exitfuncs()
    failed = flush_open_files()
    if failed:
        os.write(2, f"error: could not write out {'; '.join(failed)}\n".encode())
        code = code or 1
    os._exit(code)
