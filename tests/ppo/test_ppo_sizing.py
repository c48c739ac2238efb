"""PPO's environment batch and minibatch by device (issue 33): today's 64 x 512 on a CPU; on a GPU a thousand
environments and a minibatch scaled alike, unless the user says; a minibatch larger than a rollout refused."""

import pytest

from trainers.errors import UsageError
from trainers.ppo.config import PpoConfig
from trainers.ppo.size import CPU_ENVS, MAX_AUTO_ENVS, env_batch, rollout_bytes_per_env, size_for_device, workload
from trainers.runtime import device as device_mod

GIB = 2**30


def test_a_cpu_keeps_todays_defaults_and_a_gpu_gets_a_thousand_environments():
    cfg = PpoConfig()
    assert env_batch(cfg, None) == (CPU_ENVS, 512) == (64, 512)
    assert env_batch(cfg, 16 * GIB) == (MAX_AUTO_ENVS, MAX_AUTO_ENVS * cfg.rollout_steps // 8) == (1024, 8192)


def test_a_small_card_gets_the_power_of_two_its_memory_holds_and_never_fewer_than_a_cpu():
    cfg = PpoConfig(num_stocks=30, window=60, rollout_steps=256)
    per_env = rollout_bytes_per_env(cfg)
    envs, batch = env_batch(cfg, 4 * 300 * per_env)  # a quarter of it holds 300 environments' rollouts
    assert (envs, batch) == (256, 256 * 256 // 8)
    assert env_batch(cfg, 10 * per_env)[0] == CPU_ENVS


def test_the_users_numbers_are_kept():
    assert env_batch(PpoConfig(num_envs=8), 80 * GIB) == (8, 8 * 64 // 8)
    assert env_batch(PpoConfig(batch_size=100), 80 * GIB) == (1024, 100)


def test_sizing_for_the_device_fills_the_config_and_refuses_a_minibatch_larger_than_a_rollout(monkeypatch):
    monkeypatch.setattr(device_mod, "total_memory", lambda _device: 16 * GIB)
    cfg = PpoConfig()
    size_for_device(cfg, "cuda:0")
    assert (cfg.num_envs, cfg.batch_size) == (1024, 8192)  # what the run's config.json records
    cfg = PpoConfig(batch_size=100_000)
    monkeypatch.setattr(device_mod, "total_memory", lambda _device: None)
    with pytest.raises(UsageError, match="--batch-size 100000 is more than one rollout holds"):
        size_for_device(cfg, "cpu")


def test_the_plan_describes_the_gpu_default():
    w = workload(PpoConfig(num_stocks=4, window=6, hidden=16))
    assert w.shape["envs"] == MAX_AUTO_ENVS and w.items_per_micro == MAX_AUTO_ENVS * 64
