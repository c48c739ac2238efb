"""The GNN's nodes per step by device (issue 33): 4,096 on a CPU as before; on a GPU up to 65,536 as its memory
and the dataset allow (an epoch keeps at least 16 steps), unless the user says."""

import json

import pytest

from trainers.gnn.config import GnnConfig
from trainers.gnn.size import CPU_NODES, MAX_AUTO_NODES, MIN_STEPS_PER_EPOCH, assumed_counts, nodes_per_step, workload
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
    big = workload(GnnConfig(data_dir=_dataset(tmp_path, 100_000_000)), measured=(100_000.0, 0.0, 1.0, 1, []))
    assert big.shape["nodes_per_step"] == plan(big, h100, 1).shape["nodes_per_step"] == MAX_AUTO_NODES
    assert plan(big, DEVICES["t4"], 1).shape["nodes_per_step"] == 32768


def test_with_no_dataset_yet_the_plan_sizes_the_step_for_the_graphs_it_assumes(tmp_path):
    """A regression: the deploy shows the plan before its data phase, with no dataset yet. The plan then assumed the
    deploy's 20,000 graphs for the job's length but not for its step: on 8 H200s it said 65,536 nodes a step (129
    steps) where the run, its data written, takes 16,384 (516 steps)."""
    from trainers.ops.devices import DEVICES
    from trainers.ops.plan import plan

    graphs, nodes, edges = assumed_counts(GnnConfig().seed)
    written = tmp_path / "written"
    written.mkdir()
    (written / "metadata.json").write_text(json.dumps({"splits": {"train": {"graphs": graphs, "nodes": nodes,
                                                                            "edges": edges}}}))
    h200 = DEVICES["h200"]
    for gpus in (1, 8):
        before, after = (plan(workload(GnnConfig(data_dir=str(d))), h200, gpus).shape["nodes_per_step"]
                         for d in (tmp_path / "none", written))
        assert before == after, (gpus, before, after)
    assert plan(workload(GnnConfig(data_dir=str(tmp_path / "none"))), h200, 8).shape["nodes_per_step"] == 16384


def test_a_resume_keeps_the_folders_number_on_any_device_or_world_size(tmp_path):
    cfg = GnnConfig(data_dir=_dataset(tmp_path, 10_000_000))
    cfg = pin_from_saved(cfg, {"nodes_per_batch": 4096})  # begun on a CPU, resumed on 8 GPUs
    assert nodes_per_step(cfg, 80 * GIB, 8, per_node=1000.0) == 4096
    fresh = pin_from_saved(GnnConfig(data_dir=cfg.data_dir), None)
    assert nodes_per_step(fresh, 80 * GIB, 8, per_node=1000.0) == MAX_AUTO_NODES


def _tiny_job(tmp_path) -> list[str]:
    """A 4-step GNN job on 16 tiny graphs written under tmp_path (the CLI's arguments, less its run folder)."""
    from trainers.cli import main

    data = tmp_path / "graphs"
    assert main(["gnn", "data", "--out", str(data), "--train", "16", "--val", "4", "--max-nodes", "40",
                 "--no-progress"]) == 0
    return ["gnn", "train", "--data-dir", str(data), "--epochs", "1", "--nodes-per-batch", "150", "--hidden", "16",
            "--layers", "2", "--search-iters", "50"]


def test_the_gnn_turns_tf32_on_where_the_device_has_it_and_says_so(tmp_path, monkeypatch):
    """The H200's compiled GNN step ran its fp32 matmuls without TF32 (inductor warned); the forecaster, the
    GPT and PPO turn it on. The GNN asks for it too, on the run's device, and its results and log say which."""
    import trainers.gnn.train as gnn_train
    from trainers.cli import main

    job = [*_tiny_job(tmp_path), "--no-compile"]
    assert main([*job, "--run-dir", str(tmp_path / "cpu")]) == 0
    assert json.loads((tmp_path / "cpu" / "results.json").read_text())["training"]["tf32"] is False
    asked = []
    monkeypatch.setattr(gnn_train, "enable_tf32", lambda device: asked.append(device) or True)
    assert main([*job, "--run-dir", str(tmp_path / "tf32")]) == 0
    assert [d.type for d in asked] == ["cpu"]
    assert json.loads((tmp_path / "tf32" / "results.json").read_text())["training"]["tf32"] is True
    assert ", TF32;" in (tmp_path / "tf32" / "training.log").read_text()


REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_the_compile_pays_after_the_steps_the_h200_measured_and_the_default_follows_them():
    """The H200 ran the GNN's job (65,536 nodes a step) eager and compiled, one command apart
    (bench/results/gpu_h200/): the constants are those runs', and by default a GPU run (or its rehearsal)
    compiles only when its steps left are at least the break-even; --compile and --no-compile are obeyed."""
    from trainers.gnn.size import COMPILE_EAGER_STEP_RATIO, COMPILE_PAYS_AFTER_STEPS, COMPILE_S, compiles

    runs = {mode: json.loads((REPO / f"bench/results/gpu_h200/gnn_{mode}_results.json").read_text())
            for mode in ("compile", "no-compile")}
    assert runs["compile"]["training"]["compiled"] is True and runs["no-compile"]["training"]["compiled"] is False
    differ = {k for k in runs["compile"]["config"] if runs["compile"]["config"][k] != runs["no-compile"]["config"][k]}
    assert differ == {"compile", "run_dir"}  # one command apart
    first = {m: r["training"]["throughput"]["breakdown_s"]["first_window"] for m, r in runs.items()}
    step = {m: r["training"]["throughput"]["breakdown_s"]["steady_steps"] / r["training"]["throughput"]["steady_steps"]
            for m, r in runs.items()}
    assert COMPILE_S == pytest.approx(first["compile"] - first["no-compile"], abs=1e-3)
    assert COMPILE_PAYS_AFTER_STEPS == pytest.approx(COMPILE_S / (step["no-compile"] - step["compile"]), rel=1e-3)
    assert COMPILE_EAGER_STEP_RATIO == pytest.approx(step["no-compile"] / step["compile"], rel=1e-3)
    assert 5_000 < COMPILE_PAYS_AFTER_STEPS < 20_000
    assert compiles(None, True, COMPILE_PAYS_AFTER_STEPS)[0] and not compiles(None, True, COMPILE_PAYS_AFTER_STEPS - 1)[0]
    assert not compiles(None, False, 10**9)[0]  # a CPU run without the rehearsal: eager however long
    assert compiles(True, False, 1) == (True, "--compile given") and compiles(False, True, 10**9)[0] is False
    assert "--compile to compile anyway" in compiles(None, True, 100)[1]


@pytest.mark.slow  # (a compile; nothing in it depends on the SIMD width: out of CI's narrowed pass)
def test_a_short_gpu_like_run_trains_eager_and_says_why_and_a_long_one_compiles(tmp_path, monkeypatch):
    """Under --gpu-defaults (what a CUDA run decides), a run of a few steps trains eager, and its log and
    results.json say why; the same run with the break-even lowered below its steps compiles (tries to: where
    this machine's compiler fails, the step trains eager and says so, CompiledOrEager)."""
    import trainers.gnn.size as gnn_size
    from trainers.cli import main

    job = [*_tiny_job(tmp_path), "--gpu-defaults"]
    assert main([*job, "--run-dir", str(tmp_path / "short")]) == 0
    training = json.loads((tmp_path / "short" / "results.json").read_text())["training"]
    assert training["compiled"] is False and training["compile_decision"].startswith("eager: ")
    assert "after which a compile" in (tmp_path / "short" / "training.log").read_text()
    steps = training["steps"]
    monkeypatch.setattr(gnn_size, "COMPILE_PAYS_AFTER_STEPS", steps)
    assert main([*job, "--run-dir", str(tmp_path / "long")]) == 0
    training = json.loads((tmp_path / "long" / "results.json").read_text())["training"]
    assert training["compile_decision"].startswith("compiled: ")
    assert training["compiled"] is True or training["compile_error"]  # tried: an error only a try can have


def test_the_plan_counts_the_compile_where_the_run_would_compile(tmp_path):
    """The plan decides as the run does, on the steps it plans (epochs, --items or --hours, on the planned GPU
    and ranks): the deploy's default job plans eager and nothing outside its steps; one long enough plans the
    compile outside its steps, once (every rank compiles at the same time)."""
    from trainers.gnn.size import COMPILE_S
    from trainers.ops.devices import DEVICES
    from trainers.ops.plan import plan

    h200 = DEVICES["h200"]
    short = plan(workload(GnnConfig(data_dir=str(tmp_path / "none"))), h200, 1)
    assert "outside_steps_s" not in short.time and "training step eager" in " ".join(short.assumptions)
    long = plan(workload(GnnConfig(data_dir=str(tmp_path / "none"), epochs=400)), h200, 1)
    assert long.time["outside_steps_s"] == pytest.approx(COMPILE_S)
    assert "training step compiled" in " ".join(long.assumptions)
    assert plan(workload(GnnConfig(data_dir=str(tmp_path / "none"), epochs=4000)), h200, 4).time["outside_steps_s"] \
        == pytest.approx(COMPILE_S)
    default = workload(GnnConfig(data_dir=str(tmp_path / "none")))  # 20 epochs, but more nodes asked of it
    assert plan(default, h200, 1, items=1e10).time["outside_steps_s"] == pytest.approx(COMPILE_S)
    assert plan(default, h200, 1, hours=1.0).time["outside_steps_s"] == pytest.approx(COMPILE_S)
    forced = plan(workload(GnnConfig(data_dir=str(tmp_path / "none"), compile=True)), h200, 1)
    assert forced.time["outside_steps_s"] == pytest.approx(COMPILE_S)
    assert "outside_steps_s" not in plan(workload(GnnConfig(data_dir=str(tmp_path / "none"), compile=False)), h200,
                                         1, items=1e10).time


@pytest.mark.parametrize("nodes_per_batch,ranks", [(1, 1), (512, 1), (300, 2)])
def test_the_plan_counts_the_steps_the_run_takes(tmp_path, nodes_per_batch, ranks):
    """A step holds whole graphs up to its node budget, and an epoch has no more steps than a rank has graphs: the
    plan divided the nodes by the budget (10,456 steps and a 16 s compile where the run takes 256, eager)."""
    from trainers.gnn.graphs import GraphSplit, write_dataset
    from trainers.gnn.sampling import steps_per_epoch
    from trainers.ops.devices import DEVICES
    from trainers.ops.plan import plan

    data = tmp_path / "d"
    write_dataset(data, 24, 2, seed=1, min_nodes=20, max_nodes=60, workers=1, progress=False)
    cfg = GnnConfig(data_dir=str(data), epochs=4, nodes_per_batch=nodes_per_batch, hidden=16, layers=2)
    run = cfg.epochs * steps_per_epoch(GraphSplit(data, "train").nodes, ranks, nodes_per_batch)
    planned = plan(workload(cfg), DEVICES["h200"], ranks)
    assert planned.time["steps"] == pytest.approx(run) and planned.time["items"] == 4 * GraphSplit(data, "train") \
        .nodes.sum()
    assert planned.time["hours"] * 3600 == pytest.approx(run * planned.time["step_s"])


def test_the_plan_refuses_more_ranks_than_graphs_as_the_run_does(tmp_path):
    from trainers.errors import UsageError
    from trainers.gnn.graphs import write_dataset
    from trainers.ops.devices import DEVICES
    from trainers.ops.plan import plan

    data = tmp_path / "d"
    write_dataset(data, 6, 2, seed=1, min_nodes=20, max_nodes=30, workers=1, progress=False)
    with pytest.raises(UsageError, match="6 training graphs are too few for 8 ranks"):
        plan(workload(GnnConfig(data_dir=str(data))), DEVICES["h200"], 8)


@pytest.mark.parametrize("dense", [False, True])
def test_a_steps_saved_bytes_follow_the_datasets_edges_and_include_the_loss(tmp_path, dense):
    """What autograd saves in a training step (the model and its Potts loss, which keeps both ends' colour
    probabilities of every edge) against the estimate the plan and a GPU's auto-size use: per node it was measured
    on the deploy's sparse graphs, model only, and a dense dataset's steps saved 17x more."""
    import numpy as np
    import torch

    from trainers.gnn.batch import DeviceGraphs
    from trainers.gnn.build import build_model
    from trainers.gnn.graphs import GraphSplit, write_dataset
    from trainers.gnn.size import _loss_module, _measured, bytes_per_node
    from trainers.ops.plan import saved_bytes

    data = tmp_path / "d"
    write_dataset(data, 12, 2, seed=1, min_nodes=80, max_nodes=120, workers=1, progress=False, dense=int(dense))
    cfg = GnnConfig(data_dir=str(data), hidden=32, layers=2)
    split = GraphSplit(data, "train")
    batch = DeviceGraphs(split, cfg.max_colors, cfg.random_features, torch.device("cpu")).batch(
        np.arange(len(split)), torch.Generator().manual_seed(0))
    real = saved_bytes(_loss_module(build_model(cfg).train()), (batch.x, batch.edge_index, batch.color_mask,
                                                                batch.edge_graph, batch.edges_per_graph))
    estimate = bytes_per_node(cfg, *_measured(cfg)[:2]) * split.nodes.sum()
    assert estimate == pytest.approx(real, rel=0.1)
    assert workload(cfg).activation_bytes(1000, False) == pytest.approx(1000 * estimate / split.nodes.sum(), rel=1e-6)
