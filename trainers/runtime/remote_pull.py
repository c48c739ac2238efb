"""A run resumed from its remote on a fresh machine (`--remote`; the mirror is trainers.runtime.remote).

When the local folder holds no run and the remote does, every file but the checkpoints is copied down,
then the newest checkpoint whose files all match its meta's SHA-256 (and the best one, when older), data
first and meta last; the run then resumes from the local copy under the usual checks (config, data
fingerprint, hashes). A remote checkpoint that fails its check is passed over for the one before it.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainers.errors import UsageError
from trainers.runtime.files import atomic_write
from trainers.runtime.remote import LEASE, META_RE, open_remote, redact, sha256_bytes


def holds_a_run(run_dir: Path) -> bool:
    return (run_dir / "config.json").exists() or any((run_dir / "checkpoints").glob("meta_*.json")) or \
        any(run_dir.glob("symbols/*/config.json"))


def pull_run(url: str, run_dir: Path, log=print) -> str | None:
    """Copy a remote run into an empty local folder (module docstring); what was pulled, in words, or None
    when the remote holds no run."""
    fs, root = open_remote(url)
    if not fs.exists(f"{root}/config.json"):
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    names = [p[len(root) + 1:] for p in fs.find(root)]
    plain = [n for n in names if n.rsplit("/", 1)[-1] != LEASE and "checkpoints/" not in n]
    for name in plain:
        _write(run_dir / name, fs.cat_file(f"{root}/{name}"))
    pulled = []
    for folder in sorted({n.rsplit("checkpoints/", 1)[0] for n in names if "checkpoints/" in n}):
        step = _pull_checkpoints(fs, f"{root}/{folder}checkpoints", run_dir / folder / "checkpoints", log)
        pulled.append(f"{folder or './'} step {step}" if step is not None else f"{folder or './'} no usable checkpoint")
    return f"{len(plain)} files and checkpoints ({'; '.join(pulled) or 'none'})"


def _pull_checkpoints(fs, remote: str, local: Path, log) -> int | None:
    """The newest remote checkpoint that verifies, and the best one (lowest metric) when it is another;
    data first, meta last. The newest one's step (None: none verifies)."""
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(remote, detail=False)]
    records = {}
    for step in sorted((int(m.group(1)) for n in names if (m := META_RE.match(n))), reverse=True):
        try:
            records[step] = json.loads(fs.cat_file(f"{remote}/meta_{step:08d}.json"))
        except (OSError, ValueError) as exc:
            log(f"remote checkpoint step {step}: its meta is unreadable ({exc}); not used")
    scored = sorted((r["metric"], -s, s) for s, r in records.items() if isinstance(r.get("metric"), (int, float))
                    and r["metric"] == r["metric"])
    newest = None
    for step in records:  # newest first
        if _pull_one(fs, remote, local, step, records[step], log):
            newest = step
            break
    for _metric, _neg, step in scored:
        if newest is None or step == newest or _pull_one(fs, remote, local, step, records[step], log):
            break
    return newest


def _pull_one(fs, remote: str, local: Path, step: int, record: dict, log) -> bool:
    try:
        blobs = {name: fs.cat_file(f"{remote}/{name}") for name in record["files"]}
    except (OSError, KeyError, TypeError, AttributeError) as exc:
        log(f"remote checkpoint step {step} is incomplete ({exc}); trying an older one")
        return False
    bad = [name for name, data in blobs.items() if sha256_bytes(data) != record["files"][name]]
    if bad:
        log(f"remote checkpoint step {step} fails its SHA-256 check ({', '.join(bad)}); trying an older one")
        return False
    for name, data in blobs.items():
        _write(local / name, data)
    _write(local / f"meta_{step:08d}.json", json.dumps(record).encode())  # last: complete now
    return True


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(data))



def restore_from_remote(url: str | None, run_dir: Path, ctx) -> str | None:
    """Collective, before a trainer reads its run folder: rank 0 pulls the remote run into an empty local
    folder (`pull_run`); every rank gets the same one-line refusal when the remote cannot be read.
    Returns what was pulled, in words (None: nothing to pull, or a local run is there)."""
    from trainers.runtime.dist import broadcast_object

    if not url:
        return None
    outcome = None
    if ctx.is_main:
        try:
            pulled = None if holds_a_run(Path(run_dir)) else pull_run(url, Path(run_dir))
            outcome = ("ok", pulled)
        except UsageError as exc:
            outcome = ("refused", str(exc))
        except Exception as exc:  # noqa: BLE001 - unreachable, denied, malformed: one line, nothing written
            outcome = ("refused", f"--remote {redact(url)} cannot be read ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}); check the URL, the endpoint "
                                  f"(AWS_ENDPOINT_URL) and the credentials; nothing was changed")
    kind, text = broadcast_object(ctx, outcome)
    if kind == "refused":
        raise UsageError(text)
    if text and ctx.is_main:
        print(f"resumed the run folder {run_dir} from --remote {redact(url)}: {text}", flush=True)
    return text
