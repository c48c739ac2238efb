"""`trainers plan`: sizes counted from the model, memory checked against what autograd and AdamW
really hold, the seeds' claims as tests, time and money, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainers.cli import main
from trainers.forecast.model import Forecaster
from trainers.forecast.size import activation_bytes_per_sample
from trainers.ops.commands import load_workload
from trainers.ops.devices import DEVICES, device_for_name
from trainers.ops.plan import compare, measured_mfu, memory, plan, saved_bytes, saved_bytes_per_item

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("d,layers,heads,ff,window,dropout", [(32, 2, 4, 64, 16, 0.0), (64, 3, 4, 256, 40, 0.1)])
@pytest.mark.parametrize("dtype,compute_bytes", [(None, 4), (torch.bfloat16, 2)])
def test_the_forecasters_activation_estimate_matches_what_autograd_saves(d, layers, heads, ff, window, dropout, dtype,
                                                                          compute_bytes):
    torch.manual_seed(0)
    model = Forecaster(d, layers, heads, ff, 5, window, dropout=dropout).train()
    measured = saved_bytes_per_item(model, lambda b: (torch.randn(b, window, 5),), batches=(2, 6), autocast_dtype=dtype)
    estimate = activation_bytes_per_sample(window, 5, d, layers, heads, ff, dropout, compute_bytes)
    assert estimate == pytest.approx(measured, rel=0.10), (estimate, measured)


def test_weight_grad_and_optimizer_bytes_are_what_the_state_dicts_hold():
    w = load_workload("forecast", ["--preset", "tiny", "--window", "90"])
    model = Forecaster(32, 2, 4, 64, 5, 90, past_returns=0)  # the default model: past returns from ret_1d
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 90, 5)).sum().backward()
    opt.step()
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values() if t.dim() > 0 and
                  t.dtype == torch.float32) - 0  # buffers are 0-dim
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    moments = sum(v.numel() * v.element_size() for s in opt.state.values() for k, v in s.items() if k != "step")
    m = memory(w, "ddp", 1, compute_bytes=4)
    assert (m["weights"], m["grads"], m["optimizer"]) == (weights, grads, moments)
    assert w.parameters == sum(p.numel() for p in model.parameters())


def test_seed_000s_151m_at_2048_per_gpu_does_not_fit_80gb_and_the_fix_is_accumulation():
    # a 120-day window (the kit's default before the demo moved to 60; seed 000 names none)
    w = load_workload("forecast", ["--preset", "151m", "--batch-size", "2048", "--window", "120"])
    assert 150e6 < w.parameters < 153e6
    p = plan(w, DEVICES["h100-sxm"], 8)
    assert p.chosen is None and "2x smaller with 2x gradient accumulation" in p.fix
    assert plan(load_workload("forecast", ["--preset", "151m", "--batch-size", "1024", "--window", "120"]), DEVICES["h100-sxm"],
                8).chosen == "ddp"


def test_time_and_money_for_hours_a_budget_or_the_configs_own_job():
    w = load_workload("forecast", ["--preset", "base", "--epochs", "10"])
    h100 = DEVICES["h100-sxm"]
    own = plan(w, h100, 8, usd_per_gpu_hour=3.0)
    assert own.time["items"] == w.items_total and own.money["usd"] == pytest.approx(own.time["hours"] * 8 * 3.0)
    bought = plan(w, h100, 8, usd_per_gpu_hour=3.0, budget_usd=24.0)
    assert bought.time["hours"] == pytest.approx(1.0) and bought.time["items"] == pytest.approx(
        bought.time["items_per_s"] * 3600)
    t = own.time
    assert t["step_s"] == pytest.approx(t["compute_s"] + t["communication_s"]) and t["communication_s"] > 0
    # the forecaster's MFU on an H100 is measured (bench/results/gpu_h100: the 151m loop, its only size there)
    measured = json.loads((REPO / "bench/results/gpu_h100/run_forecast_gpu.json").read_text())["results"][0]["mfu"]
    assert own.mfu["source"].startswith("measured") and own.mfu["value"] == pytest.approx(measured)


def test_a_small_forecaster_is_planned_at_least_a_launch_floor_a_step():
    """The tiny and small presets' FLOPs at the 151m's MFU made a step of well under a millisecond: the plan
    promised the default preset 146 steps in 0.00087 s. A step takes at least the assumed floor, and says so;
    the 151m is bound by its FLOPs, not by the floor."""
    from trainers.forecast.size import SMALL_STEP_S

    h100 = DEVICES["h100-sxm"]
    for preset in ("tiny", "small"):
        t = plan(load_workload("forecast", ["--preset", preset]), h100, 8).time
        assert t["launch_bound"] and t["step_s"] == SMALL_STEP_S > t["compute_s"] + t["communication_s"], preset
        assert t["step_floor_why"].startswith("ASSUMED"), preset
    accumulated = plan(load_workload("forecast", ["--preset", "tiny", "--grad-accum", "4"]), h100, 8).time
    assert accumulated["step_s"] == 4 * SMALL_STEP_S  # each micro-batch launches its kernels
    large = plan(load_workload("forecast", ["--preset", "151m", "--window", "120"]), h100, 8).time
    assert not large["launch_bound"] and large["step_s"] > SMALL_STEP_S


def read_from(monkeypatch, root: Path) -> None:
    """The plan reads the committed GPU results; from here on, the records under `root`."""
    import trainers.ops.plan as plan_mod

    committed = plan_mod.measured_configuration
    monkeypatch.setattr(plan_mod, "measured_configuration", lambda *a, **k: committed(*a, **{**k, "root": root}))


def test_a_committed_gpu_benchmark_sets_the_mfu(tmp_path):
    (tmp_path / "train_gpu_compiled.json").write_text(json.dumps(
        {"device": "NVIDIA H100 80GB HBM3", "results": [{"preset": "151m", "kit": {"mfu": 0.47}}]}))
    assert measured_mfu("forecast", DEVICES["h100-sxm"], tmp_path) == 0.47
    assert measured_mfu("forecast", DEVICES["a100-80gb"], tmp_path) is None


def test_the_measured_mfu_is_the_one_of_the_nearest_size_not_the_best_of_any(tmp_path):
    """A benchmark of three GPT depths: a plan for a small model must not get the large one's MFU."""
    (tmp_path / "gpt_throughput_gpu.json").write_text(json.dumps(
        {"device": "NVIDIA H100 80GB HBM3", "trainer": "gpt", "results": [
            {"depth": 6, "parameters": 30_000_000, "mfu": 0.21},
            {"depth": 12, "parameters": 200_000_000, "mfu": 0.38},
            {"depth": 26, "parameters": 1_100_000_000, "mfu": 0.52},
            {"depth": 26, "parameters": 1_100_000_000, "mfu": 0.44},  # the same size eager: the compiled row counts
            {"depth": 12, "mfu": 0.9},  # no size: used only when no row has one
            "a row that is not an object"]}))
    h100 = DEVICES["h100-sxm"]
    assert measured_mfu("gpt", h100, tmp_path, parameters=20_000_000) == 0.21
    assert measured_mfu("gpt", h100, tmp_path, parameters=150_000_000) == 0.38
    assert measured_mfu("gpt", h100, tmp_path, parameters=12_886_999_040) == 0.52
    (tmp_path / "gpt_throughput_gpu.json").write_text(json.dumps(
        {"device": "NVIDIA H100 80GB HBM3", "trainer": "gpt", "results": [{"mfu": 0.3}, {"mfu": 0.5}]}))
    assert measured_mfu("gpt", h100, tmp_path, parameters=20_000_000) == 0.5


def test_a_small_models_measured_mfu_is_the_one_of_the_nearest_step(tmp_path, monkeypatch):
    """A launch-bound model's MFU grows with its step: PPO at 64 environments a step uses the card far less
    than at 1,024. A plan for either takes the run of the nearest step (bench/gpu.py's items_per_step), so the
    64-environment run cannot make a plan at 1,024 pessimistic 10x, nor the reverse; rows of no step size count
    only when none has one, and a garbled step size is no size."""
    record = {"device": "NVIDIA H100 80GB HBM3", "trainer": "ppo", "results": [
        {"mfu": 0.0005, "items_per_step": 64 * 64, "parameters": {"clstm": 114430}},
        {"mfu": 0.007, "items_per_step": 1024 * 64, "parameters": {"clstm": 114430}},
        {"mfu": 0.9, "items_per_step": float("inf")}, {"mfu": 0.8, "items_per_step": True},
        {"mfu": 0.7, "items_per_step": 0.5}]}
    (tmp_path / "run_ppo_gpu.json").write_text(json.dumps(record))
    h100 = DEVICES["h100-sxm"]
    assert measured_mfu("ppo", h100, tmp_path, items_per_step=64 * 64) == 0.0005
    assert measured_mfu("ppo", h100, tmp_path, items_per_step=1024 * 64) == 0.007
    assert measured_mfu("ppo", h100, tmp_path, items_per_step=2048 * 64) == 0.007
    assert measured_mfu("ppo", h100, tmp_path, items_per_step=1) == 0.0005  # True and 0.5 are no sizes (0.5: log 0)
    assert measured_mfu("ppo", h100, tmp_path) == 0.9  # no step asked: the best row, as before
    read_from(monkeypatch, tmp_path)
    for envs, expected in ((64, 0.0005), (1024, 0.007)):
        w = load_workload("ppo", ["--num-stocks", "4", "--window", "6", "--hidden", "16", "--num-envs", str(envs)])
        assert plan(w, h100, 1).mfu["value"] == expected, envs


def test_runs_of_one_configuration_on_several_machines_give_their_median_not_the_luckiest(tmp_path, monkeypatch):
    """The GNN's compiled step at 65,536 nodes ran 8.7 M nodes/s on one H200 and 7.6 M on the next: the plan took
    the best run and promised every user the faster machine. Runs of one configuration (a size, a step, compiled
    or not) now count once each, and the plan takes their median and says their spread; a run's several rows are
    configurations side by side (its best counts), and an eager run beside a compiled one is another configuration,
    not a repeat."""
    import trainers.ops.plan as plan_mod

    def run(folder: str, mfu: float, step: int = 65536, compiled: bool | None = True, extra: tuple = ()) -> None:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "run_gnn_gpu.json").write_text(json.dumps(
            {"device": "NVIDIA H200", "trainer": "gnn", "training": {"compiled": compiled},
             "results": [{"mfu": mfu, "parameters": 35280, "items_per_step": step}, *extra]}))

    run("a", 0.0018, extra=({"mfu": 0.0001, "parameters": 35280, "items_per_step": 65536},))
    run("b", 0.0016)
    run("c", 0.0017)
    run("d", 0.0009, step=8192)  # another step: not a repeat
    h200 = DEVICES["h200"]
    runs = plan_mod.measured_runs("gnn", h200, root=tmp_path, parameters=35280, items_per_step=65536)
    assert runs == [0.0016, 0.0017, 0.0018]
    assert measured_mfu("gnn", h200, tmp_path, parameters=35280, items_per_step=65536) == pytest.approx(0.0017)
    assert measured_mfu("gnn", h200, tmp_path, parameters=35280, items_per_step=8192) == 0.0009
    read_from(monkeypatch, tmp_path)
    w = load_workload("gnn", ["--nodes-per-batch", "65536"])
    p = plan(w, h200, 1)
    assert p.mfu["value"] == pytest.approx(0.0017)
    assert p.mfu["source"] == "measured by this repository's GPU benchmark (the median of 3 runs: 0.160% to 0.180%)"
    (tmp_path / "e").mkdir()  # an eager run of the same size and step: another configuration
    (tmp_path / "e" / "run_gnn_gpu.json").write_text(json.dumps(
        {"device": "NVIDIA H200", "trainer": "gnn", "training": {"compiled": False},
         "results": [{"mfu": 0.0030, "parameters": 35280, "items_per_step": 65536}]}))
    assert plan_mod.measured_runs("gnn", h200, root=tmp_path, parameters=35280, items_per_step=65536) == [0.0030]
    (tmp_path / "e" / "run_gnn_gpu.json").unlink()
    run("f", 0.0025, compiled=None)  # a run that does not say: one more compiled run of its size and step
    assert plan_mod.measured_runs("gnn", h200, root=tmp_path, parameters=35280,
                                  items_per_step=65536) == [0.0016, 0.0017, 0.0018, 0.0025]
    # a size that is none (0, negative) chooses nothing: every run, as with no size given (it raised in math.log)
    unsized = plan_mod.measured_runs("gnn", h200, root=tmp_path)
    assert plan_mod.measured_runs("gnn", h200, root=tmp_path, parameters=-5, items_per_step=0) == unsized


def test_a_throughput_benchmarks_rows_say_whether_they_compiled(tmp_path):
    """gpt_throughput's rows say "compile": "on" or "off": its compiled row and a compiled trainer run of the same
    size are two runs of one configuration (their median), its eager row another configuration (here a little
    faster than the compiled row beside it: not that run's figure for the compiled configuration)."""
    import trainers.ops.plan as plan_mod

    (tmp_path / "gpt_throughput_gpu.json").write_text(json.dumps(
        {"device": "NVIDIA H200", "trainer": "gpt", "rows": [
            {"parameters": 85_000_000, "compile": "on", "mfu": 0.48},
            {"parameters": 85_000_000, "compile": "off", "mfu": 0.485}]}))
    (tmp_path / "run_gpt_gpu.json").write_text(json.dumps(
        {"device": "NVIDIA H200", "trainer": "gpt", "training": {"compiled": True},
         "results": [{"parameters": 85_000_000, "mfu": 0.52}]}))
    assert plan_mod.measured_runs("gpt", DEVICES["h200"], root=tmp_path, parameters=85_000_000) == [0.48, 0.52]
    assert plan_mod.percent(0.0017) == "0.17%" and plan_mod.percent(0.4821) == "48%"
    assert plan_mod.percent(0.01075, 3) == "1.07%" and plan_mod.percent(4e-05) == "0.0040%"


def test_a_small_models_rate_measured_on_one_card_is_what_the_plan_says_for_another(tmp_path, monkeypatch):
    """A small model's step is launches and host work: the default MFU promised an H100 1.6 M env steps/s of PPO
    where 79,401 were measured. A card with no measurement of its own takes the rate (items a second) of the
    slowest card that has one, said ASSUMED; its own measurement, and the forecaster's (not a small model), are
    its own. An A100 (312 TFLOP/s) at the rate measured on an H200 (989) has that many times its MFU."""
    record = {"device": "NVIDIA H200", "trainer": "ppo", "results": [{"mfu": 0.007, "items_per_step": 1024 * 64}]}
    (tmp_path / "run_ppo_gpu.json").write_text(json.dumps(record))
    read_from(monkeypatch, tmp_path)
    w = load_workload("ppo", ["--num-stocks", "4", "--window", "6", "--hidden", "16", "--num-envs", "1024"])
    h200, a100 = DEVICES["h200"], DEVICES["a100-80gb"]
    on_h200, on_a100 = plan(w, h200, 1), plan(w, a100, 1)
    assert on_h200.mfu == {"value": 0.007, "source": "measured by this repository's GPU benchmark"}
    assert on_a100.mfu["value"] == pytest.approx(0.007 * h200.peak_tflops / a100.peak_tflops)
    assert on_a100.mfu["source"].startswith("ASSUMED: env steps/s as measured on h200")
    assert on_a100.time["items_per_s"] == pytest.approx(on_h200.time["items_per_s"])
    slower = {"device": "NVIDIA A10G", "trainer": "ppo", "results": [{"mfu": 0.01, "items_per_step": 1024 * 64}]}
    (tmp_path / "run_ppo_a10g_gpu.json").write_text(json.dumps(slower))  # 0.01 x 125 TFLOP/s: the slowest rate
    assert plan(w, a100, 1).mfu["source"].startswith("ASSUMED: env steps/s as measured on a10g")
    forecast = load_workload("forecast", ["--preset", "tiny"])
    assert plan(forecast, a100, 1).mfu["source"].startswith("ASSUMED (no GPU benchmark")


def test_a_garbled_gpu_benchmark_file_is_skipped_never_fatal(tmp_path):
    """GPU JSONs are rewritten by make bench-gpu on machines we do not control (issue 34): a file whose top
    level is a list, a peer entry that is a string, rows that are not a list: the others still count."""
    (tmp_path / "train_gpu_a.json").write_text(json.dumps([{"device": "NVIDIA H100 80GB HBM3"}]))
    (tmp_path / "train_gpu_b.json").write_text(json.dumps(
        {"device": "NVIDIA H100 80GB HBM3", "results": [{"preset": "151m", "kit": "n/a"}, {"kit": {"mfu": 0.31}}]}))
    (tmp_path / "forecast_x_gpu.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "results": "n/a"}))
    (tmp_path / "train_gpu_c.json").write_text("{not json")
    assert measured_mfu("forecast", DEVICES["h100-sxm"], tmp_path) == 0.31
    (tmp_path / "train_gpu_b.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "rows": [{"kit": 7}]}))
    assert measured_mfu("forecast", DEVICES["h100-sxm"], tmp_path) is None


def test_the_forecaster_without_an_encoder_is_planned(capsys):
    """--encoder none (the linear skip alone) has no Transformer blocks: the plan took max() of none."""
    assert main(["plan", "--trainer", "forecast", "--encoder", "none", "--linear-skip", "--gpus", "1"]) == 0
    assert "plan: ddp" in capsys.readouterr().out
    w = load_workload("forecast", ["--encoder", "none", "--linear-skip"])
    assert w.n_blocks == 0 and w.block_parameters == w.parameters > 0


def test_compare_sorts_the_gpus_by_cost_and_puts_those_that_do_not_fit_last():
    w = load_workload("forecast", ["--preset", "151m", "--batch-size", "1024"])
    rows = compare(w, 8, "auto", {"h100-sxm": 2.99, "a100-80gb": 1.79, "t4": 0.35}, None, None, None)
    priced = [r for r in rows if r["usd"] is not None and r["fits"]]
    assert [r["usd"] for r in priced] == sorted(r["usd"] for r in priced)
    t4 = next(r for r in rows if r["device"] == "t4")
    assert not t4["fits"] and rows.index(t4) > rows.index(priced[-1])


def test_compare_without_prices_keeps_the_device_tables_order_where_the_times_differ_in_the_last_bits(capsys):
    """A launch-bound model plans about the same time on every card (the GNN's within 0.5 %, beyond what a plan
    knows): the table keeps DEVICES' order there instead of an order that moves with the last bits, and
    says "-" for the price and cost nobody gave (it printed 0.00 and nan) and the time in seconds for a short job
    (it printed 0.00 hours)."""
    rows = compare(load_workload("gnn", []), 8, "auto", {}, None, None, None)
    fitting = [r["device"] for r in rows if r["fits"]]
    assert fitting == [key for key in DEVICES if key in fitting]
    assert main(["plan", "--trainer", "ppo", "--compare"]) == 0
    table = capsys.readouterr().out.splitlines()[2:]
    assert table and all(line.split()[-2:] == ["-", "-"] and line.split()[-3] == "s" for line in table)
    assert "nan" not in " ".join(table)


def test_device_names_as_drivers_print_them():
    assert device_for_name("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert device_for_name("NVIDIA H100 PCIe").key == "h100-pcie"
    assert device_for_name("NVIDIA A100-SXM4-40GB", 39.4).key == "a100-40gb"
    assert device_for_name("x86_64") is None


def test_the_plan_command(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--trainer", "forecast", "--preset", "151m", "--window", "120", "--gpus", "8", "--usd-per-gpu-hour", "2.5",
                 "--hours", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "151,287,809 parameters" in text and "plan: ddp" in text and "= $40.00" in text
    saved = json.loads(out.read_text())
    assert saved["chosen"] == "ddp" and saved["money"]["usd"] == pytest.approx(40.0)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"h100-sxm": 2.99, "t4": 0.35}))
    assert main(["plan", "--preset", "small", "--compare", "--prices", str(prices), "--hours", "1"]) == 0
    assert "h100-sxm" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "h999"], "--gpu 'h999' is not one of: b200, h200"),
    (["--gpus", "0"], "--gpus: 0 is not allowed"),
    (["--usd-per-gpu-hour", "nan"], "nan is not allowed"),
    (["--hours", "1", "--budget-usd", "5"], "give one of"),
    (["--preset", "huge"], "--preset 'huge' is not one of"),
    (["--trainer", "nope"], "--trainer 'nope' is not one of"),
    (["--bogus", "1"], "--bogus"),
])
def test_bad_input_is_one_line(args, needle, capsys):
    try:
        rc = main(["plan", *args])
    except SystemExit as exc:  # argparse's own (one-line) errors
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_a_bad_prices_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"h100-sxm": -1}))
    assert main(["plan", "--compare", "--prices", str(bad)]) == 2
    assert "the price of h100-sxm is -1" in capsys.readouterr().err


@pytest.mark.parametrize("trainer,options", [("lstm", ["--hidden", "16", "--window", "12", "--cohort", "1"]),
                                             ("lstm", ["--hidden", "16", "--window", "12", "--cohort", "4"]),
                                             ("ppo", ["--hidden", "16", "--window", "6", "--num-stocks", "4"])])
def test_small_models_activation_estimates_extrapolate_to_other_batches(trainer, options):
    """Counted at batches 32 and 96, the per-item estimate must hold between 128 and 256 (activations are
    linear in the batch); in cohorts, per sample of a member of a stack of 4."""
    w = load_workload(trainer, options)
    if trainer == "lstm":
        from trainers.lstm.build import build_model
        from trainers.lstm.stacked import StackedLSTM

        cfg = __import__("trainers.registry", fromlist=["x"]).trainer_config("lstm", options)
        model = build_model(cfg).train()
        inputs = lambda b: (torch.randn(b, cfg.window, model.lstm.input_size),)  # noqa: E731
        predicted = w.activation_bytes(32, False) / 32
        if cfg.cohort > 1:  # the stack's saves per member-sample, counted on the stack of 4 itself
            stack = StackedLSTM(4, model.lstm.input_size, cfg.hidden, cfg.layers, cfg.dropout).train()
            members = lambda b: (torch.randn(4, b // 4, cfg.window, model.lstm.input_size),)  # noqa: E731
            assert predicted == pytest.approx(saved_bytes_per_item(stack, members, batches=(128, 256)), rel=0.10)
            return
    else:
        from trainers.ppo.build import build_model
        from trainers.ppo.features import FEATURES

        cfg = __import__("trainers.registry", fromlist=["x"]).trainer_config("ppo", options)
        model = build_model(cfg).train()
        inputs = lambda b: (torch.randn(b, cfg.window, cfg.num_stocks, len(FEATURES)),  # noqa: E731
                            torch.randn(b, cfg.num_stocks + 1), torch.randn(b, cfg.num_stocks))
        from trainers.ppo.size import PLAN_GPU_MEMORY, env_batch

        predicted = w.activation_bytes(0, False) / env_batch(cfg, PLAN_GPU_MEMORY)[1]  # the plan's GPU minibatch
    measured = saved_bytes_per_item(model, inputs, batches=(128, 256))  # per item, between much larger batches
    assert predicted == pytest.approx(measured, rel=0.10)
    assert w.parameters == sum(p.numel() for p in model.parameters())


def test_lstm_flops_are_counted_although_torch_does_not():
    from trainers.ops.plan import forward_flops

    lstm = torch.nn.LSTM(10, 32, 2, batch_first=True)
    assert forward_flops(lstm, (torch.randn(1, 16, 10),)) == 16 * (8 * 32 * (10 + 32) + 8 * 32 * (32 + 32))


def test_packed_jobs_multiply_memory_and_throughput():
    one = load_workload("lstm", ["--jobs-per-gpu", "1", "--cohort", "1"])  # processes packed, one symbol each
    four = load_workload("lstm", ["--jobs-per-gpu", "4", "--cohort", "1"])
    a100 = DEVICES["a100-80gb"]
    assert memory(four, "ddp", 1, 2)["total"] == pytest.approx(4 * memory(one, "ddp", 1, 2)["total"], rel=0.01)
    assert plan(four, a100, 2).time["items_per_s"] == pytest.approx(4 * plan(one, a100, 2).time["items_per_s"])
    assert plan(one, a100, 8).time["communication_s"] == 0  # separate models: no gradient traffic


def test_seed_004s_depth_64_is_12_9b_parameters_and_needs_fsdp_with_checkpointing_on_8_h100():
    """Seed 004 says depth 64 is 4.3B parameters at ~75 GB per GPU with plain DDP; counted, it is 12.9B, and
    only FSDP2 with activation checkpointing fits 80 GB."""
    w = load_workload("gpt", ["--depth", "64", "--device-batch-size", "4"])
    assert 12.8e9 < w.parameters < 13.0e9
    p = plan(w, DEVICES["h100-pcie"], 8)
    fits = {s: p.strategies[s]["fits"] for s in ("ddp", "ddp+ac", "fsdp", "fsdp+ac")}
    assert fits == {"ddp": False, "ddp+ac": False, "fsdp": False, "fsdp+ac": True}
    assert p.chosen == "fsdp+ac"
    # AdamW's fp32 weights + grads + moments alone are 16 bytes per parameter: DDP holds all of it on each GPU
    assert p.strategies["ddp"]["memory_bytes"]["total"] > 16 * w.parameters
    # the planner's figure is the GPT's own sizing (`trainers gpt size`), not a second formula
    from trainers.gpt.size import Shape, memory_per_gpu
    own = memory_per_gpu(Shape(depth=64, vocab=8), "fsdp+ac", 8, 4).as_dict()["total"]  # (synthetic: 8 characters)
    assert p.strategies["fsdp+ac"]["memory_bytes"]["total"] == own


def test_seed_004s_thousand_dollars_is_31_hours_and_the_budget_buys_a_smaller_compute_optimal_model(capsys):
    assert main(["plan", "--trainer", "gpt", "--gpus", "8", "--budget-usd", "1000", "--usd-per-gpu-hour", "4",
                 "--depth", "64"]) == 0
    out = capsys.readouterr().out
    assert "31.25 h" in out and "$1,000.00" in out
    w = load_workload("gpt", ["--depth", "64"])
    p = plan(w, DEVICES["h100-sxm"], 8, budget_usd=1000, usd_per_gpu_hour=4)
    from trainers.gpt.size import compute_optimal
    best = compute_optimal(p, DEVICES["h100-sxm"])
    # 20 tokens per parameter: C = 6 N (20 N)  =>  N = sqrt(C / 120)
    flops = 31.25 * 3600 * 8 * DEVICES["h100-sxm"].peak_tflops * 1e12 * p.mfu["value"]
    assert best["parameters"] == pytest.approx((flops / 120) ** 0.5)
    assert best["parameters"] < w.parameters / 4 and best["depth"] < 64
    assert "compute-optimal" in out


def test_the_gpts_global_batch_is_fixed_in_tokens_so_fewer_gpus_accumulate_more():
    w = load_workload("gpt", ["--depth", "8", "--device-batch-size", "4", "--batch-tokens", "524288"])
    for gpus in (1, 2, 8):
        assert plan(w, DEVICES["h100-sxm"], gpus, hours=1).time["items_per_step"] == 524288


def test_the_gnns_per_node_estimate_holds_on_other_graphs_and_the_datasets_own_counts_are_read(tmp_path):
    """Measured on the generator's first graphs, the bytes autograd saves per node must hold for a batch of
    other graphs (another seed) of about --nodes-per-batch nodes; a dataset on disk replaces the assumption."""
    from trainers.gnn.batch import make_batch
    from trainers.gnn.build import build_model
    from trainers.gnn.graphs import random_graph, write_dataset
    from trainers.gnn.size import _loss_module
    from trainers.registry import trainer_config

    options = ["--hidden", "32", "--layers", "3", "--data-dir", str(tmp_path / "none")]
    w = load_workload("gnn", options)
    cfg = trainer_config("gnn", options)
    model = build_model(cfg).train()
    graphs, nodes = [], 0
    while nodes < 4096:  # the CPU default step (the plan's own is the GPU's)
        graphs.append(random_graph(len(graphs), 7, 20, 300))
        nodes += graphs[-1].n
    b = make_batch(graphs, cfg.max_colors, cfg.random_features, list(range(len(graphs))), torch.device("cpu"))
    step = _loss_module(model)  # the model and its loss: what a training step saves
    assert w.activation_bytes(nodes, False) == pytest.approx(saved_bytes(step, (b.x, b.edge_index, b.color_mask,
                                                                                b.edge_graph, b.edges_per_graph)),
                                                              rel=0.15)
    assert w.parameters == sum(p.numel() for p in model.parameters())
    assert "ASSUMED" in " ".join(w.notes)

    write_dataset(tmp_path / "g", 12, 4, seed=0, min_nodes=20, max_nodes=40, workers=1, progress=False)
    on_disk = load_workload("gnn", ["--data-dir", str(tmp_path / "g"), "--epochs", "3"])
    meta = json.loads((tmp_path / "g" / "metadata.json").read_text())["splits"]["train"]
    assert on_disk.items_total == 3 * meta["nodes"] and "ASSUMED" not in " ".join(on_disk.notes)


def test_the_lstm_jobs_time_counts_each_symbols_run_outside_its_steps():
    """The per-symbol LSTM job is bound by each symbol's own run (its folder, evaluations, checkpoints,
    results), not its steps: the plan adds SYMBOL_RUN_S a symbol, shared by the workers, and counts the
    synthetic symbols the job would train (it counted the seed's 3 whatever --synthetic-tickers said)."""
    from trainers.lstm.size import SYMBOL_RUN_S

    h100 = DEVICES["h100-sxm"]
    for symbols in (10, 500):
        w = load_workload("lstm", ["--epochs", "5", "--synthetic-tickers", str(symbols), "--cohort", "1", "--no-export",
                                   "--ckpt-at-eval", "always"])  # as the H100's job ran: always was the default then
        assert w.shape["symbols"] == symbols and w.outside_steps_s == pytest.approx(symbols * SYMBOL_RUN_S)
        for gpus in (1, 4):
            t = plan(w, h100, gpus).time
            assert t["outside_steps_s"] == pytest.approx(symbols * SYMBOL_RUN_S / gpus)
            assert t["hours"] * 3600 == pytest.approx(w.items_total / t["items_per_s"] + t["outside_steps_s"])
    bought = plan(load_workload("lstm", ["--synthetic-tickers", "500", "--cohort", "1", "--no-export", "--ckpt-at-eval",
                                         "always"]), h100, 1, hours=0.1).time
    assert bought["items"] == pytest.approx(bought["items_per_s"] * (360 - 500 * SYMBOL_RUN_S))


def test_the_lstm_jobs_time_in_cohorts_is_the_h200s_measured_cohort_jobs():
    """A GPU's LSTM job trains in cohorts (--cohort's default there): the plan forms the cohorts (256 at most, as
    even as the symbols allow), gives each stacked step every member's batch at the H200's measured time per
    sample, and counts a cohort's and a member's time outside the steps, fitted to the H200's two cohort jobs
    (bench/results/gpu_h200/cohort_packing_gpu.runs.json): the constants are that fit, and the plan comes
    within 15 % of both jobs' wall time."""
    from trainers.lstm.size import COHORT_RUN_S, COHORT_SYMBOL_RUN_S, SMALL_STEP_S, STACKED_SAMPLE_S

    jobs = json.loads((REPO / "bench/results/gpu_h200/cohort_packing_gpu.runs.json").read_text())["runs"][0]["jobs"]
    # (run 0: the 2026-11-27 session at aadb2aa, the one the constants were fitted on)
    cohort_jobs = {j["symbols"]: j for j in jobs if j["cohort"] == "auto"}
    outside = {n: j["sum_symbol_s"] * j["share_outside_steps"] for n, j in cohort_jobs.items()}
    assert COHORT_RUN_S + 64 * COHORT_SYMBOL_RUN_S == pytest.approx(outside[64], rel=0.01)
    assert 2 * COHORT_RUN_S + 500 * COHORT_SYMBOL_RUN_S == pytest.approx(outside[500], rel=0.01)
    h200 = DEVICES["h200"]
    as_run = ["--no-export", "--ckpt-at-eval", "improved"]  # as the jobs were (improved was the LSTM's default then)
    w = load_workload("lstm", ["--epochs", "5", "--synthetic-tickers", "500", *as_run])
    # the stacked steps' time: the job's, over the samples as the plan counts them
    steps = cohort_jobs[500]["sum_symbol_s"] - outside[500]
    assert STACKED_SAMPLE_S == pytest.approx(steps / w.items_total, rel=0.01)
    assert w.shape["cohort"] == 256 and w.items_per_micro == 256 * 256  # the largest cohort: its activations fit
    assert w.outside_steps_s == pytest.approx(2 * COHORT_RUN_S + 500 * COHORT_SYMBOL_RUN_S)
    assert w.min_step_s == pytest.approx(max(SMALL_STEP_S, 256 * 256 * STACKED_SAMPLE_S))
    for n, job in cohort_jobs.items():
        planned = plan(load_workload("lstm", ["--epochs", "5", "--synthetic-tickers", str(n), *as_run]), h200, 1).time
        assert planned["hours"] * 3600 == pytest.approx(job["job_wall_s"], rel=0.15)
    small = load_workload("lstm", ["--synthetic-tickers", "10", "--cohort", "4", *as_run])
    assert small.shape["cohort"] == 4 and small.items_per_micro == 256 * 4  # 3 cohorts for 10 symbols: 4, 4, 2
    assert small.outside_steps_s == pytest.approx(3 * COHORT_RUN_S + 10 * COHORT_SYMBOL_RUN_S)
    assert plan(small, h200, 1).time["step_floor_why"].startswith("ASSUMED")  # 1,024 samples: the launch floor binds


def test_the_lstm_jobs_held_bests_take_the_h200s_measured_saving_off():
    """--ckpt-at-eval held (the LSTM's default) writes a new best only at the symbol's next checkpoint: the plan takes
    off each symbol what the H200's 500-symbol job saved in step_done against improved, one command apart, with the
    same final evaluations (bench/results/gpu_h200/lstm_ckpt_at_eval_gpu.json), for each evaluation before
    its last (5 epochs: 4), in cohorts and one at a time; improved and always take nothing off, nor does one epoch
    (its one evaluation is the last) or a step cadence as frequent as the evaluations (a best is written at once)."""
    from trainers.lstm.size import HELD_SAVES_PER_EVAL_S

    run = json.loads((REPO / "bench/results/gpu_h200/lstm_ckpt_at_eval_gpu.json").read_text())
    ways = {w["way"]: w for w in run["ways"]}
    assert run["same_evaluations"] and run["symbols"] == 500 and all(w["symbols_ok"] == 500 for w in ways.values())
    assert ways["held"]["written"] < ways["improved"]["written"] and ways["improved"]["held"] == 0
    assert "--epochs" in run["job"] and run["job"][run["job"].index("--epochs") + 1] == "5"
    saving = ways["improved"]["step_done_s"] - ways["held"]["step_done_s"]
    assert 500 * 4 * HELD_SAVES_PER_EVAL_S == pytest.approx(saving, rel=0.01)
    saved = {"5": 500 * 4 * HELD_SAVES_PER_EVAL_S, "1": 0.0}
    for epochs, cadence in (("5", []), ("1", []), ("5", ["--ckpt-every", "6"])):  # 6 steps an epoch: each evaluation's
        job = ["--epochs", epochs, "--synthetic-tickers", "500", "--no-export", *cadence]
        for cohort in ([], ["--cohort", "1"]):
            held = load_workload("lstm", [*job, *cohort])  # the default
            for writing in ("improved", "always"):
                written = load_workload("lstm", [*job, *cohort, "--ckpt-at-eval", writing])
                assert written.outside_steps_s - held.outside_steps_s == pytest.approx(
                    saved[epochs] if not cadence else 0.0)
                assert "held" not in " ".join(written.notes)
            assert ("held until its next checkpoint" in " ".join(held.notes)) == (epochs == "5" and not cadence)
    one_epoch = ["--epochs", "1", "--eval-every", "2", "--synthetic-tickers", "500", "--no-export"]  # 2, 4, 6
    every_other = load_workload("lstm", one_epoch)
    improved = load_workload("lstm", [*one_epoch, "--ckpt-at-eval", "improved"])
    assert improved.outside_steps_s - every_other.outside_steps_s == pytest.approx(500 * 2 * HELD_SAVES_PER_EVAL_S)
    as_run = load_workload("lstm", ["--epochs", "5", "--synthetic-tickers", "500", "--no-export"])
    planned = plan(as_run, DEVICES["h200"], 1).time["hours"] * 3600
    assert planned < ways["held"]["job_wall_s"] < ways["improved"]["job_wall_s"]  # (fitted on a faster H200)


def test_the_lstm_jobs_time_counts_its_onnx_exports_as_measured():
    """--export (the default) adds each worker's first export and the one that works out the graph's reuse, and
    each symbol's reused graph, parity check and latency: the worker's part from the dev VM's run
    (bench/results/lstm_export_default_cpu.json), a symbol's from the H200 host's 500-symbol jobs with and without,
    one command apart (bench/results/gpu_h200/); --no-export adds nothing. Both the cohort and the one-at-a-time job, shared
    by the workers."""
    from trainers.lstm.size import EXPORT_SYMBOL_S, EXPORT_WORKER_S

    run = json.loads((REPO / "bench/results/lstm_export_default_cpu.json").read_text())
    reused = run["export_symbol"][0]["median_symbol_s"]
    assert EXPORT_WORKER_S + run["symbols"] * reused == pytest.approx(run["job_wall_export_minus_no_export_s"], rel=0.01)
    gpu = REPO / "bench/results/gpu_h200/"
    # the 2026-11-27 session at 1be637a: its export job is run 1 of cohort_export_job.runs.json (run 0 is the session
    # before, whose parity checks used every core), its job without exports the only one measured
    exported = json.loads((gpu / "cohort_export_job.runs.json").read_text())["runs"][1]
    without = json.loads((gpu / "cohort_noexport_job.json").read_text())
    for job in (exported, without):
        assert job["training"]["symbols"]["ok"] == 500 and job["training"]["device_name"] == "NVIDIA H200"
    differ = {k for k in exported["config"] if exported["config"][k] != without["config"].get(k)}
    assert differ == {"export", "run_dir"} and exported["config"]["export"]  # one command apart: a clean difference
    assert EXPORT_WORKER_S + 500 * EXPORT_SYMBOL_S == pytest.approx(
        exported["training"]["wall_time_s_this_attempt"] - without["training"]["wall_time_s_this_attempt"], rel=0.01)
    h200 = DEVICES["h200"]
    for cohort in ([], ["--cohort", "1"]):
        job = ["--epochs", "5", "--synthetic-tickers", "500", *cohort]
        without = load_workload("lstm", [*job, "--no-export"])
        in_worker = load_workload("lstm", [*job, "--no-export-behind"])
        assert in_worker.outside_steps_s - without.outside_steps_s == pytest.approx(
            EXPORT_WORKER_S + 500 * EXPORT_SYMBOL_S)
        assert "ONNX export" in " ".join(in_worker.notes) and "ONNX export" not in " ".join(without.notes)
        # exported behind the training (a GPU deploy's default): what is left of them when the training ends
        with_export = load_workload("lstm", job)
        assert 0 < with_export.outside_steps_s - without.outside_steps_s < (in_worker.outside_steps_s
                                                                            - without.outside_steps_s)
        assert "behind the training" in " ".join(with_export.notes)
        assert "behind the training" not in " ".join(in_worker.notes)
        on_cpu = load_workload("lstm", [*job, "--device", "cpu"])  # a CPU job exports in the worker
        assert on_cpu.outside_steps_s == pytest.approx(in_worker.outside_steps_s)
        on_eight = plan(in_worker, h200, 8).time["outside_steps_s"] - plan(without, h200, 8).time["outside_steps_s"]
        assert on_eight == pytest.approx(EXPORT_WORKER_S + 500 * EXPORT_SYMBOL_S / 8)  # each worker its own first


def test_the_lstm_jobs_exports_behind_are_what_its_exporter_has_left_when_the_training_ends():
    """--export-behind: a cohort's symbols go to the worker's exporter when the cohort ends; the exporter pays its
    first exports once, then a symbol after another, while the worker trains on; the job waits for what is left.
    The exporter's time a symbol is fitted to the H200's 500-symbol job three ways, one command apart
    (bench/results/gpu_h200/lstm_export_behind_gpu.json: every way complete, 500 exported both exporting
    ways, the same ONNX bytes): its two cohorts ending at their share of the training alone, the model gives the
    cost measured. A worker with one cohort (8 GPUs for those 500 symbols) waits for all its exports, more than
    in the worker (the exporter's thread is the slower); one symbol at a time the exporter keeps up."""
    from trainers.lstm.size import EXPORT_BEHIND_SYMBOL_S, EXPORT_WORKER_S, exports_after_training_s

    run = json.loads((REPO / "bench/results/gpu_h200/lstm_export_behind_gpu.json").read_text())
    ways = {w["way"]: w for w in run["ways"]}
    assert run["complete"] and run["same_onnx_bytes"] and all(w["symbols_ok"] == 500 for w in ways.values())
    assert ways["in_worker"]["exported"] == ways["behind"]["exported"] == 500 and ways["no_export"]["exported"] == 0
    cost = {way: ways[way]["job_wall_s"] - ways["no_export"]["job_wall_s"] for way in ("in_worker", "behind")}
    assert cost == pytest.approx(run["export_cost_s"])
    train_s = ways["no_export"]["job_wall_s"]
    finished = [(train_s * 256 / 500, 256), (train_s, 244)]
    assert exports_after_training_s(finished, train_s, EXPORT_WORKER_S, EXPORT_BEHIND_SYMBOL_S) == pytest.approx(
        cost["behind"], rel=0.01)
    # the model itself: an exporter that keeps up leaves the last cohort's symbols; one that cannot, all it has left
    assert exports_after_training_s([(10.0, 2), (30.0, 3)], 30.0, 4.0, 1.0) == pytest.approx(3.0)
    assert exports_after_training_s([(10.0, 20), (30.0, 3)], 30.0, 4.0, 1.0) == pytest.approx(4.0 + 20 + 3 - 20)
    assert exports_after_training_s([(5.0, 4)], 5.0, 4.0, 1.0) == pytest.approx(8.0)
    h200 = DEVICES["h200"]
    job = ["--epochs", "5", "--synthetic-tickers", "500"]
    without, behind, in_worker = (load_workload("lstm", [*job, *extra]) for extra in
                                  (["--no-export"], [], ["--no-export-behind"]))
    on_eight = {name: plan(w, h200, 8).time["outside_steps_s"] - plan(without, h200, 8).time["outside_steps_s"]
                for name, w in (("behind", behind), ("in_worker", in_worker))}
    assert plan(behind, h200, 8).shape["cohort"] == 63  # one cohort a worker: every export after its training
    assert on_eight["behind"] == pytest.approx(EXPORT_WORKER_S + 63 * EXPORT_BEHIND_SYMBOL_S)
    assert on_eight["behind"] > on_eight["in_worker"]
    # one cohort (64 symbols on one H200, measured after the plan said so): behind costs more than in the worker,
    # in the plan and on the H200 (bench/results/gpu_h200/lstm_export_behind64_gpu.json)
    measured = json.loads((REPO / "bench/results/gpu_h200/lstm_export_behind64_gpu.json").read_text())
    assert measured["complete"] and measured["same_onnx_bytes"]
    assert measured["export_cost_s"]["behind"] > measured["export_cost_s"]["in_worker"]
    small = ["--epochs", "5", "--synthetic-tickers", "64"]
    planned = {name: plan(load_workload("lstm", [*small, *extra]), h200, 1).time["hours"]
               for name, extra in (("behind", []), ("in_worker", ["--no-export-behind"]))}
    assert plan(load_workload("lstm", small), h200, 1).shape["cohort"] == 64 and planned["behind"] > planned["in_worker"]
    one_at_a_time = [load_workload("lstm", [*job, "--cohort", "1", *extra]) for extra in (["--no-export"], [])]
    assert one_at_a_time[1].outside_steps_s - one_at_a_time[0].outside_steps_s == pytest.approx(EXPORT_BEHIND_SYMBOL_S)


def test_a_workers_cohorts_take_their_share_of_its_steps_and_their_own_time():
    """cohort_seconds: a smaller last cohort takes its members' share of the largest cohort's step (the plan counts
    samples at the stacked rate) and a cohort's own time; one at a time, each symbol its steps and its own run."""
    from trainers.lstm.size import COHORT_RUN_S, COHORT_SYMBOL_RUN_S, SMALL_STEP_S, SYMBOL_RUN_S, cohort_seconds

    first, last = cohort_seconds([256, 244], 35, 0.256, 0.01)
    assert first == pytest.approx(COHORT_RUN_S + 256 * (COHORT_SYMBOL_RUN_S - 0.01) + 35 * 0.256)
    assert last == pytest.approx(COHORT_RUN_S + 244 * (COHORT_SYMBOL_RUN_S - 0.01) + 35 * 0.256 * 244 / 256)
    one_at_a_time = 35 * SMALL_STEP_S + SYMBOL_RUN_S - 0.01
    assert cohort_seconds([1, 1], 35, SMALL_STEP_S, 0.01) == pytest.approx([one_at_a_time] * 2)


# The plans the READMEs quote as this code's, each with the command written beside it there (the _before and
# _1adc135 files are earlier code's, quoted as such)
QUOTED_PLANS = {
    "plan_gnn_h200.json": ["--trainer", "gnn", "--gpu", "h200", "--gpus", "1"],
    "plan_lstm500_h100.json": ["--trainer", "lstm", "--epochs", "5", "--synthetic-tickers", "500", "--cohort", "1",
                               "--no-export", "--ckpt-at-eval", "always", "--gpus", "1"],
    "plan_lstm500_h200.json": ["--trainer", "lstm", "--epochs", "5", "--synthetic-tickers", "500", "--no-export",
                               "--ckpt-at-eval", "improved", "--gpus", "1", "--gpu", "h200"],
    "plan_lstm500_h200_export.json": ["--trainer", "lstm", "--epochs", "5", "--synthetic-tickers", "500",
                                      "--no-export-behind", "--ckpt-at-eval", "improved", "--gpus", "1", "--gpu", "h200"],
    "plan_lstm500_h200_held.json": ["--trainer", "lstm", "--epochs", "5", "--synthetic-tickers", "500", "--gpus", "1",
                                    "--gpu", "h200", "--no-export"],
    "plan_lstm500_h200_export_behind.json": ["--trainer", "lstm", "--epochs", "5", "--synthetic-tickers", "500",
                                             "--gpus", "1", "--gpu", "h200"],
    "plan_lstm64_h200_export_behind.json": ["--trainer", "lstm", "--epochs", "5", "--synthetic-tickers", "64",
                                            "--gpus", "1", "--gpu", "h200"],
}


@pytest.mark.parametrize("name", sorted(QUOTED_PLANS))
def test_the_committed_plans_are_what_their_commands_print_now(name, tmp_path, capsys):
    """A change to the plan that moves a quoted figure fails here until its JSON (and the sentence quoting it, which
    test_claims checks against the JSON) is made again with its command."""
    out = tmp_path / name
    assert main(["plan", *QUOTED_PLANS[name], "--json", str(out)]) == 0
    capsys.readouterr()
    now, committed = json.loads(out.read_text()), json.loads((REPO / "bench/results" / name).read_text())
    # where each was made: its own commit and versions (a plan made at another commit is the same plan)
    for made in (now.pop("run"), committed.pop("run")):
        assert set(made) == {"git_commit", "versions"} and made["versions"]["torch"], made
    if now["measured_with_torch"] != committed["measured_with_torch"]:
        # another torch saves other tensors for backward, where a small model's activations are measured on the CPU
        # (plan.saved_bytes): those figures, and what adds them up, are the committed torch's; the rest is the same
        for plan_json in (now, committed):
            plan_json.pop("measured_with_torch")
            for strategy in plan_json.get("strategies", {}).values():
                for measured in ("activations", "overhead", "total"):  # (the allocator overhead is a share of them)
                    strategy.get("memory_bytes", {}).pop(measured, None)
                strategy.pop("headroom_bytes", None)
    assert now == committed


def test_the_plan_sizes_what_the_run_leaves_to_the_device_for_the_planned_gpu_and_workers():
    """PPO's environment batch and the LSTM's cohorts follow the planned GPU's memory (a 16 GB T4 is sized down,
    as the run would be, instead of failing to fit an 80 GB card's default) and the LSTM's its workers (each
    worker claims its share of the symbols and forms its own cohorts)."""
    from trainers.lstm.size import COHORT_RUN_S, COHORT_SYMBOL_RUN_S, HELD_SAVES_PER_EVAL_S

    t4, h200 = DEVICES["t4"], DEVICES["h200"]
    long_ppo = load_workload("ppo", ["--total-steps", str(4096 * 64 * 16)])
    assert long_ppo.shape["envs"] == 4096
    on_t4 = plan(long_ppo, t4, 1)
    assert on_t4.chosen is not None and on_t4.shape["envs"] < 4096  # the T4's quarter holds fewer rollouts
    lstm = load_workload("lstm", ["--epochs", "5", "--synthetic-tickers", "500", "--no-export"])
    on_t4 = plan(lstm, t4, 1)
    assert on_t4.chosen is not None and on_t4.shape["cohort"] < 256
    eight = plan(lstm, h200, 8)
    assert eight.shape["cohort"] == 63  # 500 symbols over 8 workers: 63 each, one cohort apiece
    assert eight.time["outside_steps_s"] == pytest.approx(
        COHORT_RUN_S + 500 * (COHORT_SYMBOL_RUN_S - 4 * HELD_SAVES_PER_EVAL_S) / 8)


def test_the_lstm_plan_counts_the_jobs_symbols_and_windows_as_the_job_finds_them(tmp_path):
    """The plan once counted three symbols for yfinance, a tickers file or a price file (a 500-symbol job priced as
    three), and calendar days x (1 - val - test) of daily bars for every source, where the job's split (window,
    lookback, higher timeframes, two embargoes) of the bars it has trains other counts: fewer for daily bars, far
    more for an hourly file."""
    import numpy as np
    import pandas as pd

    from trainers.lstm.config import LstmConfig
    from trainers.lstm.features import build_symbol_data
    from trainers.lstm.job import prepare_job, symbol_config
    from trainers.lstm.size import job_shape, train_samples
    from trainers.market.universe import load_universe

    def trained(cfg) -> int:  # the job's own count: its split of the first symbol's bars
        plan = prepare_job(cfg, log=lambda *_: None)
        s = plan.symbols[0]
        return len(build_symbol_data(plan.bars[s], symbol_config(cfg, s), plan.timeframes).ids["train"])

    assert len(job_shape(LstmConfig(source="yfinance"))[0]) == len(load_universe("sp500")) > 400
    names = tmp_path / "names.txt"
    names.write_text("AAPL\nMSFT\nNVDA\nAMZN\n")
    assert len(job_shape(LstmConfig(source="yfinance", tickers_file=str(names)))[0]) == 4
    synthetic = LstmConfig(symbols="SYN000", synthetic_days=900, window=32)
    (bars,), base = job_shape(synthetic)
    assert train_samples(synthetic, bars, base) == trained(synthetic) < int(900 * 0.7)
    ts = pd.date_range("2023-01-02", periods=6000, freq="h")
    close = 100 * np.exp(np.cumsum(np.random.default_rng(0).normal(0, 0.003, (5, len(ts))), axis=1))
    prices = tmp_path / "hourly.csv"
    broken = pd.DataFrame({"date": ts, "ticker": "F", "close": -1.0})  # no valid bar: the job leaves it out
    pd.concat([*(pd.DataFrame({"date": ts, "ticker": t, "close": close[i]}) for i, t in enumerate("ABCDE")), broken]
              ).to_csv(prices, index=False)
    hourly = LstmConfig(source=f"file:{prices}", window=32)
    bars, base = job_shape(hourly)
    assert (bars, base.label) == ([6000] * 5, "1h")
    assert train_samples(hourly, bars[0], base) == trained(hourly) > 2 * 1391
    later = LstmConfig(source=f"file:{prices}", window=32, start=str(ts[3000].date()))  # the job reads from there
    bars, base = job_shape(later)
    assert len(bars) == 5 and bars[0] == len(prepare_job(later, log=lambda *_: None).bars["A"].ts) < 3100
    assert train_samples(later, bars[0], base) == trained(later)


def test_the_lstm_plan_counts_daily_bars_between_the_dates_and_sp500_pit_members_over_their_membership(tmp_path):
    """Daily bars: the plan counted ten years whatever --start/--end said, and every sp500-pit member with the whole
    range's bars, where the job cuts each to its membership (trainers.lstm.job.point_in_time). Against the job's own
    cut of a file of those members' weekday bars (the estimate counts a year's 252 trading days of 261 weekdays)."""
    from trainers.lstm.config import LstmConfig
    from trainers.lstm.job import prepare_job
    from trainers.lstm.size import job_shape

    (year, *_), _ = job_shape(LstmConfig(source="yfinance", start="2020-01-01", end="2021-01-01"))
    assert 250 <= year <= 254  # (NYSE 2020: 253 sessions)
    dates = dict(start="2015-01-01", end="2024-01-01")
    names = "ABMD,ANET,AMG"  # joined 2018-05-31, left 2022-12-22; joined 2018-08-28; left 2019-12-23
    estimate, _ = job_shape(LstmConfig(source="yfinance", universe="sp500-pit", symbols=names, **dates))
    prices = _weekday_prices(tmp_path, names.split(","), dates)
    from_file = LstmConfig(source=f"file:{prices}", universe="sp500-pit", **dates)
    job = prepare_job(from_file, log=lambda *_: None)
    cut = [len(job.bars[s].ts) for s in names.split(",")]
    assert sorted(job_shape(from_file)[0]) == sorted(cut) and job_shape(from_file)[1] == job.bars["ANET"].base
    assert all(abs(e / c - 1) < 0.05 for e, c in zip(estimate, cut)) and max(cut) < 0.7 * 2348


def _weekday_prices(tmp_path, names: list[str], dates: dict):
    import numpy as np
    import pandas as pd

    days = pd.bdate_range(dates["start"], dates["end"], inclusive="left")
    close = 100 * np.exp(np.cumsum(np.random.default_rng(1).normal(0, 0.01, (len(names), len(days))), axis=1))
    prices = tmp_path / "daily.csv"
    pd.concat([pd.DataFrame({"date": days, "ticker": t, "close": close[i]}) for i, t in enumerate(names)]
              ).to_csv(prices, index=False)
    return prices


def test_the_lstm_plan_leaves_out_the_members_the_job_leaves_out_and_counts_each_ones_windows(tmp_path):
    """A point-in-time member too briefly in the index to train is left out by the job (unless named): the plan
    counted it, and at the members' mean bars, a short one's clipped windows made it say 0 samples of a job that
    trains two symbols. Named (--symbols), the job refuses it, and so does the plan."""
    from trainers.errors import UsageError
    from trainers.lstm.config import LstmConfig
    from trainers.lstm.features import build_symbol_data
    from trainers.lstm.job import prepare_job, symbol_config
    from trainers.lstm.size import trained_symbols

    dates = dict(start="2019-12-01", end="2024-01-01")  # AMG left on 2019-12-23: three weeks a member
    cfg = LstmConfig(source=f"file:{_weekday_prices(tmp_path, ['ABMD', 'ANET', 'AMG'], dates)}",
                     universe="sp500-pit", **dates)
    job = prepare_job(cfg, log=lambda *_: None)
    windows = [len(build_symbol_data(job.bars[s], symbol_config(cfg, s), job.timeframes).ids["train"])
               for s in job.symbols]
    assert job.symbols == ["ABMD", "ANET"] and trained_symbols(cfg) == (2, sum(windows) / 2) and min(windows) > 0
    with pytest.raises(UsageError, match="1 of the job's 3 symbol"):
        trained_symbols(LstmConfig(source=cfg.source, universe="sp500-pit", symbols="ABMD,ANET,AMG", **dates))


def test_the_forecasters_plan_counts_the_samples_of_the_tickers_and_dates_asked_for(tmp_path):
    """It once counted 25 years of the 503 members for every real source: a two-ticker job, a two-year job or a
    file were priced as the whole index's quarter century. A file is counted as the job loads it; yfinance, before
    its fetch, from the trading days between the dates and the tickers asked for. A walk-forward (K runs) was
    counted as one run."""
    import dataclasses

    import numpy as np
    import pandas as pd

    from trainers.forecast.config import ForecastConfig
    from trainers.forecast.data import load_store
    from trainers.forecast.size import training_samples, yfinance_shape
    from trainers.market.fetch import PriceCache, fill_cache
    from trainers.market.synthetic import synthetic_market
    from trainers.market.windows import plan_splits

    def train_dates(dates: int, cfg) -> int:
        lo, hi = plan_splits(dates, cfg.window, cfg.horizon, cfg.val_frac, cfg.test_frac, 1).ranges["train"]
        return hi - lo

    two = ForecastConfig(source="yfinance", tickers="AAPL,MSFT", start="2010-01-01", end="2020-01-01")
    assert yfinance_shape(two)[1] == 2 and 2510 <= yfinance_shape(two)[0] <= 2530  # (NYSE: 2,516 sessions)
    assert training_samples(two) == (2 * train_dates(yfinance_shape(two)[0], two), True)
    index = ForecastConfig(source="yfinance", start="2010-01-01", end="2020-01-01")
    assert training_samples(index) == (503 * train_dates(yfinance_shape(two)[0], index), True)
    _, members = yfinance_shape(ForecastConfig(source="yfinance", universe="sp500-pit", start="2015-01-01",
                                               end="2020-01-01"))
    assert 480 < members < 510  # the index's members on an average day, not everyone who was ever in it
    days = pd.bdate_range("2015-01-01", periods=900)
    close = 100 * np.exp(np.cumsum(np.random.default_rng(2).normal(0, 0.01, (6, len(days))), axis=1))
    prices = tmp_path / "daily.csv"
    pd.concat([pd.DataFrame({"date": days, "ticker": t, "close": close[i]}) for i, t in enumerate("ABCDEF")]
              ).to_csv(prices, index=False)
    from_file = ForecastConfig(source=f"file:{prices}", window=20, horizon=5)
    assert training_samples(from_file) == (load_store(from_file, log=lambda *_: None)[0].stats["train"], False)
    assert 0 < training_samples(from_file)[0] < 6 * train_dates(6300, from_file)  # (what it counted: 25 years)
    folds = dataclasses.replace(from_file, walk_forward=3)  # three runs, each on its own (growing) training range
    trained = [load_store(dataclasses.replace(folds, fold=k), log=lambda *_: None)[0].stats["train"]
               for k in range(3)]
    assert training_samples(folds)[0] == sum(trained) and trained[0] < trained[1] < trained[2]
    assert training_samples(dataclasses.replace(folds, fold=1))[0] == trained[1]
    synthetic = ForecastConfig(walk_forward=4)
    assert training_samples(synthetic)[0] == sum(load_store(dataclasses.replace(synthetic, fold=k), log=lambda *_: None)
                                              [0].stats["train"] for k in range(4))
    # the deploy's check plans its cache before its data phase fills it: estimated as that fetch, not refused
    empty = dataclasses.replace(index, source="cache", cache_dir=str(tmp_path / "cache"))
    assert training_samples(empty) == training_samples(index) and not (tmp_path / "cache").exists()
    cache = PriceCache(tmp_path / "cache")
    fill_cache(synthetic_market(6, 900, seed=2), cache, "synthetic(seed=2)", 100)
    filled = dataclasses.replace(from_file, source="cache", cache_dir=str(cache.root), start="1999-01-01",
                                 end="2010-01-01")
    assert training_samples(filled) == (load_store(filled, log=lambda *_: None)[0].stats["train"], False)


def test_the_lstm_plan_counts_a_caches_symbols_and_bars_as_the_job_loads_them(tmp_path):
    """The cache was counted as every ticker its index lists with ten years of bars each, however few it held."""
    import dataclasses

    from trainers.errors import UsageError
    from trainers.lstm.config import LstmConfig
    from trainers.lstm.job import pin_dates, prepare_job
    from trainers.lstm.size import job_shape
    from trainers.market.fetch import PriceCache, fill_cache
    from trainers.market.synthetic import synthetic_market

    cache = PriceCache(tmp_path / "cache")
    fill_cache(synthetic_market(3, 700, seed=1), cache, "synthetic(seed=1)", 100)
    cfg = LstmConfig(source="cache", cache_dir=str(cache.root), window=16, start="2000-06-01", end="2003-01-01")
    job_cfg = pin_dates(cfg, None)  # what the job's first run does
    job = prepare_job(job_cfg, log=lambda *_: None)
    assert job_shape(cfg)[0] == [len(job.bars[s].ts) for s in job.symbols] and 500 < len(job.bars["SYN000"].ts) < 700
    empty = dataclasses.replace(cfg, cache_dir=str(tmp_path / "none"))
    with pytest.raises(UsageError, match="holds no cached prices"):  # (one line, exit 2, from the CLI)
        job_shape(empty)


def test_a_small_last_cohorts_steps_take_at_least_the_launch_floor():
    """A stacked step of a few members costs its launches like a full one; the plan gave it their share of a full
    step's time (4 of 256: a 60th of the floor)."""
    from trainers.lstm.size import COHORT_RUN_S, COHORT_SYMBOL_RUN_S, SMALL_STEP_S, cohort_seconds

    full, small = cohort_seconds([256, 4], steps=100, step_s=0.01, held_each=0.0)
    assert full == pytest.approx(COHORT_RUN_S + 256 * COHORT_SYMBOL_RUN_S + 100 * 0.01)
    assert small == pytest.approx(COHORT_RUN_S + 4 * COHORT_SYMBOL_RUN_S + 100 * SMALL_STEP_S)


def test_the_forecasters_plan_stops_where_its_run_does_and_refuses_what_it_refuses():
    """The plan counted every epoch of a run that stops at --max-steps (292 steps for a run of 5), planned a split
    the trainer refuses (it used a split of 1 date where --min-split-dates asks for 20), and priced a
    --grad-accum step larger than the training split, which the run refuses at its first line."""
    from trainers.errors import UsageError

    h100 = DEVICES["h100-sxm"]
    capped = plan(load_workload("forecast", ["--epochs", "1", "--max-steps", "5"]), h100, 1)
    assert capped.time["steps"] == pytest.approx(5) and any("--max-steps" in n for n in capped.assumptions)
    whole = plan(load_workload("forecast", ["--epochs", "1"]), h100, 1)
    assert whole.time["steps"] > 100 and not any("--max-steps" in n for n in whole.assumptions)
    folds = plan(load_workload("forecast", ["--walk-forward", "3", "--max-steps", "50"]), h100, 1)
    assert folds.time["steps"] == pytest.approx(150)  # each fold is a run of its own 50 steps
    budget = plan(load_workload("forecast", ["--epochs", "1", "--max-steps", "5"]), h100, 1, hours=2.0)
    assert budget.time["steps"] == pytest.approx(5) and budget.time["hours"] < 0.01  # it ends before the hours
    with pytest.raises(UsageError, match="need about 360 dates"):
        load_workload("forecast", ["--synthetic-days", "330"])
    grad_accum = load_workload("forecast", ["--grad-accum", "100"])
    with pytest.raises(UsageError, match="--grad-accum 100 .* on 8 rank"):
        plan(grad_accum, h100, 8)


def test_the_gpts_plan_takes_the_layout_end_and_refusals_of_its_run():
    """The GPT's plan picked ddp+ac on several GPUs where the run takes FSDP first, kept layouts that
    --activation-checkpointing off or a tied embedding rule out, counted recomputation's forward nowhere, planned
    --max-tokens alone when --max-steps ends the run first, priced a global batch the ranks do not divide (the run
    refuses it), and promised a depth-2 model 428 M tokens a second."""
    from trainers.errors import UsageError
    from trainers.gpt.size import SMALL_STEP_S, layout_options

    h100 = DEVICES["h100-sxm"]
    big = ["--depth", "32", "--device-batch-size", "16", "--max-steps", "10"]
    auto = plan(load_workload("gpt", big), h100, 8)
    assert auto.chosen == layout_options("auto", "auto", False, 8)[2] == "fsdp+ac"  # ddp and fsdp do not fit
    assert plan(load_workload("gpt", [*big, "--activation-checkpointing", "off"]), h100, 8).chosen is None
    with pytest.raises(UsageError, match="runs ddp, ddp\\+ac here"):
        plan(load_workload("gpt", ["--tie-embeddings", "--max-steps", "5"]), h100, 2, parallel="fsdp")
    with_ac = plan(load_workload("gpt", big), h100, 8, parallel="fsdp+ac").time
    without = plan(load_workload("gpt", big), h100, 8, parallel="fsdp").time
    assert with_ac["compute_s"] == pytest.approx(without["compute_s"] * 4 / 3)
    first_end = plan(load_workload("gpt", ["--max-steps", "3", "--max-tokens", "100000000"]), h100, 8).time
    assert first_end["steps"] == pytest.approx(3)
    with pytest.raises(UsageError, match="not a multiple of 3 rank"):
        plan(load_workload("gpt", ["--max-steps", "5"]), h100, 3)
    small = plan(load_workload("gpt", ["--depth", "2", "--max-steps", "100"]), h100, 8).time
    assert small["launch_bound"] and small["step_s"] == pytest.approx(SMALL_STEP_S * 8)  # 8 micro-steps a step


def test_a_json_path_that_is_a_folder_is_refused_before_the_plan_is_printed(tmp_path, capsys):
    assert main(["plan", "--trainer", "forecast", "--json", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [f"error: --json {tmp_path} is a folder; give a file name"]


def test_preflight_fails_the_fit_of_a_job_the_trainer_would_refuse_on_these_gpus():
    from trainers.ops.preflight import GpuInfo, check_fit

    three = [GpuInfo(i, "NVIDIA H100 80GB HBM3", 81559, "580") for i in range(3)]
    check = check_fit(load_workload("gpt", ["--max-steps", "5"]), three, 2.0, None)
    assert check.status == "FAIL" and "not a multiple of 3 rank" in check.detail, check
    base = check_fit(load_workload("forecast", ["--preset", "base"]), three[:2], 2.0, None)  # the 151m's MFU
    assert base.status == "PASS" and base.detail.endswith("(assumed)"), base


def test_the_h100_and_h200_hold_what_their_drivers_show_not_their_marketed_size():
    """The table said 80 GiB for an H100 whose driver shows 81,559 MiB (79.6 GiB, the committed nvidia_smi.txt):
    a GPT of depth 43 was planned to fit with 0.2 GiB free where the run's own estimate refuses it."""
    h100 = DEVICES["h100-sxm"]
    shown = [line for line in (REPO / "bench/results/gpu_h100/nvidia_smi.txt").read_text().splitlines() if "MiB" in line]
    mib = int(shown[0].split(",")[1].split()[0])
    assert h100.memory_gib == pytest.approx(mib / 1024, abs=0.05)
    edge = load_workload("gpt", ["--depth", "43", "--device-batch-size", "1", "--activation-checkpointing", "off",
                                 "--max-steps", "1"])
    assert plan(edge, h100, 1, parallel="ddp").chosen is None


def test_an_mfu_measured_for_a_model_of_another_size_says_so():
    """The forecaster's only H100 measurement is the 151m's: the base preset (25 M parameters) was planned at it
    as "measured", 1.55x faster than on an H200 of the same peak that measured the base itself."""
    h100 = DEVICES["h100-sxm"]
    base = plan(load_workload("forecast", ["--preset", "base"]), h100, 8).mfu["source"]
    assert base.startswith("measured") and "for a model of 151,287,809 parameters" in base and "ASSUMED" in base
    same = plan(load_workload("forecast", ["--preset", "151m", "--window", "120"]), h100, 8).mfu["source"]
    assert same.startswith("measured") and "ASSUMED" not in same


def test_the_gpts_plan_counts_the_vocabulary_its_corpus_has(tmp_path):
    """The plan assumed 256 characters whatever the corpus: a CJK file's depth-1 model was planned at 81,920
    parameters and trained 433,152. It counts the corpus's distinct characters as the run tokenises them."""
    from trainers.gpt.size import Shape

    text = "".join(chr(0x4E00 + (i * 7) % 3000) for i in range(6000)) + "\n"
    corpus = tmp_path / "cjk.txt"
    corpus.write_text(text, encoding="utf-8")
    w = load_workload("gpt", ["--data", str(corpus), "--depth", "1", "--head-dim", "16", "--seq-len", "64",
                              "--max-steps", "1"])
    vocab = len(set(text))
    assert vocab > 2000 and w.parameters == Shape(depth=1, head_dim=16, seq_len=64, vocab=vocab).parameters()
    assert any(f"{vocab:,} distinct characters" in note for note in w.notes)
    synthetic = load_workload("gpt", ["--depth", "1", "--head-dim", "16", "--seq-len", "64", "--max-steps", "1"])
    assert synthetic.parameters == Shape(depth=1, head_dim=16, seq_len=64, vocab=8).parameters()


def test_a_runs_own_time_budget_ends_its_plan():
    """`trainers plan --trainer gpt --max-hours 2` printed no time or cost at all, and a run whose --max-hours
    stops it before its epochs was priced for every epoch; --budget-usd at --usd-per-gpu-hour alike, and the
    LSTM's (a workload sized for the device) keeps the budget too."""
    h100, h200 = DEVICES["h100-sxm"], DEVICES["h200"]
    two_hours = plan(load_workload("gpt", ["--max-hours", "2"]), h100, 8, usd_per_gpu_hour=3.0)
    assert two_hours.time["hours"] == 2 and two_hours.money["usd"] == pytest.approx(48.0)
    money = plan(load_workload("gpt", ["--budget-usd", "24", "--usd-per-gpu-hour", "3"]), h100, 8)
    assert money.time["hours"] == pytest.approx(1.0)
    sooner = plan(load_workload("gpt", ["--max-hours", "2", "--max-steps", "10"]), h100, 8)
    assert sooner.time["steps"] == pytest.approx(10) and sooner.time["hours"] < 0.01  # its steps end it first
    lstm = plan(load_workload("lstm", ["--synthetic-tickers", "500", "--epochs", "500", "--max-hours", "0.1"]), h200, 1)
    assert lstm.time["hours"] == pytest.approx(0.1)
    for cohort in (["--cohort", "1"], []):  # what holding bests saves never outgrows the time it is taken from
        long = plan(load_workload("lstm", ["--synthetic-tickers", "500", "--epochs", "500", *cohort]), h200, 1)
        assert long.time["outside_steps_s"] > 0 and long.time["hours"] > 0, cohort
    given = plan(load_workload("gpt", ["--max-hours", "2"]), h100, 8, hours=1.0)  # the plan's own --hours first
    assert given.time["hours"] == 1.0


def test_the_runs_own_ends_cap_the_plans_hours_and_reach_preflight(tmp_path):
    """The GPT's --max-steps did not cap a plan given --hours (175,654 steps planned for a run of 100); the run's
    --max-hours did not cap the plan's longer --hours; preflight never saw the run's --max-hours; and a corpus the
    run refuses as too short was planned (the fourth review)."""
    from trainers.errors import UsageError
    from trainers.ops.commands import workload_of
    from trainers.ops.preflight import GpuInfo, check_fit
    from trainers.registry import trainer_config

    h200 = DEVICES["h200"]
    steps = plan(load_workload("gpt", ["--max-steps", "100"]), h200, 8, hours=5.0).time
    assert steps["steps"] == pytest.approx(100) and steps["hours"] < 0.1
    hours = plan(load_workload("gpt", ["--max-hours", "1"]), h200, 8, hours=5.0).time
    assert hours["hours"] == pytest.approx(1.0)
    eight = [GpuInfo(i, "NVIDIA H200", 143771, "580") for i in range(8)]
    check = check_fit(workload_of("gpt", trainer_config("gpt", ["--max-hours", "2"])), eight, 3.0, None)
    assert check.status == "PASS" and "about 2.00 h, $48.00" in check.detail, check
    short = tmp_path / "short.txt"
    short.write_text("hello world!")
    with pytest.raises(UsageError, match="too short for two blocks"):
        load_workload("gpt", ["--data", str(short), "--max-steps", "10"])


def test_the_forecasters_plan_says_whose_data_an_epoch_counts():
    """Issue 66: the plan for the 151m deploy said "one epoch is 74,640 samples", the synthetic demo's market (the
    plan's default --source), which a newcomer read as the S&P 500 the deploy trains on."""
    demo = load_workload("forecast", ["--preset", "151m"])
    real = load_workload("forecast", ["--preset", "151m", "--source", "cache"])
    demo_note = next(n for n in demo.notes if n.startswith("one epoch is"))
    real_note = next(n for n in real.notes if n.startswith("one epoch is"))
    assert "of the synthetic market" in demo_note and "--source cache or yfinance" in demo_note
    assert "of --source cache" in real_note and real.items_total > 10 * demo.items_total
