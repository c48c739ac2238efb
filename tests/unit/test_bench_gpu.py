"""`make bench-gpu` (bench/gpu.py and bench/gpu_summary.py), proven on the CPU before a GPU runs it.

- the dry run runs every step of the GPU set at tiny sizes (2 gloo processes where a step is
  multi-process), on the fake accelerator (CUDA's placement rules on the CPU, tests/fakes/accelerator):
  each writes its JSON with its provenance, the plan predicts each comparable figure, the one-page
  summary names every figure, and the committed results are not touched;
- a step that fails and one that hangs (with a worker in a session of its own, as torchrun starts
  them) are recorded as failed and timed out, the hung one is ended with its worker, and the rest go on;
- the processes follow the visible GPUs, never a fixed 8; no GPU at all says so and points to the dry run;
- a missing optional package skips its step with the reason; the time budget defers what does not fit
  and --resume runs it later.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from fake_accelerator import fake_env, read_logs

sys.path.insert(0, str(ROOT / "bench"))
import gpu  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PROVENANCE = {"command", "git_commit", "versions", "machine", "measured_at"}
HAS_GCOL = importlib.util.find_spec("gcol") is not None


def committed_gpu_files() -> dict:
    """What a GPU run writes under bench/results, with each file's modification time."""
    return {p.name: p.stat().st_mtime_ns for p in RESULTS.rglob("*") if "gpu" in p.name}


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-gpu-dry")
    before = committed_gpu_files()
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--dry-run", "--dry-device", "auto",
                           "--out-dir", str(out)], capture_output=True, text=True, timeout=600,
                          env=fake_env(out / "fake-accelerator"))
    return {"out": out, "proc": proc, "seconds": time.monotonic() - t0, "before": before,
            "record": json.loads((out / "gpu_steps.json").read_text()) if (out / "gpu_steps.json").exists() else {}}


def test_the_dry_run_runs_every_step_of_the_gpu_set(dry):
    proc, record, out = dry["proc"], dry["record"], dry["out"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert record["dry_run"] and record["device"] == "auto" and record["nproc"] == 2
    names = [s.name for s in gpu.build_steps(gpu.Setup(True, 2, "auto", "h100-sxm", out, out))]
    assert record["order"] == names and set(record["steps"]) == set(names)
    for name in names:
        entry = record["steps"][name]
        if name == "gnn_coloring" and not HAS_GCOL:
            assert (entry["status"], entry["reason"]) == ("skipped", "gcol not installed")
            continue
        assert entry["status"] == "ok", (name, entry, (out / entry.get("log", "none")).read_text()[-3000:]
                                         if entry.get("log") else "")
        data = json.loads((out / entry["json"]).read_text())
        if name != "plan":
            assert PROVENANCE <= set(data), (name, sorted(data))
            assert data["git_commit"] and data["versions"]["torch"], name
    # the run folders and datasets of the trainer runs are gone
    run_dir = record["steps"]["run_forecast"]["commands"][0].split("--run-dir ")[1].split()[0]
    assert run_dir.endswith("run_forecast") and not os.path.exists(os.path.dirname(run_dir))
    assert committed_gpu_files() == dry["before"], "the dry run wrote into bench/results"


def test_every_step_of_the_dry_run_ran_on_the_fake_accelerator(dry):
    """Each bench script and trainer run the GPU set starts ran with its tensors on "the GPU": a placement
    mistake in a step (the forecaster's a09b8e2 crash was one) fails here, not on the first GPU lent."""
    assert dry["proc"].returncode == 0, dry["proc"].stderr[-4000:]
    ran = " ".join(" ".join(r["argv"]) for r in read_logs(dry["out"] / "fake-accelerator"))
    for script in ("matmul.py", "train_throughput.py", "profile_step.py", "checkpoint_save.py", "lstm_pack.py"):
        assert script in ran, script
    for trainer in ("forecast", "gnn", "lstm", "ppo", "gpt"):
        assert f"{trainer} train" in ran, trainer


def test_the_dry_runs_figures_are_real_runs(dry):
    out = dry["out"]
    read = lambda name: json.loads((out / name).read_text())  # noqa: E731
    for mode in ("eager", "compiled"):
        record = read(f"train_gpu_{mode}.json")
        row = record["results"][0]
        assert row["preset"] == "tiny" and row["kit"]["samples_per_s"] > 0 and row["plain"]["samples_per_s"] > 0
        # with the GPU run's settings (bf16, fused AdamW for the kit): the H200 run's Lightning peer failed on
        # every preset (fused AdamW + clipping), which a rehearsal with the CPU's defaults could not show
        assert record["gpu_defaults"] and record["precision"] == "bf16" and row["kit"]["fused_adamw"]
        assert row["lightning"]["samples_per_s"] > 0 and row["lightning"]["precision"] == "bf16-mixed", row["lightning"]
    assert read("train_gpu_eager.json")["trainer"] == "forecast"  # `trainers plan` keys measured MFU by it
    assert read("matmul_gpu.json")["tflops"] > 0
    profile = read("profile_gpu.json")
    assert profile["kit"]["top"] and sum(x["share"] for x in profile["kit"]["top"]) <= 1.0 + 1e-9
    assert read("checkpoint_gpu.json")["rows"][0]["sync"]["stall_s"] > 0
    gpt = read("gpt_throughput_gpu.json")
    assert gpt["complete"] and [(r["parallel"], r["world_size"]) for r in gpt["rows"]] == [("fsdp", 2)]
    assert gpt["rows"][0]["tokens_per_s"] > 0 and "error" not in gpt["rows"][0]
    for trainer in ("forecast", "gnn", "gpt", "lstm", "ppo"):
        r = read(f"run_{trainer}_gpu.json")
        t, x = r["training"], r["results"][0]
        assert r["trainer"] == trainer and t["stop_reason"] == "completed" and t["world_size"] == 2, (trainer, t)
        assert "torch.distributed.run" in r["command"] and "--gpu-defaults" in r["command"]
        assert (x["per_s_job"] if trainer == "lstm" else x["per_s_steady"]) > 0, (trainer, x)
        if trainer in ("forecast", "gpt"):
            assert t["precision"] == "bf16"  # the GPU configuration, rehearsed
        if trainer == "ppo":
            assert t["precision"] == "fp32"  # its policy in fp32 on a GPU too (the ratio), unless asked
        # the step each small model's MFU was measured at, which `trainers plan` matches (measured_mfu)
        if trainer in ("gnn", "ppo"):
            c = r["config"]
            assert x["items_per_step"] == (c["nodes_per_batch"] if trainer == "gnn" else c["num_envs"] * c["rollout_steps"])
    packing = read("cohort_packing_gpu.json")  # the LSTM job one symbol at a time, then in cohorts (auto)
    assert [(j["symbols"], j["cohort"], j["largest_cohort"]) for j in packing["jobs"]] == [(2, "1", 1), (2, "auto", 2)]
    assert packing["job_wall_ratio_cohort_vs_one_at_a_time"]["2 symbols, cohort auto"] > 0
    assert all(j["plan_job_s"] > 0 and j["job_wall_over_plan"] > 0 for j in packing["jobs"])  # the plan beside each
    predictions = read("gpu_plan.json")["predictions"]
    for figure in ("forecast tiny", "gpt d1 fsdp", *(f"run {t}" for t in ("forecast", "gnn", "gpt", "lstm", "ppo"))):
        p = predictions[figure]
        assert p["items_per_s"] > 0 and p["command"].startswith("python -m trainers plan"), (figure, p)
        assert "--gpu h100-sxm" in p["command"] and p["mfu"]["source"], figure
    # the GNN's plan counted the dataset its run trains on (made before the plan reads it), not the deploy's
    assert "32 training graphs" in predictions["run gnn"]["notes"][0], predictions["run gnn"]["notes"]


def test_the_summary_names_every_figure_beside_its_rehearsal_and_plan(dry):
    text = (dry["out"] / "gpu_summary.md").read_text()
    assert "DRY RUN on the CPU" in text and "torch " in text
    for name in dry["record"]["order"]:
        assert f"| `{name}` | {dry['record']['steps'][name]['status']}" in text, name
    figures = ["matmul peak fp32 256^3", "device-to-device copy", "forecaster tiny eager", "forecaster tiny compiled",
               "profile tiny kit step", "profile tiny naive / kit step time", "checkpoint stall tiny",
               "GPT d1 off fsdp x2", "run forecast", "run gnn", "run gpt", "run lstm", "run ppo"]
    figures.append("GNN colouring: measured" if HAS_GCOL else "GNN colouring: skipped: gcol not installed")
    for figure in figures:
        assert f"| {figure}" in text or figure in text, figure
    if (RESULTS / "train_cpu.json").exists():  # the committed CPU figure sits in the same table
        assert "| CPU rehearsal: tiny (train_cpu.json" in text
    if (RESULTS / "checkpoint_cpu.json").exists():
        assert "CPU rehearsal (checkpoint_cpu.json)" in text
    forecast_row = next(line for line in text.splitlines() if line.startswith("| forecaster tiny eager"))
    assert "samples/s at MFU" in forecast_row and ("(assumed" in forecast_row or "(measured before" in forecast_row)


def test_a_failed_and_a_hung_step_are_recorded_and_the_rest_go_on(tmp_path, monkeypatch):
    worker_pid = tmp_path / "worker.pid"
    hang = ("import subprocess, sys, time\n"  # a worker in a session of its own that ignores SIGTERM: torchrun's kind
            "w = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], start_new_session=True)\n"
            "open(sys.argv[1], 'w').write(str(w.pid))\n"
            "time.sleep(600)\n")
    build = gpu.build_steps

    def steps(s):
        out = build(s)
        by = {st.name: st for st in out}
        by["matmul"].commands = [[sys.executable, "-c", "import sys; print('ValueError: forced'); sys.exit(3)"]]
        by["profile"].commands = [[sys.executable, "-c", hang, str(worker_pid)]]
        return out

    monkeypatch.setattr(gpu, "build_steps", steps)
    monkeypatch.setattr(gpu, "KILL_GRACE_S", 1)
    out = tmp_path / "out"
    code = gpu.main(["--dry-run", "--out-dir", str(out), "--only", "matmul,profile,checkpoint",
                     "--timeout", "profile=4"])
    assert code == 1  # every step was tried; the exit code says not all of them measured
    record = json.loads((out / "gpu_steps.json").read_text())["steps"]
    assert record["matmul"]["status"] == "failed" and record["matmul"]["exit_code"] == 3
    assert record["matmul"]["reason"] == "ValueError: forced"
    assert record["profile"]["status"] == "timed out" and "4 s timeout" in record["profile"]["reason"]
    assert 4 <= record["profile"]["wall_s"] < 30
    assert not gpu._alive(int(worker_pid.read_text())), "the hung step's worker outlived it"
    assert record["checkpoint"]["status"] == "ok" and (out / "checkpoint_gpu.json").exists()
    assert not (out / "matmul_gpu.json").exists() and not (out / "profile_gpu.json").exists()
    text = (out / "gpu_summary.md").read_text()
    assert "| `matmul` | failed: ValueError: forced |" in text
    assert "| `profile` | timed out: killed after its 4 s timeout |" in text
    assert "| `checkpoint` | ok |" in text and "| checkpoint stall tiny |" in text
    assert "matmul: no JSON (failed: ValueError: forced)" in text
    assert "| `train_eager` | not run yet |" in text


def fake_probe(count: int):
    def probe(_python):
        return {"count": count, "names": ["NVIDIA H100 80GB HBM3"] * count, "memory_gib": [80.0] * count,
                "torch": "2.11.0+cu130", "cuda": "13.0", "python": "3.12.3",
                "provenance": {"machine": {"processor": "x86_64", "cpus": 16, "gpu_driver": None},
                               "versions": {}, "git_commit": "0" * 40, "measured_at": ""}}
    return probe


def test_processes_follow_the_visible_gpus_never_a_fixed_eight(monkeypatch, capsys):
    monkeypatch.setattr(gpu, "probe", fake_probe(3))
    assert gpu.main(["--list"]) == 0
    listed = capsys.readouterr().out
    torchruns = [line for line in listed.splitlines() if "torch.distributed.run" in line]
    assert len(torchruns) == 5 and all("--nproc_per_node=3" in line for line in torchruns)  # the five trainer runs
    assert "gpt_throughput.py --device auto --nproc 3" in listed and "gnn_coloring.py --nproc 3" in listed
    assert f"--batch-tokens {3 * gpu.GPT_DBS * gpu.GPT_SEQ * 2}" in listed  # the GPT run's batch follows them
    assert "=8" not in listed and "--nproc 8" not in listed
    assert "about " in listed and "(estimated" in listed
    assert gpu.main(["--list", "--nproc", "2"]) == 0
    assert "--nproc_per_node=2" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu.main(["--list", "--nproc", "4"])  # more than are visible


def test_no_gpu_says_so_and_the_dry_run_never_writes_committed_results(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "sees no GPU" in proc.stderr and "bench-gpu-dry" in proc.stderr
    assert not (tmp_path / "gpu_steps.json").exists()
    with pytest.raises(SystemExit):
        gpu.main(["--dry-run", "--out-dir", str(RESULTS)])


def test_a_missing_optional_package_skips_its_step(tmp_path):
    s = gpu.Setup(True, 2, "cpu", "h100-sxm", tmp_path, tmp_path)
    step = gpu.Step("peer", "a peer", [[sys.executable, "-c", "raise SystemExit(1)"]], None, 10, 1,
                    needs=("json", "no_such_package_for_bench"))
    entry = gpu.run_step(step, s, fake_probe(1)(None), None, gpu.child_env())
    assert (entry["status"], entry["reason"]) == ("skipped", "no_such_package_for_bench not installed")


def test_the_budget_defers_what_does_not_fit_and_resume_runs_it(tmp_path):
    out = str(tmp_path)
    assert gpu.main(["--dry-run", "--out-dir", out, "--only", "matmul,checkpoint", "--total-min", "0.01"]) == 1
    steps = json.loads((tmp_path / "gpu_steps.json").read_text())["steps"]
    assert {steps[n]["status"] for n in ("matmul", "checkpoint")} == {"not run"}
    assert "--resume" in steps["matmul"]["reason"] and "estimated" in steps["matmul"]["reason"]
    assert gpu.main(["--dry-run", "--out-dir", out, "--resume", "--only", "matmul"]) == 0
    steps = json.loads((tmp_path / "gpu_steps.json").read_text())["steps"]
    assert steps["matmul"]["status"] == "ok" and steps["checkpoint"]["status"] == "not run"
    ran = steps["matmul"]["started_at"]
    assert gpu.main(["--dry-run", "--out-dir", out, "--resume", "--only", "matmul"]) == 0  # done: not run again
    assert json.loads((tmp_path / "gpu_steps.json").read_text())["steps"]["matmul"]["started_at"] == ran
