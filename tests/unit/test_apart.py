"""Several nodes without a shared disk (trainers.runtime.apart), as two processes of a gloo group, each its own "node"
(local rank 0) with its own folder: node 0's folder holds every rank's checkpoint state, the other node copies of
the metas only; a resume gives every rank its own state back from node 0; ranks that read different data are
refused on every rank; FSDP2's sharded states, each rank's part written on its own disk, end up whole in node 0's
folder, come back to every rank at a resume (a fresh node's empty disk included) and at a restore, and a damaged
part on node 0 falls back for every rank."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainers.errors import UsageError
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.dist import DistContext
from trainers.runtime.rundir import same_data_on_every_rank


def _node(rank: int, base: str, scenario: str) -> None:
    os.environ["TRAINERS_RUN_DIR_APART"] = "1"
    from trainers.runtime import apart

    apart.RELAY_CHUNK = 97  # (every shard part relayed in many chunks, the last a short one)
    dist.init_process_group("gloo", init_method=f"file://{base}/store", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))  # (a collective one rank skips fails the test, not hangs)
    ctx = DistContext(rank, 0, 2, 1, torch.device("cpu"), "gloo")  # one process a node: each is its local rank 0
    folder = os.path.join(base, f"node{rank}", "checkpoints")
    said: dict = {}
    try:
        manager = CheckpointManager(folder, ctx, keep_last=2, logger=logging.getLogger("test"))
        if scenario == "save":
            for step in (1, 2, 3):
                shared = {"states": {"w": torch.full((2,), float(step))}, "run": {}} if rank == 0 else None
                state = manager.gather_rank_states({"position": {"rank": rank, "step": step}})
                manager.commit(step, manager.write_local(step, shared, state), {"metric": 1.0 / step})
            said["complete"] = manager.complete_steps()
            said["best"] = manager.best_step()
        elif scenario == "resume":
            resumed = manager.resume(torch.device("cpu"))
            said.update(step=resumed.step, position=resumed.rank_state["position"],
                        w=resumed.shared["states"]["w"].tolist())
        elif scenario == "data":
            same_data_on_every_rank(ctx, "ab"[rank] * 64)  # (as a SHA-256 in hex)
        elif scenario == "sharded_save":
            from test_checkpoint_sharded import train_step

            model, optimizer, states = sharded_model()
            for step in (1, 2, 3):
                train_step(model, optimizer)
                state = manager.gather_rank_states({"position": {"rank": rank, "step": step}})
                manager.save(step, {"states": {}, "run": {}}, state, {"metric": 1.0 / step}, sharded=states)
                said[f"full{step}"] = full(model)
        elif scenario == "sharded_resume":
            model, optimizer, states = sharded_model()
            resumed = manager.resume(torch.device("cpu"), sharded=states)
            said.update(step=resumed.step, position=resumed.rank_state["position"], full=full(model),
                        moments=bool(optimizer.state_dict()["state"]))
            manager.load_sharded(2, {"model": states["model"]})  # what restore_best does with an older best
            said["full_restored"] = full(model)
    except UsageError as err:
        said["refused"] = str(err)
    except Exception:  # noqa: BLE001 - the test reads it and fails with it
        said["crashed"] = traceback.format_exc()
    finally:
        gc.collect()  # (an FSDP module alive when its group goes aborts the process now and then: trainers.runtime.dist)
        dist.destroy_process_group()
    with open(os.path.join(base, f"said{rank}.json"), "w") as f:
        json.dump(said, f)


def sharded_model():
    """test_checkpoint_sharded's model (the same seed on every rank), with its states for the manager."""
    from test_checkpoint_sharded import sharded_model as one_model

    from trainers.runtime.sharded import ShardedModel, ShardedOptimizer

    model, optimizer = one_model()
    return model, optimizer, {"model": ShardedModel(model), "optimizer": ShardedOptimizer(model, optimizer)}


def full(model) -> dict:
    """Collective: the whole model's tensors, as lists (the same on every rank)."""
    return {k: v.full_tensor().tolist() for k, v in model.state_dict().items()}


def run_nodes(base, scenario: str) -> list[dict]:
    for rank in (0, 1):
        (base / f"said{rank}.json").unlink(missing_ok=True)
    (base / "store").unlink(missing_ok=True)
    mp.start_processes(_node, args=(str(base), scenario), nprocs=2, start_method="spawn", join=True)
    said = [json.loads((base / f"said{rank}.json").read_text()) for rank in (0, 1)]
    assert not any("crashed" in s for s in said), said
    return said


def test_node_0_holds_every_ranks_state_and_a_resume_gives_each_rank_its_own(tmp_path):
    said = run_nodes(tmp_path, "save")
    assert said[0] == said[1] == {"complete": [3, 2], "best": 3}  # the same steps and best on either node
    node0, node1 = tmp_path / "node0" / "checkpoints", tmp_path / "node1" / "checkpoints"
    assert sorted(p.name for p in node0.iterdir() if p.name.endswith("_00000003.pt")) == \
        ["model_00000003.pt", "rank000_00000003.pt", "rank001_00000003.pt"]
    assert sorted(p.name for p in node1.iterdir()) == ["meta_00000002.json", "meta_00000003.json"]  # pruned alike
    assert (node1 / "meta_00000003.json").read_bytes() == (node0 / "meta_00000003.json").read_bytes()

    (node1 / "meta_00000009.json").write_text("{}")  # a stale copy on the other node is not a checkpoint
    said = run_nodes(tmp_path, "resume")
    assert said[0] == {"step": 3, "position": {"rank": 0, "step": 3}, "w": [3.0, 3.0]}
    assert said[1] == {"step": 3, "position": {"rank": 1, "step": 3}, "w": [3.0, 3.0]}
    assert not (node1 / "meta_00000009.json").exists()

    (node0 / "rank001_00000003.pt").write_bytes(b"garbage")  # rank 1's state of step 3 damaged: step 2 for every rank
    said = run_nodes(tmp_path, "resume")
    assert said[0]["step"] == said[1]["step"] == 2 and said[1]["position"] == {"rank": 1, "step": 2}
    assert sorted(p.name for p in node1.glob("meta_*.json")) == ["meta_00000002.json"]


def test_ranks_that_read_different_data_are_refused_on_every_rank(tmp_path):
    said = run_nodes(tmp_path, "data")
    for s in said:
        assert "the ranks read different data (rank 0: aaaaaaaaaaaa, rank 1: bbbbbbbbbbbb)" in s["refused"]
        assert "pinned range" in s["refused"]


def test_fsdp2_shards_written_on_each_nodes_disk_are_kept_whole_on_node_0_and_come_back_to_every_rank(tmp_path):
    said = run_nodes(tmp_path, "sharded_save")
    assert said[0] == said[1]  # (the whole model, gathered, the same on either rank)
    node0, node1 = tmp_path / "node0" / "checkpoints", tmp_path / "node1" / "checkpoints"
    meta = json.loads((node0 / "meta_00000003.json").read_text())
    parts = sorted(n for n in meta["files"] if n.startswith("shards_00000003/"))
    assert parts == ["shards_00000003/.metadata", "shards_00000003/__0_0.distcp", "shards_00000003/__1_0.distcp"]
    assert all((node0 / n).is_file() for n in parts)  # rank 1's part, written on node 1, is in node 0's folder
    assert sorted(p.name for p in node1.iterdir()) == ["meta_00000002.json", "meta_00000003.json"]  # no shards kept
    assert sorted(p.name for p in node0.glob("shards_*")) == ["shards_00000002", "shards_00000003"]  # pruned alike

    shutil.rmtree(tmp_path / "node1")  # node 1 replaced: an empty disk
    resumed = run_nodes(tmp_path, "sharded_resume")
    for rank, got in enumerate(resumed):
        assert got["step"] == 3 and got["position"] == {"rank": rank, "step": 3} and got["moments"]
        assert got["full"] == said[0]["full3"] and got["full_restored"] == said[0]["full2"]
    assert not list((tmp_path / "node1" / "checkpoints").glob("shards_*"))  # the parts it was sent, removed

    part = node0 / "shards_00000003" / "__1_0.distcp"
    part.write_bytes(part.read_bytes()[:-1] + b"x")  # rank 1's part of step 3 damaged on node 0: step 2 everywhere
    resumed = run_nodes(tmp_path, "sharded_resume")
    assert [got["step"] for got in resumed] == [2, 2] and resumed[1]["full"] == said[0]["full2"]
    assert (node0 / "meta_00000003.json.unusable").exists()
    assert not list(tmp_path.rglob("*.relay*"))  # no relay's partial file left on either node
