"""`--remote URL`: a run folder mirrored to object storage and resumed from it on a fresh machine
(trainers.runtime.remote), against a real S3 server on loopback (moto's ThreadedMotoServer, the way s3fs
tests itself) and against file:// (a mounted volume).

The machine is "lost" the hard way: the process is SIGKILLed between a checkpoint's data and its meta on
the remote, the local folder is deleted, and the same command on a fresh folder must end equal to an
uninterrupted run (the loop contract's standard) from the newest complete remote checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

import pytest

from conftest import GPT_TINY, TINY_DATA, read_results, run_cli, run_torchrun

fsspec = pytest.importorskip("fsspec")
moto_server = pytest.importorskip("moto.server")

SECRET = "tEsT-SeCrEt-9f3a1c"  # the test credentials: must appear in no file the kit writes
KEY_ID = "AKIATESTKEYID0000001"


@pytest.fixture(scope="module")
def s3():
    """A real S3 endpoint on 127.0.0.1 (in this process, reachable from the runs' subprocesses)."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import boto3

    client = boto3.client("s3")

    class S3:
        def __init__(self):
            self.env, self.server, self.port = env, server, port

        def bucket(self) -> str:
            name = f"runs-{uuid.uuid4().hex[:10]}"
            client.create_bucket(Bucket=name)
            return name

        def fs(self):
            return fsspec.filesystem("s3", skip_instance_cache=True)

    yield S3()
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


FORECAST = [*TINY_DATA, "--epochs", "2", "--batch-size", "128", "--log-every", "5", "--max-steps", "16"]
FORECAST_EQUAL = [("training", "best_val", "value"), ("evaluation", "test", "model", "mse")]
GPT = [*GPT_TINY, "--batch-tokens", "1024", "--max-steps", "12", "--eval-every", "4", "--log-every", "2"]
GPT_EQUAL = [("training", "best_val", "value"), ("evaluation", "val_loss"), ("training", "stream")]


def dig(results: dict, path: tuple[str, ...]):
    for key in path:
        results = results[key]
    return results


def remote_names(fs, root: str) -> list[str]:
    fs.invalidate_cache()  # s3fs answers from its listing cache: the runs wrote since
    return sorted(p[len(root) + 1:] for p in fs.find(root))


def assert_no_credentials(*folders: Path) -> None:
    for folder in folders:
        for path in Path(folder).rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert SECRET.encode() not in data and KEY_ID.encode() not in data, path


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["forecast", "gpt"])
def test_a_lost_machine_resumes_from_the_bucket_to_the_uninterrupted_result(s3, tmp_path, trainer):
    """Rank 0 is SIGKILLed between step 8's data and meta on the remote (mid-upload; its machine is then
    lost: the local folder is deleted); the same command on a fresh folder pulls the newest complete
    remote checkpoint (step 4: the half-uploaded step 8 is never taken for complete) and ends equal to
    an uninterrupted run."""
    args, equal = (FORECAST, FORECAST_EQUAL) if trainer == "forecast" else (GPT, GPT_EQUAL)
    args = [*args, "--ckpt-every", "4"]
    bucket = s3.bucket()
    ref = tmp_path / "reference"
    run_torchrun([trainer, "train", *args, "--run-dir", str(ref), "--remote", f"s3://{bucket}/reference"], env=s3.env)
    lost = tmp_path / "lost"
    url = f"s3://{bucket}/run"
    killed = run_torchrun([trainer, "train", *args, "--run-dir", str(lost), "--remote", url], check=False,
                          env={**s3.env, "TRAINERS_FAULT_REMOTE": "kill-before-meta@step8"})
    assert killed.returncode != 0
    fs = s3.fs()
    names = remote_names(fs, f"{bucket}/run")
    assert "checkpoints/model_00000008.pt" in names and "checkpoints/meta_00000008.json" not in names, names
    assert "checkpoints/meta_00000004.json" in names
    shutil.rmtree(lost)  # the machine is gone

    fresh = tmp_path / "fresh"
    proc = run_torchrun([trainer, "train", *args, "--run-dir", str(fresh), "--remote", url], env=s3.env)
    assert f"resumed the run folder {fresh} from --remote {url}" in proc.stdout + proc.stderr
    assert "resumed from checkpoint step 4" in (fresh / "training.log").read_text()
    r, want = read_results(fresh), read_results(ref)
    assert r["training"]["stop_reason"] == "completed" and r["training"]["steps"] == want["training"]["steps"]
    for path in equal:
        assert dig(r, path) == pytest.approx(dig(want, path), rel=1e-5), path
    assert r["remote"]["caught_up"] and r["remote"]["url"] == url
    names = remote_names(fs, f"{bucket}/run")  # the remote holds the run folder's layout, complete
    assert {"config.json", "results.json", "metrics.jsonl", "training.log"} <= set(names)
    final = f"checkpoints/meta_{r['training']['steps']:08d}.json"
    assert final in names and "LEASE.json" not in names  # released: everything was uploaded
    remote_results = json.loads(fs.cat_file(f"{bucket}/run/results.json"))
    assert remote_results["remote"]["caught_up"] and remote_results["training"]["steps"] == r["training"]["steps"]
    mirror = tmp_path / "mirror"  # what the bucket holds, for the credentials check
    fs.get(f"{bucket}/run", str(mirror), recursive=True)
    assert_no_credentials(fresh, ref, mirror)


def small_forecast(tmp_path: Path, url: str, env: dict, *extra: str, name: str = "run", check: bool = True):
    proc = run_cli(["forecast", "train", *TINY_DATA, "--epochs", "1", "--batch-size", "256", "--ckpt-every", "4",
                    "--device", "cpu", "--run-dir", str(tmp_path / name), "--remote", url, *extra], env=env)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_mounted_volume_works_as_the_remote_and_a_truncated_checkpoint_is_passed_over(tmp_path):
    """file:// (a network volume): mirrored; then the newest remote model file is truncated, and a fresh
    folder resumes from the checkpoint before it (refused by its SHA-256), not from the broken one."""
    volume = tmp_path / "volume"
    volume.mkdir()  # (a mounted volume is there: a missing one is refused)
    url = f"file://{volume}/run"
    small_forecast(tmp_path, url, {})
    r = read_results(tmp_path / "run")
    last = r["training"]["steps"]
    remote = volume / "run" / "checkpoints"
    assert (remote / f"meta_{last:08d}.json").is_file() and r["remote"]["caught_up"]
    model = remote / f"model_{last:08d}.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])  # a partial object
    from trainers.runtime.remote_pull import pull_run

    said = []
    pulled = pull_run(url, tmp_path / "fresh", log=said.append)
    assert pulled and any(f"step {last} fails its SHA-256 check" in line for line in said), said
    local = sorted(p.name for p in (tmp_path / "fresh" / "checkpoints").glob("meta_*.json"))
    assert local and f"meta_{last:08d}.json" not in local  # the broken newest is not taken
    assert (tmp_path / "fresh" / "config.json").is_file()


def test_a_second_writer_is_refused_until_the_lease_is_stale(s3, tmp_path):
    bucket = s3.bucket()
    url = f"s3://{bucket}/run"
    fs = s3.fs()
    lease = {"host": "another-machine", "pid": 4242, "run_dir": "/workspace/run", "token": "abc", "time": time.time()}
    fs.pipe_file(f"{bucket}/run/LEASE.json", json.dumps(lease).encode())
    proc = small_forecast(tmp_path, url, s3.env, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "another-machine" in line and "pid 4242" in line and "lease" in line, line
    assert not (tmp_path / "run" / "config.json").exists()  # refused before anything was written
    lease["time"] = time.time() - 3600  # its holder went silent an hour ago: taken over
    fs.pipe_file(f"{bucket}/run/LEASE.json", json.dumps(lease).encode())
    small_forecast(tmp_path, url, s3.env)
    assert read_results(tmp_path / "run")["remote"]["caught_up"]


def refused_in_process(args: list[str], capsys) -> tuple[int, str]:
    """`trainers ARGS` in this process (a refusal happens before anything starts: no torch import to pay per
    case): its exit status and stderr."""
    from trainers.cli import main

    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    return code, capsys.readouterr().err


def test_bad_remote_urls_are_one_line_and_exit_2(tmp_path, capsys):
    """Refused before anything is written, the URL never printed with its credentials."""
    for url, says in (("not-a-url", "is not a URL"), ("nosuchscheme://bucket/x", "nosuchscheme"),
                      ("", "is empty"), ("file://", "file:///absolute/path"), ("file://relative/x", "three slashes"),
                      ("s3://", "names no bucket"), ("memory://user:SECRETVALUE@host/x", "credentials do not go"),
                      ("KEY:SECRETVALUE@bucket/x", "credentials do not go"), ("s3://K:S@b@bucket/x", "credentials")):
        code, err = refused_in_process(["forecast", "train", *TINY_DATA, "--run-dir", str(tmp_path / "r"),
                                        "--remote", url], capsys)
        assert code == 2 and "Traceback" not in err and says in err, (url, err)
        assert "SECRETVALUE" not in err and ":S@" not in err
        assert not (tmp_path / "r").exists()
    for args in (["status", "--remote", "s3://KEYID:SECRETVALUE@bucket/x"], ["status", "--remote", "s3://"],
                 ["push", "--remote", "file:///nonexistent-volume/x"],
                 ["push", "--run-dir", str(tmp_path), "--remote", "s3://KEYID:SECRETVALUE@bucket/x"]):
        code, err = refused_in_process(["remote", *args], capsys)
        assert code == 2 and "Traceback" not in err and "SECRETVALUE" not in err, (args, err)
        assert len(err.strip().splitlines()) == 1, err
    # one case through the real entry point: the exit status and the one line as a user's shell sees them
    proc = run_cli(["forecast", "train", *TINY_DATA, "--run-dir", str(tmp_path / "r"), "--remote",
                    "s3://bucket/x", "--walk-forward", "2"])
    assert proc.returncode == 2 and "--walk-forward" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_remote_that_holds_another_run_is_refused_and_nothing_is_written(tmp_path):
    """Another config: a fresh folder is not filled with it; a local run behind the remote's newest
    checkpoint is refused instead of overwriting the remote's history; a meta naming a file outside the
    run folder is refused; a lease that is JSON of the wrong shape holds nothing."""
    volume = tmp_path / "volume"
    volume.mkdir()  # (a mounted volume is there: a missing one is refused)
    url = f"file://{volume}/run"
    small_forecast(tmp_path, url, {})
    other = run_cli(["forecast", "train", *TINY_DATA, "--window", "16", "--epochs", "1", "--device", "cpu",
                     "--run-dir", str(tmp_path / "other"), "--remote", url])
    assert other.returncode == 2 and "different config" in other.stderr and "window" in other.stderr, other.stderr
    assert not (tmp_path / "other").exists()

    behind = tmp_path / "behind"  # the same run, its folder copied before the end: the remote is ahead
    shutil.copytree(tmp_path / "run", behind)
    for meta in sorted((behind / "checkpoints").glob("meta_*.json"))[-1:]:
        meta.unlink()
    newest = max(int(p.stem.split("_")[1]) for p in (volume / "run" / "checkpoints").glob("meta_*.json"))
    proc = small_forecast(tmp_path, url, {}, name="behind", check=False)
    assert proc.returncode == 2 and f"holds a newer checkpoint (step {newest})" in proc.stderr, proc.stderr
    assert max(int(p.stem.split("_")[1]) for p in (volume / "run" / "checkpoints").glob("meta_*.json")) == newest

    meta = volume / "run" / "checkpoints" / f"meta_{newest:08d}.json"
    record = json.loads(meta.read_text())
    record["files"]["../../../ESCAPED.txt"] = "0" * 64
    meta.write_text(json.dumps(record))
    (volume / "run" / "LEASE.json").write_text('{"time": "yesterday"}')
    from trainers.runtime.remote_pull import pull_run

    said = []
    pull_run(url, tmp_path / "fresh", log=said.append)
    assert not (tmp_path / "ESCAPED.txt").exists() and not list(tmp_path.rglob("ESCAPED.txt"))
    assert any("which is not a file of step" in line for line in said), said
    assert (volume / "run" / "checkpoints" / f"meta_{newest:08d}.json.unusable").exists()  # set aside, kept


class Outage:
    """A TCP proxy on loopback in front of the S3 server whose link can be cut: `down()` closes the
    listening socket and every open connection (what a lost network does to pooled keep-alive
    connections, which a stopped server thread would keep serving), `up()` listens again on the same port."""

    def __init__(self, target_port: int):
        import threading

        self.target = target_port
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.lock, self.conns, self.listener = threading.Lock(), [], None
        self.up()

    def up(self) -> None:
        import threading

        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(64)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def down(self) -> None:
        self.listener.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self.conns.clear()

    def _accept(self, listener) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.mark.slow
def test_the_store_going_away_mid_run_does_not_stop_training_and_the_mirror_catches_up(s3, tmp_path):
    """The link to the S3 server is cut after the first checkpoint is mirrored and comes back 4 s later:
    training goes on, the uploads retry, the end waits for the mirror, and results.json says it caught up
    (with the failures counted). A store unreachable at the start: refused in one line, nothing written."""
    import subprocess
    import sys

    link = Outage(s3.port)
    # one attempt per request: botocore's own retries would hide a 4 s outage; the kit's retries are tested
    env = {**s3.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{link.port}", "OMP_NUM_THREADS": "1",
           "AWS_MAX_ATTEMPTS": "1"}
    bucket = s3.bucket()
    fs = s3.fs()
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "trainers", "forecast", "train", *TINY_DATA, "--epochs", "4", "--batch-size", "64",
           "--ckpt-every", "20", "--device", "cpu", "--run-dir", str(run_dir), "--remote", f"s3://{bucket}/run",
           "--patience", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 120
        while not any("/meta_" in n for n in remote_names(fs, f"{bucket}/run")):
            assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint mirrored"
            time.sleep(0.2)
        link.down()
        time.sleep(4)
        link.up()
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        link.down()
    r = read_results(run_dir)
    assert r["remote"]["caught_up"] and r["remote"]["failures"] > 0, r["remote"]
    assert "upload failed" in (run_dir / "training.log").read_text()
    names = remote_names(fs, f"{bucket}/run")
    assert f"checkpoints/meta_{r['training']['steps']:08d}.json" in names and "results.json" in names

    gone = tmp_path / "gone"  # the link is down for good: refused at the start, nothing written
    ok = subprocess.run([*cmd[:cmd.index("--run-dir")], "--run-dir", str(gone), "--remote", f"s3://{bucket}/gone"],
                        capture_output=True, text=True, env={**os.environ, **env},
                        timeout=300, check=False)
    assert ok.returncode == 2 and "cannot be" in ok.stderr and "Traceback" not in ok.stderr, ok.stderr[-2000:]
    assert not (gone / "config.json").exists()


def test_an_lstm_job_resumes_from_a_mounted_volume_without_training_its_finished_symbols_again(tmp_path):
    """The job's own files and each symbol's run (<remote>/symbols/<symbol>) are mirrored; on a fresh folder
    the same command finds every symbol done (their markers came down with the job) and trains none."""
    url = f"file://{tmp_path / 'volume'}/job"
    (tmp_path / "volume").mkdir()  # (a mounted volume is there: a missing one is refused)
    args = ["lstm", "train", "--synthetic-tickers", "3", "--synthetic-days", "600", "--window", "16", "--hidden", "8",
            "--batch-size", "64", "--epochs", "1", "--no-export", "--remote", url]
    first = run_cli([*args, "--run-dir", str(tmp_path / "job")])
    assert first.returncode == 0, first.stderr[-3000:]
    volume = tmp_path / "volume" / "job"
    assert (volume / "results.json").is_file() and sorted(p.parent.name for p in volume.glob("symbols/*/done.json")) \
        == ["SYN000", "SYN001", "SYN002"]
    assert list(volume.glob("symbols/SYN001/checkpoints/meta_*.json")) and not list(volume.rglob("LEASE.json"))
    again = run_cli([*args, "--run-dir", str(tmp_path / "fresh")])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 to train" in again.stderr and read_results(tmp_path / "fresh")["training"]["symbols"]["ok"] == 3


def test_a_symbols_count_of_broken_cuda_contexts_follows_the_job_to_a_fresh_machine(tmp_path):
    """The count decides that a symbol breaking the context alone a second time is recorded failed
    (trainers.lstm.markers.remember_lost): it is mirrored with the job's markers, so a restore on a fresh folder
    keeps it instead of starting the count again."""
    url = f"file://{tmp_path / 'volume'}/job"
    (tmp_path / "volume").mkdir()  # (a mounted volume is there: a missing one is refused)
    args = ["lstm", "train", "--synthetic-tickers", "2", "--synthetic-days", "600", "--window", "16", "--hidden", "8",
            "--batch-size", "64", "--epochs", "1", "--no-export", "--remote", url]
    lost = {"TRAINERS_FAULT_RAISE": "SYN001@step1:lost"}
    first = run_cli([*args, "--run-dir", str(tmp_path / "job")], env=lost)
    assert first.returncode == 1 and "CUDA's context is broken" in first.stderr, first.stderr[-3000:]
    mirrored = tmp_path / "volume" / "job" / "symbols" / "SYN001" / "device_lost.json"
    assert json.loads(mirrored.read_text())["count"] == 1
    again = run_cli([*args, "--run-dir", str(tmp_path / "fresh")], env=lost)
    assert again.returncode == 1, again.stderr[-3000:]
    rows = read_results(tmp_path / "fresh")["symbols"]
    assert rows["SYN000"]["status"] == "ok" and rows["SYN001"]["status"] == "failed"
    assert "broke 2 times" in rows["SYN001"]["error"]


@pytest.mark.slow
def test_a_deploy_with_remote_reaches_a_verified_tarball_in_the_bucket_and_status_reads_it_from_anywhere(s3, tmp_path):
    import hashlib
    import subprocess
    import sys
    import tarfile

    root = Path(__file__).resolve().parents[2]
    bucket = s3.bucket()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "TRAINERS_FAULT"))}
    env.update(s3.env, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin", TRAINERS_PYTHON=sys.executable,
               OMP_NUM_THREADS="1", TRAINERS_REMOTE=f"s3://{bucket}/jobs")  # the container's way to pass it
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(root / "deploy_8gpu.sh"), "--out", str(out), "--trainer", "forecast", "--demo",
                           "--", *TINY_DATA, "--epochs", "1"], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"s3://{bucket}/jobs/forecast/package/forecast.tar.gz" in proc.stdout and "deploy finished" in proc.stdout
    fs = s3.fs()
    names = remote_names(fs, f"{bucket}/jobs/forecast")
    assert {"package/forecast.tar.gz", "package/forecast.tar.gz.sha256", "deploy.state", "results.json"} <= set(names)
    assert any(n.endswith(".onnx") for n in names), names  # the export phase's files went up too
    tarball = fs.cat_file(f"{bucket}/jobs/forecast/package/forecast.tar.gz")
    want = fs.cat_file(f"{bucket}/jobs/forecast/package/forecast.tar.gz.sha256").decode().split()[0]
    assert hashlib.sha256(tarball).hexdigest() == want
    (tmp_path / "down.tar.gz").write_bytes(tarball)
    with tarfile.open(tmp_path / "down.tar.gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path / "x" / "forecast", capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    state = dict(line.split("=", 1) for line in fs.cat_file(f"{bucket}/jobs/forecast/deploy.state").decode().splitlines())
    assert state["state"] == "finished"
    # status from "a laptop": no output folder, only the URL
    status = subprocess.run(["bash", str(root / "deploy_8gpu.sh"), "status", "--remote", f"s3://{bucket}/jobs/forecast"],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "deploy: forecast finished" in status.stdout and "training ended: completed" in status.stdout
    assert "newest complete checkpoint: step" in status.stdout
    assert_no_credentials(out, tmp_path / "x")
