"""Benchmark: one PPO backtest (a validation, or the final test of one agent) as evaluate.run_policy runs it,
beside the day-by-day loop it replaced, on the same market and weights, in one run.

    run_policy     the policy's market part (the cascade and the actor's LSTM) over the period's days in
                   batched passes, then a day at a time only what the portfolio joins, and env.advance
    day by day     each simulated day the whole deterministic model on the day's observation (the critic
                   too, as before) and the environment's training step (reward, episode sums, reset)

Per simulated day: aten operations dispatched (a dispatch-mode counter; on a GPU each is at least one kernel
launch) and seconds; and whether the two equity curves agree. The agent is the default configuration's
untrained one with its weights moved (seeded) so that it trades; the random policy's runs are the report's
baseline row (--random-runs environments).

    python bench/ppo_backtest.py --out bench/results/ppo_backtest_cpu.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import write_record  # noqa: E402


def day_by_day(market, spec, start: int, stop: int, decide, num_envs: int) -> dict:
    """The loop before run_policy's two parts: observe, the window, the whole decision, the training step."""
    import torch

    from trainers.ppo.env import fixed_range_env

    env = fixed_range_env(market, spec, start, stop, num_envs)
    values = [env.value()]
    with torch.no_grad():
        for _day in range(stop - start):
            t, portfolio = env.observe()
            _obs, _reward, _done, info = env.step(decide(market.windows(t, spec.window), portfolio))
            values.append(info["value"])
    return {"values": torch.stack(values, 1).cpu().numpy()}


def measure(run, repeats: int) -> dict:
    """Aten ops of one call (counted once, after a warm-up call), and its best time of `repeats`."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.ops += 1
            return func(*args, **(kwargs or {}))

    run()
    with Counter():
        curve = run()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return {"aten_ops": Counter.ops, "seconds": min(seconds), "curve": curve["values"], "trades": curve.get("trades")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, or auto")
    p.add_argument("--synthetic-days", type=int, default=2520, help="days of the synthetic market (the default's)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls of each loop; the best is kept")
    p.add_argument("--out", default=None, help="JSON to write")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.synthetic_days < 2:
        p.error("--repeats must be >= 1 and --synthetic-days >= 2")

    import numpy as np
    import torch

    from trainers.ppo.build import AgentSet
    from trainers.ppo.config import PpoConfig
    from trainers.ppo.data import env_spec, load_trading_data
    from trainers.ppo.env import DeviceMarket
    from trainers.ppo.evaluate import deterministic_actor, random_actor, run_policy
    from trainers.runtime.dist import pick_device

    device = pick_device(0, args.device)
    cfg = PpoConfig(synthetic_days=args.synthetic_days)
    data, _info = load_trading_data(cfg, log=lambda _msg: None)
    market, spec = DeviceMarket(data.close, data.features, device), env_spec(cfg)
    agent = AgentSet(cfg, data.n_stocks, device).agents[0]
    torch.manual_seed(1)
    with torch.no_grad():  # moved off its init, whose actions are too small to buy a whole share
        for param in agent.policy.parameters():
            param.add_(0.3 * torch.randn_like(param))
    policy, norms = agent.policy.eval(), agent.norms
    start, stop = data.splits["test"]
    days = stop - start

    def whole_model(window, portfolio):  # the deterministic action as it was: the whole net, critic included
        return torch.tanh(policy.net(norms[0](window), norms[1](portfolio))[0]).double()

    def random_run():  # a fresh generator each call: every call draws the same actions
        return run_policy(market, spec, start, stop, random_actor(market.n_stocks, 7, device), cfg.random_runs)

    def random_day_by_day():
        actor = random_actor(market.n_stocks, 7, device)
        return day_by_day(market, spec, start, stop, lambda _window, portfolio: actor.act(None, portfolio),
                          cfg.random_runs)

    rows = {}
    for name, new, old in (
            ("agent", lambda: run_policy(market, spec, start, stop, deterministic_actor(policy, norms)),
             lambda: day_by_day(market, spec, start, stop, whole_model, 1)),
            ("random_policy", random_run, random_day_by_day)):
        now, before = measure(new, args.repeats), measure(old, args.repeats)
        rows[name] = {"day_by_day": {"aten_ops_per_day": before["aten_ops"] / days,
                                     "seconds_per_day": before["seconds"] / days},
                      "run_policy": {"aten_ops_per_day": now["aten_ops"] / days, "seconds_per_day": now["seconds"] / days},
                      "ops_ratio": before["aten_ops"] / now["aten_ops"], "time_ratio": before["seconds"] / now["seconds"],
                      "curves_max_abs_difference": float(np.abs(now["curve"] - before["curve"]).max()),
                      "trades_per_run": float(now["trades"].sum() / len(now["trades"]))}
        print(f"{name:<14} aten ops a day {rows[name]['day_by_day']['aten_ops_per_day']:7.1f} -> "
              f"{rows[name]['run_policy']['aten_ops_per_day']:6.1f} ({rows[name]['ops_ratio']:.2f}x), seconds "
              f"{before['seconds']:.3f} -> {now['seconds']:.3f} ({rows[name]['time_ratio']:.2f}x), curves differ by "
              f"{rows[name]['curves_max_abs_difference']:.3g}")
    write_record({"benchmark": "ppo_backtest", "device": str(device), "days": days, "num_stocks": data.n_stocks,
                  "window": cfg.window, "random_runs": cfg.random_runs, "results": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
