"""`trainers preflight`: is this machine fit to train on, before any money is spent on it?

Each check prints one line — PASS, WARN or FAIL, what was seen, and the fix when there is one —
and the whole report can be written as JSON. GPU facts come from `nvidia-smi` (driver, CUDA,
names, memory) and from torch (what PyTorch itself can use); the NCCL check runs a real
all-reduce across the local GPUs under torchrun (`trainers.ops.nccl_check`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainers.errors import UsageError
from trainers.registry import trainer_config
from trainers.runtime.config import check_folder_writable, number

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
MIN_SHM_BYTES = 1 << 30  # Docker's 64 MB default breaks NCCL and DataLoader workers
# Bus bandwidth an all-reduce should reach at large messages, GB/s, by interconnect.
EXPECTED_BUSBW_GBPS = {"nvlink": 350.0, "pcie": 15.0}


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""
    data: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.status:4}  {self.name:<14} {self.detail}" + (f"  -> {self.fix}" if self.fix else "")


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_mib: int
    driver: str


def query_nvidia_smi() -> tuple[list[GpuInfo], str | None, str | None]:
    """(GPUs, driver version, CUDA version) from nvidia-smi; ([], None, reason) when it is absent."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], None, "nvidia-smi not found"
    try:
        out = subprocess.run([exe, "--query-gpu=index,name,memory.total,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return [], None, "nvidia-smi timed out (driver hung?)"
    if out.returncode != 0:
        return [], None, f"nvidia-smi failed: {(out.stderr or out.stdout).strip().splitlines()[:1]}"
    gpus = []
    for row in out.stdout.strip().splitlines():
        parts = [p.strip() for p in row.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            gpus.append(GpuInfo(int(parts[0]), parts[1], int(float(parts[2])), parts[3]))
    cuda = None
    header = subprocess.run([exe], capture_output=True, text=True, timeout=20).stdout
    for token in header.split("|"):
        if "CUDA Version:" in token:
            cuda = token.split("CUDA Version:")[1].strip().split()[0]
    return gpus, (gpus[0].driver if gpus else None), cuda


def link_type() -> str:
    """nvlink when `nvidia-smi topo -m` shows NV# links between GPUs, else pcie."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "pcie"
    out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20).stdout
    return "nvlink" if any(tok.startswith("NV") and tok[2:].isdigit() for tok in out.split()) else "pcie"


def check_gpus(expect: int | None) -> tuple[list[Check], list[GpuInfo]]:
    gpus, driver, cuda = query_nvidia_smi()
    if not gpus:
        reason = cuda if driver is None and cuda else "no GPU listed"
        return [Check("gpus", FAIL, f"no NVIDIA GPU ({reason})",
                      "on a machine without GPUs run " + ("`deploy --demo` (the image's entrypoint)" if os.environ.get(
                          "TRAINERS_IN_CONTAINER") else "`bash deploy_8gpu.sh --demo`") + " (CPU, 2 workers, synthetic data)")], []
    names = sorted({g.name for g in gpus})
    checks = [Check("gpus", PASS, f"{len(gpus)} x {', '.join(names)}, {min(g.memory_mib for g in gpus) // 1024} GiB each",
                    data={"count": len(gpus), "gpus": [asdict(g) for g in gpus]})]
    if expect is not None and len(gpus) != expect:
        status = FAIL if len(gpus) < expect else WARN
        checks.append(Check("gpu count", status, f"expected {expect}, found {len(gpus)}",
                            "check the pod type / CUDA_VISIBLE_DEVICES, or pass --expect-gpus "
                            f"{len(gpus)}"))
    checks.append(Check("driver", PASS, f"driver {driver}, CUDA {cuda or 'unknown'}",
                        data={"driver": driver, "cuda": cuda}))
    return checks, gpus


def check_versions() -> Check:
    """torch and the ONNX stack inside the tested range (trainers/versions.py), read without importing them."""
    from trainers.versions import REQUIRED, problems

    found = problems()
    if found:
        return Check("versions", FAIL, found[0] + (f" (and {len(found) - 1} more: {'; '.join(found[1:])})"
                                                   if len(found) > 1 else ""))
    return Check("versions", PASS, "torch, onnx, onnxscript and onnxruntime in the tested range ("
                 + ", ".join(f"{name}{'>=' + '.'.join(map(str, low))}" for name, low, _high, _why in REQUIRED) + ")")


def check_torch(n_smi_gpus: int) -> list[Check]:
    import torch

    from trainers.runtime.device import facts as device_facts

    info = {"torch": torch.__version__, "cuda_build": torch.version.cuda}
    gpus = device_facts()
    if not gpus["count"]:
        status = FAIL if n_smi_gpus else WARN
        fix = ("this torch is a CPU build or does not match the driver: install a CUDA build of torch"
               if n_smi_gpus else "")
        return [Check("torch", status, f"torch {torch.__version__} sees no CUDA device (build CUDA "
                                       f"{torch.version.cuda})", fix, info)]
    n, caps, nccl = gpus["count"], gpus["capabilities"], gpus["nccl"]
    path = "bf16" if min(caps) >= (8, 0) else "fp16 + grad scaler"
    info.update(devices=n, capabilities=[list(c) for c in caps], nccl=nccl, precision=path)
    status = PASS if n == n_smi_gpus else WARN
    checks = [Check("torch", status, f"torch {torch.__version__} (CUDA {torch.version.cuda}, NCCL {nccl}) "
                                     f"sees {n} GPU(s), capability {caps}, precision {path}", data=info)]
    if n > 1:
        missing = gpus["no_peer_access"]
        checks.append(Check("p2p", PASS if not missing else WARN,
                            "peer access between all GPU pairs" if not missing else
                            f"no peer access for {len(missing)} pair(s), e.g. {missing[:3]}",
                            "" if not missing else "NCCL will route through host memory: expect lower bandwidth",
                            {"missing_pairs": missing}))
    return checks


def check_shm(path: str = "/dev/shm") -> Check:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Check("shm", WARN, f"cannot stat {path}: {exc}")
    size = st.f_blocks * st.f_frsize
    detail = f"{path} is {size / 2**30:.2f} GiB"
    if size < MIN_SHM_BYTES:
        return Check("shm", FAIL, detail + " (Docker's default is 64 MB; NCCL and DataLoader workers fail with it)",
                     "run the container with --ipc=host or --shm-size=16g", {"bytes": size})
    return Check("shm", PASS, detail, data={"bytes": size})


def model_parameters(trainer: str, cfg) -> int:
    """Parameters of the trainer's model, built on the meta device (no memory, no data)."""
    import torch

    from trainers.registry import trainer_module

    with torch.device("meta"):
        model = trainer_module(trainer, "build").build_model(cfg)
    return sum(p.numel() for p in model.parameters())


def checkpoint_bytes(n_parameters: int, keep_last: int) -> int:
    """Disk a run writes: each checkpoint holds fp32 weights + AdamW's two moments (x3), kept
    keep_last + best + one being written."""
    return n_parameters * 4 * 3 * (keep_last + 2) + (200 << 20)  # + logs, ONNX, tarball slack


def check_disk(out_dir: str, need: int) -> Check:
    path = Path(out_dir)
    probe = path if path.exists() else next((p for p in path.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    detail = f"{free / 2**30:.1f} GiB free at {probe}, the run needs about {need / 2**30:.1f} GiB"
    status = PASS if free >= need else FAIL
    return Check("disk", status, detail, "" if status == PASS else "free space or point --out at a bigger volume",
                 {"free": free, "need": need})


def check_memory(min_gib: float = 8.0) -> Check:
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        return Check("memory", WARN, "cannot read /proc/meminfo")
    status = PASS if avail >= min_gib * 2**30 else WARN
    return Check("memory", status, f"{avail / 2**30:.1f} GiB host memory available", data={"available": avail})


def check_nccl(n_gpus: int, backend: str, sizes_mb: list[int], expected_gbps: float | None) -> Check:
    """All-reduce across the local devices under torchrun; bus bandwidth per message size."""
    with_report = Path(os.environ.get("TMPDIR", "/tmp")) / f"nccl_check_{os.getpid()}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n_gpus}",
           "-m", "trainers.ops.nccl_check", "--backend", backend, "--sizes-mb", ",".join(map(str, sizes_mb)),
           "--out", str(with_report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not with_report.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return Check("nccl", FAIL, f"all-reduce across {n_gpus} devices failed: {' | '.join(tail)}",
                     "check NCCL_DEBUG=INFO output, /dev/shm and that all GPUs are healthy")
    result = json.loads(with_report.read_text())
    with_report.unlink()
    best = max(r["busbw_gbps"] for r in result["sizes"])
    table = ", ".join(f"{r['mb']} MB {r['busbw_gbps']:.1f}" for r in result["sizes"])
    if expected_gbps is None:
        return Check("nccl", PASS, f"{backend} all-reduce busbw GB/s: {table}", data=result)
    result["expected_gbps"] = expected_gbps
    status = PASS if best >= 0.5 * expected_gbps else WARN
    return Check("nccl", status, f"{backend} all-reduce busbw GB/s: {table} (expected about {expected_gbps:.0f})",
                 "" if status == PASS else "slow interconnect: check `nvidia-smi topo -m` and NCCL_P2P/NCCL_IB settings",
                 result)


def check_fit(workload, gpus: list[GpuInfo], usd_per_gpu_hour: float | None, plan_json: str | None) -> Check:
    """The planner, for the job about to run on the GPUs found: does it fit, what will it cost, and
    if it does not fit, the change that makes it fit — before any money is spent on training."""
    from dataclasses import replace

    from trainers.ops.devices import Device, device_for_name
    from trainers.ops.plan import percent, plan
    from trainers.runtime.files import atomic_write_json

    memory_gib = min(g.memory_mib for g in gpus) / 1024
    known = device_for_name(gpus[0].name, memory_gib)
    device = replace(known, memory_gib=memory_gib) if known else Device(
        "detected", gpus[0].name, memory_gib, 100.0, "pcie", 10.0)
    try:
        p = plan(workload, device, len(gpus), usd_per_gpu_hour=usd_per_gpu_hour)
    except UsageError as exc:  # the job the trainer would refuse on these GPUs (a batch that does not divide)
        return Check("fit", FAIL, f"{workload.trainer} on {len(gpus)} GPU(s): {exc}")
    if plan_json:
        atomic_write_json(Path(plan_json), p.to_json())
    if p.chosen is None:
        total = min(st["memory_bytes"]["total"] for st in p.strategies.values() if st["supported"])
        return Check("fit", FAIL, f"{workload.trainer} needs about {total / 2**30:.1f} GiB per GPU, "
                                  f"{memory_gib:.1f} GiB here", p.fix, p.to_json())
    m = p.strategies[p.chosen]["memory_bytes"]["total"]
    estimate = ""
    if "hours" in p.time:
        usd = p.money.get("usd")
        source = "measured" if p.mfu["source"].startswith("measured") and "ASSUMED" not in p.mfu["source"] \
            else "assumed"  # (a carried one, or one measured for another size, says ASSUMED)
        estimate = f"; plan: about {p.time['hours']:.2f} h" + (f", ${usd:,.2f}" if usd is not None else "") + \
            f" at an MFU of {percent(p.mfu['value'])} ({source})"
    return Check("fit", PASS, f"{p.chosen}: about {m / 2**30:.1f} of {memory_gib:.1f} GiB per GPU{estimate}",
                 data=p.to_json())


def run_preflight(expect_gpus: int | None, out_dir: str, disk_need: int, nccl: bool, sizes_mb: list[int],
                  json_path: str | None, shm_path: str = "/dev/shm", workload=None, usd_per_gpu_hour=None,
                  plan_json: str | None = None) -> int:
    gpu_checks, gpus = check_gpus(expect_gpus)
    checks = [check_versions(), *gpu_checks]
    if not gpus:  # fail fast: nothing below matters without a GPU
        return _report(checks, json_path)
    if workload is not None:
        checks.append(check_fit(workload, gpus, usd_per_gpu_hour, plan_json))
    checks += check_torch(len(gpus))
    checks += [check_shm(shm_path), check_disk(out_dir, disk_need), check_memory()]
    torch_ok = all(c.status != FAIL for c in checks if c.name == "torch")
    if nccl and len(gpus) > 1 and torch_ok:
        checks.append(check_nccl(len(gpus), "nccl", sizes_mb, EXPECTED_BUSBW_GBPS[link_type()]))
    return _report(checks, json_path)


def _report(checks: list[Check], json_path: str | None) -> int:
    for c in checks:
        print(c.line())
    failed = [c.name for c in checks if c.status == FAIL]
    verdict = FAIL if failed else (WARN if any(c.status == WARN for c in checks) else PASS)
    print(f"preflight: {verdict}" + (f" ({', '.join(failed)})" if failed else ""))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps({"verdict": verdict, "checks": [asdict(c) for c in checks]}, indent=2))
    return 1 if failed else 0


def add_args(p) -> None:
    p.add_argument("--expect-gpus", type=number(int, min=1), default=None, help="fail when fewer GPUs are present")
    p.add_argument("--out", default=".", help="output folder whose disk is checked (default: .)")
    p.add_argument("--trainer", default="forecast", help="the trainer about to run: its model sizes the disk check")
    p.add_argument("--no-nccl", dest="nccl", action="store_false", help="skip the all-reduce bandwidth test")
    p.add_argument("--sizes-mb", default="8,64,256", help="all-reduce message sizes in MB (default: 8,64,256)")
    p.add_argument("--json", default=None, help="write the report here as JSON")
    p.add_argument("--plan-json", default=None, help="write the job's plan (memory, time, cost) here as JSON")
    p.add_argument("train_options", nargs="*", metavar="-- TRAIN-OPTIONS",
                   help="the trainer's own options, as its training gets them (e.g. -- --preset 151m)")


def main(args) -> int:
    if args.expect_gpus is not None and args.expect_gpus < 1:
        raise UsageError(f"--expect-gpus {args.expect_gpus} must be >= 1")
    try:
        sizes = [int(s) for s in args.sizes_mb.split(",") if s]
    except ValueError:
        raise UsageError(f"--sizes-mb {args.sizes_mb!r} must be comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--sizes-mb {args.sizes_mb!r} must list message sizes >= 1 MB")
    if args.json:
        check_folder_writable(Path(args.json).parent, "--json")
        if Path(args.json).is_dir():
            raise UsageError(f"--json {args.json} is a folder; give a file name")
    cfg = trainer_config(args.trainer, args.train_options)
    cfg.validate()
    need = checkpoint_bytes(model_parameters(args.trainer, cfg), cfg.keep_last) * 2  # ONNX + tarball copy it again
    workload = None
    try:
        from trainers.ops.commands import workload_of

        workload = workload_of(args.trainer, cfg)
    except ModuleNotFoundError:
        print(f"note: no plan for the {args.trainer} trainer yet: the memory fit is not checked")
    return run_preflight(args.expect_gpus, args.out, need, args.nccl, sizes, args.json, workload=workload,
                         usd_per_gpu_hour=cfg.usd_per_gpu_hour, plan_json=args.plan_json)
