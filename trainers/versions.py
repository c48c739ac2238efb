"""The versions of torch and the ONNX stack the kit is tested with, checked before anything runs.

pyproject.toml, the Dockerfile's default base and this table state one range; CI runs the fast tiers, the compiled
paths and the demo deploys at the floor and at the newest torch it installs. A torch outside the range is refused
in one line with the pip command that fixes it, at each trainer's entry (before data is fetched or a step is
trained), in preflight and in the deploy's install phase, instead of ten minutes into a run: torch 2.4 trained a
forecaster for ten minutes, then died in export (`dynamic_shapes` needs 2.5); torch below 2.6 has no
`torch.compiler.set_stance` nor FSDP2's `fully_shard` (the GPT), and below 2.7 no `TritonMissing`.

Read from the installed distributions' metadata (importlib.metadata): nothing is imported, so the check costs
milliseconds and answers before torch's own import could fail.
"""

from __future__ import annotations

import re
from importlib import metadata

from trainers.errors import UsageError

# (distribution, lowest tested, first version not accepted, why the floor is there)
REQUIRED = (
    ("torch", (2, 7), (3,), "torch.compiler.set_stance and fully_shard (2.6), TritonMissing (2.7)"),
    ("onnx", (1, 15), None, "the exported graphs' opset"),
    ("onnxscript", (0, 2), None, "torch.onnx.export(dynamo=True) translates through it"),
    ("onnxruntime", (1, 17), None, "every export's parity check"),
)


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '2.7.1+cu128' -> (2, 7, 1); '2.8.0.dev20250101' -> (2, 8, 0)."""
    parts = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in parts.group(0).split(".")) if parts else ()


def spec(low: tuple[int, ...], high: tuple[int, ...] | None) -> str:
    text = f">={'.'.join(map(str, low))}"
    return text + (f",<{'.'.join(map(str, high))}" if high else "")


def problems(installed=None) -> list[str]:
    """One line per distribution outside its range or missing, naming the version found and the pip command."""
    installed = installed or _installed
    found = []
    for name, low, high, why in REQUIRED:
        version = installed(name)
        wanted = f"{name}{spec(low, high)}"
        if version is None:
            found.append(f"{name} is not installed; the kit needs {wanted} ({why}): pip install '{wanted}'")
            continue
        number = release(version)
        if number[:len(low)] < low or (high is not None and number[:len(high)] >= high):
            hint = " (for a GPU, the CUDA build that matches the driver)" if name == "torch" else ""
            found.append(f"{name} {version} is outside the tested range {wanted} ({why}): "
                         f"pip install --upgrade '{wanted}'{hint}")
    return found


def check() -> None:
    """A UsageError naming the first distribution outside its range, with the fix (every trainer's entry)."""
    found = problems()
    if found:
        raise UsageError(found[0] + (f"; and {len(found) - 1} more (trainers preflight lists them)"
                                     if len(found) > 1 else ""))


def installed_release(name: str, parts: int) -> str | None:
    """The installed distribution's release to `parts` numbers ('2.13' for torch 2.13.0+cpu), or None."""
    version = _installed(name)
    return None if version is None else ".".join(map(str, release(version)[:parts]))


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":  # the deploy's install phase: `python -m trainers.versions` (exit 2, a line each)
    import sys

    for line in problems():
        print(f"error: {line}", file=sys.stderr)
    sys.exit(2 if problems() else 0)
