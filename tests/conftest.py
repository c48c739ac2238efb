import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the repository
FAKES = ROOT / "tests" / "fakes"  # stand-ins for nvidia-smi and friends
sys.path.insert(0, str(FAKES / "accelerator"))  # fake_accelerator: CUDA's placement rules on the CPU

# The signal tests drive what a terminal or a container's PID 1 sees: SIGINT and SIGHUP at their defaults.
# A suite started as `nohup ...` or `cmd &` from a script inherits them ignored, and an ignored signal
# stays ignored in every child (bash cannot even trap it): the stop tests then failed for the launcher,
# not the kit. Put them back before any test or child starts.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)

# torch on one intra-op thread, unless the caller set its own, in the test processes and in every command they
# start, which inherit this environment (_env and the leak tier's guard_env no longer set it each): an xdist
# worker per core, each with a pool of a thread per core beside the other worker's torchrun jobs, spun against
# each other. CI's full pass at c26b079 spent 990 s in tests/lstm/test_lstm_cohort.py, which takes 23 s alone;
# that file and tests/leaks/test_leaks.py on two workers took 180 s, and 98 s on one thread each. Set before any
# test module imports torch, which reads it once.
os.environ.setdefault("OMP_NUM_THREADS", "1")

def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): one worker per CPU this process may run on, so `taskset -c 0` gets
    one (xdist's own count asks psutil, when installed, for the machine's CPUs and ignores the affinity).
    At most 8: each worker's tests start 2-process torchrun jobs of their own. PYTEST_XDIST_AUTO_NUM_WORKERS
    (xdist's own setting) still wins."""
    asked = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    return int(asked) if asked.isdigit() and int(asked) > 0 else max(1, min(len(os.sched_getaffinity(0)), 8))


# A market small enough for CPU tests: 16 tickers x 800 days, window 32, horizon 5.
TINY_DATA = ["--synthetic-tickers", "16", "--synthetic-days", "800", "--window", "32", "--horizon", "5",
             "--synthetic-momentum", "0.3"]

# A GPT small enough for CPU tests: depth 1 (dim 64, 4 heads of 16) on 64K characters of the synthetic
# Markov text, windows of 32; callers add --batch-tokens and an end.
GPT_TINY = ["--depth", "1", "--head-dim", "16", "--seq-len", "32", "--device-batch-size", "8", "--synthetic-chars",
            "65536", "--eval-tokens", "2048", "--sample-chars", "16", "--warmup-steps", "2"]


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.pop("TRAINERS_FAULT", None)
    env.update(extra or {})
    return env


# A subprocess's timeout bounds a hang, never a speed: generous enough for a 2-core machine that other jobs keep
# busy (a load average of 17 made a 300-s bound fail a test whose commands take 20 s on an idle machine).
HANG_S = 900


def run_cli(args: list[str], env: dict | None = None, timeout: float = HANG_S, check: bool = False):
    proc = subprocess.run([sys.executable, "-m", "trainers", *args], capture_output=True, text=True,
                          env=_env(env), timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"trainers {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def torchrun_cmd(args: list[str], nproc: int = 2, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            *(extra or []), "-m", "trainers", *args]


def run_torchrun(args: list[str], nproc: int = 2, extra: list[str] | None = None, env: dict | None = None,
                 timeout: float = HANG_S, check: bool = True):
    proc = subprocess.run(torchrun_cmd(args, nproc, extra), capture_output=True, text=True, env=_env(env),
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc


def read_results(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "results.json").read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def wait_for(predicate, timeout: float, proc: subprocess.Popen) -> None:
    """Poll `predicate` until true; fail if the process ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def tiny_data():
    return list(TINY_DATA)


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now (the OS picks it; a test binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving_in_thread(app, timeout: float = 30):
    """`app` (ASGI) served by uvicorn on a free localhost port in a thread of this process: its URL while inside."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not come up"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_until_serving(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Poll the server's /health until it answers; fail with its output if it exits or never comes up."""
    from trainers.gpt.loadtest import get

    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url + "/health", timeout=1)
            return
        except OSError:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
