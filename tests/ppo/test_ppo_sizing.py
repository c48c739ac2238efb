"""PPO's environment batch and minibatch by device (issue 33): today's 64 x 512 on a CPU; on a GPU up to 4,096
environments and a minibatch scaled alike, as long as each agent keeps 16 updates, unless the user
says; a resume keeps the run folder's numbers; a minibatch larger than a rollout refused (by the plan too)."""

import pytest
import torch

from trainers.errors import UsageError
from trainers.ppo.config import PpoConfig
from trainers.ppo.size import (
    CPU_ENVS,
    MAX_AUTO_ENVS,
    MIN_UPDATES_PER_AGENT,
    env_batch,
    flops_per_env_step,
    policy_saved_bytes,
    rollout_bytes_per_env,
    sized_for_device,
    update_bytes_per_env,
    workload,
)
from trainers.ppo.train import pin_from_saved
from trainers.runtime import device as device_mod

GIB = 2**30
LONG = 1024 * 64 * MIN_UPDATES_PER_AGENT * 8  # env steps an agent: 16 updates of 1,024 x 64 on 8 GPUs
LONGEST = 4 * LONG  # 16 updates of 4,096 x 64 on 8 GPUs


def test_a_cpu_keeps_todays_defaults_and_a_gpu_gets_thousands_of_environments_for_a_long_job():
    assert env_batch(PpoConfig(), None) == (CPU_ENVS, 512) == (64, 512)
    assert env_batch(PpoConfig(total_steps=LONG), 16 * GIB, 8) == (1024, 1024 * 64 // 8)  # as many as the job allows
    longest = PpoConfig(total_steps=LONGEST)
    assert env_batch(longest, 80 * GIB, 8) == (MAX_AUTO_ENVS, 32768) == (4096, 4096 * 64 // 8)  # the cap
    # a quarter of a 16 GB card holds about 1,100 environments' rollouts and update minibatches of the default shape
    # (the policy's saved activations most of it): the power of two below
    per_env = rollout_bytes_per_env(longest) + update_bytes_per_env(longest, policy_saved_bytes(longest))
    assert 1024 <= 4 * GIB // per_env < 2048 and env_batch(longest, 16 * GIB, 8)[0] == 1024


def test_a_job_keeps_its_updates_per_agent():
    """The 8-GPU deploy's 504,000 env steps an agent: 1,024 environments would leave one update; 64 leave 16 (the
    last one short)."""
    deploy = PpoConfig(num_episodes=2000)
    assert env_batch(deploy, 80 * GIB, 8)[0] == CPU_ENVS
    assert env_batch(deploy, 80 * GIB, 1)[0] == 256  # 504,000 / (64 steps x 16 updates) = 492 -> 256
    envs = env_batch(PpoConfig(total_steps=LONG), 80 * GIB, 8)[0]
    assert LONG // (8 * envs * 64) >= MIN_UPDATES_PER_AGENT


def test_a_small_card_gets_the_power_of_two_its_memory_holds_and_never_fewer_than_a_cpu():
    cfg = PpoConfig(num_stocks=30, window=60, rollout_steps=256, total_steps=10**9)
    per_env = rollout_bytes_per_env(cfg) + update_bytes_per_env(cfg, policy_saved_bytes(cfg))
    assert env_batch(cfg, 4 * 300 * per_env) == (256, 256 * 256 // 8)  # a quarter holds 300 environments' rollouts
    assert env_batch(cfg, 10 * per_env)[0] == CPU_ENVS


def test_the_users_numbers_are_kept():
    assert env_batch(PpoConfig(num_envs=8, total_steps=10**9), 80 * GIB) == (8, 8 * 64 // 8)
    assert env_batch(PpoConfig(batch_size=100, total_steps=10**9), 80 * GIB) == (4096, 100)


def sized(cfg: PpoConfig, device: str, world_size: int, saved: dict | None) -> PpoConfig:
    """What training does before its config check: the folder's saved numbers, then the device's."""
    return sized_for_device(pin_from_saved(cfg, saved), device, world_size)


def test_a_resume_keeps_the_folders_numbers_on_any_device(monkeypatch):
    """A folder begun with --rollout-steps 16 before the minibatch followed the rollout saved 512: the same
    command resumes it (it was refused as another config), and a GPU resumes a CPU's run with its 64."""
    saved = {"num_envs": 64, "batch_size": 512}
    cfg = PpoConfig(rollout_steps=16)
    cfg = sized(cfg, "cpu", 1, saved)
    assert (cfg.num_envs, cfg.batch_size) == (64, 512)
    monkeypatch.setattr(device_mod, "total_memory", lambda _device: 80 * GIB)
    cfg = PpoConfig(total_steps=LONG)
    cfg = sized(cfg, "cuda:0", 8, saved)
    assert (cfg.num_envs, cfg.batch_size) == (64, 512)
    cfg = PpoConfig(total_steps=LONG)
    cfg = sized(cfg, "cuda:0", 8, None)  # a fresh run: the device's
    assert (cfg.num_envs, cfg.batch_size) == (1024, 8192)


def test_a_minibatch_larger_than_a_rollout_is_refused_by_the_run_and_the_plan(monkeypatch):
    monkeypatch.setattr(device_mod, "total_memory", lambda _device: None)
    with pytest.raises(UsageError, match="--batch-size 100000 is more than one rollout holds"):
        sized(PpoConfig(batch_size=100_000), "cpu", 1, None)
    with pytest.raises(UsageError, match="--batch-size 100000 is more than one rollout holds"):
        workload(PpoConfig(batch_size=100_000, num_stocks=4, window=6, hidden=16))


def test_the_plan_describes_one_gpus_default():
    w = workload(PpoConfig(num_stocks=4, window=6, hidden=16, total_steps=LONG))
    assert w.shape["envs"] == MAX_AUTO_ENVS and w.items_per_micro == MAX_AUTO_ENVS * 64


def test_the_plan_counts_the_whole_updates_the_run_trains(tmp_path):
    """The run rounds --total-steps up to whole updates of every rank's environments (its schedule); the plan
    counted the steps as given: 600 env steps on 2 ranks where the run trains 1,024."""
    from trainers.ppo.train import updates_per_agent

    cfg = PpoConfig(num_stocks=4, window=6, hidden=16, num_envs=8, rollout_steps=16, batch_size=64, total_steps=300)
    per_update = 8 * 16 * 2
    updates, _ = updates_per_agent(cfg, tmp_path, per_update)
    planned = workload(cfg).for_device(80 * GIB, 2)
    assert planned.items_total == updates * per_update * len(cfg.agents()) == 1024


@pytest.mark.parametrize("count", ["ppo", "gnn"])
def test_the_runs_flop_count_leaves_the_global_rng_as_it_was(count):
    """Training counts its FLOPs per item (for its MFU) before it builds its models: the count's own
    models and inputs must not move the seed the run's initialisation draws from."""
    from trainers.gnn.config import GnnConfig
    from trainers.gnn.size import flops_per_node

    torch.manual_seed(3)
    before = torch.get_rng_state()
    flops = (flops_per_env_step(PpoConfig(num_stocks=4, window=6, hidden=16), 4) if count == "ppo" else
             flops_per_node(GnnConfig(hidden=16, layers=2)))
    assert flops > 0 and torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("options", [{}, {"seeds": 2}, {"baseline_mlp": False}, {"encoder": "mlp"}])
def test_the_flops_of_an_env_step_are_the_mean_over_the_runs_agents(options):
    """Each agent makes as many env steps: the run's FLOPs an env step are the mean of its agents' (the CLSTM
    agent costs several times the MLP baseline), each an acting forward and 3 forwards an update epoch."""
    from trainers.ops.plan import forward_flops
    from trainers.ppo.build import build_model

    cfg = PpoConfig(num_stocks=4, window=6, hidden=16, update_epochs=3, **options)
    one = {e: forward_flops(build_model(cfg, 4, e), (torch.randn(1, 6, 4, 6), torch.randn(1, 5), torch.randn(1, 4)))
           for e in ("clstm", "mlp")}
    assert one["clstm"] > 2 * one["mlp"]
    agents = [e for e, _ in cfg.agents()]
    assert flops_per_env_step(cfg, 4) == pytest.approx(sum(one[e] for e in agents) / len(agents) * (1 + 3 * 3))


def test_a_rollouts_bytes_are_what_the_buffer_holds():
    """The buffer keeps the date and the portfolio of each step (the window is gathered from the features when
    used); it was counted as if it held every step's [window, stocks, features] window (180x, at the defaults)."""
    from trainers.ppo.ppo import Rollout

    cfg = PpoConfig(num_stocks=7, window=12, rollout_steps=5)
    envs = 3
    obs = (torch.zeros(envs, dtype=torch.int64), torch.zeros(envs, cfg.num_stocks + 1))
    buf = Rollout(cfg.rollout_steps, obs, (cfg.num_stocks,), torch.float32, torch.device("cpu"))
    held = [*buf.obs, buf.actions, buf.log_probs, buf.rewards, buf.dones, buf.values]
    advantages_and_returns = 2 * cfg.rollout_steps * envs * 4
    assert envs * rollout_bytes_per_env(cfg) == sum(t.nbytes for t in held) + advantages_and_returns


def test_a_plan_of_more_env_steps_sizes_the_environments_for_that_job():
    """The environment batch follows the job's length (16 updates an agent at least): --items planned the options'
    own job's batch (64 environments, 10.85 h) where training that many steps sizes 4,096 (1.34 h)."""
    import dataclasses

    from trainers.ops.devices import DEVICES
    from trainers.ops.plan import plan

    cfg = PpoConfig()
    asked = plan(workload(cfg), DEVICES["h200"], 1, items=1e9)
    trained = plan(workload(dataclasses.replace(cfg, total_steps=500_000_000)), DEVICES["h200"], 1)
    assert asked.shape["envs"] == trained.shape["envs"] == MAX_AUTO_ENVS
    assert asked.time["hours"] == pytest.approx(trained.time["hours"], rel=1e-3)
