"""Run code right after a module is executed, before anyone can use it (no torch import here: the
sitecustomize that uses it runs in every Python process the tests start)."""

import importlib.abc
import importlib.util
import sys


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` once the module `name` has been executed."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec


def when_imported(name, then) -> None:
    """`then(module)` now if `name` is imported already, else right after it is."""
    module = sys.modules.get(name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        then(module)
    else:
        sys.meta_path.insert(0, AfterImport(name, then))
