"""The test hooks the LSTM's fault tests use, in trainers.runtime.faults (not in the LSTM): the worker
rank a process injects TRAINERS_FAULT as, and the named piece of work TRAINERS_FAULT_RAISE fails."""

import os
import signal

import pytest

from trainers.runtime import faults


@pytest.fixture
def caught():
    """SIGTERMs this process sends itself, recorded instead of ending the test."""
    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
    yield got
    signal.signal(signal.SIGTERM, previous)


def test_a_worker_injects_as_its_own_rank_not_as_its_runs_rank_0(monkeypatch, caught):
    """Each symbol's run has rank 0 (a single-process context): without `as_worker` the fault meant
    for worker 1 would fire in worker 0, and worker 1's run would never match it."""
    monkeypatch.setenv("TRAINERS_FAULT", "sigterm@rank1:step3")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    with faults.as_worker(0):
        faults.maybe_inject(0, 3, 0)  # what the run calls in worker 0
    assert caught == []
    with faults.as_worker(1):
        faults.maybe_inject(0, 2, 0)
        assert caught == []
        faults.maybe_inject(0, 3, 0)  # worker 1's run, rank 0 inside, at the step named
        assert caught == [signal.SIGTERM]
        faults.maybe_inject(0, 3, 1)  # a restarted attempt runs through
    assert len(caught) == 1
    faults.maybe_inject(1, 3, 0)  # outside `as_worker` the run's own rank counts again (every other trainer)
    assert len(caught) == 2


def test_a_named_symbol_raises_at_its_step_always_or_on_the_first_try_only(monkeypatch):
    monkeypatch.setenv("TRAINERS_FAULT_RAISE", "SYN001@step2:always, SYN002@step5:once")
    assert faults.raise_requests() == {"SYN001": (2, "always"), "SYN002": (5, "once")}
    faults.maybe_raise("SYN001", 1, 1)
    faults.maybe_raise("SYN000", 2, 1)
    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match=f"asked SYN001 to fail at step 2 \\(try {attempt}\\)"):
            faults.maybe_raise("SYN001", 2, attempt)
    with pytest.raises(RuntimeError, match="asked SYN002 to fail at step 5 \\(try 1\\)"):
        faults.maybe_raise("SYN002", 5, 1)
    faults.maybe_raise("SYN002", 5, 2)  # once: the second try goes through
    monkeypatch.setenv("TRAINERS_FAULT_RAISE", "SYN001:always")  # the old LSTM-only spelling is a typo now
    with pytest.raises(ValueError, match="is not like SYN001@step2:always"):
        faults.raise_requests()
    monkeypatch.delenv("TRAINERS_FAULT_RAISE")
    assert faults.raise_requests() == {} and "TRAINERS_FAULT_RAISE" not in os.environ


def test_a_stacked_pass_of_more_models_than_the_memory_fault_allows_is_out_of_memory(monkeypatch):
    import torch

    faults.before_stacked_pass(10**6)  # unset: anything fits
    monkeypatch.setenv("TRAINERS_FAULT_MEMORY", "2")
    faults.before_stacked_pass(2)
    with pytest.raises(torch.OutOfMemoryError, match="a pass of 3 models does not fit"):
        faults.before_stacked_pass(3)
    monkeypatch.setenv("TRAINERS_FAULT_MEMORY", "two")  # a typo fails loudly, at the job's start
    with pytest.raises(ValueError, match="TRAINERS_FAULT_MEMORY='two' is not a number of models"):
        faults.raise_requests()


def test_a_lost_device_fault_is_sticky_for_the_rest_of_the_process_and_skips_torchruns_restarts(monkeypatch):
    """`lost`: CUDA's words for a kernel fault, then, as on a GPU, the same error from every later call of the
    process (any piece of work, any stacked pass); a restarted worker (a new process, a fresh context) runs
    through, and `as_worker` ending forgets it (an in-process test's next job)."""
    from trainers.runtime.device import context_lost

    monkeypatch.setenv("TRAINERS_FAULT_RAISE", "SYN001@step2:lost")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with faults.as_worker(0):
        faults.maybe_raise("SYN001", 2, 1)  # a restarted attempt
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with faults.as_worker(0):
        faults.maybe_raise("SYN001", 1, 1)
        faults.maybe_raise("SYN000", 2, 1)
        faults.before_stacked_pass(3)
        with pytest.raises(RuntimeError, match="CUDA error: an illegal memory access") as first:
            faults.maybe_raise("SYN001", 2, 1)
        assert context_lost(first.value)
        for call in (lambda: faults.maybe_raise("SYN000", 1, 2), lambda: faults.before_stacked_pass(1)):
            with pytest.raises(RuntimeError, match="asked SYN001's device to fail at step 2"):
                call()
    faults.maybe_raise("SYN000", 1, 1)
    faults.before_stacked_pass(3)


@pytest.mark.parametrize("message, lost", [
    ("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported", True),
    ("CUDA error: device-side assert triggered", True),
    ("CUDA error: unspecified launch failure", True),
    ("CUDA error: misaligned address", True),
    ("CUDA error: uncorrectable ECC error encountered", True),
    ("CUDA error: out of memory", False),  # not sticky: the cohort halves its passes (out_of_memory)
    ("CUDA error: invalid argument", False),
    ("an illegal memory access was encountered", False),  # not CUDA's (another library's words)
])
def test_which_errors_break_the_cuda_context(message, lost):
    import torch

    from trainers.runtime.device import context_lost, out_of_memory

    assert context_lost(torch.AcceleratorError(message)) is lost and context_lost(RuntimeError(message)) is lost
    assert not (lost and out_of_memory(RuntimeError(message)))
    assert not context_lost(ValueError(message))


def test_a_fault_named_after_a_worker_fires_in_whatever_that_worker_trains(monkeypatch):
    monkeypatch.setenv("TRAINERS_FAULT_RAISE", "worker1@step2:once")
    with faults.as_worker(0):
        faults.maybe_raise("SYN003", 2, 1)
    with faults.as_worker(1):
        faults.maybe_raise("SYN003", 1, 1)
        with pytest.raises(RuntimeError, match="asked SYN003 to fail at step 2"):
            faults.maybe_raise("SYN003", 2, 1)
    faults.maybe_raise("SYN003", 2, 1)  # outside a worker: no worker named


def test_on_cuda_a_librarys_error_after_a_kernel_fault_is_told_by_probing_the_device(monkeypatch):
    """The first call to notice an earlier kernel's fault may be cuBLAS's, in its own words: on a CUDA device
    any RuntimeError is checked by running a kernel (out of memory excepted: a probe could itself run out)."""
    import torch

    from trainers.runtime import device as device_mod

    cuda, cublas = torch.device("cuda", 0), RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling "
                                                         "`cublasSgemm( handle, opa, opb, m, n, k, ...)`")
    assert device_mod.device_answers(torch.device("cpu"))
    monkeypatch.setattr(device_mod, "device_answers", lambda device: False)  # the context is broken
    assert device_mod.context_lost(cublas, cuda)
    assert not device_mod.context_lost(cublas) and not device_mod.context_lost(cublas, torch.device("cpu"))
    assert not device_mod.context_lost(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), cuda)
    assert not device_mod.context_lost(ValueError("bad shape"), cuda)
    monkeypatch.setattr(device_mod, "device_answers", lambda device: True)  # the context still works
    assert not device_mod.context_lost(cublas, cuda)
    assert device_mod.context_lost(RuntimeError("CUDA driver error: an illegal memory access was encountered"))


def test_the_probe_counts_out_of_memory_as_an_answer_and_a_sticky_error_as_none(monkeypatch):
    """device_answers runs while the failed work's memory may still be held: running out then is an answer (a
    broken context repeats its own error), or a symbol's plain library error would stop the job as a broken
    context and be recorded failed on its second."""
    import torch

    from trainers.runtime import device as device_mod

    def raising(error):
        def ones(*_args, **_kwargs):
            raise error
        return ones

    for error, answers in ((torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"), True),
                           (RuntimeError("CUDA error: out of memory"), True),
                           (torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), False),
                           (RuntimeError("CUDA error: unspecified launch failure"), False)):
        monkeypatch.setattr(device_mod.torch, "ones", raising(error))
        assert device_mod.device_answers(torch.device("cuda", 0)) is answers, error


@pytest.mark.parametrize("content", ['{"count": 2}', "[]", "null", '{"count": -1}', '{"count": "2"}', "\x00\xff",
                                     "folder"])
def test_a_symbols_count_of_broken_contexts_reads_as_0_unless_it_is_a_positive_whole_number(tmp_path, content):
    from trainers.lstm.queue import times_lost

    path = tmp_path / "device_lost.json"
    if content == "folder":
        path.mkdir()
    else:
        path.write_bytes(content.encode("latin-1"))
    assert times_lost(tmp_path) == (2 if content == '{"count": 2}' else 0)
