"""Train the CLSTM-PPO trading agents (seed 001) with DDP over the learner: build, resume, a flat
loop, finish.

One run trains its agents one after another (the cascaded-LSTM agent for each of --seeds seeds,
then the MLP baseline for each): step s of the loop is update s % U of agent s // U, where U is the
number of PPO updates per agent. An update is a rollout of T steps in this rank's B environments
(its own seeds), GAE, and PPO epochs whose gradients DDP averages over ranks. Every --eval-every
updates the agent is validated (deterministic policy, --select-by on the validation period, computed
identically on every rank) and its best snapshot kept. Checkpoints fall on update boundaries and
hold every agent (policy, optimizer, normaliser, best snapshot); each rank's environments, episode
counters and sampling generator go in its own `position`, so a resume continues exactly.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

import torch

from trainers.errors import UsageError
from trainers.ppo import ppo
from trainers.ppo.build import Agent, AgentSet
from trainers.ppo.config import PpoConfig
from trainers.ppo.data import checked_fingerprint, env_spec, load_trading_data, pin_dates
from trainers.ppo.env import DeviceMarket, VecPortfolioEnv
from trainers.ppo.evaluate import evaluate_agents, validation_score
from trainers.ppo.features import FEATURES
from trainers.ppo.size import SIZES, flops_per_env_step, sized_for_device
from trainers.runtime import config as cfgmod
from trainers.runtime.dist import DistContext, all_reduce_sum, distributed, wrap_ddp
from trainers.runtime.files import atomic_write_json
from trainers.runtime.precision import Precision, compile_facts, enable_tf32, make_grad_scaler, precision_for
from trainers.runtime.remote_pull import restore_from_remote
from trainers.runtime.run import Run, RunSpec
from trainers.runtime.stops import StopReason

EPISODE_STATS = ("episodes", "reward", "return", "final_value", "trades", "cost")


def settings(cfg: PpoConfig) -> ppo.PPOSettings:
    return ppo.PPOSettings(rollout_steps=cfg.rollout_steps, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
                           update_epochs=cfg.update_epochs, minibatch_size=cfg.batch_size, grad_accum=cfg.grad_accum,
                           clip_coef=cfg.clip_coef, clip_vloss=cfg.clip_vloss, ent_coef=cfg.ent_coef,
                           vf_coef=cfg.vf_coef, max_grad_norm=cfg.max_grad_norm, target_kl=cfg.target_kl)


class Phase:
    """One agent's training on this rank: its environments, sampling generator and episode counters."""

    def __init__(self, index: int, agent: Agent, cfg: PpoConfig, market: DeviceMarket, spec, train_range, ctx: DistContext,
                 position: dict | None, step: Callable):
        self.index = index
        env_seed = agent.seed * 7919 + index
        self.env = VecPortfolioEnv(market, spec, cfg.num_envs, train_range, seed=env_seed, rank=ctx.rank)
        self.generator = torch.Generator(device=ctx.device).manual_seed(env_seed * 1_000 + ctx.rank)
        self.done = torch.zeros(cfg.num_envs, dtype=torch.bool, device=ctx.device)
        self.window = torch.zeros(len(EPISODE_STATS), dtype=torch.float64, device=ctx.device)
        if position is not None and position.get("agent") == index:
            self.env.load_state_dict(position["env"])
            self.generator.set_state(position["generator"].cpu())  # a ByteTensor on the CPU, whatever the device
            self.done = position["done"].to(ctx.device)
            self.window = position["window"].to(ctx.device)
        self.obs = self.env.observe()
        # one for the phase, zeroed after each update's merge: a compiled step keeps reading the same tensors
        self.stats = ppo.NormStats(agent.norms, ctx.device) if agent.norms is not None else None
        self.step = step  # the run's rollout step (ppo.rollout_stepper), compiled once for every agent
        if cfg.compile_rollout == "graphs":
            ppo.mark_static(self.written_by_the_step())
        # not a static graph: an update may stop early on the KL target, mid-epoch of the graph's life
        self.train_policy = wrap_ddp(agent.policy, ctx, accumulates=cfg.grad_accum > 1, static_graph=False) \
            if ctx.distributed else agent.policy

    def written_by_the_step(self) -> list[torch.Tensor]:
        """What rollout_step writes in place: the environments' state, the normaliser sums, the episode window."""
        return [*(getattr(self.env, name) for name in self.env._STATE), *(self.stats.sums if self.stats else []),
                self.window]

    def position(self) -> dict:
        return {"agent": self.index, "env": self.env.state_dict(), "generator": self.generator.get_state(),
                "done": self.done.clone(), "window": self.window.clone()}

    def record(self, info: dict) -> None:
        """Add the episodes that finished in this step to the log window (no host sync)."""
        ep = info["episode"]
        d = ep["done"].double()
        self.window += torch.stack([d.sum(), (ep["reward"] * d).sum(), (ep["return"] * d).sum(),
                                    (ep["final_value"] * d).sum(), (ep["trades"] * d).sum(), (ep["cost"] * d).sum()])


SCHEDULE = "schedule.json"


def updates_per_agent(cfg: PpoConfig, run_dir: Path, per_update: int) -> tuple[int, int | None]:
    """(updates per agent, the world size the run started with; None on a first start). The loop's
    step counts updates agent after agent, so the number of updates per agent is fixed when the run
    starts (schedule.json): recomputed on another number of workers, a resume would map its steps
    to other agents and train finished ones again. `--restart` starts a new schedule."""
    path = run_dir / SCHEDULE
    if path.exists() and not cfg.restart:
        try:
            saved = json.loads(path.read_text())
            return int(saved["updates_per_agent"]), int(saved["world_size"])
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise UsageError(f"{path} is unreadable ({exc}); it fixes how many updates each agent trains: restore it, "
                             f"or start over with --restart") from None
    return math.ceil(cfg.steps_per_agent() / per_update), None


def policy_precision(device: torch.device, requested: str, rehearse: bool = False) -> Precision:
    """`auto` is fp32 for PPO on every device (a GPU deploy and its rehearsal too): rounded to bf16, the
    heads' outputs differ between the rollout's batch and the update's minibatch, so the probability ratio
    exp(new - old) is noisy from the first step, and networks this small gain no speed from bf16."""
    return precision_for(device, "fp32" if requested == "auto" else requested, rehearse)


def keep_schedule(cfg: PpoConfig, ctx: DistContext, updates: int, saved_world: int | None, per_update: int,
                  log) -> None:
    """schedule.json written on a first start (and on --restart); a resume on another number of workers keeps its
    updates per agent, each of more or fewer environment steps, and says so."""
    if ctx.is_main and (saved_world is None or cfg.restart):
        atomic_write_json(Path(cfg.run_dir) / SCHEDULE, {"updates_per_agent": updates, "world_size": ctx.world_size})
    elif saved_world is not None and saved_world != ctx.world_size:
        log.warning("this run started on %d worker(s), now %d: it keeps its %d updates per agent, each now of "
                    "%d environment steps", saved_world, ctx.world_size, updates, per_update)
    log.info("schedule: %d updates per agent of %d env steps (%d per rank x %d ranks), %d optimizer steps each",
             updates, per_update, per_update // ctx.world_size, ctx.world_size,
             cfg.update_epochs * math.ceil(cfg.num_envs * cfg.rollout_steps / cfg.batch_size))


def pin_from_saved(cfg: PpoConfig, saved: dict | None) -> PpoConfig:
    """A copy with what a saved config fixes in options left out: the date range, the environment batch."""
    return pin_dates(cfg, saved).replaced(**cfgmod.saved_sizes(cfg, saved, SIZES))


def resolve(cfg: PpoConfig, run_dir: Path, device, world_size: int) -> PpoConfig:
    """The run's options, settled once at its entry: dates and sizes pinned from the folder's saved config, the
    sizes still left out this device's, the saved run's options checked against them (a different config is
    refused); read-only from here (RunOptions.settled)."""
    cfg = sized_for_device(pin_from_saved(cfg, cfgmod.saved_config(run_dir)), device, world_size)
    cfgmod.check_run_dir_compatible(run_dir, cfg)
    return cfg.settled()


def train(cfg: PpoConfig) -> dict | None:
    started_at = time.time()
    cfg.validate()
    with distributed(cfg.device, cfg.collective_timeout_s) as ctx:
        return _train(cfg.for_attempt(ctx.restart_count), ctx, started_at)  # (its schedule reads --restart too)


def _train(cfg: PpoConfig, ctx: DistContext, started_at: float) -> dict | None:
    # Everything that can reject the input happens before the first write into the run folder.
    run_dir = Path(cfg.run_dir)
    restore_from_remote(cfg.remote, run_dir, ctx, cfg, pin_from_saved)  # a fresh machine: the remote's run first
    cfg = resolve(cfg, run_dir, ctx.device, ctx.world_size)
    data, data_info = load_trading_data(cfg, log=print if ctx.is_main else (lambda _msg: None))
    spec = env_spec(cfg)
    train_range = data.splits["train"]
    market = DeviceMarket(data.close, data.features, ctx.device)
    VecPortfolioEnv(market, spec, 1, train_range, seed=0)  # rejects an episode longer than the training period
    precision = policy_precision(ctx.device, cfg.precision, cfg.gpu_defaults)
    tf32 = enable_tf32(ctx.device)
    s = settings(cfg)
    per_update = cfg.num_envs * cfg.rollout_steps * ctx.world_size
    updates, saved_world = updates_per_agent(cfg, run_dir, per_update)
    agents = AgentSet(cfg, data.n_stocks, ctx.device)
    total_steps = updates * len(agents.agents)
    scaler = make_grad_scaler(ctx.device, precision)
    n_params = {a.encoder: sum(p.numel() for p in a.policy.parameters()) for a in agents.agents}
    # the plan's count: a GPU run's MFU calibrates `trainers plan`; unknown where --target-kl may cut an update short
    flops = None if cfg.target_kl is not None else flops_per_env_step(cfg, data.n_stocks)

    inputs = lambda obs: (market.windows(obs[0], cfg.window), obs[1])  # noqa: E731 - (date index, portfolio)

    with Run(cfg, ctx, RunSpec("ppo", {"agents": agents, "scaler": scaler}, total_steps, unit="env_steps",
                               metric_name="pg_loss", started_at=started_at, flops_per_item=flops,
                               data_fingerprint=checked_fingerprint(data, data_info, cfg.source))) as run:
        log = run.log
        log.info("ppo: agents %s, %s parameters; %d rank(s) x %d environments on %s, precision %s%s",
                 ", ".join(f"{e}/seed{sd}" for e, sd in cfg.agents()), n_params, ctx.world_size, cfg.num_envs,
                 ctx.device.type, precision.name, ", TF32" if tf32 else "")
        log.info("data: %s", data.text(data_info["source"]))
        keep_schedule(cfg, ctx, updates, saved_world, per_update, log)
        start = run.resume()
        step = start.step
        phase: Phase | None = None
        buf = None
        rollout_step = ppo.rollout_stepper(cfg.compile_rollout, log)
        while step < total_steps and not start.ended:
            index, u = divmod(step, updates)
            agent = agents.agents[index]
            if phase is None or phase.index != index:
                phase = Phase(index, agent, cfg, market, spec, train_range, ctx,
                              start.position if phase is None else None, rollout_step)
                buf = ppo.Rollout(cfg.rollout_steps, phase.obs, (data.n_stocks,), torch.float32, ctx.device)
                learner = ppo.Learner(agent.policy, phase.train_policy, agent.norms, inputs, agent.optimizer, scaler,
                                      precision, ctx.device)  # (the phase's agent, for all its updates)
            lr = ppo.anneal_lr(agent.optimizer, cfg.lr, u, updates) if cfg.anneal_lr else cfg.lr
            stats = phase.stats
            phase.obs, phase.done = ppo.collect(learner, phase.env, buf, phase.obs, phase.done, phase.generator,
                                                on_step=phase.record, stats=stats, step=phase.step)
            with torch.no_grad():
                next_value = agent.policy(*ppo.normalise(agent.norms, inputs(phase.obs)),
                                          torch.zeros(cfg.num_envs, data.n_stocks, device=ctx.device))[2]
            adv, returns = ppo.advantages(buf, next_value, phase.done, cfg.gamma, cfg.gae_lambda)
            update_stats = ppo.update(learner, buf, adv, returns, s, phase.generator, ctx)
            if stats is not None:
                stats.merge_into(agent.norms, ctx)  # after the update: it trained on the statistics it acted with
                stats.reset()
            step += 1
            u += 1
            agent.updates_done = u

            watched = [update_stats["pg_loss"], update_stats["v_loss"]]  # (explained variance may be NaN by design)
            if u % cfg.eval_every == 0 or u == updates:
                with run.timing("evaluation"):
                    score = validation_score(market, spec, data.splits["val"], agent.policy, agent.norms, cfg.select_by)
                    watched.append(score)
                    best = agents.validated(agent, u, score, cfg.min_delta)
                    run.evaluated(step, None, improved=best)  # its checkpoint at this step, as --ckpt-at-eval says
                    run.metrics.log(step, "val", {"agent": index, "update": u, f"val_{cfg.select_by}": score, "best": best})
                    log.info("agent %d (%s, seed %d) update %d: validation %s %.4f%s", index, agent.encoder,
                             agent.seed, u, cfg.select_by, score, " (best)" if best else "")
            if run.should_log(step, also=u == updates):  # (an agent's last: its window would go with its phase)
                ep = dict(zip(EPISODE_STATS, all_reduce_sum(ctx, phase.window.tolist())))
                n = max(ep["episodes"], 1.0)
                values = {"agent": index, "update": u, "lr": lr, "episodes": int(ep["episodes"]),
                          **{k: float(v) for k, v in update_stats.items()},
                          "log_std": float(agent.policy.log_std.detach().mean())}
                if ep["episodes"]:
                    values.update({f"episode_{k}": ep[k] / n for k in EPISODE_STATS[1:]})
                run.log_train(step, values)
                phase.window.zero_()
            if run.step_done(step, phase.position(), per_update, loss=watched) != StopReason.NONE:
                break

        def final_evaluation() -> dict | None:
            return evaluate_agents(agents, cfg, data, market, spec, run_dir, ctx, checkpoint_step=run.step)

        summary = {"data": data_info,
                   "model": {"parameters": n_params, "encoder": cfg.encoder, "heads": cfg.heads, "hidden": cfg.hidden,
                             "window": cfg.window, "n_stocks": data.n_stocks, "n_features": len(FEATURES),
                             "flops_per_env_step": flops},
                   "training": {"updates_per_agent": updates, "env_steps_per_update": per_update,
                                "agents": [f"{e}/seed{sd}" for e, sd in cfg.agents()], "precision": precision.name,
                                "tf32": tf32, **compile_facts(rollout_step, ctx),
                                "best_val": {"name": f"val_{cfg.select_by}", "higher_is_better": True, "per_agent": [
                                    {"agent": f"{a.encoder}/seed{a.seed}", "update": (a.best or {}).get("update"),
                                     "value": (a.best or {}).get("val_score")} for a in agents.agents]}}}
        return run.finish(summary, evaluate=final_evaluation)
