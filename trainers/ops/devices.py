"""The GPUs the planner knows: memory, dense peak FLOP/s, interconnect. Dated; no prices.

Peaks are the vendors' dense (no sparsity) bf16 figures (fp16 where the chip has no bf16). The
all-reduce bus bandwidths are what nccl-tests-class measurements report for a full node at >= 1 GiB
messages (GUIDE.md §4 for H100/H200; the others are public figures of the same kind). They are
assumptions for a plan, not measurements of this repository, and are labelled so in every plan.
Prices vary by provider and week: the planner takes them from the user (--usd-per-gpu-hour,
--prices FILE); `devices_example_prices.json` is a dated example, labelled as such.
"""

from __future__ import annotations

from dataclasses import dataclass

TABLE_DATE = "2026-11-22"


@dataclass(frozen=True)
class Device:
    key: str
    name: str
    memory_gib: float
    peak_tflops: float  # dense bf16 (fp16 on chips without bf16)
    link: str  # nvlink | pcie
    busbw_gbps: float  # all-reduce bus bandwidth across the node's GPUs, assumed
    bf16: bool = True


# memory_gib: what the card's driver shows (nvidia-smi's MiB / 1024) where our GPU sessions recorded it
# (bench/results/gpu_h100/nvidia_smi.txt: 81559 MiB; gpu_h200*/nvidia_smi.txt: 143771 MiB), else the marketed
# size, which overstates it by a few tenths of a GiB (an 80 GB H100 holds 79.6 GiB: a plan at 0.2 GiB free did not fit)
DEVICES: dict[str, Device] = {d.key: d for d in (
    Device("b200", "NVIDIA B200 (SXM)", 180.0, 2250.0, "nvlink", 700.0),
    Device("h200", "NVIDIA H200 (SXM)", 140.4, 989.0, "nvlink", 475.0),
    Device("h100-sxm", "NVIDIA H100 80GB HBM3 (SXM)", 79.6, 989.0, "nvlink", 370.0),
    Device("h100-pcie", "NVIDIA H100 PCIe", 80.0, 756.0, "pcie", 25.0),
    Device("a100-80gb", "NVIDIA A100-SXM4-80GB", 80.0, 312.0, "nvlink", 230.0),
    Device("a100-40gb", "NVIDIA A100-SXM4-40GB", 40.0, 312.0, "nvlink", 230.0),
    Device("l40s", "NVIDIA L40S", 48.0, 362.0, "pcie", 20.0),
    Device("a10g", "NVIDIA A10G", 24.0, 125.0, "pcie", 10.0),
    Device("rtx4090", "NVIDIA GeForce RTX 4090", 24.0, 165.0, "pcie", 10.0),
    Device("v100-32gb", "Tesla V100-SXM2-32GB", 32.0, 125.0, "nvlink", 130.0, bf16=False),
    Device("t4", "Tesla T4", 16.0, 65.0, "pcie", 8.0, bf16=False),
)}

# torch.cuda.get_device_name() substrings -> table key (first match wins: PCIe before SXM)
_NAME_KEYS = [("B200", "b200"), ("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"),
              ("A100", None), ("L40S", "l40s"), ("A10G", "a10g"), ("4090", "rtx4090"), ("V100", "v100-32gb"),
              ("T4", "t4")]


def device_for_name(name: str, memory_gib: float | None = None) -> Device | None:
    """The table's entry for a name as nvidia-smi/torch print it (the A100s told apart by memory)."""
    upper = name.upper()
    for needle, key in _NAME_KEYS:
        if needle.upper() in upper:
            if key is None:  # A100: 40 or 80 GB
                return DEVICES["a100-80gb" if (memory_gib or 80) > 60 else "a100-40gb"]
            return DEVICES[key]
    return None
