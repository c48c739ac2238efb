"""Sharded states (FSDP2) through the checkpoint manager, in one process with a 1-rank gloo group:
written with torch.distributed.checkpoint, every file checksummed in the meta, a damaged part never
resumed from, old steps pruned with their shards folder, consolidation into one verified file, a
metric recorded after the fact, and a resume with other sharded states refused."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.distributed as dist

from trainers.errors import UsageError
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.dist import DistContext
from trainers.runtime.sharded import ShardedModel, ShardedOptimizer


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield DistContext(0, 0, 1, 1, torch.device("cpu"), "gloo")
    finally:
        dist.destroy_process_group()


def sharded_model():
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fully_shard(model[0])
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, optimizer


def train_step(model, optimizer):
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def full(model) -> dict:
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def test_sharded_states_round_trip_and_a_damaged_part_falls_back(group, tmp_path):
    log = logging.getLogger("test")
    ckpt = CheckpointManager(tmp_path / "ckpt", group, keep_last=2, logger=log)
    model, optimizer = sharded_model()
    states = {"model": ShardedModel(model), "optimizer": ShardedOptimizer(model, optimizer)}
    saved = {}
    for step in (1, 2, 3):
        train_step(model, optimizer)
        ckpt.save(step, {"states": {}}, {"position": step}, {"metric": 1.0 / step}, sharded=states)
        saved[step] = full(model)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("shards_*")) == ["shards_00000002", "shards_00000003"]
    meta = json.loads((tmp_path / "ckpt" / "meta_00000003.json").read_text())
    assert meta["sharded"] == ["model", "optimizer"]
    assert {"shards_00000003/.metadata", "shards_00000003/__0_0.distcp"} <= set(meta["files"])

    fresh, fresh_opt = sharded_model()
    fresh_states = {"model": ShardedModel(fresh), "optimizer": ShardedOptimizer(fresh, fresh_opt)}
    resumed = ckpt.resume(torch.device("cpu"), sharded=fresh_states)
    assert resumed.step == 3 and resumed.rank_state["position"] == 3
    assert all(torch.equal(full(fresh)[k], saved[3][k]) for k in saved[3])
    assert fresh_opt.state_dict()["state"]  # the AdamW moments came back too

    part = tmp_path / "ckpt" / "shards_00000003" / "__0_0.distcp"
    damaged = bytearray(part.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # one byte flipped
    part.write_bytes(bytes(damaged))
    resumed = ckpt.resume(torch.device("cpu"), sharded=fresh_states)
    assert resumed.step == 2 and all(torch.equal(full(fresh)[k], saved[2][k]) for k in saved[2])
    assert (tmp_path / "ckpt" / "meta_00000003.json.unusable").exists()

    with pytest.raises(UsageError, match="sharded states \\['model', 'optimizer'\\], this run shards none"):
        ckpt.resume(torch.device("cpu"))


def test_consolidate_writes_one_verified_file_and_a_late_metric_makes_a_checkpoint_best(group, tmp_path):
    log = logging.getLogger("test")
    ckpt = CheckpointManager(tmp_path / "ckpt", group, keep_last=3, logger=log)
    model, optimizer = sharded_model()
    states = {"model": ShardedModel(model), "optimizer": ShardedOptimizer(model, optimizer)}
    train_step(model, optimizer)
    ckpt.save(1, {"states": {"vocab": {"chars": ["a"]}}}, {}, {"metric": 0.5}, sharded=states)
    train_step(model, optimizer)
    ckpt.save(2, {"states": {"vocab": {"chars": ["a"]}}}, {}, {"metric": None}, sharded=states)
    assert ckpt.best_step() == 1
    ckpt.record_metric(2, 0.25)
    assert ckpt.best_step() == 2
    path = ckpt.consolidate(2)
    assert path.name == "consolidated_00000002.pt" and path.name in ckpt.read_meta(2)["files"]
    states_back = ckpt.load_verified(2, "cpu")["states"]
    assert states_back["vocab"] == {"chars": ["a"]}
    assert all(torch.equal(states_back["model"][k], v) for k, v in full(model).items())  # plain tensors
    assert ckpt.verify(2) is None
    path.write_bytes(b"garbage")
    with pytest.raises(UsageError, match="fails its SHA-256 check"):
        ckpt.load_verified(2, "cpu")
    with pytest.raises(UsageError, match="no sharded optimizer_x"):
        ckpt.consolidate(1, ("optimizer_x",))
