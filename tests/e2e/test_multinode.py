"""Several nodes as a cluster runs them, on one machine: each node a network namespace with its own address and host
name (tests/netns.py), a deploy started in each with only one launcher's environment set, 2 gloo workers per node.
The shared-disk runs give every node one output folder; the others give each node its own."""

import os
import signal
import subprocess
import sys
import time

import pytest
from netns import Cluster, can_make_namespaces
from test_deploy import bin_dir, clean_env, verify_tarball

from conftest import ROOT, TINY_DATA, read_results

pytestmark = pytest.mark.skipif(can_make_namespaces() is not None, reason=str(can_make_namespaces()))

SCONTROL = {"scontrol": "#!/bin/sh\n[ \"$1 $2 $3\" = 'show hostnames node[0-1]' ] && printf 'node0\\nnode1\\n'\n"}


def launcher_env(launcher: str, rank: int, cluster: Cluster) -> dict:
    return {
        "slurm": {"SLURM_JOB_NODELIST": "node[0-1]", "SLURM_NNODES": "2", "SLURM_NODEID": str(rank),
                  "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77"},
        "skypilot": {"SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": "\n".join(cluster.addresses),
                     "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "0", "SKYPILOT_TASK_ID": "sky-77"},
        "kubeflow": {"PET_NNODES": "2", "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": "auto",
                     "PET_MASTER_ADDR": "node0", "PET_MASTER_PORT": "29400"},
        "dstack": {"DSTACK_NODE_RANK": str(rank), "DSTACK_NODES_NUM": "2", "DSTACK_MASTER_NODE_IP": cluster.addresses[0],
                   "DSTACK_NODES_IPS": "\n".join(cluster.addresses), "DSTACK_RUN_NAME": "run-77"},
    }[launcher]


def node_env(tmp_path, extra: dict) -> dict:
    env = clean_env()
    env.update(PATH=bin_dir(tmp_path, extra=SCONTROL), FAKE_GPUS="0", TRAINERS_PYTHON=sys.executable,
               OMP_NUM_THREADS="1", TRAINERS_NODES_TIMEOUT_S="120", **extra)
    return env


def deploy_on_nodes(cluster, tmp_path, launcher, outs, *args, timeout=900, extra=None):
    procs = [cluster.popen(rank, ["bash", str(ROOT / "deploy_8gpu.sh"), "--demo", "--out", str(outs[rank]), *args],
                           env={**node_env(tmp_path, launcher_env(launcher, rank, cluster)), **(extra or {})},
                           stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
             for rank in range(len(outs))]
    return [p.communicate(timeout=timeout)[0] for p in procs], [p.returncode for p in procs]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["slurm", "skypilot", "kubeflow"])
def test_a_launchers_environment_alone_runs_a_two_node_deploy_on_a_shared_folder(tmp_path, launcher):
    out = tmp_path / "shared"
    with Cluster(2) as cluster:
        outputs, codes = deploy_on_nodes(cluster, tmp_path, launcher, [out, out], "--", *TINY_DATA, "--epochs", "1")
    assert codes == [0, 0], outputs[0][-4000:] + "\n----- node 1\n" + outputs[1][-4000:]
    assert f"launcher {launcher}: node 0 of 2" in outputs[0] and f"launcher {launcher}: node 1 of 2" in outputs[1]
    assert "nodes: all 2 met (0:node0, 1:node1)" in outputs[0]
    r = read_results(out / "forecast")
    assert r["training"]["world_size"] == 4 and r["training"]["stop_reason"] == "completed"
    inside = verify_tarball(tmp_path, out, "forecast")  # one tarball, node 0's
    assert (inside / "results.json").is_file() and list(inside.rglob("model.onnx"))
    assert "node 1: packaging runs on node 0" in outputs[1] and (out / "deploy-forecast.node1.log").is_file()
    assert "deploy finished" in (out / "deploy-forecast.log").read_text()


@pytest.mark.slow
def test_nodes_that_share_no_disk_are_refused_before_any_data_or_training(tmp_path):
    outs = [tmp_path / "node0" / "output", tmp_path / "node1" / "output"]
    started = time.monotonic()
    with Cluster(2) as cluster:
        outputs, codes = deploy_on_nodes(cluster, tmp_path, "dstack", outs, "--", *TINY_DATA, timeout=300)
    assert codes == [2, 2], outputs
    for text in outputs:
        assert "node 1 (node1) cannot see node 0's output folder" in text and "share no disk" in text
        assert "or give --remote URL" in text  # the two fixes, in one line
        assert "FAILED in phase 'nodes'" in text and "==> [train]" not in text and "==> [data]" not in text
    assert not (outs[0] / "forecast").exists() and not (outs[1] / "forecast").exists()
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_the_lstm_on_nodes_apart_is_refused_even_with_a_remote(tmp_path):
    outs = [tmp_path / "node0" / "output", tmp_path / "node1" / "output"]
    with Cluster(2) as cluster:
        outputs, codes = deploy_on_nodes(cluster, tmp_path, "dstack", outs, "--trainer", "lstm", "--remote",
                                         f"file://{tmp_path / 'volume'}", timeout=300)
    assert codes == [2, 2], outputs
    for text in outputs:
        assert "--trainer lstm on several nodes needs a shared --out" in text and "==> [train]" not in text
    pushed = sorted(p.relative_to(tmp_path / "volume").as_posix() for p in (tmp_path / "volume").rglob("*")
                    if p.is_file())
    assert pushed == ["lstm/deploy.state"]  # the failed deploy's state, for `status --remote`; no run


SILENCE_S = 20  # TRAINERS_NODE_SILENCE_S for these runs
LOSS_BOUND_S = SILENCE_S + 30  # the kit's stated bound (docs/deploy.md): the silence, one beat, the others' settling


def wait_for_checkpoint(run_dir, step: int, procs, timeout=300):
    deadline = time.monotonic() + timeout
    while not (run_dir / "checkpoints" / f"meta_{step:08d}.json").is_file():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no checkpoint came"
        time.sleep(0.2)


def start_deploys(cluster, tmp_path, out, args, extra_env=None):
    env = [{**node_env(tmp_path, launcher_env("skypilot", rank, cluster)), "TRAINERS_NODE_SILENCE_S": str(SILENCE_S),
            **(extra_env or {})} for rank in range(2)]
    return [cluster.popen(rank, ["bash", str(ROOT / "deploy_8gpu.sh"), "--demo", "--out", str(out), *args],
                          env=env[rank], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in range(2)]


LONG = ["--", *TINY_DATA, "--epochs", "20"]  # 140 steps, a checkpoint every 7


@pytest.mark.slow
def test_a_killed_node_ends_the_survivor_within_the_bound_and_every_nodes_rerun_resumes_to_the_same_end(tmp_path):
    with Cluster(2) as cluster:  # the same job, never interrupted
        outputs, codes = deploy_on_nodes(cluster, tmp_path, "skypilot", [tmp_path / "ref"] * 2, *LONG)
    assert codes == [0, 0], outputs[0][-3000:]
    reference = read_results(tmp_path / "ref" / "forecast")["training"]

    out = tmp_path / "shared"
    with Cluster(2) as cluster:
        procs = start_deploys(cluster, tmp_path, out, LONG)
        wait_for_checkpoint(out / "forecast", 14, procs)
        assert cluster.kill(1) > 0
        killed_at = time.monotonic()
        said = procs[0].communicate(timeout=2 * LOSS_BOUND_S)[0]
        took = time.monotonic() - killed_at
        status = subprocess.run(cluster.command(0, [sys.executable, "-m", "trainers", "status", "--out", str(out),
                                                    "--trainer", "forecast"]), capture_output=True, text=True)
    assert procs[0].returncode == 75 and took < LOSS_BOUND_S, (took, said[-3000:])
    assert "node 1 (node1) was lost: its deploy ended without finishing" in said
    assert "rerun the same command on every node to resume" in said
    assert "node 1 (node1): lost in phase train" in status.stdout, status.stdout + status.stderr
    assert "node 0 (node0): failed in phase train" in status.stdout
    assert not (out / "forecast.tar.gz").exists()

    with Cluster(2) as cluster:  # new addresses (a new subnet), the same command on every node
        assert cluster.addresses[0] not in said
        outputs, codes = deploy_on_nodes(cluster, tmp_path, "skypilot", [out, out], *LONG)
    assert codes == [0, 0], outputs[0][-3000:] + "\n----- node 1\n" + outputs[1][-3000:]
    resumed = read_results(out / "forecast")["training"]
    assert resumed["world_size"] == 4 and resumed["stop_reason"] == reference["stop_reason"]  # (both stop early)
    assert resumed["steps"] == reference["steps"]
    assert "resumed from checkpoint step" in (out / "forecast" / "training.log").read_text()
    for key in ("best_val", "last_val"):  # the CPU's resume is exact (the loop contract's 1e-5)
        ref_value = reference[key]["value"] if key == "best_val" else reference[key]
        got = resumed[key]["value"] if key == "best_val" else resumed[key]
        assert got == pytest.approx(ref_value, rel=1e-5), key
    verify_tarball(tmp_path, out, "forecast")


@pytest.mark.slow
def test_a_frozen_node_ends_the_survivor_within_the_bound_naming_its_silence(tmp_path):
    out = tmp_path / "shared"
    with Cluster(2) as cluster:
        procs = start_deploys(cluster, tmp_path, out, LONG)
        wait_for_checkpoint(out / "forecast", 7, procs)
        for pid in cluster.pids(1):  # a node that hangs (or whose network goes) closes no socket
            os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        said = procs[0].communicate(timeout=2 * LOSS_BOUND_S)[0]
        took = time.monotonic() - frozen_at
    assert procs[0].returncode == 75 and took < LOSS_BOUND_S, (took, said[-3000:])
    assert said.count(f"error: node 1 (node1) went silent: no heartbeat for {SILENCE_S} s") == 1  # its first worker
    assert f"error: training stopped on node 0 (rc 1): node 1 (node1) went silent: no heartbeat for {SILENCE_S} s" in said


@pytest.fixture
def s3_on_the_bridge():
    """A real S3 endpoint (moto) on a cluster's bridge address: what the nodes reach, and nothing else."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import boto3

    def start(cluster):
        server = moto_server.ThreadedMotoServer(ip_address=cluster.head_address, port=0, verbose=False)
        server.start()
        servers.append(server)
        host, port = server.get_host_and_port()
        env = {"AWS_ACCESS_KEY_ID": "AKIATESTKEYID0000001", "AWS_SECRET_ACCESS_KEY": "test-secret",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1"
                     ).create_bucket(Bucket="runs")
        return env

    servers = []
    yield start
    for server in servers:
        server.stop()


def remote_holds(env: dict, key: str) -> bool:
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    return client.list_objects_v2(Bucket="runs", Prefix=key).get("KeyCount", 0) > 0


@pytest.mark.slow
def test_nodes_without_a_shared_disk_train_through_the_remote_and_fresh_nodes_resume_from_it(tmp_path,
                                                                                               s3_on_the_bridge):
    with Cluster(2) as cluster:
        s3 = s3_on_the_bridge(cluster)
        outs = [tmp_path / "ref0" / "output", tmp_path / "ref1" / "output"]  # the same job, never interrupted
        outputs, codes = deploy_on_nodes(cluster, tmp_path, "slurm", outs, "--remote", "s3://runs/ref", *LONG,
                                         extra=s3)
        assert codes == [0, 0], outputs[0][-3000:] + "\n----- node 1\n" + outputs[1][-3000:]
        assert "node 1 (node1) cannot see node 0's output folder, so node 0's run folder is the job's" in outputs[0]
        reference = read_results(outs[0] / "forecast")["training"]
        assert reference["world_size"] == 4
        verify_tarball(tmp_path, outs[0], "forecast")  # node 0's, the only one
        assert not (outs[1] / "forecast.tar.gz").exists() and "node 1: packaging runs on node 0" in outputs[1]
        node1 = outs[1] / "forecast" / "checkpoints"  # the other node keeps copies of the metas, no state
        assert sorted(p.name[5:13] for p in node1.glob("meta_*.json")) == \
            sorted(p.name[5:13] for p in (outs[0] / "forecast" / "checkpoints").glob("meta_*.json"))
        assert not list(node1.glob("*.pt"))

        outs = [tmp_path / "node0" / "output", tmp_path / "node1" / "output"]
        procs = [cluster.popen(rank, ["bash", str(ROOT / "deploy_8gpu.sh"), "--demo", "--out", str(outs[rank]),
                                      "--remote", "s3://runs/job", *LONG],
                               env={**node_env(tmp_path, launcher_env("slurm", rank, cluster)), **s3,
                                    "TRAINERS_NODE_SILENCE_S": str(SILENCE_S)},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
        deadline = time.monotonic() + 300
        while not remote_holds(s3, "job/forecast/checkpoints/meta_00000014.json"):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no checkpoint on the remote"
            time.sleep(0.5)
        assert cluster.kill(0) > 0  # node 0, with the only complete copy of the run on a disk, is gone
        killed_at = time.monotonic()
        said = procs[1].communicate(timeout=2 * LOSS_BOUND_S)[0]
        assert procs[1].returncode != 0 and time.monotonic() - killed_at < LOSS_BOUND_S, said[-3000:]

        cluster.replace(0)  # two fresh machines: new addresses, empty disks, the same command
        cluster.replace(1)
        outs = [tmp_path / "fresh0" / "output", tmp_path / "fresh1" / "output"]
        outputs, codes = deploy_on_nodes(cluster, tmp_path, "slurm", outs, "--remote", "s3://runs/job", *LONG,
                                         extra=s3)
    assert codes == [0, 0], outputs[0][-3000:] + "\n----- node 1\n" + outputs[1][-3000:]
    assert "from --remote s3://runs/job/forecast" in outputs[0]
    resumed = read_results(outs[0] / "forecast")["training"]
    assert "resumed from checkpoint step" in (outs[0] / "forecast" / "training.log").read_text()
    assert resumed["world_size"] == 4 and resumed["steps"] == reference["steps"]
    assert resumed["stop_reason"] == reference["stop_reason"]
    for key in ("best_val", "last_val"):  # the CPU's resume is exact (the loop contract's 1e-5)
        ref_value = reference[key]["value"] if key == "best_val" else reference[key]
        got = resumed[key]["value"] if key == "best_val" else resumed[key]
        assert got == pytest.approx(ref_value, rel=1e-5), key
    verify_tarball(tmp_path, outs[0], "forecast")
