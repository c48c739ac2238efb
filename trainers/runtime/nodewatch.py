"""Several nodes: each node's heartbeat through the job's c10d store, and a watch that ends this node when another
goes silent, so a lost node costs the survivors a bounded wait instead of a collective that never returns.

A node killed outright closes its sockets and the survivors' next collective fails at once; a node that freezes, or
whose network goes, closes nothing, and NCCL or gloo wait out the collective timeout (10 minutes). So the first
worker of each node (local rank 0) beats every BEAT_S into torchrun's agent store (the rendezvous endpoint's, on
node 0) with its step and phase, and reads the others' beats. A node whose beat has not changed for `silence_s`
(TRAINERS_NODE_SILENCE_S, default 60) is lost: every worker of this node sees it, says which node and when, and
exits. A checkpoint is only ever the last complete one (atomic writes), so nothing is lost
but the steps since it. The store itself gone (node 0 lost: it hosts it) reads as node 0's silence.

Each beat is also written to <run>/nodes/node<R>.json (TRAINERS_NODES_DIR, which the deploy sets), so `status` on any
node (they share the run folder) shows every node's last beat, step and phase; a lost node's verdict goes to
verdict-node<R>.txt there, for this node's deploy to name.

Staleness is measured by this node's own monotonic clock from the moment a node's beat last changed: the nodes'
wall clocks need not agree.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

BEAT_S = 5.0
SILENCE_S = 60.0
NODES_DIR = "nodes"
KEY = "trainers/nodes/"
LOST_EXIT = 75  # EX_TEMPFAIL: a rerun of the same command resumes


def node_count() -> int:
    """How many nodes (torchrun agents) this job has: GROUP_WORLD_SIZE, 1 outside torchrun."""
    return int(os.environ.get("GROUP_WORLD_SIZE") or 1)


def node_rank() -> int:
    """This node's rank as the launcher and the deploy name it (TRAINERS_NODE_RANK), else torchrun's group rank."""
    return int(os.environ.get("TRAINERS_NODE_RANK") or os.environ.get("GROUP_RANK") or 0)


def silence_s() -> float:
    """The bound, at least two beats: a shorter one would call a node lost between its beats."""
    said = os.environ.get("TRAINERS_NODE_SILENCE_S") or str(SILENCE_S)
    try:
        value = float(said)
    except ValueError:
        value = float("nan")
    if not 2 * BEAT_S <= value < float("inf"):
        from trainers.errors import UsageError

        raise UsageError(f"TRAINERS_NODE_SILENCE_S={said!r} must be a number of seconds >= {2 * BEAT_S:g}, e.g. 60")
    return value


class NodeWatch:
    """Beats for this node and watches the others'. `store`: a c10d Store client of this thread's own (a TCPStore
    with a short timeout); `on_lost(message)` ends the node (the default exits the process)."""

    def __init__(self, store, nnodes: int, rank: int, silence: float = SILENCE_S, beat_s: float = BEAT_S,
                 on_lost: Callable[[str], None] | None = None, beats: bool = True):
        self.store, self.nnodes, self.rank, self.silence, self.beat_s = store, nnodes, rank, silence, beat_s
        self.beats = beats  # the node's first worker beats; every worker watches, so all of them end at once
        self.on_lost = on_lost or _exit_lost
        self.host = socket.gethostname()
        self.step, self.phase = 0, "starting"
        self.folder: Path | None = None  # <run>/nodes: where this node's beats and verdict go (None: nowhere)
        self._seq = 0
        # node -> (its last beat, when it last changed here). An earlier worker group's beat (the agent's store outlives
        # torchrun's restarts) counts as a first one: each node's first worker overwrites its key the moment its watch
        # starts, which is within a moment of the others' (they start past one process-group rendezvous).
        self._seen: dict[int, tuple[str, float]] = {}
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._store_failed, self._latest = False, None
        self._thread = threading.Thread(target=self._loop, name="trainers-nodewatch", daemon=True)
        self._files = threading.Thread(target=self._file_loop, name="trainers-nodewatch-files", daemon=True)

    def start(self) -> "NodeWatch":
        self._thread.start()
        self._files.start()
        return self

    def stop(self) -> None:
        """The last beat says "done": a node that ended its part is not lost while the others finish theirs."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.beat_s + 5)
        self.phase = "done"
        if self.beats:
            self.beat_once(time.monotonic())  # (a store that does not answer says so, in one line)
            self.write_file(self._latest)

    def at(self, step: int, phase: str = "train") -> None:  # the loop's position, read by the next beat
        self.step, self.phase = step, phase

    def _loop(self) -> None:
        while not self._stop.is_set():
            lost = self.beat_once(time.monotonic())
            if lost is not None:  # (said once, by the node's first worker: each worker ends on it)
                if self.beats and self.folder is not None:  # for this node's deploy: `trainers nodes lost` reads it
                    self._write_verdict(lost)
                self.on_lost(lost if self.beats else "")
                return
            self._stop.wait(self.beat_s)

    def beat_once(self, now: float) -> str | None:
        """One beat and one look at the others; the message naming a lost node, else None."""
        self._seq += 1
        beat = {"node": self.rank, "host": self.host, "step": self.step, "phase": self.phase, "time": time.time(),
                "seq": self._seq, "pid": os.getpid()}
        try:
            if self.beats:
                self.store.set(f"{KEY}{self.rank}", json.dumps(beat))
            for other in range(self.nnodes):
                if other != self.rank and self.store.check([f"{KEY}{other}"]):
                    said = self.store.get(f"{KEY}{other}").decode()
                    if self._seen.get(other, ("",))[0] != said:
                        self._seen[other] = (said, now)
        except RuntimeError as err:  # (DistNetworkError, DistStoreError) unanswered: it counts as node 0's silence
            if not self._store_failed:
                print(f"nodes: the job's store did not answer ({str(err).splitlines()[0][:120]}); node 0 is lost if "
                      f"it stays silent {self.silence:g} s", file=sys.stderr, flush=True)
            self._store_failed = True
            if self._said(0).get("phase") == "done":  # node 0 finished and its agent closed the store: nothing to
                self._stop.set()                      # watch through any more (its last word was done)
                return None
        else:
            self._store_failed = False
        self._latest = beat  # (the file is written by a thread of its own: a stalled shared disk stalls no beat)
        for other in range(self.nnodes):
            if other == self.rank:
                continue
            changed = self._seen.get(other, ("", self._started))[1]
            last = self._said(other)
            if now - changed > self.silence and last.get("phase") != "done":
                return self._lost_message(other, last, now - changed)
        return None

    def _said(self, other: int) -> dict:
        said = self._seen.get(other, ("",))[0]
        return json.loads(said) if said else {}

    def _lost_message(self, other: int, last: dict, quiet_s: float) -> str:
        where = (f"its last beat: step {last.get('step')}, {last.get('phase')}" if last
                 else "it never beat")
        store = " (it holds the job's store)" if other == 0 else ""
        return (f"node {other} ({last.get('host', '?')}){store} went silent: no heartbeat for {quiet_s:.0f} s "
                f"(TRAINERS_NODE_SILENCE_S={self.silence:g}; {where}); node {self.rank} ({self.host}) stops at step "
                f"{self.step}, keeping the last complete checkpoint; rerun the same command on every node to resume")

    def _write_verdict(self, lost: str) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / f"verdict-node{self.rank}.txt").write_text(lost + "\n")
        except OSError as err:  # the deploy then judges by the nodes' state files and beats alone
            print(f"nodes: the verdict was not written ({err})", file=sys.stderr, flush=True)

    def _file_loop(self) -> None:
        written = None
        while not self._stop.wait(self.beat_s / 2):
            if self._latest is not written:
                written = self._latest
                self.write_file(written)

    def write_file(self, beat: dict | None) -> None:
        if self.folder is None or not self.beats or beat is None:
            return
        from trainers.runtime.files import atomic_write_json

        try:
            atomic_write_json(self.folder / f"node{self.rank}.json", beat)
        except OSError as err:  # for `status` only: training goes on, and says so once
            print(f"nodes: cannot write this node's heartbeat file ({err}); `status` will not show it",
                  file=sys.stderr, flush=True)
            self.folder = None


def _exit_lost(message: str) -> None:
    if message:  # (a new line first: a progress bar may be drawn there)
        print(f"\nerror: {message}", file=sys.stderr, flush=True)
    os._exit(LOST_EXIT)  # the main thread may be inside a collective that will not return for minutes


_WATCH: NodeWatch | None = None


def start_if_several_nodes() -> NodeWatch | None:
    """In each worker of a multi-node job: the watch (one per process), beating from each node's first worker. Every
    worker watches: a worker left inside a collective when its neighbour exits would hold torchrun's agent for its
    30 s stop timeout."""
    global _WATCH
    env = os.environ
    if (_WATCH is not None or node_count() < 2
            or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env):
        return _WATCH
    from torch.distributed import TCPStore

    silence = silence_s()
    store = TCPStore(host_name=env["MASTER_ADDR"], port=int(env["MASTER_PORT"]), is_master=False,
                     timeout=datetime.timedelta(seconds=min(BEAT_S * 2, silence)))
    _WATCH = NodeWatch(store, node_count(), node_rank(), silence, beats=env.get("LOCAL_RANK", "0") == "0")
    _WATCH.folder = Path(env["TRAINERS_NODES_DIR"]) if env.get("TRAINERS_NODES_DIR") else None
    return _WATCH.start()


def stop() -> None:
    global _WATCH
    if _WATCH is not None:
        _WATCH.stop()
        _WATCH = None


def at(step: int, phase: str = "train") -> None:
    if _WATCH is not None:
        _WATCH.at(step, phase)


def read_beats(run_dir: Path, since: float = 0.0) -> list[dict]:
    """Every node's last beat in <run>/nodes (for `status`), each checked for what it can be; `since`: only beats of
    a training started then (an earlier run's files stay in the folder)."""
    beats = []
    folder = Path(run_dir) / NODES_DIR
    for path in sorted(folder.glob("node*.json")) if folder.is_dir() else []:
        try:
            beat = json.loads(path.read_bytes()[: 1 << 14])
        except (OSError, ValueError):
            continue
        if not isinstance(beat, dict) or not isinstance(beat.get("node"), int):
            continue
        if since <= 0 or (beat_age(beat) is not None and beat["time"] >= since):
            beats.append(beat)
    return beats


def beat_age(beat: dict | None) -> float | None:
    """Seconds since a beat (by this machine's clock), None where it holds no finite time."""
    when = (beat or {}).get("time")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        return None
    return max(0.0, time.time() - when)


def verdict(run_dir: Path, rank: int, since: float) -> str | None:
    """The lost node this node's watch named, in a training started at `since`, else None."""
    path = Path(run_dir) / NODES_DIR / f"verdict-node{rank}.txt"
    try:
        if path.stat().st_mtime >= since:
            return path.read_text(errors="replace")[:2000].strip() or None
    except OSError:  # (none: the watch named nobody)
        return None
    return None
