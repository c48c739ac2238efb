"""Train the graph-coloring GNN (seed 002) with DDP over graphs: build, resume, a flat
loop, finish.

The whole training split lives on the device (trainers.gnn.batch.DeviceGraphs); each step gathers
this rank's graphs there by offsets, about --nodes-per-batch nodes of whole graphs, each graph once
per epoch across ranks (trainers.gnn.sampling). The loss is the expected fraction of conflicting
edges per graph (Potts), averaged over the global batch. Nothing in the steady-state step waits
for the device: the loss is summed on the device and read at log points. Stops, checkpoints and
results go through the run boundary (trainers.runtime.run); the final evaluation colours the
benchmark and validation graphs with the best checkpoint, through every decoding stage.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers.gnn.batch import DeviceGraphs, pad_batch, potts_loss
from trainers.gnn.build import build_model
from trainers.gnn.config import GnnConfig
from trainers.gnn.evaluate import EVAL_SEED, evaluate, markdown_table, validation_loss
from trainers.gnn.graphs import GraphSplit
from trainers.gnn.sampling import NodeBudgetCursor, padded_capacity
from trainers.gnn.size import SIZES, compiles, flops_per_node, nodes_per_step
from trainers.runtime import config as cfgmod
from trainers.runtime import device as device_mod
from trainers.runtime.dist import DistContext, all_reduce_sum, distributed, wrap_ddp
from trainers.runtime.precision import build_adamw, compile_facts, enable_tf32, maybe_compile
from trainers.runtime.remote_pull import restore_from_remote
from trainers.runtime.run import Run, RunSpec
from trainers.runtime.sampling import steps_left
from trainers.runtime.stops import StopReason
from trainers.runtime.written import write_result


def feature_seed(cfg: GnnConfig, epoch: int, step_in_epoch: int, rank: int) -> int:
    """Random node features: fresh each step in training (an augmentation), a pure function of the
    data position, so a resumed run draws the same ones."""
    return ((cfg.seed * 1_000_003 + epoch) * 100_003 + step_in_epoch) * 1_009 + rank


def pin_from_saved(cfg: GnnConfig, saved: dict | None) -> GnnConfig:
    """A copy with what a saved config fixes in options left out: the nodes per step."""
    return cfg.replaced(**cfgmod.saved_sizes(cfg, saved, SIZES))


def resolve(cfg: GnnConfig, run_dir: Path, memory_bytes: int | None, world_size: int) -> GnnConfig:
    """The run's options, settled once at its entry: --nodes-per-batch the folder's, else this device's (its
    `memory_bytes`), the saved run's options checked against them (a different config is refused); read-only
    from here (RunOptions.settled)."""
    cfg = pin_from_saved(cfg, cfgmod.saved_config(run_dir))
    cfg = cfg.replaced(nodes_per_batch=nodes_per_step(cfg, memory_bytes, world_size))
    cfgmod.check_run_dir_compatible(run_dir, cfg)
    return cfg.settled()


def train(cfg: GnnConfig) -> dict | None:
    started_at = time.time()
    cfg.validate()
    with distributed(cfg.device, cfg.collective_timeout_s) as ctx:
        return _train(cfg, ctx, started_at)


def _train(cfg: GnnConfig, ctx: DistContext, started_at: float) -> dict | None:
    run_dir = Path(cfg.run_dir)
    restore_from_remote(cfg.remote, run_dir, ctx, cfg, pin_from_saved)  # a fresh machine: the remote's run first
    cfg = resolve(cfg, run_dir, device_mod.total_memory(ctx.device), ctx.world_size)
    train_split, val_split = GraphSplit(Path(cfg.data_dir), "train"), GraphSplit(Path(cfg.data_dir), "val")
    cursor = NodeBudgetCursor(train_split.nodes, ctx.world_size, ctx.rank, cfg.nodes_per_batch, cfg.seed)
    total_steps = cfg.epochs * cursor.steps_per_epoch

    # fp32 throughout: its matmuls in TF32 on Ampere and newer, as the other trainers' (inductor warned on the H200)
    tf32 = enable_tf32(ctx.device)
    torch.manual_seed(cfg.seed)  # identical init on every rank
    model = build_model(cfg).to(ctx.device)
    n_params = sum(p.numel() for p in model.parameters())
    # the plan's count, per trained graph (every graph once an epoch): a GPU run's MFU calibrates `trainers plan`
    flops_per_graph = flops_per_node(cfg) * float(train_split.nodes.mean())
    # fused on CUDA; no decay on biases and norms (weight decay is 0 by default: plain AdamW)
    optimizer = build_adamw(model, cfg.lr, cfg.weight_decay, (0.9, 0.999), ctx.device, cfg.gpu_defaults)

    with Run(cfg, ctx, RunSpec("gnn", {"model": model, "optimizer": optimizer}, total_steps, unit="graphs",
                               metric_name="conflict_fraction", started_at=started_at,
                               data_fingerprint=train_split.fingerprint, flops_per_item=flops_per_graph)) as run:
        train_data = DeviceGraphs(train_split, cfg.max_colors, cfg.random_features, ctx.device,
                                  fewer_colors=cfg.fewer_colors)
        val_data = DeviceGraphs(val_split, cfg.max_colors, cfg.random_features, ctx.device, fixed_random_seed=EVAL_SEED)
        run.log.info("gnn: %s parameters, %d rank(s) on %s%s; %d train graphs (%d nodes) / %d val; %d steps per epoch "
                     "of about %d nodes per rank (--nodes-per-batch %d)", f"{n_params:,}", ctx.world_size,
                     ctx.device.type, ", TF32" if tf32 else "", len(train_split), int(train_split.nodes.sum()),
                     len(val_split), cursor.steps_per_epoch,
                     round(train_split.nodes.sum() / (cursor.steps_per_epoch * ctx.world_size)), cfg.nodes_per_batch)
        at = lambda s: NodeBudgetCursor.start(s.position, s.position_rank0)  # noqa: E731
        start = run.resume(lambda s: steps_left(cursor.steps_per_epoch, cfg.epochs, at(s)))
        total_steps = run.total_steps
        cursor = NodeBudgetCursor(train_split.nodes, ctx.world_size, ctx.rank, cfg.nodes_per_batch, cfg.seed,
                                  **at(start))
        train_model = wrap_ddp(model, ctx) if ctx.distributed else model
        # the steps left decide (a resume near the end compiles nothing); the same on every rank
        compiled, compile_why = compiles(cfg.compile, device_mod.gpu_like(ctx.device, cfg.gpu_defaults),
                                         total_steps - start.step)
        run.log.info("gnn: training step %s", compile_why)
        # every batch padded to the run's largest step: one static shape (CUDA-graph ready), one compile
        capacity = padded_capacity(train_split.nodes, train_data.directed, ctx.world_size, ctx.rank,
                                   cfg.nodes_per_batch, cfg.seed, cfg.epochs) if compiled else None
        step_model = maybe_compile(train_model, compiled, dynamic=False, log=run.log)
        features = torch.Generator(device=ctx.device)

        step = start.step
        window_frac = torch.zeros((), dtype=torch.float64, device=ctx.device)
        window_graphs = 0
        model.train()
        while step < total_steps and not start.ended:
            graphs, global_count = cursor.batch()
            features.manual_seed(feature_seed(cfg, cursor.epoch, cursor.step_in_epoch, ctx.rank))
            batch = train_data.batch(graphs, features)
            if compiled:  # the loss and gradients of the batch itself (pad_batch)
                batch = pad_batch(batch, capacity)
            loss, frac = potts_loss(step_model, batch, ctx.world_size / global_count)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window_frac += frac  # stays on the device until a log point
            window_graphs += len(graphs)
            end_of_epoch = cursor.advance()

            if run.should_log(step):
                total, count = all_reduce_sum(ctx, [float(window_frac), float(window_graphs)])
                run.log_train(step, {"conflict_fraction": total / count, "epoch": cursor.epoch})
                window_frac.zero_()
                window_graphs = 0
            if run.should_eval(step, end_of_epoch):
                with run.timing("evaluation"):
                    run.evaluated(step, validation_loss(model, val_data, cfg, ctx))
            if run.step_done(step, cursor.position(), global_count, loss=loss.detach()) != StopReason.NONE:
                break

        nodes_per_graph = float(train_split.nodes.mean())
        throughput = run.throughput()
        per_device = throughput["per_s_per_device"]
        summary = {"data": {"data_dir": str(Path(cfg.data_dir).resolve()), "train_graphs": len(train_split),
                            "train_nodes": int(train_split.nodes.sum()), "val_graphs": len(val_split),
                            "fingerprint": train_split.fingerprint},
                   "model": {"parameters": n_params, "hidden": cfg.hidden, "layers": cfg.layers,
                             "max_colors": cfg.max_colors, "flops_per_graph": flops_per_graph},
                   "training": {"epoch": cursor.epoch, "steps_per_epoch": cursor.steps_per_epoch,
                                "nodes_per_batch": cfg.nodes_per_batch, "ddp": _ddp_facts(train_model),
                                **compile_facts(step_model, ctx), "compile_decision": compile_why,
                                "padded_to": list(capacity) if compiled else None,
                                "fused_adamw": bool(optimizer.defaults.get("fused")), "tf32": tf32,
                                # every graph is seen once per epoch, so nodes/s = graphs/s x mean graph size
                                "nodes_per_s_per_device": per_device * nodes_per_graph if per_device else None,
                                "graphs_per_s_per_device": per_device}}
        return run.finish(summary, evaluate=lambda: final_evaluation(run, model, cfg, val_split, ctx))


def final_evaluation(run: Run, model: torch.nn.Module, cfg: GnnConfig, val_split: GraphSplit,
                     ctx: DistContext) -> dict | None:
    """Collective, at the run's end: the best checkpoint coloured against the baselines, results.md written."""
    best = run.restore_best()
    evaluation = evaluate(model, cfg, val_split, ctx)
    if ctx.is_main:
        evaluation["checkpoint_step"] = best
        write_result(Path(cfg.run_dir) / "results.md", lambda f: f.write(markdown_table(evaluation)), mode="w")
    return evaluation


def _ddp_facts(train_model) -> dict | None:
    if not isinstance(train_model, DDP):
        return None
    return {"gradient_as_bucket_view": train_model.gradient_as_bucket_view, "static_graph": train_model.static_graph,
            "sync_buffers_each_forward": bool(getattr(train_model, "forward_sync_buffers",
                                                      getattr(train_model, "broadcast_buffers", None)))}
