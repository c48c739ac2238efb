"""trainers/launchers.py: each cluster launcher's environment read into one topology, every contradiction refused.

The variable names are the launchers' own (SLURM's sbatch/srun output environment, SkyPilot's, Kubeflow
Trainer's torch plugin and PyTorchJob's, dstack's runner). The shell side is in tests/e2e/test_launch.py."""

import pytest

from trainers.launchers import LauncherError, Topology, detect, main, settle


def hostnames(nodelist):  # what `scontrol show hostnames` prints for the lists these tests use
    return {"gpu[01-02]": ["gpu01", "gpu02"], "gpu[01-03]": ["gpu01", "gpu02", "gpu03"], "gpu01": ["gpu01"]}[nodelist]


SLURM = {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_NTASKS": "2",
         "SLURM_JOB_ID": "4711", "SLURM_GPUS_ON_NODE": "8"}
SKYPILOT = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n", "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NUM_GPUS_PER_NODE": "8", "SKYPILOT_TASK_ID": "sky-2026-12-02-abc_1"}
KUBEFLOW = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"}
PYTORCHJOB = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}
DSTACK = {"DSTACK_NODE_RANK": "1", "DSTACK_MASTER_NODE_IP": "10.1.0.2", "DSTACK_NODES_IPS": "10.1.0.2\n10.1.0.3",
          "DSTACK_NODES_NUM": "2", "DSTACK_GPUS_PER_NODE": "4", "DSTACK_RUN_NAME": "train-distrib"}


@pytest.mark.parametrize("env,expected", [
    (SLURM, Topology("slurm", 2, 1, "gpu01", 29500, 8, "4711")),
    (SKYPILOT, Topology("skypilot", 2, 1, "10.0.0.5", 29500, 8, "sky-2026-12-02-abc_1")),
    (KUBEFLOW, Topology("kubeflow", 2, 1, "job-node-0-0.job", 29400, None)),  # nproc "auto": the node's own GPUs
    (PYTORCHJOB, Topology("pytorchjob", 2, 1, "job-master-0", 23456)),
    (DSTACK, Topology("dstack", 2, 1, "10.1.0.2", 29500, 4, "train-distrib")),
])
def test_each_launcher_alone_gives_the_whole_topology(env, expected):
    assert detect(env, hostnames) == expected


def test_a_plain_box_has_no_launcher_and_a_torchrun_world_is_not_mistaken_for_a_pytorchjob():
    assert detect({}, hostnames) is None
    assert detect({"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2"}, hostnames) is None  # no RANK, no MASTER_PORT
    # the Kubeflow Trainer sets MASTER_ADDR/PORT beside PET_*: it is one launcher, not two that disagree
    both = {**KUBEFLOW, "MASTER_ADDR": "job-node-0-0.job", "MASTER_PORT": "29400", "WORLD_SIZE": "16", "RANK": "9"}
    assert detect(both, hostnames).launcher == "kubeflow"


def test_slurm_head_comes_from_scontrol_and_a_single_node_job_is_one_node():
    one = {"SLURM_JOB_NODELIST": "gpu01", "SLURM_NNODES": "1", "SLURM_NODEID": "0"}
    assert detect(one, hostnames) == Topology("slurm", 1, 0, "gpu01", 29500)


@pytest.mark.parametrize("env,needle", [
    ({**SLURM, "SLURM_NODEID": "2"}, "SLURM_NODEID=2 is not a node of a 2-node job (0..1)"),
    ({**SLURM, "SLURM_NNODES": "3"}, "SLURM_JOB_NODELIST='gpu[01-02]' names 2 node(s), SLURM_NNODES=3"),
    ({**SLURM, "SLURM_NTASKS": "16"}, "use srun --ntasks-per-node=1"),
    ({**SLURM, "SLURM_NNODES": "two"}, "SLURM_NNODES='two' is not a whole number >= 1"),
    ({**SKYPILOT, "SKYPILOT_NUM_NODES": "3"}, "SKYPILOT_NODE_IPS lists 2 address(es) for a 3-node job"),
    ({**SKYPILOT, "SKYPILOT_NODE_RANK": "-1"}, "SKYPILOT_NODE_RANK='-1' is not a whole number >= 0"),
    ({**KUBEFLOW, "PET_NODE_RANK": "2"}, "PET_NODE_RANK=2 is not a node of a 2-node job"),
    ({**KUBEFLOW, "PET_MASTER_ADDR": "a b"}, "PET_MASTER_ADDR='a b' is not a host name"),
    ({**KUBEFLOW, "PET_MASTER_ADDR": ""}, "PET_MASTER_ADDR='' is not a host name"),
    ({**PYTORCHJOB, "RANK": "5"}, "RANK=5 is not a node of a 2-node job"),
    ({**PYTORCHJOB, "MASTER_PORT": "0"}, "MASTER_PORT='0' is not a whole number >= 1"),
    ({**DSTACK, "DSTACK_MASTER_NODE_IP": "10.9.9.9"}, "DSTACK_MASTER_NODE_IP=10.9.9.9 is not one of DSTACK_NODES_IPS"),
    ({**DSTACK, "DSTACK_NODES_NUM": "3"}, "DSTACK_NODES_IPS lists 2 address(es) for a 3-node job"),
    ({**SLURM, **{**SKYPILOT, "SKYPILOT_NODE_RANK": "0"}}, "two launchers disagree: slurm: node 1 of 2"),
])
def test_an_environment_that_contradicts_itself_is_refused_naming_the_variable(env, needle):
    with pytest.raises(LauncherError) as err:
        detect(env, hostnames)
    assert needle in str(err.value)


def test_two_launchers_that_agree_are_one_job():  # SkyPilot on a SLURM cluster sets both
    assert detect({**SLURM, **SKYPILOT}, hostnames).launcher == "slurm"


def test_flags_re_aim_the_head_but_may_not_name_another_node_count_or_rank():
    found = detect(SLURM, hostnames)
    assert settle(found, "", "", "") == found
    assert settle(found, "2", "1", "") == found  # the same words as the launcher's: fine
    re_aimed = settle(found, "", "", "gpu01-ib:29600")
    assert (re_aimed.head, re_aimed.port, re_aimed.nnodes) == ("gpu01-ib", 29600, 2)
    with pytest.raises(LauncherError, match="--nnodes 4 contradicts slurm: node 1 of 2"):
        settle(found, "4", "", "")
    with pytest.raises(LauncherError, match="--node-rank 0 contradicts"):
        settle(found, "", "0", "")
    with pytest.raises(LauncherError, match="--rdzv-endpoint 'gpu01' must be HOST:PORT"):
        settle(found, "", "", "gpu01")
    with pytest.raises(LauncherError, match="port 70000 is not in 1..65535"):
        settle(found, "", "", "gpu01:70000")
    assert settle(None, "2", "1", "h:1") is None  # no launcher: the flags alone, checked by the deploy


def test_main_prints_key_value_lines_and_refuses_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr("trainers.launchers.scontrol_hostnames", hostnames)
    assert main([], env=SLURM) == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert lines == {"launcher": "slurm", "nnodes": "2", "node_rank": "1", "rdzv_endpoint": "gpu01:29500",
                     "gpus_per_node": "8", "job_id": "4711",
                     "summary": "slurm: node 1 of 2, head gpu01:29500, 8 GPU(s) per node, job 4711"}
    assert main([], env={}) == 0 and capsys.readouterr().out == ""
    assert main(["--nnodes", "3"], env=SKYPILOT) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --nnodes 3 contradicts skypilot: node 1 of 2")


def test_a_cluster_without_scontrol_runs_with_the_endpoint_flag(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main([], env=SLURM) == 2
    assert "scontrol is not on PATH" in capsys.readouterr().err
    assert main(["--rdzv-endpoint", "gpu01:29500"], env=SLURM) == 0
    assert "rdzv_endpoint=gpu01:29500" in capsys.readouterr().out
