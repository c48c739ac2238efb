"""The benchmark harness's own logic: FLOPs against a hand count and PyTorch's FLOP counter, MFU
arithmetic, the peak table, and the JSON the benchmark writes. The benchmarks themselves are run
by hand (`make bench-cpu`), not here."""

import json
import subprocess
import sys

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from conftest import ROOT
from trainers.forecast.model import Forecaster, flops_per_sample
from trainers.runtime.flops import mfu, peak_tflops


def test_flops_match_a_hand_count():
    # window 4, 2 features, d 8, 1 layer, ff 16:
    # dense 2*4*(2*8 + (4*64 + 2*8*16)) + 2*8 = 4240; attention 4*4*4*8 = 512; forward 4752
    assert flops_per_sample(4, 2, 8, 1, 16, training=False) == 4752
    assert flops_per_sample(4, 2, 8, 1, 16) == 3 * 4752


def test_flops_match_pytorchs_flop_counter_on_the_real_model():
    model = Forecaster(d_model=32, n_layers=2, n_heads=4, d_ff=64, n_features=5, window=24).eval()
    x = torch.randn(3, 24, 5)
    # The math backend decomposes attention into matmuls the counter sees (it skips the CPU flash kernel).
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x)
    counted = counter.get_total_flops() / 3
    ours = flops_per_sample(24, 5, 32, 2, 64, training=False)
    assert counted == pytest.approx(ours, rel=0.01), (counted, ours)


@pytest.mark.parametrize("name,peak", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                       ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                       ("NVIDIA B200", 2250.0), ("NVIDIA L40S", 362.0), ("NVIDIA A10G", 125.0),
                                       ("Tesla T4", 65.0), ("Tesla V100-SXM2-16GB", 125.0), ("x86_64", None)])
def test_peak_table_by_device_name(name, peak):
    assert peak_tflops(name) == peak


def test_mfu_arithmetic():
    # 1000 samples/s x 1e9 FLOPs = 1 TFLOP/s of 989 -> 0.1011 %
    assert mfu(1000, 1e9, "NVIDIA H100 80GB HBM3") == pytest.approx(1e12 / 989e12)
    assert mfu(1000, 1e9, "NVIDIA A100-SXM4-40GB", n_devices=8) == pytest.approx(1e12 / (8 * 312e12))
    assert mfu(1000, 1e9, "cpu") is None


def test_train_benchmark_writes_its_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "train_throughput.py"), "--presets", "tiny",
                           "--steps", "2", "--warmup", "1", "--batch", "16", "--tickers", "6", "--days", "700",
                           "--workers", "0", "--peers", "kit,plain,naive", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert {"benchmark", "device", "precision", "results", "versions", "git_commit", "command"} <= set(record)
    row = record["results"][0]
    assert row["preset"] == "tiny" and row["batch"] == 16 and row["train_flops_per_sample"] > 0
    for peer in ("kit", "plain", "naive"):
        r = row[peer]
        assert r["samples_per_s"] > 0 and r["step_time_s"] > 0 and r["parameters"] > 0
        assert 0 < r["effective_samples_per_s"] and r["wall_s"] > 0
    assert row["kit"]["parameters"] == row["plain"]["parameters"] == row["naive"]["parameters"]  # one model size
    assert row["kit_over"]["plain"] == pytest.approx(row["kit"]["samples_per_s"] / row["plain"]["samples_per_s"])


def test_the_commit_recorded_in_an_image_without_git(monkeypatch, tmp_path):
    import trainers.runtime.info as info

    monkeypatch.setattr(info, "Path", lambda *a: tmp_path / "nowhere" / "x.py")  # no checkout around the code
    monkeypatch.setenv("TRAINERS_GIT_COMMIT", "abc1234")
    assert info.git_commit() == "abc1234"


def test_the_job_profiler_names_where_a_cohort_jobs_time_goes(tmp_path, capsys):
    """bench/profile_job.py runs a trainers command under cProfile in process and keeps the functions
    that took the time, the kit's own among them; no command is a usage error."""
    sys.path.insert(0, str(ROOT / "bench"))
    from profile_job import main as profile_main

    out = tmp_path / "profile.json"
    job = ["lstm", "train", "--synthetic-tickers", "3", "--synthetic-days", "600", "--window", "16", "--hidden", "8",
           "--epochs", "1", "--no-export", "--device", "cpu", "--cohort", "3", "--run-dir", str(tmp_path / "job")]
    assert profile_main(["--out", str(out), "--top", "40", "--", *job]) == 0
    record = json.loads(out.read_text())
    assert record["job"] == job and record["exit_code"] == 0 and len(record["by_cumulative"]) == 40
    # which threads the table holds, as this Python's cProfile counts them (it says so: 3.12's mixes them)
    assert record["threads"].startswith("all threads" if sys.version_info >= (3, 12) else "the main thread only")
    cumulative = {e["function"]: e for e in record["by_cumulative"]}
    cohort = next(e for f, e in cumulative.items() if f.startswith("trainers/lstm/cohort.py") and "train_cohort" in f)
    assert cohort["calls"] == 1 and 0 < cohort["cumulative_s"] <= record["wall_s_profiled"]
    assert (tmp_path / "job" / "symbols" / "SYN002" / "done.json").exists()
    with pytest.raises(SystemExit) as exited:
        profile_main(["--out", str(out)])
    assert exited.value.code == 2 and "give the trainers command" in capsys.readouterr().err


def test_the_job_profiler_ops_mode_names_the_operations_a_ppo_job_spends_on(tmp_path):
    """--ops: torch.profiler over a trainers command (here a tiny PPO job on the CPU: host time only) keeps its
    top operations with their calls; the LSTMs of the CLSTM agent are among them."""
    sys.path.insert(0, str(ROOT / "bench"))
    from profile_job import main as profile_main

    out = tmp_path / "ops.json"
    job = ["ppo", "train", "--synthetic-tickers", "5", "--num-stocks", "4", "--synthetic-days", "500", "--window", "8",
           "--episode-days", "20", "--num-envs", "8", "--rollout-steps", "8", "--batch-size", "32", "--hidden", "8",
           "--total-steps", "128", "--no-baseline-mlp", "--random-runs", "1", "--device", "cpu",
           "--run-dir", str(tmp_path / "job")]
    assert profile_main(["--ops", "--out", str(out), "--top", "25", "--", *job]) == 0
    record = json.loads(out.read_text())
    assert record["benchmark"] == "profile_job_ops" and record["exit_code"] == 0 and record["activities"] == ["CPU"]
    rows = record["by_host_time"]
    assert 0 < len(rows) <= 25 and record["by_device_time"] == [] and record["device_s"] is None
    assert sum(r["share"] for r in rows) <= 1 + 1e-9 and all(r["calls"] > 0 and r["host_s"] > 0 for r in rows)
    assert rows == sorted(rows, key=lambda r: -r["host_s"]) and record["ops_dispatched"] > sum(r["calls"] for r in rows[:1])
    assert any("rnn" in r["op"] or "lstm" in r["op"] for r in rows), [r["op"] for r in rows]  # mkldnn_rnn_layer on a CPU
    assert (tmp_path / "job" / "results.json").exists()
    # a job that fails says so: exit 1, its own exit code in the record
    assert profile_main(["--ops", "--out", str(out), "--", *job[:-2], "--num-envs", "0", "--run-dir", str(tmp_path / "bad")]) == 1
    assert json.loads(out.read_text())["exit_code"] == 2


def test_the_ppo_backtest_benchmark_compares_the_two_loops_on_the_same_curves(tmp_path):
    """bench/ppo_backtest.py: run_policy and the day-by-day loop it replaced, on one market and one agent that
    trades: the same equity curves, fewer operations a simulated day (the committed JSON's figures)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import ppo_backtest

    out = tmp_path / "backtest.json"
    assert ppo_backtest.main(["--synthetic-days", "500", "--repeats", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert {"benchmark", "device", "days", "versions", "git_commit", "command"} <= set(record)
    for name in ("agent", "random_policy"):
        row = record["results"][name]
        assert row["curves_max_abs_difference"] < 1e-6 and row["trades_per_run"] > record["days"], name
        assert row["ops_ratio"] > 1.5 and row["run_policy"]["seconds_per_day"] > 0, name
    with pytest.raises(SystemExit):
        ppo_backtest.main(["--repeats", "0"])


@pytest.mark.slow  # three tiny jobs, each in a process of its own
def test_the_export_behind_benchmark_times_the_three_ways_and_compares_their_files(tmp_path, capsys):
    """bench/lstm_export_behind.py: one job --no-export, exporting in the worker and behind; every exporting way's
    symbols exported, the same bytes both ways, each way's export cost against the --no-export job."""
    sys.path.insert(0, str(ROOT / "bench"))
    import lstm_export_behind

    out = tmp_path / "behind.json"
    job = ["--synthetic-tickers", "2", "--synthetic-days", "700", "--window", "16", "--hidden", "8", "--batch-size",
           "64", "--epochs", "1", "--device", "cpu"]
    assert lstm_export_behind.main(["--out", str(out), "--", *job]) == 0
    record = json.loads(out.read_text())
    assert record["complete"] and record["same_onnx_bytes"] and record["job"] == job
    ways = {row["way"]: row for row in record["ways"]}
    assert [ways[w]["exported"] for w in ("no_export", "in_worker", "behind")] == [0, 2, 2]
    assert ways["behind"]["exporter_peak_rss_mb"] > 50 and ways["in_worker"]["exporter_peak_rss_mb"] is None
    assert all(row["symbols_ok"] == 2 and row["export_errors"] == 0 for row in ways.values())
    for way in ("in_worker", "behind"):
        assert record["export_cost_s"][way] == ways[way]["job_wall_s"] - ways["no_export"]["job_wall_s"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:
        lstm_export_behind.main(["--out", str(out)])
    assert usage.value.code == 2 and "give the job's options after --" in capsys.readouterr().err


def test_the_ckpt_at_eval_benchmark_counts_each_ways_writes_and_compares_the_evaluations(tmp_path, capsys):
    """bench/lstm_ckpt_at_eval.py: the same job with each --ckpt-at-eval, its checkpoints written and bests held
    counted, every symbol's final evaluation compared across the ways."""
    sys.path.insert(0, str(ROOT / "bench"))
    import lstm_ckpt_at_eval

    out = tmp_path / "ckpt.json"
    job = ["--synthetic-tickers", "2", "--synthetic-days", "700", "--window", "16", "--hidden", "8", "--batch-size",
           "64", "--epochs", "3", "--no-export", "--patience", "0", "--device", "cpu", "--cohort", "2"]
    assert lstm_ckpt_at_eval.main(["--out", str(out), "--ways", "improved,held", "--", *job]) == 0
    record = json.loads(out.read_text())
    improved, held = record["ways"]
    assert record["same_evaluations"] and record["symbols"] == 2 and record["job"] == job
    assert (improved["held"], held["held"] > 0) == (0, True) and 2 <= held["written"] <= improved["written"]
    assert all(row["symbols_ok"] == 2 and row["step_done_s"] > 0 for row in record["ways"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:
        lstm_ckpt_at_eval.main(["--out", str(out), "--ways", "held,never", "--", *job])
    assert usage.value.code == 2 and "--ways held,never" in capsys.readouterr().err


@pytest.fixture
def torch_threads_kept():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_parity_threads_benchmark_times_every_pairing_of_threads(tmp_path, capsys, torch_threads_kept):
    """bench/onnx_parity_threads.py: torch on one thread and on every core, onnxruntime on its default pool and on
    one, each timed --rounds x --iters checks; the ratios are those rows' medians."""
    import os

    sys.path.insert(0, str(ROOT / "bench"))
    import onnx_parity_threads

    out = tmp_path / "threads.json"
    assert onnx_parity_threads.main(["--iters", "3", "--rounds", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    cores = os.cpu_count() or 1
    rows = {(r["torch_threads"], r["onnxruntime_threads"]): r for r in record["rows"]}
    assert set(rows) == {(t, o) for t in {1, cores} for o in ("default", 1)}
    assert all(r["checks"] == 3 and 0 < r["median_ms"] <= r["p90_ms"] for r in rows.values())
    assert record["all_cores_default_over_one"] == rows[(cores, "default")]["median_ms"] / rows[(cores, 1)]["median_ms"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:
        onnx_parity_threads.main(["--iters", "0"])
    assert usage.value.code == 2 and "--iters 0: give 1 to 10000" in capsys.readouterr().err


@pytest.mark.slow  # two small jobs, each in a process of its own, and their exports twice
def test_the_lstm_export_benchmark_reuses_the_first_graph_and_times_both_jobs(tmp_path, torch_threads_kept,
                                                                           monkeypatch):
    """bench/lstm_export.py: the job with and without its exports (each symbol exported), then every symbol exported
    in this process with the graph reused and with an export each (what the committed JSONs compare). (Its small
    shape shrunk further here: what it measures does not change.)"""
    sys.path.insert(0, str(ROOT / "bench"))
    import lstm_export

    monkeypatch.setattr(lstm_export, "SHRUNK", ["--synthetic-days", "700", "--window", "16", "--hidden", "8",
                                                "--batch-size", "64", "--epochs", "1", "--no-export", "--device", "cpu"])
    out = tmp_path / "export.json"
    assert lstm_export.main(["--symbols", "2", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    trained, exported = record["jobs"]
    assert (trained["export"], trained["exports"]) == (False, 0)
    assert (exported["export"], exported["exports"], exported["graphs"]) == (True, 2, {"exported": 1, "reused": 1})
    reused, each = record["export_symbol"]
    assert (reused["reuse"], reused["graphs"]) == (True, {"exported": 1, "reused": 1})
    assert (each["reuse"], each["graphs"]) == (False, {"exported": 2, "reused": 0})
    assert record["exports_total_ratio_reused_over_each"] == reused["total_s"] / each["total_s"]
    assert record["job_wall_export_minus_no_export_s"] == exported["job_wall_s"] - trained["job_wall_s"]


def test_the_disk_write_benchmark_times_both_writes_in_a_folder_of_its_own(tmp_path, capsys, monkeypatch):
    """bench/disk_write.py (a GPU host's fsync cost, for the LSTM job's per-symbol bookkeeping): both rows
    timed, the folder given left as it was (it writes only into a temp folder of its own, then removes it)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import disk_write

    (tmp_path / "user.txt").write_text("kept")
    out = tmp_path / "out" / "disk.json"
    synced = []
    monkeypatch.setattr(disk_write.os, "fsync", lambda fd: synced.append(fd))  # the kit's atomic_write's os too
    assert disk_write.main(["--dir", str(tmp_path), "--writes", "6", "--out", str(out)]) == 0
    assert len(synced) == 2 * 6  # the durable row: each write's file and folder; the other row none
    record = json.loads(out.read_text())
    for row in ("durable", "no_fsync"):
        assert record[row]["writes"] == 6 and 0 < record[row]["median_ms"] <= record[row]["max_ms"], row
    assert record["fsync_cost_ms"] == record["durable"]["median_ms"] - record["no_fsync"]["median_ms"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "user.txt"] and (tmp_path / "user.txt").read_text() == "kept"
    capsys.readouterr()
    for args, needle in ((["--writes", "0"], "--writes 0 must be >= 1"),
                         (["--dir", str(tmp_path / "user.txt")], "is not an existing folder"),
                         (["--dir", str(tmp_path / "missing")], "is not an existing folder")):
        assert disk_write.main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "missing").exists()


def test_the_broken_context_check_passes_only_on_cudas_own_words_and_a_completed_restart(tmp_path, capsys):
    """bench/lost_context_check.py, gpu_session.sh's verdict on a real kernel fault: under torchrun the job's exit
    is 0 even with failed symbols, so it reads the log and the folder. The CPU rehearsal's simulated error, a
    failed symbol or a SYN001 finished without the restart each fail it."""
    sys.path.insert(0, str(ROOT / "bench"))
    import lost_context_check

    run_dir, log = tmp_path / "job", tmp_path / "job.log"
    (run_dir / "symbols" / "SYN001").mkdir(parents=True)

    def verdict(words: str, counts: dict, done: dict) -> int:
        log.write_text(f"ERROR this worker's cuda:0 failed (AcceleratorError: CUDA error: {words}): CUDA's "
                       "context is broken and every later call on it fails in this process")
        (run_dir / "results.json").write_text(json.dumps({"training": {"symbols": counts}}))
        (run_dir / "symbols" / "SYN001" / "done.json").write_text(json.dumps(done))
        return lost_context_check.main(["--run-dir", str(run_dir), "--log", str(log), "--out", str(tmp_path / "v.json")])

    words, ok, done = "device-side assert triggered", {"ok": 4, "failed": 0}, {"status": "ok", "restart": 1, "tries": 1}
    assert verdict(words, ok, done) == 0
    assert json.loads((tmp_path / "v.json").read_text())["passed"] is True
    for case, broken, check in (  # each fault fails the verdict, under its own checks' names
            ("simulated", ("an illegal memory access (TRAINERS_FAULT_RAISE asked SYN001's device to fail)", ok, done),
             "cuda_words real_fault_not_simulated"),
            ("another error", ("an illegal memory access was encountered", ok, done), "cuda_words"),
            ("simulated with the words", (f"{words} (TRAINERS_FAULT_RAISE asked SYN001's device to fail)", ok, done),
             "real_fault_not_simulated"),
            ("a failed symbol", (words, {"ok": 4, "failed": 1}, done), "all_ok_none_failed"),
            ("one not finished", (words, {"ok": 3, "failed": 0}, done), "all_ok_none_failed"),
            ("no restart", (words, ok, {**done, "restart": 0}), "restarted_on_first_try"),
            ("a second try", (words, ok, {**done, "tries": 2}), "restarted_on_first_try"),
            ("failed on its restart", (words, ok, {**done, "status": "failed"}), "restarted_on_first_try")):
        assert verdict(*broken) == 1, case
        record = json.loads((tmp_path / "v.json").read_text())
        assert record["passed"] is False and [k for k, v in record["checks"].items() if not v] == check.split(), case
    assert verdict(words, ok, done) == 0
    log.write_text("ERROR this worker's cuda:0 failed (AcceleratorError: CUDA error: device-side assert triggered)")
    assert lost_context_check.main(["--run-dir", str(run_dir), "--log", str(log), "--out", str(tmp_path / "v.json")]) \
        == 1  # the error without the worker's recognition of it (a crash with a traceback)
    assert [k for k, v in json.loads((tmp_path / "v.json").read_text())["checks"].items() if not v] == \
        ["recognised_as_broken_context"]
    capsys.readouterr()


def test_tf32_rounding_keeps_ten_mantissa_bits_to_the_nearest_or_truncated():
    """bench/ppo_ratio_noise.py's TF32: a tie goes to the even neighbour, above it up, truncation toward zero,
    signs kept, and every result holds no bit below TF32's ten."""
    sys.path.insert(0, str(ROOT / "bench"))
    from ppo_ratio_noise import round_to_tf32

    ulp = 2.0 ** -10  # TF32's step at 1
    x = torch.tensor([1 + ulp / 2, 1 + ulp / 2 + 2.0 ** -20, 1 + 1.5 * ulp, -(1 + ulp / 2 + 2.0 ** -20), 3.0, 0.0])
    assert round_to_tf32(x, "nearest").tolist() == [1.0, 1 + ulp, 1 + 2 * ulp, -(1 + ulp), 3.0, 0.0]
    assert round_to_tf32(x, "truncate").tolist() == [1.0, 1.0, 1 + ulp, -1.0, 3.0, 0.0]
    values = torch.randn(10_000) * 1e3
    for rounding, most in (("nearest", 2.0 ** -11), ("truncate", 2.0 ** -10)):
        rounded = round_to_tf32(values, rounding)
        assert (rounded.view(torch.int32) & 0x1FFF).eq(0).all()
        assert ((rounded - values).abs() <= most * values.abs()).all() and (rounded != values).any()
    special = torch.tensor([0x7FFFFFFF, -1, 0x7F800001, 0x7F800000], dtype=torch.int32).view(torch.float32)
    assert round_to_tf32(special).isnan()[:3].all() and round_to_tf32(special)[3] == float("inf")  # NaNs stay NaN
    with pytest.raises(ValueError):
        round_to_tf32(values, "up")


def test_the_emulated_gemms_compute_the_policy_as_torch_does_in_fp32():
    """The ratio-noise benchmark's own matmuls (nn.LSTM decomposed, Linear): in fp32 with one sum the PPO policy's
    outputs as torch computes them (to fp32's rounding), every LSTM and Linear through them; rounded to TF32 or
    bf16 they differ, by about those formats' precision."""
    sys.path.insert(0, str(ROOT / "bench"))
    from ppo_ratio_noise import EmulatedGemms

    from trainers.ppo.build import build_model
    from trainers.ppo.config import PpoConfig
    from trainers.ppo.features import FEATURES

    torch.manual_seed(0)
    policy = build_model(PpoConfig(hidden=16, window=5), n_stocks=3)
    market, portfolio, u = torch.randn(7, 5, 3, len(FEATURES)), torch.softmax(torch.randn(7, 4), -1), torch.randn(7, 3)
    with torch.no_grad():
        for param in policy.parameters():  # off its init, whose biases are all 0
            param.add_(0.1 * torch.randn_like(param))
        reference = policy(market, portfolio, u)
        x, w, b = torch.randn(33, 40), torch.randn(24, 40), torch.randn(24)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast_linear = torch.nn.functional.linear(x, w, b)
            with EmulatedGemms("bf16", 1):
                ours = torch.nn.functional.linear(x, w, b)
        assert torch.equal(ours, autocast_linear)  # a bf16 GEMM's output, as autocast's: to the bit on this CPU
        lstm, sequence = torch.nn.LSTM(6, 8, batch_first=True), torch.randn(2, 5, 6)
        bf16_lstm = True
        with torch.autocast("cpu", dtype=torch.bfloat16):
            try:
                autocast_lstm = lstm(sequence)[0]
            except RuntimeError as err:  # oneDNN without a bf16 LSTM for this CPU (AVX2, no AVX-512): no reference
                assert "primitive descriptor for the LSTM" in str(err), err
                bf16_lstm = False
            if bf16_lstm:
                with EmulatedGemms("bf16", 1):
                    assert lstm(sequence)[0].dtype == autocast_lstm.dtype == torch.bfloat16  # h kept as its output is
        rows = [("fp32", 1, 1e-5), ("fp32", 2, 1e-5), ("tf32-nearest", 1, 2e-2)] + [("bf16", 2, 2e-1)] * bf16_lstm
        for fmt, split, most in rows:
            # (bf16 under autocast, as the benchmark runs it: nn.LSTM takes a bf16 input with fp32 weights only so)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fmt == "bf16"), EmulatedGemms(fmt, split) as mode:
                got = policy(market, portfolio, u)
            assert {"linear", "lstm"} <= mode.seen, mode.seen
            for name, ours, theirs in zip(("log_prob", "entropy", "value"), got, reference):
                difference = float((ours.float() - theirs).abs().max() / theirs.abs().max())
                assert difference <= most, (fmt, split, name, difference)
                if name != "entropy":  # (the log-std's alone: no matmul in it)
                    assert fmt == "fp32" or difference > 1e-6, (fmt, name, difference)  # the rounding did happen


def test_the_ratio_noise_benchmark_writes_every_row(tmp_path, capsys):
    """bench/ppo_ratio_noise.py: each format's row at both weights; a CPU's own fp32 rows stay within fp32's
    rounding, and no row at these weights puts a sample outside the clip."""
    sys.path.insert(0, str(ROOT / "bench"))
    import ppo_ratio_noise

    out = tmp_path / "noise.json"
    assert ppo_ratio_noise.main(["--num-envs", "4", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    rows = record["rows"]
    assert set(rows) == {"fp32", "bf16", "fp32-emulated", "tf32-nearest-emulated", "tf32-truncate-emulated",
                         "bf16-emulated"} and record["num_envs"] == 4
    for name, by_weights in rows.items():
        assert set(by_weights) == {"initial", "moved"}, name
        for row in by_weights.values():
            assert row["samples"] == 4 * record["rollout_steps"] and row["share_outside_clip"] == 0, name
    assert rows["fp32"]["initial"]["max_abs_log_ratio"] < 1e-4
    assert rows["bf16-emulated"]["moved"]["max_abs_log_ratio"] > rows["fp32-emulated"]["moved"]["max_abs_log_ratio"]
    with pytest.raises(SystemExit):
        ppo_ratio_noise.main(["--moved", "nan"])
