"""How a `python -m trainers` process ends (`runtime.leave.leave`, which `trainers.cli.run` calls): once torch is
loaded, without the interpreter's teardown (runtime/leave.py: 0.8 s of CPU a process, and gloo's threads that
abort a completed worker when they outlive it), after everything else a normal exit does."""

import subprocess
import sys
from pathlib import Path

from conftest import _env, free_port

SCRIPT = """
import atexit, os, sys, threading, time
from trainers.runtime.leave import leave

class Teardown:
    def __del__(self):  # runs only if the interpreter tears down __main__
        os.write(1, b"teardown ran\\n")

def late_writer():
    time.sleep(0.5)
    print("non-daemon thread finished")

marker = Teardown()
atexit.register(lambda: print("atexit ran"))
mode = sys.argv[1]
if mode in ("torch", "group"):
    import torch  # noqa: F401
if mode == "group":
    from trainers.runtime.dist import all_reduce_sum, distributed
    with distributed("cpu") as ctx:
        assert ctx.distributed and all_reduce_sum(ctx, [2.0]) == [2.0]
threading.Thread(target=late_writer).start()
kept = open(sys.argv[2], "w", buffering=1 << 20)  # never closed: teardown would have flushed it
kept.write("written before leaving")
sys.stdout.write("buffered, no newline")
leave(3)
"""


def _run(mode: str, tmp_path) -> tuple[subprocess.CompletedProcess, str]:
    port = free_port()
    env = _env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "exit-test"})
    kept = tmp_path / "kept.txt"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(kept)], capture_output=True, text=True, env=env,
                          timeout=120)
    return proc, kept.read_text() if kept.exists() else ""


def _did_what_an_exit_does(proc: subprocess.CompletedProcess, kept: str) -> None:
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "non-daemon thread finished" in proc.stdout and "atexit ran" in proc.stdout, proc.stdout
    assert "buffered, no newline" in proc.stdout and kept == "written before leaving", (proc.stdout, kept)


def test_a_process_that_ran_a_process_group_leaves_without_teardown(tmp_path):
    proc, kept = _run("group", tmp_path)
    _did_what_an_exit_does(proc, kept)
    assert "teardown ran" not in proc.stdout, proc.stdout


def test_a_process_with_torch_loaded_leaves_without_teardown(tmp_path):
    proc, kept = _run("torch", tmp_path)
    _did_what_an_exit_does(proc, kept)
    assert "teardown ran" not in proc.stdout, proc.stdout


def test_a_process_without_torch_exits_the_ordinary_way(tmp_path):
    proc, kept = _run("plain", tmp_path)
    _did_what_an_exit_does(proc, kept)
    assert "teardown ran" in proc.stdout, proc.stdout


def test_a_file_that_cannot_be_written_out_is_named_and_the_exit_is_not_0():
    """Normal teardown would print "Exception ignored" and still exit 0 for a file whose last buffer could not be
    written: here the file is named and a successful run's exit becomes 1."""
    script = ("import torch, sys\nfrom trainers.runtime.leave import leave\n"
              "full = open('/dev/full', 'w', buffering=1 << 16)\nfull.write('x')\nleave(0)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: could not write out /dev/full: No space left on device"


def test_python_m_trainers_ends_through_leave_and_a_reader_leaving_is_not_an_error():
    """Both entry points: `python -m trainers` (torchrun's) and the `trainers` script. `plan` loads torch; its
    table written to a full device is named and exits 1 (teardown's way: exit 120 and a traceback), and written
    into a pipe whose reader has gone exits 0 like any other `trainers ... | head`."""
    import shutil

    env = {k: v for k, v in _env().items() if k != "PYTHONUNBUFFERED"}  # the table stays buffered to the end
    script = shutil.which("trainers", path=str(Path(sys.executable).parent))
    for command in ([sys.executable, "-m", "trainers"], [script]):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([*command, "plan", "--trainer", "ppo", "--gpus", "1"], stdout=full,
                                  stderr=subprocess.PIPE, text=True, env=env, timeout=120)
        assert proc.returncode == 1 and "could not write out <stdout>: No space left" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    reader = subprocess.run(["bash", "-c", f"{sys.executable} -m trainers plan --trainer ppo --gpus 1 | true; "
                             "echo ${PIPESTATUS[0]}"], capture_output=True, text=True, env=env, timeout=120)
    assert reader.stdout.strip() == "0" and "Traceback" not in reader.stderr, reader.stderr
