"""Run under torchrun with 2 gloo workers (tests/unit/test_ddp.py): the gradients `wrap_ddp` gives a
loop that accumulates micro-batches under `no_sync` equal the gradients of the whole global batch in
one process, step after step. Prints one line per step: `step <i> max_abs_diff <x>`, then how many
unreachable objects (reference cycles of the loop) were left when `distributed()` destroyed the group:
`unreachable_at_destroy <n>`."""

import contextlib
import gc
import sys

import torch
import torch.distributed as dist

from trainers.runtime.dist import distributed, wrap_ddp

STEPS, MICRO, ROWS = 3, int(sys.argv[1]), 4


def compare(ctx) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference.load_state_dict(model.state_dict())
    ddp = wrap_ddp(model, ctx, accumulates=MICRO > 1)
    g = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        batches = torch.randn(ctx.world_size, MICRO, ROWS, 4, generator=g)  # [rank][micro-batch]
        for i in range(MICRO):
            sync = i == MICRO - 1
            with contextlib.nullcontext() if sync else ddp.no_sync():
                (ddp(batches[ctx.rank, i]).pow(2).mean() / MICRO).backward()
        for r in range(ctx.world_size):  # the whole global batch, in one process
            for i in range(MICRO):
                (reference(batches[r, i]).pow(2).mean() / (MICRO * ctx.world_size)).backward()
        diff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(model.parameters(), reference.parameters()))
        if dist.get_rank() == 0:
            print(f"step {step} max_abs_diff {diff:.3e}", flush=True)
        for p in [*model.parameters(), *reference.parameters()]:
            p.grad = None


if __name__ == "__main__":
    destroy = dist.destroy_process_group

    def destroy_and_report(*args, **kwargs):
        unreachable = gc.collect()
        if dist.get_rank() == 0:
            print(f"unreachable_at_destroy {unreachable}", flush=True)
        return destroy(*args, **kwargs)

    dist.destroy_process_group = destroy_and_report
    with distributed("cpu") as ctx:
        compare(ctx)  # a function, as the trainers' loops are: its frame is gone at the teardown
