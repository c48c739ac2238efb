"""FSDP2 on two "nodes" without a shared disk: two torchrun agents on loopback (c10d rendezvous, one worker each, no
restarts, as the deploy runs several nodes), each with its own run folder, TRAINERS_RUN_DIR_APART=1 and the node rank
the deploy gives it. Node 1 is SIGKILLed mid-run; its disk is emptied (a replacement machine) and the same command
is run again on both: the job resumes from node 0's folder, where every rank's shards are, and ends with the
uninterrupted run's numbers. Node 1's agent is started first each time, so c10d's own numbering (by host name, then
pid) would put rank 0 on node 1: the ranks follow the deploy's node ranks (trainers.runtime.dist.rank_by_deploy_node)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GPT_TINY, HANG_S, _env, free_port, read_results

pytestmark = pytest.mark.slow

RUN = ["gpt", "train", *GPT_TINY, "--batch-tokens", "512", "--max-steps", "60", "--eval-every", "20",
       "--ckpt-every", "10", "--parallel", "fsdp", "--log-every", "10"]


def two_nodes(base: Path, apart: bool, fault: str = "", by_node: bool = True) -> list[subprocess.CompletedProcess]:
    port, procs = free_port(), {}
    base.mkdir(parents=True, exist_ok=True)
    for node in (1, 0):  # (node 1 first: see the module's docstring)
        run_dir = base / f"node{node if apart else 0}" / "run"
        env = _env({"TRAINERS_NODE_RANK": str(node), "TRAINERS_RANKS_BY_NODE": str(int(by_node)),
                    "TRAINERS_RUN_DIR_APART": "1" if apart else "0", "TRAINERS_FAULT": fault})
        with open(base / f"out{node}.log", "w") as log:
            procs[node] = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                 "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--max-restarts=0",
                 "-m", "trainers", *RUN, "--run-dir", str(run_dir)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        codes = {node: proc.wait(timeout=HANG_S) for node, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
    return [subprocess.CompletedProcess(procs[n].args, codes[n], (base / f"out{n}.log").read_text(), "") for n in (0, 1)]


def training(run_dir: Path) -> dict:
    t = read_results(run_dir)["training"]
    return {k: t[k] for k in ("steps", "stop_reason", "world_size", "best_val", "last_val")}


def test_fsdp2_apart_resumes_on_a_replaced_node_to_the_uninterrupted_runs_numbers(tmp_path):
    reference = two_nodes(tmp_path / "shared", apart=False)
    assert [p.returncode for p in reference] == [0, 0], reference[0].stdout[-3000:]

    base = tmp_path / "apart"
    killed = two_nodes(base, apart=True, fault="sigkill@rank1:step35")
    assert killed[1].returncode != 0 and killed[0].returncode != 0
    node0, node1 = base / "node0" / "run" / "checkpoints", base / "node1" / "run" / "checkpoints"
    meta = json.loads((node0 / "meta_00000030.json").read_text())
    assert {"shards_00000030/__0_0.distcp", "shards_00000030/__1_0.distcp"} <= set(meta["files"])
    assert all((node0 / name).is_file() for name in meta["files"])  # rank 1's part too, on node 0's disk
    assert not list(node1.glob("shards_*")) and not list(node1.glob("*.pt"))  # node 1 keeps metas only

    shutil.rmtree(base / "node1")  # a replacement machine: an empty disk
    again = two_nodes(base, apart=True)
    assert [p.returncode for p in again] == [0, 0], again[0].stdout[-3000:] + again[1].stdout[-3000:]
    assert "resumed from checkpoint step 30" in again[0].stdout
    assert training(base / "node0" / "run") == training(tmp_path / "shared" / "node0" / "run")
    assert not (base / "node1" / "run" / "results.json").exists()  # node 0's folder is the job's
    assert not list(node1.glob("shards_*"))


def test_nodes_apart_numbered_by_torchrun_with_rank_0_on_node_1_are_refused_before_training(tmp_path):
    said = two_nodes(tmp_path, apart=True, by_node=False)  # (node 1's agent first: c10d gives it rank 0)
    assert [p.returncode for p in said] != [0, 0]
    assert "without a shared disk rank 0 must run on node 0" in said[1].stdout + said[0].stdout
    assert "runs on node 1" in said[1].stdout + said[0].stdout
    assert not list(tmp_path.rglob("meta_*.json"))  # refused before any checkpoint


def test_the_ranks_follow_the_deploys_node_ranks_whatever_order_c10d_gives_the_nodes(monkeypatch):
    from trainers.runtime.dist import rank_by_deploy_node

    said = {"GROUP_WORLD_SIZE": "2", "RANK": "0", "TRAINERS_NODE_RANK": "1", "TRAINERS_RANKS_BY_NODE": "1",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}
    for name, value in said.items():
        monkeypatch.setenv(name, value)
    assert rank_by_deploy_node(8, 3, 4) == 7 and os.environ["RANK"] == "7"  # node 1's fourth worker
    monkeypatch.setenv("TRAINERS_NODE_RANK", "0")
    assert rank_by_deploy_node(8, 3, 4) == 3
    for name, value in (("TRAINERS_NODE_RANK", ""), ("TRAINERS_NODE_RANK", "2"), ("TRAINERS_NODE_RANK", "x"),
                        ("TRAINERS_RANKS_BY_NODE", "0"), ("TORCHELASTIC_USE_AGENT_STORE", "False"),
                        ("GROUP_WORLD_SIZE", "1")):
        monkeypatch.setenv("RANK", "5")
        with monkeypatch.context() as m:
            m.setenv(name, value)  # no node rank, one outside 0..N-1, nodes of unequal counts, no agent store: torchrun's
            assert rank_by_deploy_node(8, 1, 4) == 5
    monkeypatch.setenv("TRAINERS_NODE_RANK", "1")
    assert rank_by_deploy_node(6, 1, 4) == 5  # a world that is not nodes x workers: torchrun's
