"""Exports behind the training (`--export-behind`, trainers.lstm.export_behind): a worker's exports run in a process
of its own while it trains its next symbols; the files and done markers are the ones an export in the worker gives;
an exporter that dies leaves export errors, not failed symbols; a signal while exports wait leaves their symbols to
the next run, which finishes and exports them."""

import io
import json
import os
import signal
import sys
import time

import pytest

import trainers.lstm.export_behind as behind
import trainers.lstm.scheduler as scheduler_mod
import trainers.lstm.worker as worker_mod
from trainers.cli import main
from trainers.runtime.files import sha256_file

TINY = ["--synthetic-tickers", "3", "--synthetic-days", "700", "--window", "16", "--hidden", "8", "--batch-size", "64",
        "--epochs", "1", "--dropout", "0", "--device", "cpu"]
SYMBOLS = ["SYN000", "SYN001", "SYN002"]
# nothing in the jobs below depends on the SIMD width: CI's narrowed pass skips them
SLOW = pytest.mark.slow


def markers(run_dir) -> dict[str, dict]:
    return {s: json.loads((run_dir / "symbols" / s / "done.json").read_text()) for s in SYMBOLS
            if (run_dir / "symbols" / s / "done.json").exists()}


def log_lines(run_dir) -> list[str]:
    return (run_dir / "training.log").read_text().splitlines()


def onnx_output(path) -> list[float]:
    """What the file computes for one fixed batch (onnxruntime on the CPU)."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    shape = [5, *session.get_inputs()[0].shape[1:]]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return session.run(None, {session.get_inputs()[0].name: x})[0].tolist()


def first_line_with(lines: list[str], text: str) -> int:
    return next(i for i, line in enumerate(lines) if text in line)


@pytest.fixture
def restore_sigterm():
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("setting, gpu_like, export, expected", [
    (None, True, True, True), (None, False, True, False),  # the default: a GPU deploy's (or its rehearsal)
    (True, False, True, True), (False, True, True, False),  # the flags decide
    (True, True, False, False), (None, True, False, False),  # nothing to export
])
def test_who_exports_behind(setting, gpu_like, export, expected):
    assert behind.exports_behind(setting, gpu_like, export) is expected


def test_export_behind_without_export_is_refused_in_one_line(tmp_path, capsys):
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", *TINY, "--export-behind", "--no-export", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--export-behind" in err[0] and "--no-export" in err[0]
    assert not run_dir.exists()


def test_the_exporter_answers_each_folder_while_its_worker_lives():
    seen, answers = [], []

    def export(folder):
        seen.append(folder.name)
        return {"export": {"sha256": folder.name}}

    odd = "/a/SYN 001\nx"  # any character a path may hold travels in the JSON request
    lines = io.StringIO("".join(json.dumps({"folder": f}) + "\n" for f in ("/a/SYN000", odd)))
    assert behind.serve(lines, answers.append, os.getppid(), export) == 2
    assert seen == ["SYN000", "SYN 001\nx"]
    records = [json.loads(a) for a in answers]
    assert all(r.pop("seconds") >= 0 for r in records)  # each export's own time (the stopping job's reserve)
    assert records == [{"folder": "/a/SYN000", "outcome": {"export": {"sha256": "SYN000"}}},
                       {"folder": odd, "outcome": {"export": {"sha256": "SYN 001\nx"}}}]
    # its worker gone (the exporter's parent is another process now): it exports nothing more
    assert behind.serve(io.StringIO(json.dumps({"folder": "/a/SYN002"}) + "\n"), answers.append, os.getppid() + 1,
                        export) == 0
    assert len(seen) == 2


def fake_exporter(monkeypatch, script: str) -> None:
    """The exporter replaced by a Python script (its stdin and stdout the protocol's)."""
    monkeypatch.setattr(behind, "exporter_command", lambda parent: [sys.executable, "-c", script])


class Log:
    def __init__(self):
        self.lines = []

    def info(self, msg, *args):
        self.lines.append(msg % args)

    warning = debug = info


def wait_for_an_item(exports: behind.ExportsBehind, timeout: float = 120) -> None:
    """Until the exporter's reader has queued something (an answer, or the exporter's end), uncollected."""
    deadline = time.monotonic() + timeout
    while exports.results.qsize() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def exporters(monkeypatch) -> list[behind.ExportsBehind]:
    """Every ExportsBehind the jobs of a test make, in order."""
    made, real_init = [], behind.ExportsBehind.__init__

    def init(self, log):
        real_init(self, log)
        made.append(self)

    monkeypatch.setattr(behind.ExportsBehind, "__init__", init)
    return made


def handed(exports: behind.ExportsBehind, folders: list[str]) -> dict[str, dict]:
    outcomes = {}
    for folder in folders:
        exports.submit(folder, lambda outcome, folder=folder: outcomes.__setitem__(folder, outcome))
    deadline = time.monotonic() + 60
    while exports.waiting and time.monotonic() < deadline:
        exports.collect(wait_s=0.5)
    return outcomes


def test_the_exporter_runs_without_a_gpu_in_a_session_of_its_own_and_its_answers_reach_each_symbol(monkeypatch):
    """A signal to the worker's process group (torchrun's SIGTERM, a terminal's Ctrl-C) does not reach the exporter:
    the worker decides what becomes of the exports it waits for."""
    fake_exporter(monkeypatch, "import json, os, sys\n"
                               "for line in sys.stdin:\n"
                               "    folder = json.loads(line)['folder']\n"
                               "    seen = {'cuda': os.environ['CUDA_VISIBLE_DEVICES'], 'group': os.getpgid(0)}\n"
                               "    print(json.dumps({'folder': folder, 'outcome': seen}), flush=True)\n")
    exports = behind.ExportsBehind(Log())
    folders = ["/job/symbols/SYN000", "/job/symbols/SYN 001\nodd"]
    outcomes = handed(exports, folders)
    assert exports.settle(stop=lambda: False) == [] and exports.proc is None
    assert sorted(outcomes) == sorted(folders) and not exports.waiting
    assert all(o["cuda"] == "" and o["group"] != os.getpgid(0) for o in outcomes.values())


ANSWER = ("import json, sys\n"
          "for line in sys.stdin:\n"
          "    print(json.dumps({'folder': json.loads(line)['folder'], 'outcome': {'export': 'ok'}}), flush=True)\n")


@pytest.mark.parametrize("script, why", [
    ("import json, sys; sys.stdin.readline(); print(json.dumps({'folder': '/elsewhere', 'outcome': {}}), flush=True);"
     " sys.stdin.read()", "answered for a folder it was not given"),
    ("import sys; sys.stdin.readline(); sys.exit(3)", "ended (exit code 3)"),
])
def test_an_exporter_that_breaks_its_protocol_or_ends_leaves_export_errors_and_no_wait(monkeypatch, script, why):
    """Once a symbol's answer could never come, every symbol waiting gets an export error at once (a wait for it
    would never end); a new exporter takes the symbols after."""
    fake_exporter(monkeypatch, script)
    exports = behind.ExportsBehind(Log())
    outcomes = handed(exports, ["/job/symbols/SYN000", "/job/symbols/SYN001"])
    assert not exports.waiting and len(outcomes) == 2
    assert all(why in o["export_error"] for o in outcomes.values()), outcomes
    assert exports.proc is None
    fake_exporter(monkeypatch, ANSWER)
    assert handed(exports, ["/job/symbols/SYN002"]) == {"/job/symbols/SYN002": {"export": "ok"}}  # a new exporter
    assert exports.settle(stop=lambda: False) == []


@pytest.mark.parametrize("stray", ["a banner", json.dumps({"folder": ["/job"], "outcome": {}}),
                                   json.dumps({"folder": "/job/symbols/SYN000", "outcome": None})])
def test_a_stray_line_on_the_exporters_pipe_is_skipped(monkeypatch, stray):
    """(A sitecustomize's banner, say, or JSON that is no answer.) Logged, not taken for a broken exporter: every
    symbol still gets its answer."""
    fake_exporter(monkeypatch, f"print({stray!r}, flush=True)\n" + ANSWER)
    log = Log()
    exports = behind.ExportsBehind(log)
    assert handed(exports, ["/job/symbols/SYN000"]) == {"/job/symbols/SYN000": {"export": "ok"}}
    assert any(f"a line that is no answer (skipped): {stray!r}" in line for line in log.lines)
    exports.settle(stop=lambda: False)


def test_what_an_ended_exporter_had_not_answered_goes_once_to_a_new_one(monkeypatch):
    """An exporter that died (on a symbol, or before reading what it was handed since): its unanswered symbols go to
    a new exporter once; after GIVE_UP_AFTER exporters in a row end unanswered, and when none can be started, the
    worker exports in line."""
    scripts = iter(["import sys; sys.stdin.readline(); sys.exit(3)", ANSWER])
    monkeypatch.setattr(behind, "exporter_command", lambda parent: [sys.executable, "-c", next(scripts)])
    log = Log()
    exports = behind.ExportsBehind(log)
    folders = ["/job/symbols/SYN000", "/job/symbols/SYN001"]
    assert handed(exports, folders) == {f: {"export": "ok"} for f in folders}  # the second exporter's answers
    assert any("2 symbol(s) it had not exported go to a new one" in line for line in log.lines)
    exports.settle(stop=lambda: False)
    monkeypatch.setattr(behind, "export_outcome", lambda folder: {"export": "in line"})
    fake_exporter(monkeypatch, "import sys; sys.exit(3)")
    exports = behind.ExportsBehind(log)
    first = handed(exports, folders)  # two exporters end unanswered: export errors
    assert all("ended (exit code 3)" in o["export_error"] for o in first.values())
    assert handed(exports, ["/job/symbols/SYN002"]) == {"/job/symbols/SYN002": {"export": "in line"}}  # the third
    assert exports.proc is None and any("export processes in a row ended without an answer" in line
                                        for line in log.lines)
    monkeypatch.setattr(behind, "exporter_command", lambda parent: ["/nonexistent/python"])
    exports = behind.ExportsBehind(log)
    assert handed(exports, ["/job/symbols/SYN003"]) == {"/job/symbols/SYN003": {"export": "in line"}}
    assert any("could not start an export process" in line for line in log.lines)


def test_a_stall_counts_from_the_exporters_last_answer_or_the_work_given_to_it_idle(monkeypatch):
    """An exporter idle longer than the stall limit (the worker trained a long cohort meanwhile), then given work it
    answers in time, is not taken for stuck; one that answers nothing for the limit is."""
    fake_exporter(monkeypatch, "import json, sys, time\n"
                               "for line in sys.stdin:\n"
                               "    time.sleep(0.8)\n"  # (longer than one of the wait's collects)
                               "    answer = {'folder': json.loads(line)['folder'], 'outcome': {}}\n"
                               "    print(json.dumps(answer), flush=True)\n")
    exports = behind.ExportsBehind(Log())
    assert handed(exports, ["/job/symbols/SYN000"]) == {"/job/symbols/SYN000": {}}
    time.sleep(1.2)  # idle, past the limit below
    outcomes = {}
    exports.submit("/job/symbols/SYN001", lambda outcome: outcomes.__setitem__("SYN001", outcome))
    assert exports.settle(stop=lambda: False, stall_s=1.0) == [] and outcomes == {"SYN001": {}}
    fake_exporter(monkeypatch, "import sys, time; sys.stdin.readline(); time.sleep(600)")
    exports.submit("/job/symbols/SYN002", lambda outcome: outcomes.__setitem__("SYN002", outcome))
    assert exports.settle(stop=lambda: False, stall_s=1.0) == []
    assert outcomes["SYN002"]["export_error"].startswith("the export process answered nothing for ")


def test_a_stuck_exporter_is_waited_for_less_while_the_job_stops_and_leaves_its_symbols_to_the_next_run(monkeypatch):
    """A job whose budget is spent (or that another worker stopped) does not wait STALL_S for an exporter that answers
    nothing: STOPPING_STALL_S of silence, then the exporter is ended and its symbols keep no marker."""
    fake_exporter(monkeypatch, "import sys, time; sys.stdin.readline(); time.sleep(600)")
    log, outcomes = Log(), {}
    exports = behind.ExportsBehind(log)
    exports.submit("/job/symbols/SYN000", lambda outcome: outcomes.__setitem__("SYN000", outcome))
    proc, started = exports.proc, time.monotonic()
    left = exports.settle(stop=lambda: False, stopping=lambda: True, stall_s=600.0, stopping_stall_s=1.0)
    assert left == ["/job/symbols/SYN000"]  # named by the worker's log, as after a signal
    assert time.monotonic() - started < 60 and outcomes == {} and proc.poll() is not None
    assert any("answered nothing for" in line and "left to the next run" in line for line in log.lines), log.lines


def test_a_stopped_job_leaves_a_stuck_exporters_symbols_unmarked_even_past_the_stall(monkeypatch):
    """Silent past STALL_S by the time the wait begins (stuck early while the training went on) and the job stopping
    (its budget spent during the wait): the stopped job's rule comes first, no export error is recorded (the
    stall's rule came first and gave the symbols markers)."""
    fake_exporter(monkeypatch, "import sys, time; sys.stdin.readline(); time.sleep(600)")
    outcomes = {}
    exports = behind.ExportsBehind(Log())
    exports.submit("/job/symbols/SYN000", lambda outcome: outcomes.__setitem__("SYN000", outcome))
    exports.busy_since -= 100  # silent 100 s already
    assert exports.settle(stop=lambda: False, stopping=lambda: True, stall_s=50.0, stopping_stall_s=1.0) == [
        "/job/symbols/SYN000"]
    assert outcomes == {}


def test_an_exporter_that_ends_as_the_job_stops_names_what_it_leaves_to_the_next_run(monkeypatch):
    """Its symbols keep no marker (left to the next run) and the worker can tell: `left_to_the_next_run`, so a
    budget spent during the wait is published as the job's stop even though the wait returned nothing left."""
    fake_exporter(monkeypatch, "import sys; sys.stdin.readline(); sys.exit(3)")
    outcomes, exports = {}, behind.ExportsBehind(Log())
    exports.submit("/job/symbols/SYN000", lambda outcome: outcomes.__setitem__("SYN000", outcome))
    assert exports.settle(stop=lambda: False, stopping=lambda: True, stall_s=60.0, stopping_stall_s=30.0) == []
    assert outcomes == {} and exports.left_to_the_next_run == ["/job/symbols/SYN000"]


def test_a_job_that_is_not_stopping_waits_for_a_slow_export_past_the_stopping_stall(monkeypatch):
    """The shorter wait is for a job that stops only: otherwise an export slower than STOPPING_STALL_S (the first of
    a process, on a loaded host) is waited for, up to STALL_S."""
    fake_exporter(monkeypatch, "import json, sys, time\n"
                               "line = sys.stdin.readline(); time.sleep(2)\n"
                               "print(json.dumps({'folder': json.loads(line)['folder'], 'outcome': {'export': 'ok'}}),"
                               " flush=True)\n")
    exports, outcomes = behind.ExportsBehind(Log()), {}
    exports.submit("/job/symbols/SYN000", lambda outcome: outcomes.__setitem__("SYN000", outcome))
    assert exports.settle(stop=lambda: False, stopping=lambda: False, stall_s=60.0, stopping_stall_s=0.5) == []
    assert outcomes == {"SYN000": {"export": "ok"}}


def test_a_stopped_wait_still_marks_the_answers_that_came_back(monkeypatch):
    fake_exporter(monkeypatch, ANSWER)
    exports, outcomes = behind.ExportsBehind(Log()), {}
    exports.submit("/job/symbols/SYN000", lambda outcome: outcomes.__setitem__("SYN000", outcome))
    wait_for_an_item(exports)
    assert exports.settle(stop=lambda: True) == [] and outcomes == {"SYN000": {"export": "ok"}}


@SLOW
def test_the_real_exporter_ignores_a_sigterm_of_its_own_and_is_ended_by_its_worker(tmp_path):
    """slurm and systemd signal every process: the worker, not the signal, ends its exporter."""
    exports = behind.ExportsBehind(Log())
    missing = tmp_path / "not-a-run"
    assert "export_error" in handed(exports, [str(missing)])[str(missing)]  # (answered: it is past its set-up)
    proc = exports.proc
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None
    assert exports.settle(stop=lambda: False) == [] and proc.poll() is not None


@SLOW
def test_exports_behind_give_the_same_files_and_markers_and_the_worker_trains_on_meanwhile(tmp_path, monkeypatch):
    """The same job exported in the worker and behind it: each symbol's model.onnx computes the same (the first
    symbol's graph exported, the others reusing it, in the exporter as in the worker; the bytes can differ in names
    where this process exported other graphs before) and its marker records its file. Behind, the worker exports
    nothing itself (its own export is made to fail here) and claims the next symbol before the first one's marker
    is written."""
    inline, behind_dir = tmp_path / "inline", tmp_path / "behind"
    assert main(["lstm", "train", *TINY, "--run-dir", str(inline)]) == 0

    def not_here(folder):
        raise AssertionError(f"the worker exported {folder} itself")

    monkeypatch.setattr(scheduler_mod, "export_outcome", not_here)
    assert main(["lstm", "train", *TINY, "--export-behind", "--run-dir", str(behind_dir)]) == 0
    other = markers(behind_dir)
    assert sorted(other) == SYMBOLS
    for s in SYMBOLS:
        folder = behind_dir / "symbols" / s
        info = json.loads((folder / "export.json").read_text())
        assert other[s]["status"] == "ok" and "export_error" not in other[s]
        assert other[s]["export"]["sha256"] == sha256_file(folder / "model.onnx")
        assert other[s]["export"]["max_abs_error"] < 1e-4
        assert onnx_output(folder / "model.onnx") == onnx_output(inline / "symbols" / s / "model.onnx")
        assert info["graph"] == ("exported" if s == "SYN000" else "reused")
        # the exporter keeps to one thread beside the training: torch's (the latency's record) and onnxruntime's
        assert info["latency_cpu"]["threads"] == 1 and info["parity"]["onnxruntime_threads"] == 1
        assert json.loads((folder / "results.json").read_text())["export"]["sha256"] == info["sha256"]
    rows = json.loads((behind_dir / "results.json").read_text())["symbols"]
    assert all(rows[s]["export"]["sha256"] == other[s]["export"]["sha256"] for s in SYMBOLS)
    lines = log_lines(behind_dir)
    assert any("exporting behind the training in process" in line for line in lines)
    assert first_line_with(lines, "SYN001: claimed") < first_line_with(lines, "SYN000: done in")
    inline_lines = log_lines(inline)  # in the worker: done (exported) before the next claim
    assert first_line_with(inline_lines, "SYN000: done in") < first_line_with(inline_lines, "SYN001: claimed")


@SLOW
def test_an_exporter_that_dies_leaves_export_errors_not_failed_symbols(tmp_path, monkeypatch):
    """In a cohort too: every member is marked done with the exporter's end as its export error, the job succeeds
    (the models trained), and `trainers lstm export` then exports them."""
    monkeypatch.setattr(behind, "exporter_command",
                        lambda parent: [sys.executable, "-c", "import sys; sys.stdin.readline(); sys.exit(3)"])
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", *TINY, "--cohort", "3", "--export-behind", "--run-dir", str(run_dir)]) == 0
    done = markers(run_dir)
    assert sorted(done) == SYMBOLS
    for s in SYMBOLS:
        assert done[s]["status"] == "ok" and "export" not in done[s]
        assert done[s]["export_error"] == "the export process ended (exit code 3) before exporting it"
    r = json.loads((run_dir / "results.json").read_text())
    assert r["training"]["symbols"]["ok"] == 3
    assert r["symbols"]["SYN001"]["export_error"] == done["SYN001"]["export_error"]
    assert any("the export process ended (exit code 3)" in line for line in log_lines(run_dir))
    assert any("3 of 3 symbols succeeded (3 not exported" in line for line in log_lines(run_dir))
    md = (run_dir / "results.md").read_text()  # it once said nothing of the missing ONNX files
    assert "0 pending (3 not exported)" in md and "## Not exported" in md
    assert "- SYN001: the export process ended (exit code 3)" in md
    assert main(["lstm", "export", "--run-dir", str(run_dir)]) == 0
    assert "Not exported" not in (run_dir / "results.md").read_text()
    assert all((run_dir / "symbols" / s / "model.onnx").is_file() for s in SYMBOLS)
    after = markers(run_dir)  # the markers say what the export is now (they kept the ended exporter's error)
    for s in SYMBOLS:
        assert "export_error" not in after[s] and after[s]["status"] == "ok"
        assert after[s]["export"]["sha256"] == sha256_file(run_dir / "symbols" / s / "model.onnx")
    r = json.loads((run_dir / "results.json").read_text())
    assert "export_error" not in r["symbols"]["SYN001"]


@SLOW
@pytest.mark.parametrize("exporter_dies", [False, True])
def test_a_signal_while_exports_wait_leaves_their_symbols_to_the_next_run(tmp_path, monkeypatch, restore_sigterm,
                                                                         exporter_dies):
    """SIGTERM while the worker waits for its exporter (one that never answers; or one that dies with the signal, its
    end read first): the exporter is ended, the symbols have no done marker and the job says it stopped on a signal;
    run again, each is finished where it ended (no step trained again) and exported."""
    fake_exporter(monkeypatch, "import sys, time; sys.stdin.read(); time.sleep(600)")
    real_collect, procs = behind.ExportsBehind.collect, []

    def signalled_while_waiting(self, wait_s=0.0, stopping=lambda: False):
        if wait_s > 0 and not procs:
            procs.append(self.proc)
            os.kill(os.getpid(), signal.SIGTERM)
            if exporter_dies:
                self.proc.kill()
                self.proc.wait()
                wait_for_an_item(self)
        return real_collect(self, wait_s, stopping)

    monkeypatch.setattr(behind.ExportsBehind, "collect", signalled_while_waiting)
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", *TINY, "--export-behind", "--run-dir", str(run_dir)]) == 0
    assert markers(run_dir) == {} and procs and procs[0].poll() is not None  # the exporter is gone
    r = json.loads((run_dir / "results.json").read_text())
    assert r["training"]["stop_reason"] == "signal" and r["training"]["symbols"]["ok"] == 0
    left = "as the job stopped; 3 trained symbol(s)" if exporter_dies else "3 trained symbol(s) stopped with the job"
    assert any(left in line for line in log_lines(run_dir))
    if exporter_dies:  # (the next run's part is the other case's)
        return
    steps = {s: json.loads((run_dir / "symbols" / s / "results.json").read_text())["training"]["steps"]
             for s in SYMBOLS}
    monkeypatch.setattr(behind.ExportsBehind, "collect", real_collect)
    assert main(["lstm", "train", *TINY, "--run-dir", str(run_dir)]) == 0  # (in the worker this time)
    done = markers(run_dir)
    assert sorted(done) == SYMBOLS and all(done[s]["export"]["sha256"] for s in SYMBOLS)
    assert {s: done[s]["steps"] for s in SYMBOLS} == steps  # finished where they ended


@SLOW
def test_a_gpu_deploys_defaults_export_behind_the_training(tmp_path):
    """--gpu-defaults rehearses a GPU deploy on the CPU: its exports go behind the training unless told not to."""
    for flags, expected in (([], True), (["--no-export-behind"], False)):
        run_dir = tmp_path / f"job{len(flags)}"
        assert main(["lstm", "train", *TINY, "--synthetic-tickers", "1", "--gpu-defaults", *flags,
                     "--run-dir", str(run_dir)]) == 0
        assert any("exporting behind the training in process" in line for line in log_lines(run_dir)) is expected
        assert json.loads((run_dir / "symbols" / "SYN000" / "done.json").read_text())["export"]["sha256"]


@SLOW
def test_an_exporter_silent_while_its_worker_waits_is_ended_and_its_symbols_get_export_errors(tmp_path, monkeypatch):
    """A stuck export (an exporter that answers nothing) does not hold the job for ever: after STALL_S of silence at
    the end the worker ends it, and the models, trained, are marked done with the reason."""
    fake_exporter(monkeypatch, "import sys, time; sys.stdin.readline(); time.sleep(600)")
    monkeypatch.setattr(scheduler_mod, "STALL_S", 1.0)
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", *TINY, "--export-behind", "--run-dir", str(run_dir)]) == 0
    done = markers(run_dir)
    assert sorted(done) == SYMBOLS
    assert all(done[s]["export_error"].startswith("the export process answered nothing for ") for s in SYMBOLS)


@SLOW
def test_a_budget_stop_with_a_stuck_exporter_ends_it_after_the_stopping_stall_and_marks_nothing(tmp_path, monkeypatch):
    """The job's time spent after its first symbol, its exporter stuck on that symbol's export: the job ends after
    STOPPING_STALL_S (not STALL_S, which would give the symbol an export error and a marker) with no marker, so the
    next run finishes and exports it."""
    fake_exporter(monkeypatch, "import sys, time; sys.stdin.readline(); time.sleep(600)")
    monkeypatch.setattr(scheduler_mod, "STALL_S", 60.0)
    monkeypatch.setattr(scheduler_mod, "STOPPING_STALL_S", 1.0)
    real_submit, spent = behind.ExportsBehind.submit, []

    def submit_then_spend_the_budget(self, folder, done):
        real_submit(self, folder, done)
        spent.append(folder)

    monkeypatch.setattr(behind.ExportsBehind, "submit", submit_then_spend_the_budget)
    monkeypatch.setattr(worker_mod.Worker, "elapsed_s", lambda self: 1e9 if spent else 0.0)
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", *TINY, "--cohort", "1", "--max-hours", "1", "--export-behind",
                 "--run-dir", str(run_dir)]) == 0
    assert len(spent) == 1 and markers(run_dir) == {}
    assert json.loads((run_dir / "results.json").read_text())["training"]["stop_reason"] == "time_budget"
    assert any("answered nothing for" in line and "left to the next run" in line for line in log_lines(run_dir))


@SLOW
def test_a_budget_spent_while_the_worker_waits_for_a_stuck_exporter_ends_the_wait_after_the_stopping_stall(
        tmp_path, monkeypatch):
    """Every symbol trained inside the budget, then the exporter stuck at the end: the wait counts in the job's time
    too, so once the budget is spent it is a stopped job's wait (STOPPING_STALL_S of silence, not STALL_S: the
    hostile test's 10.8-s budget ran 601.7 s and said "completed"); the symbols keep no marker, the summary says
    the budget."""
    fake_exporter(monkeypatch, "import sys, time; sys.stdin.readline(); time.sleep(600)")
    monkeypatch.setattr(scheduler_mod, "STALL_S", 30.0)
    monkeypatch.setattr(scheduler_mod, "STOPPING_STALL_S", 1.0)
    real_settle, waiting = behind.ExportsBehind.settle, []

    def settle_with_the_budget_spent(self, *args, **kwargs):
        waiting.append(time.monotonic())
        return real_settle(self, *args, **kwargs)

    monkeypatch.setattr(behind.ExportsBehind, "settle", settle_with_the_budget_spent)
    monkeypatch.setattr(worker_mod.Worker, "elapsed_s", lambda self: 1e9 if waiting else 0.0)
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", *TINY, "--max-hours", "1", "--export-behind", "--run-dir", str(run_dir)]) == 0
    assert len(waiting) == 1 and time.monotonic() - waiting[0] < 20  # the stopping stall, not STALL_S
    assert markers(run_dir) == {}
    assert json.loads((run_dir / "results.json").read_text())["training"]["stop_reason"] == "time_budget"
    assert any("answered nothing for" in line and "left to the next run" in line for line in log_lines(run_dir))


@SLOW
def test_a_broken_context_names_the_symbols_whose_export_is_still_running(tmp_path, monkeypatch):
    """SYN001 breaks the worker's context while SYN000's export runs behind: the error line names SYN001 pending and
    SYN000 trained with its export still running (the line said nothing of it), and, the exporter stuck as the job
    stops, SYN000 is left unmarked to the next run."""
    fake_exporter(monkeypatch, "import sys, time; sys.stdin.readline(); time.sleep(600)")
    monkeypatch.setattr(scheduler_mod, "STOPPING_STALL_S", 1.0)
    monkeypatch.setenv("TRAINERS_FAULT_RAISE", "SYN001@step2:lost")
    run_dir = tmp_path / "job"
    main(["lstm", "train", *TINY, "--cohort", "1", "--export-behind", "--run-dir", str(run_dir)])
    line = next(line for line in log_lines(run_dir) if "CUDA's context is broken" in line)
    assert "the job stops with SYN001 pending (SYN000: trained, marked done if its export ends, else left to the " \
           "next run)" in line, line
    assert markers(run_dir) == {}


@SLOW
def test_a_symbols_marker_is_written_as_its_export_comes_back_not_at_the_jobs_end(tmp_path, monkeypatch, exporters):
    """Between its claims the worker marks what its exporter has finished: a worker killed later keeps those symbols
    done. (The last claim waits here until the exporter has answered for the first symbol.)"""
    first_done_before_the_end, real_claim = [], scheduler_mod.claim_cohort

    def claim(queue, size, world_size):
        claims = real_claim(queue, size, world_size)
        if claims and claims[0][1] == "SYN002":
            wait_for_an_item(exporters[0])
        if not claims:  # the loop's end: what the claims' collects marked
            first_done_before_the_end.append((run_dir / "symbols" / "SYN000" / "done.json").exists())
        return claims

    monkeypatch.setattr(scheduler_mod, "claim_cohort", claim)
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", *TINY, "--export-behind", "--run-dir", str(run_dir)]) == 0
    assert first_done_before_the_end == [True] and sorted(markers(run_dir)) == SYMBOLS


@SLOW
def test_an_exporter_that_ends_as_the_job_stops_leaves_its_symbols_to_the_next_run(tmp_path, monkeypatch,
                                                                                  restore_sigterm):
    """The exporter gone and the job stopping on a signal (as when a whole process group is killed): not export
    errors (the symbol would be done without its ONNX file, and the next run would skip it) but no marker."""
    fake_exporter(monkeypatch, "import sys; sys.stdin.readline(); sys.exit(1)")
    real_submit = behind.ExportsBehind.submit

    def submit_then_signal(self, folder, done):
        real_submit(self, folder, done)
        if len(self.waiting) == 1 and self.proc is not None:  # the first: its exporter's end is read, then SIGTERM
            self.proc.wait(timeout=60)
            wait_for_an_item(self)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(behind.ExportsBehind, "submit", submit_then_signal)
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", *TINY, "--export-behind", "--run-dir", str(run_dir)]) == 0
    assert markers(run_dir) == {}
    assert json.loads((run_dir / "results.json").read_text())["training"]["stop_reason"] == "signal"
    assert any("as the job stopped" in line for line in log_lines(run_dir))
    monkeypatch.setattr(behind.ExportsBehind, "submit", real_submit)
    assert main(["lstm", "train", *TINY, "--run-dir", str(run_dir)]) == 0
    assert sorted(markers(run_dir)) == SYMBOLS and all(m["export"] for m in markers(run_dir).values())


@SLOW
def test_an_error_out_of_the_workers_loop_ends_its_exporter(tmp_path, monkeypatch, exporters):
    calls, real_claim = [], scheduler_mod.claim_cohort

    def claim(queue, size, world_size):
        calls.append(1)
        if len(calls) == 2:
            exporters[0].pid = exporters[0].proc.pid
            raise RuntimeError("the queue broke")
        return real_claim(queue, size, world_size)

    monkeypatch.setattr(scheduler_mod, "claim_cohort", claim)
    with pytest.raises(RuntimeError, match="the queue broke"):
        main(["lstm", "train", *TINY, "--export-behind", "--run-dir", str(tmp_path / "job")])
    assert exporters[0].proc is None
    with pytest.raises(ProcessLookupError):
        os.kill(exporters[0].pid, 0)
