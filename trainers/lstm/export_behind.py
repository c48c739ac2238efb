"""Exports behind the training (`--export-behind`, the default of a GPU deploy): a worker hands each finished
symbol's ONNX export to a process of its own and trains its next symbols while that process exports.

Why: in the worker, the exports of 500 symbols took 33.8 s of a 97.7-s job on the H200, while its GPU idled
(bench/results/gpu_h200/: 97.7 s with exports, 63.9 s with --no-export). An export is CPU work
(torch.onnx, onnxruntime's parity check) that needs nothing of the device.

What does not change: a symbol's done marker is written by its worker, once its export is over, with what an export
in the worker gives it (`export_outcome`: the file's checksum and parity, or the export's error); model.onnx and
export.json are export_symbol's, in either process. A symbol whose export was not over when the worker stopped (a
signal, the worker killed) has no marker: the next run finishes it again (its evaluation) and exports it, as it did
a symbol killed during an export in the worker.

The exporter: `python -m trainers.lstm.export_behind PARENT_PID`, in a session of its own. One JSON request a line on
its stdin ({"folder": ...}), one JSON answer a line on the pipe it got as stdout ({"folder", "outcome"}; torch.onnx's
progress prints go to stderr; a stray line is skipped). An exporter that ends: the symbols it had not answered go
once more to a new one, then get an export error (after GIVE_UP_AFTER exporters in a row end unanswered, the worker
exports in line). An answer for a folder it was not given ends it, its symbols with an export error; so does STALL_S
without an answer while its worker waits. But an exporter that ends, or breaks its protocol, while the job is
stopping (any published stop: a signal, the budget, a broken context) leaves its symbols unmarked to the next run,
and so does STOPPING_STALL_S without an answer then.
It ignores SIGINT, SIGTERM and SIGHUP sent to it (slurm's and systemd's reach every process): its worker ends it.
It sees no GPU (CUDA_VISIBLE_DEVICES empty), runs torch and onnxruntime's parity sessions on one thread each (beside
a 2-core training on the dev VM, 32 symbols' exports cost the job 26.2 s with the exporter on every core and 14.9 s
on one: bench/results/lstm_export_behind_every_core_cpu.json and lstm_export_behind_cpu.json), and dies with its worker
(the kernel's parent-death signal on Linux; elsewhere it stops before its next export). It keeps the job's first
graph, as a worker does (trainers.onnx.export_reusing): the later symbols reuse it.

On a CPU the default is the export in the worker: there the exporter would take cores from the training.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

# How long a worker waits for the exporter to end after closing its stdin (or its stdout closed), before killing it
STOP_WAIT_S = 10.0
# An exporter with work that answers nothing for this long, while its worker waits for it at the end, is stuck: ended,
# its symbols recorded with an export error. (An export takes seconds; the first of a process, with torch.onnx's
# warm-up, up to about 15 s on the development VM.)
STALL_S = 600.0
# The same while the job stops (its budget spent, another worker's stop, a broken context): a job whose time or money
# is spent does not wait ten more minutes for a stuck exporter; its symbols are left unmarked to the next run.
STOPPING_STALL_S = 60.0
GIVE_UP_AFTER = 3  # exporters in a row ended without an answer: then the worker exports in line (as on a CPU)
_GONE = object()  # the reader's last item: the exporter's pipe closed (it exited)
_STRAY = object()  # (the reader's (_STRAY, line, 0.0)): a line on the answers' pipe that is no answer


LEFT_OUT = 2  # a process's first exports, left out of the median: torch.onnx's warm-up, the first graph, its reuse


class ExportPace:
    """One process's exports' own times, and `seconds`: the median of those after its first LEFT_OUT (0 before one
    is measured), what each export still to come will cost a stopping job (trainers.lstm.wind_down). Kept as each
    comes: it is read for every member at every step."""

    def __init__(self):
        self.times: list[float] = []
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        self.times.append(seconds)
        if len(self.times) > LEFT_OUT:
            self.seconds = statistics.median(self.times[LEFT_OUT:])


def exports_behind(setting: bool | None, gpu_like: bool, export: bool) -> bool:
    """Whether a worker exports behind its training: `--export-behind`/`--no-export-behind` decide; by default a
    GPU deploy does (on CUDA or under --gpu-defaults). Never without --export."""
    return export and (gpu_like if setting is None else setting)


def export_outcome(folder: Path, parity_threads: int | None = None) -> dict:
    """What a symbol's done marker says of its export: {"export": checksum and parity} or {"export_error": why}."""
    from trainers.lstm.export import export_symbol

    try:
        info = export_symbol(folder, parity_threads=parity_threads)
    except Exception as exc:  # noqa: BLE001 - the model trained; `trainers lstm export` can try again
        return {"export_error": f"{type(exc).__name__}: {exc}"}
    return {"export": {"sha256": info["sha256"], "max_abs_error": info["parity"]["max_abs_error"]}}


class ExportsBehind:
    """A worker's exporter process and the symbols handed to it. `submit` never waits (a thread of its own writes
    the requests: an exporter that stops reading cannot block the training); `collect` and `settle` (the worker's
    main thread) call each finished symbol's `done` with its export outcome."""

    def __init__(self, log):
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.requests: queue.Queue = queue.Queue()  # lines for the writer thread; None closes the exporter's stdin
        self.results: queue.Queue = queue.Queue()
        self.waiting: dict[str, Callable[[dict], None]] = {}  # folder -> what to do with its outcome, in order
        self.retried: set[str] = set()  # folders handed again after their exporter ended (once each)
        self.ended_unanswered = 0  # exporters in a row that ended without an answer; at GIVE_UP_AFTER, no more
        self.busy_since = time.monotonic()  # its last answer, or when it was given work while it had none
        self.left_to_the_next_run: list[str] = []  # folders dropped unmarked as the job stopped (_give_up)
        self.pace = ExportPace()  # its current process's exports, as the exporter measured them

    def submit(self, folder: Path, done: Callable[[dict], None]) -> None:
        if self.proc is None and self.ended_unanswered >= GIVE_UP_AFTER:  # (said once, when it came to that)
            done(export_outcome(Path(folder)))
            return
        if self.proc is None:
            try:
                self._start()
            except OSError as exc:  # (no process to be had: file descriptors, memory) the worker exports it itself
                self.log.warning("could not start an export process (%s); exporting %s in the worker", exc,
                                 Path(folder).name)
                done(export_outcome(Path(folder)))
                return
        if not self.waiting:
            self.busy_since = time.monotonic()
        self.waiting[str(folder)] = done
        self.requests.put(json.dumps({"folder": str(folder)}) + "\n")  # JSON: any character a path may hold

    def collect(self, wait_s: float = 0.0, stopping: Callable[[], bool] = lambda: False) -> int:
        """Hand each export that is over to its symbol, waiting up to `wait_s` for the first. An exporter that ended:
        the symbols it had not answered go once more to a new exporter, then get an export error; one that answered
        for a folder it was not given: an export error for every symbol waiting. Unless the job is `stopping` (any
        published stop: a signal, the budget, a broken context; or, at the end, the job's budget spent during the
        wait): then they are left unmarked to the next run (`left_to_the_next_run`). A line
        that is no answer (a stray print) is logged and skipped. Returns how many symbols were handed."""
        handed, wait = 0, wait_s
        while self.waiting:
            try:
                item = self.results.get(timeout=wait) if wait > 0 else self.results.get_nowait()
            except queue.Empty:
                break
            wait = 0.0
            if item is _GONE:
                handed += self._exporter_ended(self._end(kill=False), stopping())
                continue
            folder, outcome, seconds = item
            if folder is _STRAY:
                self.log.warning("the export process wrote a line that is no answer (skipped): %r", outcome[:200])
                continue
            done = self.waiting.pop(folder, None)
            if done is None:  # (its requests are JSON: an answer for no symbol it was given is a broken exporter)
                self._end(kill=True)
                handed += self._give_up(f"the export process answered for a folder it was not given ({folder!r})"
                                        [:300], stopping())
                continue
            self.busy_since, self.ended_unanswered = time.monotonic(), 0
            self.pace.add(seconds)
            done(outcome)
            handed += 1
        return handed

    def settle(self, stop: Callable[[], bool], stopping: Callable[[], bool] = lambda: False,
               stall_s: float = STALL_S, stopping_stall_s: float = STOPPING_STALL_S) -> list[str]:
        """Wait until every symbol handed over is marked (`collect`), unless `stop()` (this worker's signal), or
        the job is `stopping` and the exporter has been silent for `stopping_stall_s`: then what has arrived is
        marked, the exporter is ended, and the folders it had not exported are returned (no marker: the next run
        exports them). An exporter with work silent for `stall_s` is ended, its symbols recorded with an export
        error (a stall is the exporter's fault). The exporter is gone at the end (killed: with every answer in,
        nothing is lost, and its teardown took 1.3 s on the dev VM)."""
        while self.waiting and not stop():
            self.collect(wait_s=0.5, stopping=stopping)
            silent_s = time.monotonic() - self.busy_since
            if self.waiting and silent_s > stopping_stall_s and stopping():  # (first: a stopped job marks nothing)
                self.log.warning("the export process answered nothing for %.0f s as the job stopped: it is ended, and "
                                 "the symbols it had not exported are left to the next run", silent_s)
                break
            if self.waiting and silent_s > stall_s:
                self._end(kill=True)
                self._give_up(f"the export process answered nothing for {silent_s:.0f} s", stopping=False)
        self.collect(stopping=stopping)  # (stopped: what came back is kept)
        return self.stop()

    def still_exporting(self) -> int:
        """The symbols handed over whose answer has not come back yet (answers not collected yet left out)."""
        return max(0, len(self.waiting) - self.results.qsize())

    def seconds_per_export(self) -> float:
        """An export's time as measured so far by its current process (ExportPace); 0 before one is."""
        return self.pace.seconds

    def stop(self) -> list[str]:
        """End the exporter now. Returns the folders whose export was not over (no marker: the next run exports
        them)."""
        left = list(self.waiting)
        self.waiting.clear()
        self._end(kill=True)
        return left

    def _exporter_ended(self, code: int | None, stopping: bool) -> int:
        """Its exporter gone: the folders it had not answered, given once more to a new exporter (one that died on
        a symbol, or before it read those handed to it since), else recorded (`_give_up`)."""
        why = f"the export process ended (exit code {code}) before exporting it"
        self.ended_unanswered += 1
        if self.ended_unanswered == GIVE_UP_AFTER:
            self.log.warning("%d export processes in a row ended without an answer; this worker exports in line from "
                             "now on", GIVE_UP_AFTER)
        if stopping:
            return self._give_up(why, stopping=True)
        again = {f: done for f, done in self.waiting.items() if f not in self.retried}
        self.waiting = {f: done for f, done in self.waiting.items() if f in self.retried}
        handed = self._give_up(why, stopping=False)
        if again:
            self.log.warning("the export process ended (exit code %s); %d symbol(s) it had not exported go to a new "
                             "one", code, len(again))
            self.retried.update(again)
            for folder, done in again.items():
                self.submit(Path(folder), done)
        return handed

    def _give_up(self, why: str, stopping: bool) -> int:
        lost, self.waiting = self.waiting, {}
        if not lost:
            return 0
        if stopping:
            self.left_to_the_next_run.extend(lost)
            self.log.warning("%s as the job stopped; %d trained symbol(s) not exported yet are left to the next run, "
                             "which finishes and exports them", why.replace(" before exporting it", ""), len(lost))
            return 0
        self.log.warning("%s: %d symbol(s) recorded with an export error (`trainers lstm export` exports them)", why,
                         len(lost))
        for done in lost.values():
            done({"export_error": why})
        return len(lost)

    def _start(self) -> None:
        import trainers

        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
        package_root = Path(trainers.__file__).resolve().parents[1]
        # a source checkout the worker imports from, wherever it runs from; not an installed package's site-packages
        # (a PYTHONPATH entry goes before the standard library: site-packages there could shadow it)
        if package_root.name not in ("site-packages", "dist-packages"):
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root), env.get("PYTHONPATH")) if p)
        # A session of its own: a signal to the worker's process group (a terminal's Ctrl-C, torchrun's SIGTERM to
        # each worker's group) is the worker's to act on; the exporter ignores the ones sent to it alone (main) and
        # ends when its worker ends it, closes its stdin or dies.
        self.proc = subprocess.Popen(exporter_command(os.getpid()), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, encoding="utf-8", errors="replace", env=env, start_new_session=True)
        self.requests, self.results = queue.Queue(), queue.Queue()
        self.busy_since, self.pace = time.monotonic(), ExportPace()
        for target, args in ((_write_requests, (self.requests, self.proc.stdin, self.log)),
                             (_read_results, (self.proc.stdout, self.results))):
            threading.Thread(target=target, args=args, daemon=True, name="exports-behind").start()
        self.log.info("exporting behind the training in process %d (--export-behind)", self.proc.pid)

    def _end(self, kill: bool) -> int | None:
        """End the exporter (killed, or its stdin closed and waited for, then killed after STOP_WAIT_S); its exit
        code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        self.requests.put(None)  # the writer closes its stdin once every request before is written, and ends
        if kill:
            proc.kill()
        try:
            return proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def exporter_command(parent_pid: int) -> list[str]:
    return [sys.executable, "-m", "trainers.lstm.export_behind", str(parent_pid)]


def _write_requests(requests: queue.Queue, pipe, log) -> None:
    """(A thread of the worker's.) Each request onto the exporter's stdin, in order, until None (then closes it)."""
    try:
        for line in iter(requests.get, None):
            pipe.write(line)
            pipe.flush()
        pipe.close()
    except OSError as exc:  # a broken pipe: the exporter is gone, and the reader meets its end
        log.debug("the export process took no more work (%s)", exc)


def _read_results(pipe, results: queue.Queue) -> None:
    """(A thread of the worker's.) Each answer as (folder, outcome, the export's seconds); a line that is none as
    (_STRAY, line, 0.0)."""
    try:
        for line in pipe:
            try:
                record = json.loads(line)
                answer = (record["folder"], record["outcome"], _seconds(record.get("seconds")))
            except (ValueError, KeyError, TypeError, AttributeError):
                answer = None
            ok = answer is not None and isinstance(answer[0], str) and isinstance(answer[1], dict)
            results.put(answer if ok else (_STRAY, line.rstrip("\n"), 0.0))
    finally:
        results.put(_GONE)


def _seconds(value) -> float:
    """An answer's export time; 0 (not measured) where it is not a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    try:
        seconds = float(value)
    except OverflowError:  # (an integer past a float's range)
        return 0.0
    return seconds if math.isfinite(seconds) and seconds >= 0 else 0.0


def serve(lines, answer: Callable[[str], None], parent_pid: int, export: Callable[[Path], dict] = export_outcome
          ) -> int:
    """The exporter's loop: each folder asked for is exported and answered with its outcome, while the worker that
    started it lives (a worker killed outright leaves no exporter exporting on). Returns how many it exported."""
    exported = 0
    for line in lines:
        if os.getppid() != parent_pid:
            break
        folder = json.loads(line)["folder"]
        started = time.perf_counter()
        outcome = export(Path(folder))
        answer(json.dumps({"folder": folder, "outcome": outcome, "seconds": time.perf_counter() - started}) + "\n")
        exported += 1
    return exported


def main(argv: list[str]) -> int:
    parent_pid = int(argv[0])
    # Its worker decides when it ends (end of stdin, a kill, its own death): slurm's or systemd's SIGTERM to every
    # process would otherwise end it first, and its symbols would be recorded with export errors
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent()
    if os.getppid() != parent_pid:  # (gone before that took hold)
        return 0
    answers = os.fdopen(os.dup(1), "w")  # the protocol's own pipe; print() (torch.onnx's progress) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch

    from trainers.lstm.export import forget_exports

    # One thread for torch and for onnxruntime's parity sessions: the exporter works beside the training, whose
    # host thread a pool of every core (onnxruntime's spins between runs) would compete with
    torch.set_num_threads(1)
    forget_exports()

    def answer(text: str) -> None:
        answers.write(text)
        answers.flush()

    with contextlib.suppress(BrokenPipeError):  # the worker is gone: no one reads the answers
        serve(sys.stdin, answer, parent_pid, lambda folder: export_outcome(folder, parity_threads=1))
    return 0


def die_with_parent() -> None:
    """On Linux, the kernel kills this process when the worker that started it dies (prctl PR_SET_PDEATHSIG), even
    mid-export: a worker SIGKILLed (a torchrun restart resuming its symbols) leaves no exporter writing into their
    folders. Elsewhere the parent check between exports is what stops it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL) != 0:
        print(f"export_behind: prctl(PR_SET_PDEATHSIG) failed ({os.strerror(ctypes.get_errno())}); this exporter "
              f"stops only between exports once its worker is gone", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
