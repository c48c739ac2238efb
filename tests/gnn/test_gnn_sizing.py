"""The GNN's nodes per step by device (issue 33): 4,096 on a CPU as before; on a GPU up to 65,536 as its memory
and the dataset allow (an epoch keeps at least 16 steps), unless the user says."""

import json

from trainers.gnn.config import GnnConfig
from trainers.gnn.size import CPU_NODES, MAX_AUTO_NODES, MIN_STEPS_PER_EPOCH, nodes_per_step, workload
from trainers.gnn.train import pin_from_saved

GIB = 2**30


def _dataset(tmp_path, nodes: int) -> str:
    (tmp_path / "metadata.json").write_text(json.dumps({"splits": {"train": {"graphs": 10, "nodes": nodes,
                                                                             "edges": 3 * nodes}}}))
    return str(tmp_path)


def test_a_cpu_keeps_todays_default_and_a_gpu_with_a_large_dataset_gets_the_cap(tmp_path):
    cfg = GnnConfig(data_dir=_dataset(tmp_path, 10_000_000))
    assert nodes_per_step(cfg, None, 2, per_node=1000.0) == CPU_NODES == 4096
    assert nodes_per_step(cfg, 16 * GIB, 2, per_node=1000.0) == MAX_AUTO_NODES == 65536


def test_a_small_dataset_keeps_its_steps_per_epoch_and_memory_bounds_the_step(tmp_path):
    cfg = GnnConfig(data_dir=_dataset(tmp_path, 600_000))  # 600,000 / (2 ranks x 16) = 18,750 -> 16,384
    assert nodes_per_step(cfg, 80 * GIB, 2, per_node=1000.0) == 16384
    assert 600_000 // (2 * 16384) >= MIN_STEPS_PER_EPOCH
    big = GnnConfig(data_dir=_dataset(tmp_path, 10_000_000))  # a quarter of 1 GiB holds 8,947 nodes -> 8,192
    assert nodes_per_step(big, GIB, 1, per_node=30_000.0) == 8192
    assert nodes_per_step(big, GIB // 64, 1, per_node=30_000.0) == CPU_NODES  # never below the CPU's


def test_the_users_number_is_kept_and_the_plan_describes_the_gpu_default(tmp_path):
    assert nodes_per_step(GnnConfig(nodes_per_batch=777), 80 * GIB, 1, per_node=1.0) == 777
    w = workload(GnnConfig(data_dir=str(tmp_path / "none"), hidden=16, layers=2))  # no dataset: the deploy's
    assert w.items_per_micro == w.shape["nodes_per_step"] == MAX_AUTO_NODES


def test_the_plan_sizes_the_step_for_the_gpu_and_the_ranks_it_plans(tmp_path):
    """As the run would (Workload.for_device): 600,000 nodes over 8 ranks keep 16 steps an epoch at 4,096 nodes
    (one rank: 32,768), and a 16 GB card holds a smaller step than an 80 GB one when memory binds."""
    from trainers.ops.devices import DEVICES
    from trainers.ops.plan import plan

    w = workload(GnnConfig(data_dir=_dataset(tmp_path, 600_000), hidden=16, layers=2))
    h100 = DEVICES["h100-sxm"]
    assert w.shape["nodes_per_step"] == plan(w, h100, 1).shape["nodes_per_step"] == 32768
    assert plan(w, h100, 8).shape["nodes_per_step"] == 4096
    # 100 kB a node: a quarter of 80 GB holds 214,748 nodes (-> the cap), of a 16 GB T4 42,949 (-> 32,768)
    big = workload(GnnConfig(data_dir=_dataset(tmp_path, 100_000_000)), measured=(100_000.0, 1.0, 1, []))
    assert big.shape["nodes_per_step"] == plan(big, h100, 1).shape["nodes_per_step"] == MAX_AUTO_NODES
    assert plan(big, DEVICES["t4"], 1).shape["nodes_per_step"] == 32768


def test_a_resume_keeps_the_folders_number_on_any_device_or_world_size(tmp_path):
    cfg = GnnConfig(data_dir=_dataset(tmp_path, 10_000_000))
    pin_from_saved(cfg, {"nodes_per_batch": 4096})  # begun on a CPU, resumed on 8 GPUs
    assert nodes_per_step(cfg, 80 * GIB, 8, per_node=1000.0) == 4096
    fresh = GnnConfig(data_dir=cfg.data_dir)
    pin_from_saved(fresh, None)
    assert nodes_per_step(fresh, 80 * GIB, 8, per_node=1000.0) == MAX_AUTO_NODES


def test_the_gnn_turns_tf32_on_where_the_device_has_it_and_says_so(tmp_path, monkeypatch):
    """The H200's compiled GNN step ran its fp32 matmuls without TF32 (inductor warned); the forecaster, the
    GPT and PPO turn it on. The GNN asks for it too, on the run's device, and its results and log say which."""
    import trainers.gnn.train as gnn_train
    from trainers.cli import main

    data = tmp_path / "graphs"
    assert main(["gnn", "data", "--out", str(data), "--train", "16", "--val", "4", "--max-nodes", "40",
                 "--no-progress"]) == 0
    job = ["gnn", "train", "--data-dir", str(data), "--epochs", "1", "--nodes-per-batch", "150", "--hidden", "16",
           "--layers", "2", "--search-iters", "50", "--no-compile"]
    assert main([*job, "--run-dir", str(tmp_path / "cpu")]) == 0
    assert json.loads((tmp_path / "cpu" / "results.json").read_text())["training"]["tf32"] is False
    asked = []
    monkeypatch.setattr(gnn_train, "enable_tf32", lambda device: asked.append(device) or True)
    assert main([*job, "--run-dir", str(tmp_path / "tf32")]) == 0
    assert [d.type for d in asked] == ["cpu"]
    assert json.loads((tmp_path / "tf32" / "results.json").read_text())["training"]["tf32"] is True
    assert ", TF32;" in (tmp_path / "tf32" / "training.log").read_text()
