"""The job's summary: one row per symbol from its folder (done marker, results, export), the job's
facts (stop reason, steps, time, packing efficiency) and a Markdown table.

The folders are the truth: the summary is rebuilt from them whenever it is written (by rank 0 after
each of its symbols and at the end; by `trainers lstm evaluate` and `export`), so a summary that was
interrupted is simply written again.

Packing efficiency = sum of the per-symbol times finished in this attempt / (wall time x devices):
with one worker per device it says how busy the devices were (<= 1); with K workers per GPU it can
reach K when the workers overlap well. Worker utilisation divides by workers instead of devices. A
symbol trained in a cohort of K counts its share, the cohort's time / K (trainers.lstm.scheduler.finished).
"""

from __future__ import annotations

import fcntl
import time
from contextlib import contextmanager
from pathlib import Path

from trainers.lstm.queue import read_marker
from trainers.runtime import config as cfgmod
from trainers.runtime.budget import Budget
from trainers.runtime.info import device_name
from trainers.runtime.results import merge_results, read_results, run_record
from trainers.runtime.written import write_result

STOPPED = ("signal", "time_budget", "money_budget")


def _split_row(e: dict) -> dict:
    m, b, s = e["model"], e["baselines"], e["strategy"]
    return {"rows": e["rows"], "up_rate": e["up_rate"], "accuracy": m["accuracy"],
            "majority_class_rate": b["majority_class_rate"], "balanced_accuracy": m["balanced_accuracy"],
            "roc_auc": m["roc_auc"], "log_loss": m["log_loss"], "base_rate_log_loss": b["base_rate"]["log_loss"],
            "brier": m["brier"], "base_rate_brier": b["base_rate"]["brier"],
            "linear_roc_auc": b["logistic_regression"]["roc_auc"], "linear_log_loss": b["logistic_regression"]["log_loss"],
            "persistence_accuracy": b["persistence"]["accuracy"],
            "long_flat_return": s["long_flat"]["total_return"], "buy_and_hold_return": s["buy_and_hold"]["total_return"],
            "has_skill": e["skill"]["has_skill"], "verdict": e["skill"]["verdict"]}


def symbol_row(job_dir: Path, symbol: str, planned_steps: int | None) -> dict:
    folder = Path(job_dir) / "symbols" / symbol
    marker = read_marker(folder) or {}
    results = read_results(folder) if (folder / "results.json").exists() else {}
    training = results.get("training", {})
    stop = training.get("stop_reason")
    if marker:
        status = marker["status"]
    elif stop in STOPPED:
        status = "stopped"
    else:
        status = "pending"  # not started, or interrupted without a trace (it resumes next time)
    row = {"status": status, "folder": f"symbols/{symbol}", "steps": training.get("steps", 0),
           "planned_steps": training.get("total_steps", planned_steps), "stop_reason": stop,
           "best_val_loss": training.get("best_val", {}).get("value"), "seconds": marker.get("seconds"),
           "step_seconds": marker.get("step_seconds"),
           "worker": marker.get("worker", training.get("worker")), "device": marker.get("device"),
           "tries": marker.get("tries"), "attempt_token": marker.get("attempt_token"),
           **({"phase_seconds": marker["phase_seconds"]} if marker.get("phase_seconds") else {})}
    if status == "failed":
        row["error"] = marker.get("error")
    if marker.get("cohort_failed"):  # trained alone: its cohort's stacked code failed (the job's log has why)
        row["cohort_failed"] = marker["cohort_failed"]
    evaluation = results.get("evaluation", {})
    for split in ("val", "test"):
        if split in evaluation:
            row[split] = _split_row(evaluation[split])
    export = results.get("export")
    if export:
        row["export"] = {"path": f"symbols/{symbol}/{export['path']}", "sha256": export["sha256"],
                         "max_abs_error": export["parity"]["max_abs_error"], "stale": export.get("stale")}
    if marker.get("export_error"):  # its newest export failed (`lstm export` clears it): an older file is stale
        row["export_error"] = marker["export_error"]
    return row


def symbol_rows(job_dir: Path, symbols: list[str], planned: dict[str, int | None]) -> dict[str, dict]:
    return {s: symbol_row(job_dir, s, planned.get(s)) for s in symbols}


def count_states(rows: dict[str, dict]) -> dict[str, int]:
    counts = {"ok": 0, "failed": 0, "stopped": 0, "pending": 0}
    for row in rows.values():
        counts[row["status"]] += 1
    return counts


def not_exported(rows: dict[str, dict]) -> dict[str, str]:
    """Trained symbols whose export failed: {symbol: why}."""
    return {s: r["export_error"] for s, r in rows.items() if r["status"] == "ok" and r.get("export_error")}


def job_evaluation(job_dir: Path, rows: dict[str, dict], stop: dict | None) -> dict:
    not_evaluated = [s for s, r in rows.items() if r["status"] in ("stopped", "pending") and "test" not in r]
    if stop and stop.get("reason") == "signal" and not_evaluated:
        return {"skipped": f"stopped by {stop.get('signal')}; run `trainers lstm evaluate --run-dir {job_dir}` for the "
                           f"metrics of the symbols it stopped ({', '.join(not_evaluated[:10])})"}
    evaluated = {s: r for s, r in rows.items() if "test" in r}
    return {"symbols_evaluated": len(evaluated),
            "with_skill_on_test": sorted(s for s, r in evaluated.items() if r["test"]["has_skill"]),
            "no_skill_on_test": sorted(s for s, r in evaluated.items() if not r["test"]["has_skill"]),
            "beat_buy_and_hold_on_test": sorted(s for s, r in evaluated.items()
                                                if r["test"]["long_flat_return"] > r["test"]["buy_and_hold_return"])}


SUMMARY_LOCK = ".summary.lock"


@contextmanager
def summary_lock(job_dir: Path):
    """One summary writer at a time, its folders read under the lock: when the store is gone, a worker that
    finished a symbol after rank 0 read the folders rewrites the summary (trainers.lstm.worker), and whichever
    writes second has read every marker written before it (the kernel drops the flock of a dead writer)."""
    with open(Path(job_dir) / SUMMARY_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_job_summary(job_dir: Path, cfg, plan, attempt: dict, ctx, device, stop: dict | None, log) -> dict:
    """The whole summary at the end of (or during) a training attempt."""
    with summary_lock(job_dir):
        return _job_summary(job_dir, cfg, plan, attempt, ctx, device, stop, log)


def earlier_symbols(job_dir: Path, asked: list[str]) -> list[str]:
    """The job's symbols this launch was not asked for (an earlier launch's --symbols): their folders hold a run.
    A launch on a subset once wrote a summary without them, and `evaluate`/`export` then refused them."""
    folder = Path(job_dir) / "symbols"
    found = sorted(p.name for p in folder.iterdir() if p.is_dir() and ((p / "config.json").is_file() or
                                                                        read_marker(p) is not None)) \
        if folder.is_dir() else []
    return [s for s in found if s not in set(asked)]


def _job_summary(job_dir: Path, cfg, plan, attempt: dict, ctx, device, stop: dict | None, log) -> dict:
    rows = symbol_rows(job_dir, plan.symbols + earlier_symbols(job_dir, plan.symbols), plan.total_steps)
    counts = count_states(rows)
    asked = count_states({s: rows[s] for s in plan.symbols})  # this launch's: its stop reason and exit code
    wall = max(time.time() - attempt["started_at"], 1e-9)
    elapsed = attempt["elapsed_before_s"] + wall
    this_attempt = [r for r in rows.values() if r["attempt_token"] == attempt["token"] and r["seconds"]]
    job_seconds = float(sum(r["seconds"] for r in this_attempt))
    step_seconds = float(sum(r.get("step_seconds") or 0.0 for r in this_attempt))
    phases = [r["phase_seconds"] for r in this_attempt if isinstance(r.get("phase_seconds"), dict)]
    phase_seconds = {k: float(sum(p.get(k) or 0.0 for p in phases)) for k in sorted({k for p in phases for k in p})}
    if stop and stop.get("reason") in STOPPED:
        reason = stop["reason"]
    elif asked["ok"] + asked["failed"] == len(plan.symbols):  # every symbol asked for ended: how, in one word
        reason = "failed" if asked["failed"] and not asked["ok"] else "partial" if asked["failed"] else "completed"
    else:
        reason = "incomplete"
    budget = Budget(cfg.max_hours, cfg.budget_usd, cfg.usd_per_gpu_hour, attempt["devices"])
    limit = budget.limit_s()
    training = {"stop_reason": reason, "signal": (stop or {}).get("signal"), "stopped_by": stop,
                "trained_alone_after_a_failed_cohort": sorted(s for s, r in rows.items() if r.get("cohort_failed")),
                "steps": sum(r["steps"] for r in rows.values()),
                "total_steps": sum(r["planned_steps"] or 0 for r in rows.values()),
                "symbols": counts, "symbols_asked": asked, "restarts": ctx.restart_count, "world_size": ctx.world_size,
                # the launch's own failures (the deploy's verdict): a symbol an earlier launch failed is shown, not
                # counted against a launch that was not asked for it
                "failed_asked": sorted(s for s in plan.symbols if rows[s]["status"] == "failed"),
                "devices": attempt["devices"], "jobs_per_gpu": cfg.jobs_per_gpu if device.type == "cuda" else None,
                "device": device.type, "device_name": device_name(device),
                "wall_time_s_this_attempt": wall, "elapsed_s_all_attempts": elapsed,
                "device_hours": elapsed / 3600.0 * attempt["devices"], "cost_usd": budget.cost_usd(elapsed),
                # the budget as seconds (the tighter of --max-hours and --budget-usd), and how far past it the job
                # is: a stop keeps time for its symbols' ends as measured (trainers.lstm.wind_down), not before
                "budget_s": limit, "over_budget_s": None if limit is None else max(0.0, elapsed - limit),
                "packing": {"symbols_finished_this_attempt": len(this_attempt), "sum_symbol_seconds": job_seconds,
                            "efficiency": job_seconds / (wall * attempt["devices"]),
                            "worker_utilisation": job_seconds / (wall * ctx.world_size),
                            # the workers' time in training steps (host time: on a GPU, launching them)
                            "sum_step_seconds": step_seconds,
                            "share_outside_steps": 1 - step_seconds / job_seconds if job_seconds else None,
                            # cohorts only: the host time of each part of their loop, the members' shares summed
                            # (steps as above; the rest is the share outside them, part by part; exports after)
                            **({"sum_phase_seconds": phase_seconds} if phase_seconds else {}),
                            "definition": "sum of per-symbol times / (wall time x devices)"}}
    results = {"trainer": "lstm", "job": True, "config": cfgmod.to_dict(cfg), "data": plan.source,
               "training": training, "evaluation": job_evaluation(job_dir, rows, stop), "symbols": rows,
               "runs": {s: r["folder"] for s, r in rows.items() if r["status"] == "ok"}, "run": run_record()}
    return _write(job_dir, results, log)


def refresh_job_summary(job_dir: Path, symbols: list[str] | None = None, log=None,
                        keep_stop: bool = False) -> dict:
    """After `evaluate` or `export`: the symbol rows and the evaluation again; the training facts stay
    (`keep_stop`: so does the stop that skipped the evaluation, for a worker adding what it finished)."""
    with summary_lock(job_dir):
        return _refresh(job_dir, symbols, log, keep_stop)


def _refresh(job_dir: Path, symbols: list[str] | None, log, keep_stop: bool) -> dict:
    previous = read_results(job_dir)
    rows_before = previous.get("symbols", {})
    symbols = symbols or list(rows_before)
    symbols = symbols + earlier_symbols(job_dir, symbols)  # (a worker passes its launch's: the job's others stay)
    rows = symbol_rows(job_dir, symbols, {s: r.get("planned_steps") for s, r in rows_before.items()})
    stop = previous.get("training", {}).get("stopped_by") if keep_stop else None
    merged = dict(previous, symbols=rows, evaluation=job_evaluation(job_dir, rows, stop),
                  runs={s: r["folder"] for s, r in rows.items() if r["status"] == "ok"})
    if "training" in merged:
        merged["training"] = dict(merged["training"], symbols=count_states(rows))
    return _write(job_dir, merged, log)


def _write(job_dir: Path, results: dict, log) -> dict:
    merged = merge_results(job_dir, results, log.warning if log else None)
    write_result(Path(job_dir) / "results.md", lambda f: f.write(markdown(merged)), mode="w")
    return merged


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:+.2f}%"


def _num(x, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _budget_words(budget_s, over_s) -> str:
    if budget_s is None:
        return ""
    over = f"{over_s:.1f} s past it" if over_s else "not exceeded"
    return f" Budget {budget_s:.1f} s (--max-hours, --budget-usd): {over}."


def markdown(results: dict) -> str:
    t = results.get("training", {})
    rows = results.get("symbols", {})
    counts = count_states(rows)
    data = results.get("data", {})
    synthetic = " (SYNTHETIC data)" if data.get("synthetic") else ""
    unexported = not_exported(rows)
    lines = [f"# lstm: {counts['ok']} of {len(rows)} symbols succeeded, {counts['failed']} failed, "
             f"{counts['stopped']} stopped, {counts['pending']} pending"
             f"{f' ({len(unexported)} not exported)' if unexported else ''}{synthetic}", ""]
    if t:
        p = t.get("packing", {})
        lines += [f"Stop reason: {t.get('stop_reason')}" + (f" ({t['signal']})" if t.get("signal") else "") +
                  f". {t.get('world_size')} worker(s) on {t.get('devices')} {t.get('device')} device(s) "
                  f"({t.get('device_name')}); wall time {t.get('wall_time_s_this_attempt', 0):.1f} s this attempt, "
                  f"{t.get('elapsed_s_all_attempts', 0):.1f} s in all; restarts {t.get('restarts')}." +
                  _budget_words(t.get("budget_s"), t.get("over_budget_s")),
                  f"Packing efficiency {_num(p.get('efficiency'), 3)} (sum of per-symbol times "
                  f"{_num(p.get('sum_symbol_seconds'), 1)} s / (wall time x devices)); worker utilisation "
                  f"{_num(p.get('worker_utilisation'), 3)}; share of the symbols' time outside their training "
                  f"steps {_num(p.get('share_outside_steps'), 3)} (checkpoints, evaluations, baselines, results)."
                  if p.get("symbols_finished_this_attempt") else
                  "No symbol finished in this attempt: no packing figures.", ""]
    lines += [f"Bars: {data.get('base_timeframe')}, timeframes {', '.join(data.get('timeframes', []))}; "
              f"source {data.get('source')}. Baselines on the same rows: the majority class's rate, persistence "
              f"(the sign of the previous horizon's return), a logistic regression on the last bar's features "
              f"(linear), the training up-rate as a constant probability (base: log loss, Brier), buy-and-hold "
              f"over the same bars (the strategy is long when P(up) > 0.5, net of --cost-bps). "
              f"A model has skill only if its log loss beats the base rate's and its AUC clears 0.5 by 1.96 "
              f"standard errors.", ""]
    invalid = data.get("symbols_failed_validation") or []
    if invalid:  # symbols of the source that are not in the table at all
        lines += [f"Symbols left out, no valid bar in the data ({len(invalid)}): " + "; ".join(invalid[:20]) +
                  (" ..." if len(invalid) > 20 else "") + ".", ""]
    left_out = data.get("features_left_out") or {}
    if left_out:  # a close-only file: say which inputs the models never had
        lines += ["Features left out (the data lacks the columns they need): " +
                  "; ".join(f"{s}: {', '.join(names)}" for s, names in list(left_out.items())[:20]) +
                  (f"; ... ({len(left_out)} symbols)" if len(left_out) > 20 else "") + ".", ""]
    for split, title in (("test", "Test (the last period; used for nothing else)"),
                         ("val", "Validation (picked the checkpoint)")):
        lines += [f"## {title}", "",
                  "| symbol | status | steps | time s | device | acc | majority | persist. | bal. acc | AUC | linear | "
                  "log loss | base | linear | Brier | base | long/flat | buy&hold | verdict |",
                  "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for s, r in rows.items():
            e = r.get(split)
            cells = [s, r["status"], str(r["steps"]), _num(r["seconds"], 1), str(r.get("device") or "")]
            if e:
                cells += [_num(e["accuracy"]), _num(e["majority_class_rate"]), _num(e["persistence_accuracy"]),
                          _num(e["balanced_accuracy"]), _num(e["roc_auc"], 3), _num(e["linear_roc_auc"], 3),
                          _num(e["log_loss"]), _num(e["base_rate_log_loss"]), _num(e["linear_log_loss"]),
                          _num(e["brier"]), _num(e["base_rate_brier"]), _pct(e["long_flat_return"]),
                          _pct(e["buy_and_hold_return"]), e["verdict"]]
            else:
                cells += [""] * 13 + [r.get("error") or ""]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    alone = {s: r["cohort_failed"] for s, r in rows.items() if r.get("cohort_failed")}
    if alone:
        lines += ["## Trained alone after their cohort failed", "",
                  f"{len(alone)} symbol(s) whose cohort's stacked code failed were trained one at a time instead "
                  f"(the job's training.log has the traceback): " +
                  "; ".join(f"{s} ({error})" for s, error in list(alone.items())[:20]) +
                  (f"; ... ({len(alone)} symbols)" if len(alone) > 20 else "") + ".", ""]
    if unexported:  # trained, so the job succeeded; their ONNX files are missing all the same
        lines += ["## Not exported", "",
                  f"{len(unexported)} trained symbol(s) have no ONNX file: their export failed. `trainers lstm export "
                  f"--run-dir <this folder>` tries again (it exits 1 while one still fails):", ""]
        lines += [f"- {s}: {error}" for s, error in list(unexported.items())[:50]]
        lines += [f"- ... ({len(unexported)} symbols)"] if len(unexported) > 50 else []
        lines.append("")
    failed = {s: r for s, r in rows.items() if r["status"] == "failed"}
    if failed:
        lines += ["## Failed", ""] + [f"- {s}: {r.get('error')} ({r.get('tries')} tries)" for s, r in failed.items()]
        lines.append("")
    return "\n".join(lines)
