"""The job's marker files, one per symbol in its folder (trainers.lstm.queue reads and writes them): a trained
symbol's done marker with its export's outcome (`mark_done`), a failure's record (`marker`), the count of CUDA
contexts a symbol broke (`remember_lost`), and the checks that no marker's folder is a file or another job's.
"""

from __future__ import annotations

import time
from pathlib import Path

from trainers.errors import UsageError
from trainers.lstm import queue as jobqueue
from trainers.lstm.job import symbol_dir
from trainers.lstm.worker import DeviceLost, SymbolOutcome, Worker
from trainers.runtime.files import atomic_write_json
from trainers.runtime.results import read_results


def marker_of(worker: Worker, symbol: str, status: str, tries: int, started: float, **extra) -> dict:
    return {"status": status, "symbol": symbol, "worker": worker.rank, "device": str(worker.device), "tries": tries,
            "attempt_token": worker.queue.token, "restart": worker.restart,
            "seconds": time.perf_counter() - started,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}


def mark_done(symbol: str, outcome: SymbolOutcome, marker: dict, exported: dict, span: float, cohort: int,
              worker: Worker) -> None:
    """Write a trained symbol's done marker with its export's outcome (`export_outcome`'s, {} without --export)."""
    marker = {**marker, **exported, "seconds": span / cohort}
    if "export_error" in marker:
        worker.log.warning("%s: export failed (%s)", symbol, marker["export_error"])
    if cohort > 1:
        marker.update(cohort=cohort, cohort_seconds=span)
    jobqueue.write_marker(symbol_dir(Path(worker.cfg.run_dir), symbol), marker)
    test = (outcome.results or {}).get("evaluation", {}).get("test", {})
    best = (outcome.results or {}).get("training", {}).get("best_val", {}).get("value")
    worker.log.info("%s: done in %.1f s on %s, %d steps, best val loss %s; test %s", symbol, span,
                    worker.device, outcome.steps, "n/a" if best is None else f"{best:.4f}",
                    test.get("skill", {}).get("verdict", "n/a"))


def remember_lost(job_dir: Path, lost: DeviceLost, worker: Worker) -> list[str]:
    """Count the broken context in each of `lost.symbols`' folders. The next attempt trains a symbol with a count
    alone (work_on_cohort) and after the others (queue.pending_symbols), so a cohort's bystanders finish and a
    symbol whose own data or shape breaks a kernel is left by itself. One that breaks it a second time (alone,
    then) is recorded failed (returned): otherwise every torchrun restart would break it again, stopping the
    whole job each time until the restarts ran out. (A new launch tries failed symbols again, as always.)"""
    failed = []
    for symbol in lost.symbols:
        folder = symbol_dir(job_dir, symbol)
        count = jobqueue.times_lost(folder) + 1
        atomic_write_json(folder / jobqueue.LOST, {"count": count, "last_error": str(lost), "alone": lost.alone,
                                                   "worker": worker.rank, "restart": worker.restart})
        if count >= 2:  # (alone: a symbol with a count never shares a cohort again)
            jobqueue.write_marker(folder, marker_of(worker, symbol, "failed", count, time.perf_counter(),
                                                  error=f"the device's CUDA context broke {count} times while it "
                                                        f"trained, the last time alone ({lost})"))
            failed.append(symbol)
    return failed


def check_not_a_symbol_folder(job_dir: Path) -> None:
    """A job's folder is no symbol's folder of another job: a job in there wrote its summary over that symbol's
    results (with that symbol's seed it passed the config check)."""
    here = job_dir.resolve()
    if here.parent.name == "symbols" and (here.parent.parent / "config.json").is_file() and \
            read_results(here.parent.parent).get("job"):  # (an LSTM job's summary, as `trainers lstm export` reads it)
        raise UsageError(f"--run-dir {job_dir} is symbol {here.name}'s folder in the LSTM job {here.parent.parent}: "
                         f"give that job's folder, or a new one")


def check_symbol_folders(job_dir: Path, symbols: list[str]) -> None:
    """No symbol's folder is a file: its run, then the record of its failure, raised in the middle of the job."""
    if (job_dir / "symbols").exists() and not (job_dir / "symbols").is_dir():
        raise UsageError(f"{job_dir / 'symbols'} is a file where the job's symbols folder belongs: move it away and "
                         f"run the same command")
    for symbol in symbols:
        folder = symbol_dir(job_dir, symbol)
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"{folder} is a file where symbol {symbol}'s folder belongs: move it away and run the "
                             f"same command")
