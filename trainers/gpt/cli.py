"""`trainers gpt data|train|evaluate|sample|serve|export|size`. Light: torch, FastAPI and the model
load when a verb runs."""

from __future__ import annotations

import argparse
import json
import os

from trainers.errors import UsageError
from trainers.gpt.config import GptConfig
from trainers.runtime import config as cfgmod
from trainers.runtime.config import number

CONFIG = GptConfig
CPUS = os.cpu_count() or 1  # torch makes every thread asked for: more than the CPUs only costs (10**20 crashed)
HELP = "the char-level GPT (seed 004): depth-scaled, DDP or FSDP2, a wall-clock and money budget, sample/serve"


def _data(args) -> int:
    from trainers.gpt.data import load_corpus, markov_source

    cfg = cfgmod.from_args(GptConfig, args)
    corpus = load_corpus(cfg.data, cfg.cache_dir, cfg.seq_len, cfg.val_frac, markov_source(cfg), cfg.synthetic_chars)
    train, val = corpus.split(cfg.val_frac)
    print(json.dumps({"source": corpus.source, "fingerprint": corpus.fingerprint, "vocab_size": len(corpus.vocab),
                      "train_tokens": len(train), "val_tokens": len(val), "skipped_empty_files": corpus.skipped,
                      "entropy_floor": corpus.floor}))
    return 0


def process_started_at() -> float:
    """When this process began (time.time() scale): the budget counts the whole process, the
    interpreter's start and every import included. Linux: its age from /proc; elsewhere: now."""
    import os
    import time

    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, ValueError, IndexError):
        return time.time()


def _train(args) -> int:
    started_at = process_started_at()
    from trainers.gpt.train import train

    train(cfgmod.from_args(GptConfig, args), started_at)
    return 0  # the process then ends without torch's teardown (runtime/leave.py): the budget pays for none of it


def _evaluate(args) -> int:
    from trainers.gpt.evaluate import evaluate_run

    e = evaluate_run(args.run_dir, args.checkpoint, args.eval_tokens, args.device)
    print(json.dumps({k: e[k] for k in ("checkpoint_step", "val_loss", "val_bpc", "val_bpb", "baselines_nats")}))
    return 0


def _sample(args) -> int:
    from trainers.gpt.infer import sample_run

    print(sample_run(args.run_dir, args.checkpoint, args.prompt, args.max_new_tokens, args.temperature, args.top_k,
                     args.seed, args.device))
    return 0


SERVE_MODULES = ("fastapi", "uvicorn", "starlette", "pydantic")  # what the `serve` extra installs


def _serve(args) -> int:
    import importlib

    try:
        for name in ("fastapi", "uvicorn"):  # serve imports uvicorn only when it starts: ask now
            importlib.import_module(name)
        from trainers.gpt.serve import serve
    except ModuleNotFoundError as exc:
        if exc.name not in SERVE_MODULES:
            raise
        raise UsageError(f"`trainers gpt serve` needs the serve extra ({exc.name} is not installed): "
                         f"pip install -e '.[serve]' in the kit's checkout, or pip install 'trainers[serve]'") from None
    serve(args.run_dir, args.checkpoint, args.host, args.port, args.device, max_new_tokens=args.max_new_tokens_limit,
          max_prompt_chars=args.max_prompt_chars, timeout_s=args.request_timeout_s, max_queue=args.max_queue,
          threads=args.threads)
    return 0


def _export(args) -> int:
    from trainers.gpt.export import export_run

    info = export_run(args.run_dir, args.checkpoint, args.tolerance)
    print(f"exported {args.run_dir}/model.onnx (checkpoint step {info['checkpoint_step']}, traced at length "
          f"{info['export_length']}); onnxruntime vs PyTorch max abs error {info['parity']['max_abs_error']:.2e} at "
          f"lengths {info['checked_lengths']}")
    return 0


def _size(args) -> int:
    from trainers.gpt.size import GIB, Shape, table

    cfg = cfgmod.from_args(GptConfig, args)
    shape = Shape(cfg.depth, cfg.head_dim, args.vocab_size, cfg.seq_len, cfg.positions, cfg.tie_embeddings)
    gpu = int(args.gpu_memory_gib * GIB)
    rows = table(shape, args.world_size, cfg.device_batch_size, gpu)
    print(json.dumps({"depth": cfg.depth, "dim": shape.dim, "heads": shape.heads, "parameters": shape.parameters(),
                      "nominal_12_L_d2": shape.nominal_parameters(), "flops_per_token": shape.flops_per_token(),
                      "world_size": args.world_size, "gpu_memory_gib": args.gpu_memory_gib,
                      "device_batch_size": cfg.device_batch_size, "layouts": rows}, indent=1))
    if args.require_fit and not any(r["fits"] for r in rows):
        from trainers.gpt.size import describe

        raise UsageError(f"--depth {cfg.depth} does not fit {args.gpu_memory_gib:g} GiB per GPU on {args.world_size} "
                         f"GPU(s) at --device-batch-size {cfg.device_batch_size}: {describe(rows)}")
    return 0


def _checkpoint_flags(p) -> None:
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="best", help="best, latest or a step number (default: best)")


def add_verbs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="tokenise --data once into --cache-dir (training does it too when needed)")
    cfgmod.add_dataclass_args(p, GptConfig)
    p.set_defaults(func=_data)

    p = sub.add_parser("train", help="train; under torchrun for several workers; resumes when --run-dir holds a run")
    cfgmod.add_dataclass_args(p, GptConfig)
    p.set_defaults(func=_train)

    p = sub.add_parser("evaluate", help="validation loss, bits per character and the baselines of a checkpoint")
    _checkpoint_flags(p)
    p.add_argument("--eval-tokens", type=number(int, min=1), default=None,
                   help="validation tokens to read (default: the run's --eval-tokens)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("sample", help="generate text from a checkpoint (KV cache; deterministic for a seed)")
    _checkpoint_flags(p)
    p.add_argument("--prompt", default=None, help="text to continue (default: a newline, or the first character)")
    p.add_argument("--max-new-tokens", type=number(int, min=1), default=200, help="characters to generate")
    p.add_argument("--temperature", type=number(float, min=0), default=1.0, help="0: greedy (default: 1.0)")
    p.add_argument("--top-k", type=number(int, min=1), default=None, help="sample from the k likeliest only")
    p.add_argument("--seed", type=number(int, min=0), default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.set_defaults(func=_sample)

    p = sub.add_parser("serve", help="an HTTP server: GET /health, POST /generate (JSON or server-sent events)")
    _checkpoint_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=number(int, min=1, max=65535), default=8000)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--max-new-tokens-limit", type=number(int, min=1), default=2048,
                   help="largest max_new_tokens a request may ask for (default: 2048)")
    p.add_argument("--max-prompt-chars", type=number(int, min=1), default=8192,
                   help="longest prompt accepted (longer: 413) (default: 8192)")
    p.add_argument("--request-timeout-s", type=number(float, gt=0), default=60.0,
                   help="a request (queueing included) ends after this many seconds (default: 60)")
    p.add_argument("--max-queue", type=number(int, min=1), default=64,
                   help="requests waiting at once; more are refused with 503 (default: 64)")
    p.add_argument("--threads", type=number(int, min=0, max=CPUS), default=0,
                   help=f"torch CPU threads (0: torch's default; 1 is fastest for tiny models on busy CPUs; at most "
                        f"this machine's {CPUS} CPUs)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("export", help="ONNX tokens -> logits with a dynamic length, checked by onnxruntime")
    _checkpoint_flags(p)
    p.add_argument("--tolerance", type=number(float, gt=0), default=1e-4, help="largest allowed abs difference")
    p.set_defaults(func=_export)

    p = sub.add_parser("size", help="parameters, FLOPs per token and the per-GPU memory of DDP / FSDP2 (+ activation "
                                    "checkpointing) for the model options given")
    cfgmod.add_dataclass_args(p, GptConfig)
    p.add_argument("--world-size", type=number(int, min=1), default=8, help="GPUs in all (default: 8)")
    p.add_argument("--gpu-memory-gib", type=number(float, gt=0), default=80.0, help="memory of one GPU (default: 80)")
    p.add_argument("--vocab-size", type=number(int, min=1), default=256, help="characters (default: 256)")
    p.add_argument("--require-fit", action="store_true", help="exit 2 when no layout fits")
    p.set_defaults(func=_size)
