"""`trainers gpt export`: ONNX of tokens [batch, length] -> logits [batch, length, vocab] with dynamic
batch and length axes (length up to --seq-len), traced at one length and checked by onnxruntime at
others; the vocabulary goes beside it (export.json), so a consumer can encode text."""

from __future__ import annotations

from pathlib import Path

import torch

from trainers.gpt.infer import load_for_inference
from trainers.onnx import check_parity, check_tolerance, export_program, opset
from trainers.runtime.files import sha256_file
from trainers.runtime.results import merge_results
from trainers.runtime.rundir import exclusive
from trainers.runtime.written import write_result_json

EXPORT_LENGTH = 16  # the example length the graph is traced at; the checks use others


class Logits(torch.nn.Module):
    """The GPT without a KV cache: what ONNX carries."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)


def check_lengths(seq_len: int) -> list[int]:
    """Lengths other than the traced one: short, odd, and the longest the model takes."""
    return sorted({n for n in (3, 37, seq_len) if 2 <= n <= seq_len and n != EXPORT_LENGTH})


def export_run(run_dir: Path, checkpoint: str = "best", tolerance: float = 1e-4) -> dict:
    check_tolerance(tolerance)
    run_dir = Path(run_dir)
    loaded = load_for_inference(run_dir, checkpoint, "cpu")
    with exclusive(run_dir):
        return _export(run_dir, loaded, tolerance)


def _export(run_dir: Path, loaded, tolerance: float) -> dict:
    cfg, vocab = loaded.cfg, loaded.vocab
    module = Logits(loaded.model).eval()
    length = min(EXPORT_LENGTH, cfg.seq_len)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    seq = torch.export.Dim("length", min=2, max=cfg.seq_len)
    path = run_dir / "model.onnx"
    example = torch.randint(0, len(vocab), (2, length), generator=torch.Generator().manual_seed(0))
    export_program(module, (example,), path, input_names=["tokens"], output_names=["logits"],
                   dynamic_shapes={"tokens": {0: batch, 1: seq}})
    g = torch.Generator().manual_seed(1)
    lengths = check_lengths(cfg.seq_len)
    cases = {f"batch{b}_length{n}": (torch.randint(0, len(vocab), (b, n), generator=g),)
             for b, n in zip((1, 3, 2), lengths)}
    parity = check_parity(module, path, cases, ["tokens"], tolerance)
    info = {"path": path.name, "checkpoint_step": loaded.step, "export_length": length, "checked_lengths": lengths,
            "opset": opset(path), "bytes": path.stat().st_size, "sha256": sha256_file(path), "parity": parity,
            "input": {"name": "tokens", "shape": ["batch", "length"], "dtype": "int64", "max_length": cfg.seq_len},
            "output": {"name": "logits", "shape": ["batch", "length", len(vocab)]},
            "vocab": vocab}
    write_result_json(run_dir / "export.json", info)
    merge_results(run_dir, {"export": info})
    return info
