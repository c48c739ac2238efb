"""Puts a whole process under the fake accelerator (fake_accelerator.py) when TRAINERS_FAKE_ACCELERATOR=1.

Python imports `sitecustomize` at start-up from its path; the tests put this folder on PYTHONPATH of the
processes they start (torchrun's workers inherit it). Nothing is imported until the process imports
torch itself (a shell helper that only reads JSON stays fast): the fake is switched on right after.
"""

import os
import sys

from after_import import when_imported

DEFERRED = False  # a process that imported fake_accelerator itself first: it activates when that import ends


def _activate(_torch):
    global DEFERRED
    module = sys.modules.get("fake_accelerator")
    if module is not None and getattr(module.__spec__, "_initializing", False):
        DEFERRED = True
        return
    from fake_accelerator import activate_for_process

    activate_for_process()


if os.environ.get("TRAINERS_FAKE_ACCELERATOR") == "1" and "torch" not in sys.modules:
    when_imported("torch", _activate)
