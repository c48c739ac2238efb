"""The fake accelerator itself (tests/fakes/accelerator/fake_accelerator.py): each of CUDA's placement
rules it claims to enforce is enforced, each host sync it claims to count is counted, and what CUDA
allows stays allowed (a rule that fired on correct code would teach people to ignore it)."""

from __future__ import annotations

import io
import threading

import pytest
import torch

from fake_accelerator import GENERATOR, HOST_INDEXED, NUMPY, FakeAccelerator, steady_step_syncs

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


@pytest.fixture
def acc():
    with FakeAccelerator() as fake:
        yield fake


def kinds(acc) -> list[str]:
    return [s.kind for s in acc.syncs]


def test_a_moved_tensor_is_a_copy_on_the_device_and_answers_as_cuda_would(acc):
    host = torch.arange(6)
    moved = host.to(acc.device)
    assert moved.device == acc.device and host.device == torch.device("cpu") and moved.device != host.device
    assert moved.data_ptr() != host.data_ptr()  # on a plain CPU .to() returns the same tensor
    assert moved.get_device() == 0 and host.get_device() == -1
    assert moved.to(acc.device) is moved  # already there: no copy, as on CUDA
    back = moved.cpu()
    assert back.device == torch.device("cpu") and back.data_ptr() != moved.data_ptr()
    assert torch.equal(back, host)
    assert (moved * 2).device == acc.device and moved[1:].device == acc.device  # results and views stay


def test_a_reference_kept_from_before_a_move_is_still_the_host_copy(acc):
    # a09b8e2's forecaster: `train_ids = store.sample_ids["train"]`, then `store.to(device)`, then
    # train_ids[positions on the device]
    store = {"train": torch.arange(100)}
    train_ids = store["train"]
    store = {k: v.to(acc.device) for k, v in store.items()}
    positions = torch.randperm(100)[:8].to(acc.device)
    assert torch.equal(store["train"][positions].cpu(), positions.cpu())
    with pytest.raises(RuntimeError, match=HOST_INDEXED.replace("(", r"\(").replace(")", r"\)")):
        train_ids[positions]


def test_ops_that_mix_device_and_host_raise_cudas_error_but_host_scalars_pass(acc):
    d = torch.ones(3, device=acc.device)
    with pytest.raises(RuntimeError, match=MIXED):
        d + torch.ones(3)
    with pytest.raises(RuntimeError, match=MIXED):
        torch.cat([d, torch.ones(3)])
    with pytest.raises(RuntimeError, match=MIXED):
        torch.nn.Linear(3, 2)(d)  # a model left on the host, fed device inputs
    assert torch.equal((d + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))  # a 0-dim host tensor: allowed
    assert (d * 2.5).device == acc.device
    d.copy_(torch.zeros(3))  # copies cross on purpose
    assert d.sum().item() == 0
    host = torch.zeros(3)
    host[torch.tensor([0, 1])] = torch.tensor(7.0)  # host with host indices: fine
    assert d[torch.tensor([0, 2])].device == acc.device  # device indexed by host indices: CUDA copies them
    assert kinds(acc)[-1] == "host->device"


def test_numpy_of_a_device_tensor_and_a_generator_of_the_other_side_are_refused(acc):
    d = torch.ones(2, device=acc.device)
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
        d.numpy()
    assert NUMPY.startswith("can't convert")
    assert d.cpu().numpy().tolist() == [1.0, 1.0]
    gen = torch.Generator(device=acc.device).manual_seed(0)
    assert gen.device == acc.device and isinstance(gen, torch.Generator)
    assert isinstance(torch.default_generator, torch.Generator)
    with pytest.raises(RuntimeError, match=GENERATOR.format(want="cpu", got="cuda")):
        torch.randint(0, 5, (3,), generator=gen)  # a09b8e2's population search
    with pytest.raises(RuntimeError, match=GENERATOR.format(want="cuda", got="cpu")):
        torch.rand(3, generator=torch.Generator().manual_seed(0), device=acc.device)
    with pytest.raises(RuntimeError, match=GENERATOR.format(want="cpu", got="cuda")):
        torch.empty(3).uniform_(generator=gen)
    assert torch.randint(0, 5, (3,), generator=gen, device=acc.device).device == acc.device
    assert torch.multinomial(torch.ones(4, device=acc.device), 2, generator=gen).device == acc.device


def test_the_host_syncs_cuda_would_wait_for_are_counted(acc):
    d = torch.arange(8, device=acc.device, dtype=torch.float32)
    assert acc.syncs == []  # a factory on the device: no copy
    d.fill_(3.0)  # a kernel with a scalar argument: no wait
    assert acc.syncs == []
    float(d.sum())
    bool(d[0] > 0)
    d.sum().item()
    d.tolist()
    d.cpu()
    torch.tensor([1.0, 2.0], device=acc.device)
    torch.arange(3).to(acc.device)
    d.nonzero()
    d[d > 4]
    torch.masked_select(d, d > 1)
    d.double().cpu()  # a dtype change stays on the device: its copy out is still a wait
    assert kinds(acc) == ["item", "item", "item", "tolist", "device->host", "host->device", "host->device",
                          "data-dependent shape", "data-dependent shape", "data-dependent shape", "device->host"]
    assert all(s.where.startswith("tests/device/test_fake_accelerator.py") for s in acc.syncs)
    n = len(acc.syncs)
    pinned = torch.arange(4).pin_memory()
    assert pinned.is_pinned()
    assert pinned.to(acc.device, non_blocking=True).device == acc.device  # pinned + non-blocking: no wait
    torch.arange(4)[torch.tensor([1])].sum().item()  # host work never waits for the device
    assert len(acc.syncs) == n


def test_a_model_trains_on_the_device_with_fused_adamw_clipping_and_an_lstm(acc):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 1).to(acc.device)
    lstm = torch.nn.LSTM(3, 4, batch_first=True).to(acc.device)
    params = [*lin.parameters(), *lstm.parameters()]
    assert {p.device for p in params} == {acc.device}
    opt = torch.optim.AdamW(params, lr=0.01, fused=True)
    x = torch.randn(5, 7, 3, device=acc.device)
    moved = len(acc.syncs)  # the modules' .to(): a copy each parameter
    for _ in range(3):
        out, _ = lstm(x)
        loss = (lin(out[:, -1]) ** 2).mean() + (x[:, 0] ** 2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)  # groups tensors by their real device: no false copy
        opt.step()
    assert acc.syncs[moved:] == [] and all(p.grad.device == acc.device for p in params)


def test_threads_started_while_active_are_watched_and_loads_land_where_asked(acc):
    errors = []

    def work():
        try:
            torch.ones(2, device=acc.device) + torch.ones(2)
        except RuntimeError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert errors and MIXED in errors[0]
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    buf.seek(0)
    assert torch.load(buf, map_location=acc.device)["w"].device == acc.device
    buf.seek(0)
    assert torch.load(buf, map_location="cpu")["w"].device == torch.device("cpu")


def test_steady_step_syncs_keep_only_the_body_of_completed_steps():
    def sync(label, run=1, thread="MainThread"):
        return {"kind": "item", "op": "x", "where": "w", "label": label, "thread": thread, "run": run}

    markers = [{"marker": "step_done", "step": s, "run": 1} for s in (1, 2, 3)]
    syncs = [sync("body 1"), sync("body 2"), sync("step_done 3"), sync("agree 3"), sync("log 3"),
             sync("evaluation 3"), sync("body 4"), sync("body 3", thread="checkpoint-3"), sync("body 2", run=2)]
    found = steady_step_syncs({"syncs": syncs, "markers": markers})
    assert [s["label"] for s in found] == ["body 2", "step_done 3"]


def test_nothing_is_left_behind_when_it_exits():
    real = torch.Generator
    with FakeAccelerator() as fake:
        assert torch.Generator is not real
        moved = torch.ones(2).to(fake.device)
    assert torch.Generator is real
    assert moved.device == torch.device("cpu")  # no mode any more: a plain CPU tensor
    torch.ones(2) + moved


def test_one_process_agrees_with_one_read_of_the_devices_flag(acc):
    """Every LSTM cohort member's run, and every single-GPU run, agrees alone: its stop agreement sent its values
    to the device (a pinned copy), joined the divergence flag there and read all back. Alone there is nothing
    to agree with: one read of the flag, no copy to the device, the same answer."""
    from trainers.runtime.dist import all_reduce_max
    from trainers.runtime.rundir import single_process_context

    ctx = single_process_context(str(acc.device))
    for flag, want in ((0.0, [2.0, 0.0, 0.0]), (1.0, [2.0, 0.0, 1.0])):
        on_device = torch.tensor(flag, device=acc.device)
        before = len(acc.syncs)
        assert all_reduce_max(ctx, [2.0, 0.0], on_device=on_device) == want
        assert acc.pins == []  # (the values went to the device through a pinned copy)
        assert [s.kind for s in acc.syncs[before:]] == ["item"]
    assert all_reduce_max(ctx, [3.0]) == [3.0]
