"""Train one LSTM direction model per symbol, many at once: every torchrun worker takes the next symbol
from the job queue and trains it on its own device in a run of its own.

    trainers lstm train --symbols AAPL,MSFT,BTC-USD            one process (CPU or one GPU)
    torchrun --nproc_per_node=8 -m trainers lstm train ...      8 workers, one per GPU
    torchrun --nproc_per_node=16 -m trainers lstm train --jobs-per-gpu 2 ...   2 workers share each GPU

No DDP: the models are independent. This file is the entry point. The one training loop is
trainers.lstm.cohort.train_cohort: a cohort of symbols (`--cohort`), each its own run with a
single-process context and its own folder, so each symbol resumes on its own; a symbol alone is a
cohort of one, trained with nn.LSTM's fused kernel (cohort.Fused). The job around it (the queue, a
second try for a symbol that raised, stops published to every worker, the summary) is
trainers.lstm.scheduler, which gets `train_cohort` passed in; a worker's state is trainers.lstm.worker.

Exit code: 0 when the queue ran out (or the job was stopped by a signal or budget) and nothing
failed. Run as one process, 1 when a symbol failed; under torchrun 0 even then (a non-zero exit
makes torchrun restart every worker for nothing, and stops deploy_8gpu.sh before the symbols that
did succeed are exported): the summary and the last log line count the failures.
"""

from __future__ import annotations

import time

from trainers.lstm.cohort import train_cohort
from trainers.lstm.config import LstmConfig
from trainers.lstm.scheduler import run_job
from trainers.lstm.worker import close_job_logger
from trainers.runtime.dist import distributed


def train(cfg: LstmConfig) -> int:
    started_at = time.time()
    cfg.validate()
    # A gloo group on the CPU, whatever the device: it carries one broadcast (the attempt's queue);
    # NCCL would refuse two workers on one GPU (--jobs-per-gpu).
    with distributed("cpu", cfg.collective_timeout_s) as ctx:
        try:
            return run_job(cfg, ctx, started_at, train_cohort)  # (the job holds the stop signals: its handlers
        finally:  # are given back as it ends, runtime.stops.StopSignals)
            close_job_logger(ctx.rank)
