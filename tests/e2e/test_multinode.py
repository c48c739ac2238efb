"""Several nodes as a cluster runs them, on one machine: each node a network namespace with its own address and host
name (tests/netns.py), a deploy started in each with only one launcher's environment set, 2 gloo workers per node.
The shared-disk runs give every node one output folder; the others give each node its own."""

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


def deploy_on_nodes(cluster, tmp_path, launcher, outs, *args, timeout=900):
    procs = [cluster.popen(rank, ["bash", str(ROOT / "deploy_8gpu.sh"), "--demo", "--out", str(outs[rank]), *args],
                           env=node_env(tmp_path, launcher_env(launcher, rank, cluster)), stdout=subprocess.PIPE,
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
        assert "FAILED in phase 'nodes'" in text and "==> [train]" not in text and "==> [data]" not in text
    assert not (outs[0] / "forecast").exists() and not (outs[1] / "forecast").exists()
    assert time.monotonic() - started < 120
