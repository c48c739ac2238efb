"""`trainers status` (and `bash deploy_8gpu.sh status`): where a deployed job stands, from the files it
writes — no connection to the job needed, so it works after the SSH session that started it is gone.

    <out>/deploy-<trainer>.state     the deploy's phase, pid, state (running/finished/failed), paths
    <out>/.deploy-<trainer>.lock     held (flock) while the deploy runs: alive or not
    <run>/metrics.jsonl              the last training and validation rows
    <run>/heartbeat.json             elapsed time across restarts, step, total steps, world size
    <run>/results.json               the end: stop reason, evaluation, cost
    nvidia-smi                       GPU utilisation and memory, when present

Every one of these files can meet garbage (a disk filled mid-write, a hand edit, binary junk): each
value is read for what it can be (a finite number, a printable text) and shown, or left out; a bad
value never stops the rest from being shown.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

from trainers.errors import UsageError
from trainers.registry import TRAINERS
from trainers.runtime.lock import is_locked

STATE_CAP = 1 << 20  # a deploy's state file is a few hundred bytes


def read_capped(path: Path, cap: int, name: str, holds: str) -> bytes:
    """A file a user points at (`name`: how messages name it; `holds`: what it should be), read whole but at most
    `cap` bytes: a FIFO or a device (/dev/zero) in its place is refused, as is a larger file, in one line each,
    never read without end. A missing file raises FileNotFoundError, for the caller's words."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise UsageError(f"{name}: not a plain file; {holds}")
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        size = f"{cap >> 20} MiB" if cap >= 1 << 20 else f"{cap >> 10} KiB"
        raise UsageError(f"{name}: over {size}; {holds}")
    return data


def read_state(path: Path) -> dict:
    """The deploy's key=value lines; bytes that are not UTF-8 become U+FFFD (shown, not fatal). A FIFO or device
    in its place is refused (a read would block, or never end), and so is a file with no key=value line at all (the
    deploy writes it whole: empty is a file truncated or replaced by hand: `unreadable_state`)."""
    data = read_capped(path, STATE_CAP, str(path), "a deploy writes its state as a plain file of a few key=value "
                                                   "lines; move it away and rerun the deploy to write it again")
    state = {}
    for line in data.decode(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            state[key.strip()] = value.strip()
    return state


def _number(value) -> float | None:
    """A finite number from a JSON value or a state file's text ("12", "3.5"); None for anything
    else (a list, a bool, "abc", NaN, 1e999)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _int(value) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _text(value) -> str | None:
    """Printable text, or None: a garbled file must not send escape sequences to the terminal."""
    if value is None or isinstance(value, (dict, list)):
        return None
    return "".join(c if c.isprintable() else "?" for c in str(value))


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def last_rows(metrics: Path, kinds=("train", "val"), tail_bytes: int = 1 << 16) -> dict:
    """The last row of each kind in metrics.jsonl (reads only its end: it can be large)."""
    if not metrics.exists():
        return {}
    with open(metrics, "rb") as f:
        f.seek(max(0, metrics.stat().st_size - tail_bytes))
        lines = f.read().decode(errors="replace").splitlines()
    out = {}
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # a torn or garbled row: the rows before it still count
            continue
        if isinstance(row, dict) and row.get("kind") in kinds and row["kind"] not in out:
            out[row["kind"]] = row
    return out


def gpu_usage() -> list[dict] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--query-gpu=index,utilization.gpu,memory.used,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    gpus = []
    for row in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in row.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            try:
                gpus.append({"index": int(parts[0]), "util_pct": float(parts[1]), "mem_used_mib": float(parts[2]),
                             "mem_total_mib": float(parts[3])})
            except ValueError:
                continue
    return gpus


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." nested beyond the parser's depth
        return {}


def job_status(out: Path, trainer: str) -> dict:
    state_path = out / f"deploy-{trainer}.state"
    if not state_path.exists():
        raise UsageError(f"no deploy of {trainer} in {out} (no {state_path.name}); start one with "
                         f"`bash deploy_8gpu.sh --trainer {trainer} --out {out}`")
    state = {k: _text(v) for k, v in read_state(state_path).items()}
    alive = is_locked(out / f".deploy-{trainer}.lock")
    run_dir = Path(state.get("run_dir") or out / trainer)
    rows = last_rows(run_dir / "metrics.jsonl")
    beat = _read_json(run_dir / "heartbeat.json")
    results = _read_json(run_dir / "results.json")
    recorded = state.get("state") or "unknown"  # a state file without its state line still shows the rest
    st = {"trainer": trainer, "out": str(out), "alive": alive, "phase": state.get("phase"),
          "state": recorded if not (recorded == "running" and not alive) else "lost",
          "exit_code": _int(state.get("exit_code")), "pid": _int(state.get("pid")), "host": state.get("host"),
          "detached": state.get("detached") == "1", "log": state.get("log"), "run_dir": str(run_dir),
          "tarball": state.get("tarball"), "download": state.get("download") or None,
          "reason": state.get("reason") or None, "training_end": state.get("training_end") or None}
    # the state file is checked against the files it names: "finished" promises a tarball
    tarball = Path(st["tarball"]) if st["tarball"] else None
    st["tarball_exists"] = bool(tarball and tarball.is_file())
    if st["state"] == "finished" and not st["tarball_exists"]:
        st["state"] = "incomplete"
    started, ended = _number(state.get("started")), _number(state.get("ended"))
    st["wall_s"] = (ended or time.time()) - started if started else None
    train, val = rows.get("train", {}), rows.get("val", {})
    step = max(_int(train.get("step")) or 0, _int(beat.get("step")) or 0)
    training_results = _dict(results.get("training"))
    total = _int(beat.get("total_steps")) or _int(training_results.get("total_steps"))
    st.update(step=step or None, total_steps=total, last_train=_metric_values(train), last_val=_metric_values(val))
    rate = next(((k, _number(v)) for k, v in train.items() if k.endswith("_per_s") and _number(v) is not None),
                (None, None))
    st["throughput"] = {"unit": rate[0][:-6] if rate[0] else None, "per_s": rate[1]}
    elapsed = _number(beat.get("elapsed_s"))
    st["elapsed_s"] = elapsed
    step_time = _number(train.get("step_time_s"))
    training = st["state"] == "running" and st["phase"] == "train"
    st["eta_s"] = (total - step) * step_time if (total and step and step_time and training) else None
    price = _number(state.get("usd_per_gpu_hour"))
    devices = max(1, _int(beat.get("world_size")) or _int(state.get("nproc")) or 1)
    st["spent_usd"] = elapsed / 3600.0 * price * devices if (price is not None and elapsed is not None) else None
    budget = _number(state.get("budget_usd"))
    st["budget_left_usd"] = budget - st["spent_usd"] if (budget is not None and st["spent_usd"] is not None) else None
    max_hours = _number(state.get("max_hours"))
    st["time_left_s"] = max_hours * 3600.0 - elapsed if (max_hours is not None and elapsed is not None) else None
    if training_results:
        st["stop_reason"] = _text(training_results.get("stop_reason"))
        st["real"] = {"hours": (_number(training_results.get("elapsed_s_all_attempts")) or 0) / 3600,
                      "usd": _number(training_results.get("cost_usd"))}
    plan = _read_json(out / f"plan-{trainer}.json")
    hours = _number(_dict(plan.get("time")).get("hours"))
    if hours is not None:
        mfu = _dict(plan.get("mfu"))
        st["plan"] = {"hours": hours, "usd": _number(_dict(plan.get("money")).get("usd")),
                      "mfu": _number(mfu.get("value")), "mfu_source": _text(mfu.get("source"))}
    for key in ("wall_s", "eta_s", "spent_usd", "budget_left_usd", "time_left_s"):
        st[key] = _number(st[key])  # finite inputs can still overflow to inf (1e308 hours x 3600)
    st["gpus"] = gpu_usage()
    st["nodes"] = node_rows(out, trainer, run_dir)
    return st


def node_files(out: Path, trainer: str, rank: int) -> tuple[Path, Path]:
    """A node's deploy state and lock on the shared folder (deploy_8gpu.sh's NODE_TAG: node 0's carry no tag)."""
    tag = "" if rank == 0 else f".node{rank}"
    return out / f"deploy-{trainer}{tag}.state", out / f".deploy-{trainer}{tag}.lock"


def node_rows(out: Path, trainer: str, run_dir: Path) -> list[dict]:
    """A multi-node job on a shared folder: every node's deploy (its state file and lock) and its training's last
    heartbeat (<run>/nodes, trainers/runtime/nodewatch.py), so `status` on any node shows the whole job."""
    from trainers.runtime.nodewatch import beat_age, read_beats

    tagged = re.compile(rf"deploy-{re.escape(trainer)}\.node([0-9]+)\.state")
    ranks = {int(m.group(1)) for p in out.glob(f"deploy-{trainer}.node*.state") if (m := tagged.fullmatch(p.name))}
    beats = {beat["node"]: beat for beat in read_beats(run_dir)}
    if not ranks and len(beats) < 2:
        return []
    head_state = out / f"deploy-{trainer}.state"
    nnodes = _int(read_state(head_state).get("nnodes")) if head_state.is_file() else None
    rows = []
    # (not the nodes of an earlier, larger job in this folder: their files stay)
    for rank in sorted(r for r in ranks | set(beats) | {0} if nnodes is None or r < nnodes):
        state_path, lock = node_files(out, trainer, rank)
        state = {k: _text(v) for k, v in read_state(state_path).items()} if state_path.is_file() else {}
        alive, recorded = is_locked(lock), state.get("state") or "unknown"
        beat = beats.get(rank, {})
        rows.append({"node": rank, "host": state.get("host") or _text(beat.get("host")), "phase": state.get("phase"),
                     "state": "lost" if recorded == "running" and not alive else recorded,
                     "step": _int(beat.get("step")), "training": _text(beat.get("phase")),
                     "beat_age_s": beat_age(beat)})
    return rows


def _metric_values(row: dict) -> dict:
    """The row's flags and finite numbers (a garbled row's other strings, lists and NaN are left out)."""
    values = {_text(k): v if isinstance(v, bool) else _number(v) for k, v in row.items() if k not in ("kind", "time")}
    return {k: v for k, v in values.items() if v is not None}


def _hms(seconds) -> str:
    if seconds is None:
        return "?"
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def unreadable_state(state_path: Path) -> str | None:
    """Why a job's state file cannot be read (a link to nothing, a folder, no permission), or None."""
    if state_path.is_symlink() and not state_path.exists():
        return f"{state_path.name} is a link to a missing file ({state_path.readlink()})"
    if state_path.exists() and not state_path.is_file():
        return f"{state_path.name} is not a file"
    try:
        state = read_state(state_path) if state_path.exists() else {"missing": ""}
    except OSError as exc:
        return f"{state_path.name} cannot be read ({exc.strerror or exc})"
    except UsageError as exc:
        return str(exc)
    if not state:  # (the deploy writes it whole, through a rename: empty is a truncated or hand-made file)
        return (f"{state_path.name} holds no key=value line (empty, or not a state file): the deploy's record of "
                f"the job is lost; its run folder and log are untouched, and rerunning the same deploy command "
                f"resumes the job and writes the state again")
    return None


def broken_status(out: Path, trainer: str, why: str) -> dict:
    """A job whose state file cannot be read: said so, beside the jobs that can (never instead of them)."""
    return {"trainer": trainer, "out": str(out), "state": "broken", "reason": why,
            "alive": is_locked(out / f".deploy-{trainer}.lock")}


def format_status(st: dict) -> str:
    state = st["state"]
    if state == "broken":
        return (f"{st['trainer']} in {st['out']}: BROKEN STATE FILE: {st['reason']}"
                + ("; its deploy still holds the job's lock (running)" if st["alive"] else "")
                + f"\n  remove or restore deploy-{st['trainer']}.state (every other job in the folder is shown as usual)")
    lines = [f"{st['trainer']} in {st['out']}: {state.upper()}"
             + (f" in phase {st['phase']}" if state in ("running", "lost", "failed") else "")
             + (f" (exit {st['exit_code']})" if state == "failed" else "")
             + (f", pid {st['pid']} on {st['host']}" if state == "running" else "")
             + (", detached" if st["detached"] and state == "running" else "")]
    if state == "lost":
        lines.append("  the deploy is not running any more and did not record how it ended (killed?); rerun the "
                     "same command to resume from the last checkpoint")
    if state == "incomplete":
        lines.append(f"  the deploy recorded 'finished', but its tarball {st['tarball']} is not there (deleted or "
                     f"moved?); rerun the same command to export and package again")
    if st.get("reason"):
        lines.append(f"  {state}: {st['reason']}")
    if st.get("step"):
        total = f"/{st['total_steps']}" if st.get("total_steps") else ""
        pct = f" ({100 * st['step'] / st['total_steps']:.1f}%)" if st.get("total_steps") else ""
        lines.append(f"  step {st['step']}{total}{pct}; last train {_short(st['last_train'])}; "
                     f"last val {_short(st['last_val'])}")
    tp = st["throughput"]
    if tp.get("per_s"):
        eta = f"; ETA {_hms(st['eta_s'])}" if st["eta_s"] is not None else ""
        lines.append(f"  throughput {tp['per_s']:,.1f} {tp['unit']}/s; elapsed {_hms(st['elapsed_s'])}{eta}")
    money = []
    if st["spent_usd"] is not None:
        money.append(f"spent ${st['spent_usd']:.2f}")
    if st["budget_left_usd"] is not None:
        money.append(f"budget left ${st['budget_left_usd']:.2f}")
    if st["time_left_s"] is not None:
        money.append(f"time left {_hms(st['time_left_s'])}")
    if money:
        lines.append("  " + "; ".join(money))
    for n in st.get("nodes") or []:
        beat = (f"; heartbeat {n['beat_age_s']:.0f} s ago at step {n['step']} ({n['training']})"
                if n["beat_age_s"] is not None else "; no heartbeat yet")
        lines.append(f"  node {n['node']} ({n['host'] or '?'}): {n['state']} in phase {n['phase'] or '?'}{beat}")
    for g in st["gpus"] or []:
        lines.append(f"  GPU {g['index']}: {g['util_pct']:.0f}% busy, {g['mem_used_mib'] / 1024:.1f}/"
                     f"{g['mem_total_mib'] / 1024:.1f} GiB")
    if st.get("stop_reason"):
        lines.append(f"  training stopped: {st['stop_reason']}" + (" (resume: rerun the same deploy command)"
                                                                   if st["stop_reason"] == "signal" else ""))
    if st.get("plan"):
        pl, real = st["plan"], st.get("real")
        line = f"  plan: {pl['hours']:.2f} h" + (f", ${pl['usd']:,.2f}" if pl.get("usd") is not None else "")
        if real:
            line += f"  |  real: {real['hours']:.2f} h" + (f", ${real['usd']:,.2f}" if real.get("usd") is not None else "")
        lines.append(line)
    if state == "finished" and st.get("tarball"):
        lines.append(f"  tarball {st['tarball']}")
        if st.get("download"):
            lines.append(f"  download: {st['download']}")
    lines.append(f"  log {st['log']}")
    return "\n".join(lines)


def _short(values: dict) -> str:
    keep = {k: v for k, v in values.items() if k not in ("step", "epoch", "peak_memory_bytes") and
            not k.endswith("_per_s") and k != "step_time_s" and not isinstance(v, bool)}
    return ", ".join(f"{k} {v:.4g}" for k, v in list(keep.items())[:3]) or "-"


def main(args) -> int:
    out = Path(args.out)
    if args.trainer is not None and args.trainer not in TRAINERS:  # it becomes part of a file name
        raise UsageError(f"--trainer {args.trainer!r} is not one of: {', '.join(TRAINERS)}")
    trainers = [args.trainer] if args.trainer else sorted(
        p.name[len("deploy-"):-len(".state")] for p in out.glob("deploy-*.state"))
    if not trainers:
        raise UsageError(f"no deploy in {out}; give the --out a deploy used")
    statuses = []
    for trainer in trainers:  # every job in the folder; one broken state file is said, not fatal
        why = unreadable_state(out / f"deploy-{trainer}.state")
        if why and not args.trainer:
            statuses.append(broken_status(out, trainer, why))
        elif why:  # (asked for by name: one line and exit 2, never a read that blocks on a FIFO)
            raise UsageError(f"{why}: the deploy of {trainer} in {out} cannot be read")
        else:
            statuses.append(job_status(out, trainer))
    if args.json:
        print(json.dumps(statuses if len(statuses) > 1 else statuses[0], indent=2, default=str))
    else:
        print("\n".join(format_status(s) for s in statuses))
    return 0
