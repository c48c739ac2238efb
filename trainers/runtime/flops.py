"""Peak FLOP/s by device, and MFU: what fraction of the device's dense bf16 peak training uses.

MFU counts the model's matmul FLOPs only (nanoGPT/PaLM convention: training = 3 x forward, the
backward pass costs two forwards); each trainer counts its own next to its model. Peaks are
dense (no sparsity) bf16 tensor-core figures from the vendors' data sheets; CPUs get no MFU.
"""

from __future__ import annotations

# Dense bf16 (fp16 where the chip has no bf16) peak TFLOP/s, matched against torch's device name.
# Order matters: the first key contained in the name wins (so "H100 PCIe" before "H100").
PEAK_TFLOPS: list[tuple[str, float]] = [
    ("B200", 2250.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("A100", 312.0),
    ("L40S", 362.0),
    ("A10G", 125.0),  # NVIDIA's A10 data-sheet figure; AWS's A10G variant may be lower (not verified here)
    ("T4", 65.0),  # fp16 (no bf16)
    ("V100", 125.0),  # fp16 (no bf16)
]


def peak_tflops(device_name: str) -> float | None:
    name = device_name.upper()
    for key, value in PEAK_TFLOPS:
        if key.upper() in name:
            return value
    return None


def mfu(samples_per_s: float, flops_per_sample: float, device_name: str, n_devices: int = 1) -> float | None:
    peak = peak_tflops(device_name)
    if peak is None:
        return None
    return samples_per_s * flops_per_sample / (peak * 1e12 * n_devices)
