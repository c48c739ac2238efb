"""Each trainer's evaluation loop makes no host sync per batch: its syncs are a fixed few per call.

Why: on a GPU every `.item()`, `float()`, `.cpu()` or pageable host-to-device copy inside an evaluation
loop makes the host wait for the device's queue, batch after batch, so evaluating a large split runs at
the speed of round trips rather than of the GPU. A CPU run never shows it (nothing queues). Under the fake
accelerator (tests/fakes/accelerator/fake_accelerator.py) each such wait is recorded, so here every
evaluation function runs twice on tiny data placed on the fake device: once in few batches and once in at
least four times as many (for PPO, four times as many simulated days). A sync per batch would make the
second call record more; one per call (the final `float()` of a loss, the `.cpu()` of predictions) records
the same. The batch counts are measured too (forward passes, decisions), so the test cannot pass because
the two calls happened to run the same loop.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from fake_accelerator import FakeAccelerator, Sync

MANY_TIMES = 4  # the long call runs at least this many times the short call's batches
FEW_SYNCS = 16  # a handful a call (the loss read back, predictions copied out: 7 a split in the LSTM), never hundreds


@pytest.fixture
def acc():
    with FakeAccelerator() as fake:
        yield fake


@dataclasses.dataclass
class Counted:
    syncs: list[Sync]
    batches: int


def counted(acc: FakeAccelerator, model: torch.nn.Module | None, call, batches=None) -> Counted:
    """The syncs `call()` made and its batches: the model's forward passes, or `batches()` after the call."""
    passes = []
    hook = model.register_forward_hook(lambda *_: passes.append(1)) if model is not None else None
    before = len(acc.syncs)
    try:
        call()
    finally:
        if hook is not None:
            hook.remove()
    return Counted(acc.syncs[before:], len(passes) if batches is None else batches())


def where(syncs: list[Sync]) -> str:
    return "\n".join(f"  {s.kind:<22} {s.op:<40} {s.where}" for s in syncs) or "  (none)"


def assert_no_sync_per_batch(few: Counted, many: Counted) -> None:
    assert many.batches >= MANY_TIMES * few.batches > 0, \
        f"the long call ran {many.batches} batches, the short one {few.batches}: the test compares nothing"
    n_few, n_many = len(few.syncs), len(many.syncs)  # plain numbers: pytest then prints the message, not the lists
    assert n_many == n_few, (
        f"{n_few} syncs in {few.batches} batches but {n_many} in {many.batches}: a host sync per batch.\n"
        f"short call:\n{where(few.syncs)}\nlong call:\n{where(many.syncs)}")
    assert n_few <= FEW_SYNCS, f"{n_few} syncs in one evaluation:\n{where(few.syncs)}"


# ---- forecast ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def forecast_market():
    """The host side of the tiny market (TINY_DATA's sizes), read once: each test builds its store from it."""
    from trainers.forecast.config import ForecastConfig
    from trainers.forecast.data import load_market

    cfg = ForecastConfig(synthetic_tickers=16, synthetic_days=800, window=32, horizon=5, synthetic_momentum=0.3)
    return cfg, load_market(cfg, log=lambda _msg: None)


def forecast_on_device(acc, forecast_market):
    """What train.py and evaluate_run hold: the store and the model on the device, one process."""
    from trainers.forecast.build import build_model
    from trainers.forecast.data import make_store
    from trainers.runtime.rundir import single_process_context

    cfg, market = forecast_market
    store, _ = make_store(cfg, market)
    store.to(acc.device)
    torch.manual_seed(0)
    model = build_model(cfg, store).to(acc.device)
    return store, model, single_process_context(str(acc.device))


def test_forecast_validation_loss_syncs_once_per_call_not_per_batch(acc, forecast_market):
    from trainers.forecast.evaluate import validation_loss

    store, model, ctx = forecast_on_device(acc, forecast_market)
    few, many = (counted(acc, model, lambda b=b: validation_loss(model, store, ctx, b)) for b in (512, 64))
    assert_no_sync_per_batch(few, many)


def test_forecast_predictions_of_a_split_sync_once_per_call_not_per_batch(acc, forecast_market):
    from trainers.forecast.evaluate import predict_split

    store, model, ctx = forecast_on_device(acc, forecast_market)
    few, many = (counted(acc, model, lambda b=b: predict_split(model, store, "val", ctx, b))
                 for b in (512, 64))
    assert_no_sync_per_batch(few, many)


# ---- lstm ----------------------------------------------------------------------------------------
def lstm_on_device(acc):
    """One synthetic symbol as a job plans it, its tensors and a tiny model on the device."""
    from trainers.lstm.build import build_model
    from trainers.lstm.config import LstmConfig
    from trainers.lstm.features import build_symbol_data
    from trainers.lstm.job import prepare_job

    cfg = LstmConfig(synthetic_tickers=1, synthetic_days=700, window=16, hidden=8, layers=1)
    plan = prepare_job(cfg, log=lambda _msg: None)
    data = build_symbol_data(plan.bars["SYN000"], cfg, plan.timeframes).to(acc.device)
    torch.manual_seed(0)
    return cfg, data, build_model(cfg, data.n_features).to(acc.device)


def test_lstm_validation_loss_syncs_once_per_call_not_per_batch(acc):
    from trainers.lstm.evaluate import validation_loss

    _cfg, data, model = lstm_on_device(acc)
    few, many = (counted(acc, model, lambda b=b: validation_loss(model, data, b)) for b in (16, 4))
    assert_no_sync_per_batch(few, many)


def test_lstm_logits_stay_on_the_device_whatever_the_batch_count(acc):
    from trainers.lstm.evaluate import predict_logits

    _cfg, data, model = lstm_on_device(acc)
    few, many = (counted(acc, model, lambda b=b: predict_logits(model, data, data.ids["val"], b)) for b in (16, 4))
    assert_no_sync_per_batch(few, many)


def test_lstm_evaluate_symbol_syncs_a_fixed_few_times_whatever_the_batch_count(acc):
    """The whole evaluation of a symbol: the logistic regression is fitted on the host by design (L-BFGS
    reads its loss every iteration), so its inputs are copied once; nothing grows with the batches."""
    from trainers.lstm.evaluate import evaluate_symbol

    cfg, data, model = lstm_on_device(acc)
    few, many = (counted(acc, model, lambda b=b: evaluate_symbol(model, data, b, cfg.cost_bps, 4)) for b in (16, 4))
    assert_no_sync_per_batch(few, many)



def test_lstm_cohort_final_evaluation_syncs_a_fixed_few_times_whatever_the_batch_count(acc):
    """A cohort's members ending together are evaluated in one series of stacked passes: their logits
    stay on the device until one read, however many passes the longest member's windows take."""
    from trainers.lstm.cohort import Cohort, Member, evaluation_logits
    from trainers.lstm.config import LstmConfig
    from trainers.lstm.features import build_symbol_data
    from trainers.lstm.job import prepare_job, symbol_config

    cfg = LstmConfig(synthetic_tickers=3, synthetic_days=700, window=16, hidden=8, layers=2)
    plan = prepare_job(cfg, log=lambda _msg: None)
    members = [Member(symbol_config(cfg, s), build_symbol_data(plan.bars[s], cfg, plan.timeframes).to(acc.device), 10)
               for s in plan.symbols]
    cohort = Cohort(members, cfg, acc.device)
    assert cohort.stacked_evaluation  # an accelerator's way: the members' models run together
    few, many = (counted(acc, cohort.model, lambda b=b: evaluation_logits(cohort, members, b)) for b in (256, 16))
    assert_no_sync_per_batch(few, many)

# ---- ppo -----------------------------------------------------------------------------------------
def ppo_on_device(acc):
    """The agent's market and an untrained agent on the device, as evaluate_run builds them (the sizes of
    the loop contract's tiny run)."""
    from trainers.ppo.build import AgentSet
    from trainers.ppo.config import PpoConfig
    from trainers.ppo.data import env_spec, load_trading_data
    from trainers.ppo.env import DeviceMarket

    cfg = PpoConfig(synthetic_tickers=5, num_stocks=4, synthetic_days=600, window=8, hidden=16)
    data, _info = load_trading_data(cfg, log=lambda _msg: None)
    market = DeviceMarket(data.close, data.features, acc.device)
    return data, market, env_spec(cfg), AgentSet(cfg, data.n_stocks, acc.device).agents[0]


def counted_decisions(actor):
    """`actor` that counts its decisions: a simulated day is one decision of every environment."""
    from trainers.ppo.evaluate import Actor

    calls = []

    def counting(prepared, portfolio):
        calls.append(1)
        return actor.act(prepared, portfolio)
    return Actor(actor.prepare, counting), lambda: len(calls)


def run_days(acc, market, spec, start: int, days: int, actor, num_envs: int = 1) -> Counted:
    from trainers.ppo.evaluate import run_policy

    counting, decisions = counted_decisions(actor)
    return counted(acc, None, lambda: run_policy(market, spec, start, start + days, counting, num_envs), decisions)


def test_ppo_policy_run_syncs_once_per_call_not_per_simulated_day(acc):
    from trainers.ppo.evaluate import deterministic_actor

    data, market, spec, agent = ppo_on_device(acc)
    start = data.splits["test"][0]
    act = deterministic_actor(agent.policy, agent.norms)  # the trained agent's path: its network on each window
    few, many = (run_days(acc, market, spec, start, days, act) for days in (5, 5 * MANY_TIMES))
    assert_no_sync_per_batch(few, many)


def test_ppo_random_policy_runs_sync_once_per_call_not_per_simulated_day(acc):
    from trainers.ppo.evaluate import random_actor

    data, market, spec, _agent = ppo_on_device(acc)
    start = data.splits["test"][0]
    few, many = (run_days(acc, market, spec, start, days, random_actor(market.n_stocks, 7, acc.device), num_envs=2)
                 for days in (5, 5 * MANY_TIMES))
    assert_no_sync_per_batch(few, many)


# ---- gpt -----------------------------------------------------------------------------------------
def test_gpt_validation_loss_syncs_once_per_call_not_per_batch(acc, tmp_path):
    """GPT_TINY's model and synthetic text, the trainer's device copies of the validation split; the same
    2,048 evaluation tokens (64 windows) in batches of 16 and of 4 windows."""
    from trainers.gpt.build import build_model
    from trainers.gpt.config import GptConfig
    from trainers.gpt.data import device_tokens, load_corpus, markov_source
    from trainers.gpt.evaluate import validation_loss
    from trainers.runtime.precision import precision_for
    from trainers.runtime.rundir import single_process_context

    cfg = GptConfig(depth=1, head_dim=16, seq_len=32, synthetic_chars=65536, eval_tokens=2048)
    corpus = load_corpus("synthetic", str(tmp_path), cfg.seq_len, cfg.val_frac, markov_source(cfg),
                         cfg.synthetic_chars, log=lambda _msg: None)
    _train, val_np = corpus.split(cfg.val_frac)
    torch.manual_seed(0)
    model = build_model(cfg, len(corpus.vocab)).to(acc.device)
    val, utf8 = device_tokens(val_np, acc.device), torch.from_numpy(corpus.utf8_bytes).to(acc.device)
    ctx, precision = single_process_context(str(acc.device)), precision_for(acc.device)
    few, many = (counted(acc, model, lambda b=b: validation_loss(model, val, cfg.seq_len, cfg.eval_tokens, b, ctx,
                                                                  precision, utf8))
                 for b in (16, 4))
    assert_no_sync_per_batch(few, many)


# ---- gnn -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gnn_graphs(tmp_path_factory) -> Path:
    """8 validation graphs of at most 30 nodes, written by the trainer's own `gnn data`."""
    out = tmp_path_factory.mktemp("gnn") / "graphs"
    run_cli(["gnn", "data", "--out", str(out), "--train", "8", "--val", "8", "--max-nodes", "30", "--no-progress"],
            timeout=120, check=True)
    return out


def test_gnn_validation_loss_syncs_once_per_call_not_per_batch(acc, gnn_graphs):
    """One batch of every graph, then a batch per graph (--nodes-per-batch 1: each graph overflows it).
    (`evaluate`, the final colouring, decodes each graph on the host by design: no batch loop to test.)"""
    from trainers.gnn.batch import DeviceGraphs
    from trainers.gnn.build import build_model
    from trainers.gnn.config import GnnConfig
    from trainers.gnn.evaluate import EVAL_SEED, validation_loss
    from trainers.gnn.graphs import GraphSplit
    from trainers.runtime.rundir import single_process_context

    cfg = GnnConfig(data_dir=str(gnn_graphs), hidden=16, layers=2)
    val = DeviceGraphs(GraphSplit(gnn_graphs, "val"), cfg.max_colors, cfg.random_features, acc.device,
                       fixed_random_seed=EVAL_SEED)  # as train.py holds the validation split
    torch.manual_seed(0)
    model = build_model(cfg).to(acc.device)
    ctx = single_process_context(str(acc.device))
    few, many = (counted(acc, model, lambda n=n: validation_loss(model, val, dataclasses.replace(cfg, nodes_per_batch=n),
                                                                  ctx))
                 for n in (100_000, 1))
    assert_no_sync_per_batch(few, many)
