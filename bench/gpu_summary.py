"""The one page a reader of `make bench-gpu` needs: bench/results/gpu_summary.md.

    python bench/gpu_summary.py                    # from bench/results (bench/gpu.py writes it after every step)
    python bench/gpu_summary.py --dir /tmp/bench-gpu-dry-xxxx

Device, driver and torch; every step with its status and wall time; then each figure beside its CPU
rehearsal (the committed bench/results/*_cpu.json, where one exists: the same script on the 2-core
development machine, usually at a smaller size, which the row says) and beside what `trainers plan`
predicted for it before the run (at the MFU the plan names: an ASSUMED default unless a committed GPU
benchmark gave one), with measured / predicted where both count the same unit. Reads JSON only (no
torch), so it can be rerun anywhere on the files a GPU session brought back.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DASH = "—"


# ---- formatting ---------------------------------------------------------------------------------------

def num(x) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return DASH
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) >= 0.01 else f"{x:.2e}"


def pct(x) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, (int, float)) and math.isfinite(x) else DASH


def gib(b) -> str:
    return f"{b / 2**30:.1f} GiB" if isinstance(b, (int, float)) and b > 0 else DASH


def ms(s) -> str:
    return f"{1e3 * s:,.1f} ms" if isinstance(s, (int, float)) and math.isfinite(s) else DASH


def ratio(a, b) -> str:
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b)) and b
    return f"{a / b:.2f}" if ok else DASH


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + \
        ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---- the page -----------------------------------------------------------------------------------------

class Page:
    def __init__(self, folder: Path, cpu_folder: Path = RESULTS):
        self.dir = folder
        self.cpu_dir = cpu_folder
        # gpu_steps.json; a run made in several calls kept one record per call (gpu_steps_call1.json, ...)
        records = [r for r in (read(p) for p in sorted(folder.glob("gpu_steps*.json"))) if r]
        self.record = dict(records[0]) if records else {}
        self.steps = {name: entry for r in records for name, entry in r.get("steps", {}).items()}
        order = [name for r in records for name in r.get("order", [])]
        self.record["order"] = [name for i, name in enumerate(order) if name not in order[:i]]
        self.plans = (read(folder / "gpu_plan.json") or {}).get("predictions", {})
        self.dry = bool(self.record.get("dry_run"))

    def json(self, name: str) -> dict | None:
        return read(self.dir / name)

    def cpu(self, name: str) -> dict | None:
        return read(self.cpu_dir / name)

    def status(self, step: str) -> str:
        e = self.steps.get(step)
        if not e:
            return "not run yet"
        return e["status"] + (f": {e['reason']}" if e.get("reason") else "")

    def plan(self, figure: str) -> tuple[str, float | None, str | None]:
        """(the prediction in words, items/s, unit) for a figure, or why there is none."""
        p = self.plans.get(figure)
        if not p:
            return DASH, None, None
        if "error" in p:
            return f"plan failed: {p['error'][:80]}", None, None
        mfu = p["mfu"]
        assumed = "assumed" if str(mfu.get("source", "")).startswith("ASSUMED") else "measured before"
        floor = ", launch-bound floor" if p.get("launch_bound") else ""
        unit = p["unit"].replace("_", " ")
        return f"{num(p['items_per_s'])} {unit}/s at MFU {num(100 * mfu['value'])}% ({assumed}{floor})", p["items_per_s"], unit

    # -- sections --

    def header(self) -> list[str]:
        r = self.record
        gpus = r.get("gpus") or []
        if self.dry:
            device = f"CPU ({(r.get('machine') or {}).get('processor') or 'unknown'}, " \
                     f"{(r.get('machine') or {}).get('cpus')} cores), {r.get('nproc')} gloo processes"
        elif gpus:
            device = f"{gpus[0]['name']} x {r.get('nproc')} ({gpus[0]['memory_gib']} GiB each)"
        else:
            device = "unknown"
        commits = sorted({e.get("git_commit") for e in self.steps.values() if e.get("git_commit")})
        started = sorted(e["started_at"] for e in self.steps.values() if e.get("started_at"))
        lines = ["# make bench-gpu: summary", ""]
        if self.dry:
            lines += ["**DRY RUN on the CPU**: every step at tiny sizes, compile off, to check the scripts and the "
                      "wiring. No figure on this page is a GPU measurement; the plan column predicts an "
                      f"{r.get('plan_gpu')} at these tiny sizes, which no CPU approaches.", ""]
        lines += [f"- device: **{device}**; driver {r.get('driver') or DASH}; torch {r.get('torch')} "
                   f"(CUDA {r.get('cuda') or DASH}); Python {r.get('python')}",
                   f"- commit {', '.join(c[:10] for c in commits) or r.get('git_commit') or DASH}; "
                   f"steps run {started[0] if started else DASH} .. {started[-1] if started else DASH} (UTC)",
                   f"- `trainers plan` table entry: {r.get('plan_gpu') or 'none (unknown GPU): no predictions'}; "
                   "every prediction was made before the measurements (gpu_plan.json holds each command)", ""]
        return lines

    def step_table(self) -> list[str]:
        order = self.record.get("order") or list(self.steps)
        rows = []
        for name in order:
            e = self.steps.get(name, {})
            rows.append([f"`{name}`", self.status(name), f"{e['wall_s']:.0f} s" if "wall_s" in e else DASH,
                         e.get("json") if e.get("status") == "ok" else DASH, e.get("what", "")])
        total = sum(e.get("wall_s", 0) for e in self.steps.values())
        return ["## Steps", ""] + table(["step", "status", "wall", "JSON", "measures"], rows) + \
            ["", f"{total / 60:.1f} min of steps in all; logs in gpu_logs/.", ""]

    def matmul(self) -> list[str]:
        m = self.json("matmul_gpu.json")
        out = ["## Figures", "", "Measured | CPU rehearsal (committed `*_cpu.json`) | `trainers plan` before the run "
               "| measured / plan (same unit only).", "", "### Peak (bench/matmul.py)", ""]
        if not m:
            return out + [f"matmul: no JSON ({self.status('matmul')})", ""]
        share = f" ({pct(m.get('share_of_peak'))} of the {num(m.get('datasheet_peak_tflops'))} TFLOP/s datasheet " \
                f"peak)" if m.get("share_of_peak") else " (no datasheet peak for this device)"
        peak = m.get("datasheet_peak_tflops")
        rows = [[f"matmul peak {m['dtype']} {m['size']}^3", f"{num(m['tflops'])} TFLOP/s{share}", DASH,
                 f"{num(peak)} TFLOP/s (datasheet)" if peak else DASH, ratio(m["tflops"], peak)],
                [f"device-to-device copy {m['copy_bytes'] >> 20} MiB", f"{num(m['copy_gb_per_s'])} GB/s (read + write)",
                 DASH, DASH, DASH]]
        return out + table(["figure", "measured", "CPU rehearsal", "plan", "measured / plan"], rows) + [""]

    def forecaster(self) -> list[str]:
        out = ["### Forecaster training (bench/train_throughput.py: one process, samples/s steady)", ""]
        rows, notes = [], []
        for step, mode in (("train_eager", "eager"), ("train_compiled", "compiled")):
            r = self.json(f"train_gpu_{mode}.json")
            if not r:
                notes.append(f"{mode}: no JSON ({self.status(step)})")
                continue
            if not r.get("complete", True):
                notes.append(f"{mode}: incomplete (the step stopped after {len(r['results'])} preset(s))")
            for row in r["results"]:
                said, predicted, unit = self.plan(f"forecast {row['preset']}")
                kit = row.get("kit", {})
                rows.append([f"forecaster {row['preset']} {mode}", *self._peers(row), ratio(kit.get("samples_per_s"),
                             (row.get("plain") or {}).get("samples_per_s")), pct(kit.get("mfu")), said,
                             ratio(kit.get("samples_per_s"), predicted) if unit == "samples" else DASH])
        cpu = self.cpu("train_cpu.json")
        for row in (cpu or {}).get("results", []):
            kit = row.get("kit", {})
            rows.append([f"CPU rehearsal: {row['preset']} (train_cpu.json, {cpu.get('threads')} threads)",
                         *self._peers(row), ratio(kit.get("samples_per_s"), (row.get("plain") or {}).get("samples_per_s")),
                         DASH, DASH, DASH])
        head = ["figure", "kit", "plain loop", "Lightning", "naive", "kit / plain", "kit MFU", "plan (kit)",
                "kit / plan"]
        return out + table(head, rows) + [""] + [f"- {n}" for n in notes] + ([""] if notes else [])

    @staticmethod
    def _peers(row: dict) -> list[str]:
        cells = []
        for peer in ("kit", "plain", "lightning", "naive"):
            r = row.get(peer)
            if r is None:
                cells.append(DASH)
            elif "samples_per_s" in r:
                cells.append(num(r["samples_per_s"]))
            elif "skipped" in r:
                cells.append("skipped: " + r["skipped"].split(" (")[0])
            else:
                cells.append("failed: " + str(r.get("error", ""))[:60])
        return cells

    def profile(self) -> list[str]:
        p = self.json("profile_gpu.json")
        out = ["### Where the step's time goes (bench/profile_step.py)", ""]
        if not p:
            return out + [f"profile: no JSON ({self.status('profile')})", ""]
        top = ", ".join(f"{x['op']} {pct(x['share'])}" for x in p["kit"]["top"][:4])
        naive = ", ".join(f"{x['op']} {pct(x['share'])}" for x in p["naive"]["top"][:3])
        return out + table(["figure", "measured", "CPU rehearsal"],
                           [[f"profile {p['preset']} kit step ({p['kit']['timed_by']})", top,
                             "README: tiny preset on the CPU (no JSON)"],
                            [f"profile {p['preset']} naive step", naive, DASH],
                            [f"profile {p['preset']} naive / kit step time", f"{p['naive_over_kit']:.2f}x", DASH]]) + [""]

    def checkpoint(self) -> list[str]:
        out = ["### Checkpoint stall (bench/checkpoint_save.py: how long the loop stops for a save)", ""]
        c = self.json("checkpoint_gpu.json")
        rows = []
        if not c:
            out.append(f"checkpoint: no JSON ({self.status('checkpoint')})")
        sources = [(c, "measured")] + [(self.cpu("checkpoint_cpu.json"), "CPU rehearsal (checkpoint_cpu.json)")]
        for rec, label in sources:
            for r in (rec or {}).get("rows", []):
                rows.append([f"checkpoint stall {r['preset']}" + ("" if label == "measured" else f": {label}"),
                             f"{r['checkpoint_bytes'] / 2**20:,.0f} MiB", ms(r["sync"]["stall_s"]),
                             ms(r["async"]["stall_s"]), f"{r['stall_reduction']:.0f}x", ms(r["async"]["write_s"]),
                             ms(r["train_step_s"])])
        return out + table(["figure", "size", "stall, written in the loop", "stall, behind it", "reduction",
                            "background write", "train step"], rows) + [""]

    def gpt(self) -> list[str]:
        out = ["### GPT throughput (bench/gpt_throughput.py: `trainers gpt train` under torchrun)", ""]
        g = self.json("gpt_throughput_gpu.json")
        rows = []
        if not g:
            out.append(f"gpt_throughput: no JSON ({self.status('gpt_throughput')})")
        for rec, cpu in ((g, False), (self.cpu("gpt_throughput_cpu.json"), True)):
            for r in self._gpt_rows(rec, cpu):
                name = f"GPT d{r['depth']} {r['compile']} {r['parallel']} x{r['world_size']}"
                if cpu:
                    name = f"CPU rehearsal: {name} (gpt_throughput_cpu.json, seq {r['seq_len']})"
                said, predicted, unit = (DASH, None, None) if cpu else self.plan(f"gpt d{r['depth']} {r['parallel']}")
                if "error" in r:
                    rows.append([name, "failed: " + r["error"][:80], DASH, DASH, DASH, said, DASH])
                    continue
                rows.append([name, num(r.get("tokens_per_s")), num(r.get("tokens_per_s_per_device")), pct(r.get("mfu")),
                             gib(r.get("peak_memory_bytes")) if not cpu else DASH, said,
                             ratio(r.get("tokens_per_s"), predicted) if unit == "tokens" else DASH])
        if g and not g.get("complete", True):
            out.append("- incomplete: the step stopped before its last run")
        return out + table(["figure", "tokens/s", "per device", "MFU", "peak memory", "plan", "measured / plan"],
                           rows) + [""]

    @staticmethod
    def _gpt_rows(rec: dict | None, rehearsal: bool) -> list[dict]:
        """Every measured row; of the CPU rehearsal, one per layout: its deepest, compiled if it was (a page)."""
        rows = (rec or {}).get("rows", [])
        if not rehearsal:
            return rows
        best: dict = {}
        for r in rows:
            key = (r["depth"], r["compile"] == "on")
            if "error" not in r and key >= best.get(r["parallel"], ((-1, False), None))[0]:
                best[r["parallel"]] = (key, r)
        return [r for _, r in best.values()]

    def runs(self) -> list[str]:
        out = ["### The trainers in their GPU configuration (a short real run each, under torchrun)", "",
               "No CPU JSON: CI rehearses this configuration with --gpu-defaults (tests/e2e/test_loop_contract.py).", ""]
        rows, notes = [], []
        for trainer in ("forecast", "gnn", "gpt", "lstm", "ppo"):
            step = f"run_{trainer}"
            r = self.json(f"{step}_gpu.json")
            said, predicted, unit = self.plan(f"run {trainer}")
            if not r:
                rows.append([f"run {trainer}", self.status(step), DASH, DASH, DASH, DASH, DASH, said, DASH])
                continue
            t, x = r["training"], r["results"][0]
            rate, rate_unit = x.get("per_s_steady"), (x.get("unit") or "").replace("_", " ")
            if trainer == "gnn" and x.get("nodes_per_s"):
                rate, rate_unit = x["nodes_per_s"], "nodes"
            if trainer == "lstm":
                rate, rate_unit = x.get("per_s_job"), "samples"
            config = ", ".join(str(v) for v in (t.get("precision"), "compiled" if t.get("compiled") else None,
                                                t.get("parallel")) if v)
            rows.append([f"run {trainer}", f"{t.get('stop_reason')} at step {t.get('steps')}",
                         f"{num(rate)} {rate_unit or ''}/s" + (" (job)" if trainer == "lstm" else ""),
                         pct(x.get("mfu")), config or DASH, str(t.get("world_size")), gib(t.get("peak_memory_bytes")),
                         said, ratio(rate, predicted) if unit == rate_unit else DASH])
        kit = next((row.get("kit", {}).get("samples_per_s") for row in
                    (self.json("train_gpu_compiled.json") or {}).get("results", []) if row["preset"] == "151m"), None)
        loop = (self.json("run_forecast_gpu.json") or {}).get("results", [{}])[0].get("per_s_steady")
        if kit and loop:
            notes.append(f"the forecaster's whole loop (DDP, agreed stops, logging, checkpoints) against its bare "
                         f"compiled step at the same shape (train_compiled, 151m): {ratio(loop, kit)}x")
        return out + table(["figure", "ran", "steady rate", "MFU", "configuration", "processes", "peak memory",
                            "plan", "measured / plan"], rows) + [""] + [f"- {n}" for n in notes] + \
            ([""] if notes else [])

    def gnn(self) -> list[str]:
        out = ["### GNN colouring (bench/gnn_coloring.py)", ""]
        g = self.json("gnn_gpu.json")
        if not g:
            return out + [f"GNN colouring: {self.status('gnn_coloring')}", ""]
        rows = []
        for rec, label in ((g, "measured"), (self.cpu("gnn_cpu.json"), "CPU rehearsal (gnn_cpu.json)")):
            if not rec:
                continue
            t = rec["train"]
            rows.append([f"GNN colouring: {label}", num(t.get("graphs_per_s_per_device")),
                         f"{len(rec['graphs'])} graphs, {rec['budget_s']:g} s budget",
                         ", ".join(rec["goals_missed"]) or "none"])
        return out + table(["figure", "training graphs/s per device", "instances", "goals missed"], rows) + [""]


def render(folder: Path, cpu_folder: Path = RESULTS) -> str:
    page = Page(folder, cpu_folder)
    lines = page.header() + page.step_table()
    for section in (page.matmul, page.forecaster, page.profile, page.checkpoint, page.gpt, page.runs, page.gnn):
        try:
            lines += section()
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:  # one odd JSON: one section
            lines += [f"({section.__name__}: could not be read: {exc!r})", ""]
    return "\n".join(lines).rstrip() + "\n"


def write(folder: Path, out: Path, cpu_folder: Path = RESULTS) -> None:
    out.write_text(render(folder, cpu_folder))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=str(RESULTS), help="where bench/gpu.py wrote (default: bench/results)")
    p.add_argument("--out", default=None, help="default: DIR/gpu_summary.md")
    args = p.parse_args()
    folder = Path(args.dir)
    out = Path(args.out) if args.out else folder / "gpu_summary.md"
    write(folder, out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
