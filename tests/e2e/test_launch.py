"""Multi-node through the launchers users have: each launcher's environment alone makes deploy_8gpu.sh a node of
the right job (the torchrun line it would run), a contradiction stops it in one line, and the files in launch/
pass their tools' own checks."""

import pytest
from test_deploy import deploy

SCONTROL = {"scontrol": "#!/bin/sh\n[ \"$1 $2 $3\" = 'show hostnames gpu[01-02]' ] && printf 'gpu01\\ngpu02\\n'\n"}

LAUNCHERS = {
    "slurm": ({"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_NTASKS": "2",
               "SLURM_JOB_ID": "4711", "SLURM_GPUS_ON_NODE": "4"},
              "launcher slurm: node 1 of 2, head gpu01:29500, 4 GPU(s) per node, job 4711",
              "--nproc_per_node=4 --max-restarts=0 --nnodes=2 --node-rank=1 --rdzv-backend=c10d "
              "--rdzv-endpoint=gpu01:29500 --rdzv-id=trainers-forecast-4711 --rdzv-conf=is_host=false"),
    "skypilot": ({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6", "SKYPILOT_NUM_NODES": "2",
                  "SKYPILOT_NUM_GPUS_PER_NODE": "8", "SKYPILOT_TASK_ID": "sky-1"},
                 "launcher skypilot: node 0 of 2, head 10.0.0.5:29500, 8 GPU(s) per node, job sky-1",
                 "--nproc_per_node=8 --max-restarts=0 --nnodes=2 --node-rank=0 --rdzv-backend=c10d "
                 "--rdzv-endpoint=10.0.0.5:29500 --rdzv-id=trainers-forecast-sky-1 --rdzv-conf=is_host=true"),
    "kubeflow": ({"PET_NNODES": "3", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "2",
                  "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"},
                 "launcher kubeflow: node 2 of 3, head job-node-0-0.job:29400",
                 "--nproc_per_node=8 --max-restarts=0 --nnodes=3 --node-rank=2 --rdzv-backend=c10d "
                 "--rdzv-endpoint=job-node-0-0.job:29400 --rdzv-id=trainers-forecast --rdzv-conf=is_host=false"),
    "pytorchjob": ({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"},
                   "launcher pytorchjob: node 1 of 2, head job-master-0:23456",
                   "--nnodes=2 --node-rank=1 --rdzv-backend=c10d --rdzv-endpoint=job-master-0:23456"),
    "dstack": ({"DSTACK_NODE_RANK": "1", "DSTACK_MASTER_NODE_IP": "10.1.0.2", "DSTACK_NODES_IPS": "10.1.0.2\n10.1.0.3",
                "DSTACK_NODES_NUM": "2", "DSTACK_GPUS_PER_NODE": "8", "DSTACK_RUN_NAME": "train-distrib"},
               "launcher dstack: node 1 of 2, head 10.1.0.2:29500, 8 GPU(s) per node, job train-distrib",
               "--nnodes=2 --node-rank=1 --rdzv-backend=c10d --rdzv-endpoint=10.1.0.2:29500 "
               "--rdzv-id=trainers-forecast-train-distrib"),
}


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_the_launchers_environment_alone_makes_a_node_of_the_job(tmp_path, name):
    env, line, torchrun = LAUNCHERS[name]
    proc, _ = deploy(tmp_path, "--dry-run", env=env, extra_bins=SCONTROL)
    assert proc.returncode == 0, proc.stderr
    assert line in proc.stdout.splitlines()
    assert torchrun in proc.stdout
    packages = "trainers package" in proc.stdout
    assert packages == ("node-rank=0 " in proc.stdout)  # node 0 alone exports and packages


def test_the_launchers_gpus_are_the_ones_used_unless_gpus_says_otherwise(tmp_path):
    env = LAUNCHERS["slurm"][0]  # 4 GPUs of the job on a machine whose nvidia-smi lists 8
    proc, _ = deploy(tmp_path, "--dry-run", env=env, extra_bins=SCONTROL)
    assert "using 4 of 8 GPU(s)" in proc.stdout and "--expect-gpus 4" in proc.stdout
    proc, _ = deploy(tmp_path, "--dry-run", "--gpus", "2", env=env, extra_bins=SCONTROL)
    assert proc.returncode == 0 and "--nproc_per_node=2 " in proc.stdout
    proc, _ = deploy(tmp_path, "--dry-run", env={**env, "SLURM_GPUS_ON_NODE": "16"}, extra_bins=SCONTROL)
    assert proc.returncode == 2 and "--gpus 16 asked for, but this machine has 8 GPU(s)" in proc.stderr


def test_several_nodes_restart_nothing_unless_asked_and_a_bad_silence_bound_is_refused(tmp_path):
    env = LAUNCHERS["skypilot"][0]  # a restart would wait torchrun's join timeout (10 min) for a lost node
    proc, _ = deploy(tmp_path, "--dry-run", env=env)
    assert proc.returncode == 0 and "--max-restarts=0 --nnodes=2" in proc.stdout
    proc, _ = deploy(tmp_path, "--dry-run", "--max-restarts", "2", env=env)  # asked for: kept
    assert proc.returncode == 0 and "--max-restarts=2 --nnodes=2" in proc.stdout
    proc, _ = deploy(tmp_path, "--dry-run", env={**env, "MAX_RESTARTS": "1"})
    assert proc.returncode == 0 and "--max-restarts=1 --nnodes=2" in proc.stdout
    for bad in ("0", "-1", "soon", "nan", "9.5"):
        proc, _ = deploy(tmp_path, "--dry-run", env={**env, "TRAINERS_NODE_SILENCE_S": bad})
        assert proc.returncode == 2 and proc.stderr.strip() == (
            f"error: TRAINERS_NODE_SILENCE_S='{bad}' must be a number of seconds >= 10, e.g. 60")


def test_flags_re_aim_the_endpoint_and_a_contradicting_flag_is_refused_in_one_line(tmp_path):
    env = LAUNCHERS["skypilot"][0]
    proc, _ = deploy(tmp_path, "--dry-run", "--rdzv-endpoint", "10.9.0.5:29600", env=env)
    assert proc.returncode == 0 and "--rdzv-endpoint=10.9.0.5:29600" in proc.stdout
    for flags, needle in ((["--nnodes", "4"], "error: --nnodes 4 contradicts skypilot: node 0 of 2"),
                          (["--node-rank", "1"], "error: --node-rank 1 contradicts skypilot: node 0 of 2")):
        proc, out = deploy(tmp_path, "--dry-run", *flags, env=env)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [proc.stderr.strip()] and needle in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("env,needle", [
    ({**LAUNCHERS["dstack"][0], "DSTACK_NODE_RANK": "5"}, "DSTACK_NODE_RANK=5 is not a node of a 2-node job"),
    ({**LAUNCHERS["slurm"][0], "SLURM_NTASKS": "8"}, "use srun --ntasks-per-node=1"),
    ({**LAUNCHERS["slurm"][0], **LAUNCHERS["pytorchjob"][0], "RANK": "0"}, "two launchers disagree"),
])
def test_an_environment_that_contradicts_itself_stops_the_deploy_before_anything_runs(tmp_path, env, needle):
    proc, out = deploy(tmp_path, "--dry-run", env=env, extra_bins=SCONTROL)
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()  # not even the log: nothing was started


def test_a_slurm_job_whose_scontrol_fails_asks_for_nothing_more_than_the_endpoint_flag(tmp_path):
    env, broken = LAUNCHERS["slurm"][0], {"scontrol": "#!/bin/sh\necho 'slurm_load_ctl_conf error' >&2; exit 1\n"}
    proc, _ = deploy(tmp_path, "--dry-run", env=env, extra_bins=broken)
    assert proc.returncode == 2 and "scontrol show hostnames 'gpu[01-02]' failed" in proc.stderr
    proc, _ = deploy(tmp_path, "--dry-run", "--rdzv-endpoint", "gpu01:29500", env=env, extra_bins=broken)
    assert proc.returncode == 0 and "--rdzv-endpoint=gpu01:29500" in proc.stdout
