"""What the end of the LSTM job's budget keeps free (--max-hours, --budget-usd).

A job stopped by its budget still ends each symbol it is training (the final checkpoint, the final evaluation
beside the baselines, results.json: the next run resumes the symbol from there), exports the symbols that ended
trained (in the worker once their cohort is over, or those waiting at its exporter), and writes the job's summary.
A single run keeps time for its final save and evaluation (trainers.runtime.stops); the job kept none and ran past
its budget by those ends: 64 small symbols in one cohort on the dev VM ended 1.7 s past a 3.6-s budget, and on the
H200 a cohort's finishes alone took 33 ms a symbol (16.4 s of the 500-symbol job,
bench/results/gpu_h200/cohort_default_job.json, packing.sum_phase_seconds.finish).

So each worker measures, as the job goes, what a symbol's end costs here (its final step's checkpoint and its
finish; in a cohort, the ends made together at one step, per symbol), an export (in the worker, or the exporter's
own times; each process's first two left out), and (rank 0) the summary. A worker stops the job once its elapsed
time plus RESERVE_FACTOR times what its stop would cost now, plus EXIT_ALLOWANCE_S, reaches the budget, as a single
run does; and it starts no cohort whose start and ends, as measured, would not fit (it would stop at its first
step).

A stop at a step where every symbol the worker trains is at its last saves only their exports (their ends are
paid either way): it is made only where those exports, at their measured cost (not doubled), would take the job
past its budget and it is inside it without them; never without exports (Worker.no_use_stopping_now).

What is not measured yet is not kept for: before a worker has measured a symbol's end, only the summary and the
exit (a budget that runs out in its first cohort can be overrun by that cohort's ends); and a process's first two
exports (torch.onnx's warm-up, the job's first graph, its CPU latency: 3.4 s and 2.0 s on the dev VM, against
18 ms for the next ones). A prior for those (the plan's EXPORT_WORKER_S, 13.4 s at the default model) stopped a
15-s job of small symbols at its first cohort's last step, with nothing exported. The job's summary says instead
how far past its budget a job ended (`over_budget_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainers.lstm.export_behind import ExportPace
from trainers.runtime.stops import EXIT_ALLOWANCE_S, RESERVE_FACTOR


@dataclass
class WindDown:
    """One worker's measured end costs, and the symbols it is training now. The worker and its loop tell it what
    happened (claimed, started, stepped, ended, awaiting_export, handed_off, exported, summary_written); only this
    class sets its fields (tests/unit/test_layout.py), and it answers what a stop now would cost (reserve_s)."""

    training: int = 0
    finishing: int = 0  # of those, the ones at their last step: ended trained (and exported) unless stopped now
    to_export: int = 0  # symbols of its cohort that ended trained: exported when the cohort is over
    ended_symbols: int = 0
    ended_seconds: float = 0.0  # the symbols' ends measured on this worker, summed
    started_symbols: int = 0
    started_seconds: float = 0.0  # and their starts: from the claim to the first step (data, runs, resumes, the
    # untrained evaluation), paid before a claim trains at all
    claimed_at: float | None = None  # (time.perf_counter()) the claim whose start is not measured yet
    # its exports in the worker (without an exporter): the first two (torch.onnx's warm-up, the job's first graph and
    # its latency; the second works out the graph's reuse: 2.0 s against 18 ms for the next on the dev VM) left out
    exports: ExportPace = field(default_factory=ExportPace)
    summary_s: float = 0.0  # the slowest job summary this worker wrote (rank 0 writes them)

    def claimed(self, now: float) -> None:
        """A claim was taken at `now` (perf_counter): its start is measured from here (started)."""
        self.claimed_at = now

    def stepped(self, training: int, finishing: int) -> None:
        """The loop made a step of `training` symbols, `finishing` of them at their last: what a budget stop at this
        step would end, and what ends trained (and exported) without one."""
        self.training, self.finishing = training, finishing

    def awaiting_export(self, symbols: int) -> None:
        """`symbols` of the cohort ended trained: the worker exports them once the cohort is over."""
        self.to_export += symbols

    def handed_off(self) -> None:
        """The cohort's trained symbols are exported now, or waiting at the exporter (counted there)."""
        self.to_export = 0

    def summary_written(self, seconds: float) -> None:
        """Rank 0 wrote the job's summary in `seconds`: the slowest is kept for the end."""
        self.summary_s = max(self.summary_s, seconds)

    @property
    def all_at_last_step(self) -> bool:
        """Every symbol the worker trains is at its last step (none trained: False)."""
        return self.training > 0 and self.finishing == self.training

    def ended(self, seconds: float, symbols: int = 1) -> None:
        """`symbols` ended together in `seconds` (their final checkpoints included)."""
        if symbols > 0:
            self.ended_symbols += symbols
            self.ended_seconds += seconds

    def exported(self, seconds: float) -> None:
        """An export in the worker took `seconds`."""
        self.exports.add(seconds)

    def seconds_per_export(self) -> float:
        return self.exports.seconds

    def started(self, now: float, symbols: int) -> None:
        """The claim's `symbols` reach their first step at `now` (perf_counter): its start is measured once (not
        for a claim's symbols tried alone after its cohort)."""
        if self.claimed_at is not None and symbols > 0:
            self.started_symbols += symbols
            self.started_seconds += now - self.claimed_at
        self.claimed_at = None

    def start_s(self, symbols: int) -> float:
        """What starting `symbols` costs, at the mean measured (0 before one is)."""
        return self.started_seconds / self.started_symbols * symbols if self.started_symbols else 0.0

    @property
    def measured(self) -> bool:
        return self.ended_symbols > 0

    def per_symbol_s(self) -> float:
        """A symbol's end, the mean of those measured: a cohort's ends made together cost less each than one
        alone, and a job has both (early stops one by one, the last step together)."""
        return self.ended_seconds / self.ended_symbols if self.ended_symbols else 0.0

    def reserve_s(self, training: int | None = None, exports_waiting: int = 0, export_s: float = 0.0,
                  finishing: int | None = None) -> float:
        """The time to keep free: the ends of `training` symbols (default: those training now), the exports to
        come (`exports_waiting` at the exporter, this cohort's symbols that ended trained, and `finishing` at their
        last step: by default those now, none for a `training` given) at `export_s` each, the summary, the exit."""
        symbols = self.training if training is None else training
        if finishing is None:
            finishing = self.finishing if training is None else 0
        exports = exports_waiting + self.to_export + finishing
        return RESERVE_FACTOR * (self.per_symbol_s() * symbols + export_s * exports + self.summary_s) \
            + EXIT_ALLOWANCE_S
