"""`trainers gpt serve`: the trained GPT behind HTTP, on FastAPI + uvicorn (the optional `serve` extra).

    GET  /health     {"status": "ok", checkpoint step, vocabulary, queue length, ...}
    POST /generate   {"prompt": "...", "max_new_tokens": 100, "temperature": 1.0, "top_k": null,
                      "seed": 0, "stream": false}
                     -> {"text": ..., "tokens": n, "seconds": ..., "queued_s": ...}
                     with "stream": true: server-sent events, one `data: {"token": "c"}` per character,
                     then `event: done` with the same summary (or `event: error`: a timeout, a failure)

Requests are served one at a time, in arrival order, by a single generation thread (a FIFO
queue, not batching: a character model at these sizes is bound by per-token latency, and one
thread keeps torch's state simple); at most --max-queue wait, more get 503. Each request has a
deadline (--request-timeout-s, counted from arrival, queueing included): a request that cannot
finish by then ends with 504 (or an error event when streaming). Refused before queueing: a prompt
longer than --max-prompt-chars (413), max_new_tokens above --max-new-tokens-limit, an empty
prompt, characters the model never saw (named) and malformed fields (422). A generation that breaks
the GPU's context (a kernel fault: no later call on the device can succeed in this process) leaves
/health and every later generation answering 503 with the device's error; `trainers gpt serve` then
finishes the answers in flight and exits 1 naming the error, for whatever runs it to start it again.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from trainers.errors import RunFailed, first_line
from trainers.gpt.infer import Loaded, encode, load_for_inference
from trainers.gpt.model import generate
from trainers.runtime import device as device_mod
from trainers.runtime.config import INT_MAX


class GenerateRequest(BaseModel):
    # strict: "stream": "yes", "top_k": 2.5 or "max_new_tokens": "5" are errors to name, not guesses
    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: str
    max_new_tokens: int = Field(100, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=100.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=1, le=INT_MAX)
    seed: int = Field(0, ge=0, le=INT_MAX)
    stream: bool = False


def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each bad field, what it got and what it takes. FastAPI's own answer echoes the
    input, and a non-finite one (`1e999`, `NaN`, `Infinity` in the body) cannot be written as JSON:
    every such request became a 500."""
    problems = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":  # its location is a character offset, not a field
            problems.append(f"body: not JSON ({(error.get('ctx') or {}).get('error', 'decode error')})")
            continue
        field = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        got = "" if error.get("type") == "missing" else f" {repr(error.get('input'))[:40]}"
        problems.append(f"{field}{got}: {error.get('msg', 'invalid')}")
    return JSONResponse({"detail": "; ".join(problems)}, status_code=422)


class Worker:
    """One thread runs every generation, in arrival order; `pending` counts queued + running. `broken`: the
    device's error once a generation broke its CUDA context (every later call on it fails the same way: only a new
    process can use the GPU again), for /health and /generate to answer 503 with it instead of ok and a 500 each."""

    def __init__(self, loaded: Loaded, max_queue: int, on_broken: Callable[[str], None] | None = None):
        self.loaded = loaded
        self.max_queue = max_queue
        self.on_broken = on_broken  # told once, from the generation thread, when the device breaks
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        self.pending = 0
        self.lock = threading.Lock()
        self.served = 0  # generations that ran to their end (done, timeout or cancelled)
        self.failed = 0  # generations that raised (each answered 500 or 503, or a stream's error event)
        self.broken: str | None = None

    def admit(self) -> bool:
        with self.lock:
            if self.pending >= self.max_queue:
                return False
            self.pending += 1
            return True

    def done(self, ok: bool) -> None:
        with self.lock:
            self.pending -= 1
            if ok:
                self.served += 1
            else:
                self.failed += 1

    def run(self, tokens: list[int], req: GenerateRequest, deadline: float, emit, cancelled: threading.Event) -> dict:
        """In the worker thread: generate, calling emit(char) per token; stops at the deadline."""
        ok = False
        try:
            if self.broken is not None:  # queued before the device broke: no call on it can succeed
                raise RuntimeError(self.broken)
            try:
                out = self._generate(tokens, req, deadline, emit, cancelled)
                ok = True
                return out
            except RuntimeError as exc:
                if device_mod.context_lost(exc, self.loaded.device):
                    self.broken = first_line(exc)
                    if self.on_broken is not None:
                        self.on_broken(self.broken)
                raise
        finally:
            self.done(ok)

    def _generate(self, tokens, req, deadline, emit, cancelled) -> dict:
        started = time.monotonic()
        out, status = [], "done"
        if started >= deadline:
            return {"status": "timeout", "tokens": 0, "started": started, "text": ""}
        g = torch.Generator().manual_seed(req.seed)
        vocab = self.loaded.vocab
        for token in generate(self.loaded.model, tokens, req.max_new_tokens, req.temperature, req.top_k, g):
            out.append(vocab[token])
            emit(vocab[token])
            if cancelled.is_set():
                status = "cancelled"
                break
            if time.monotonic() >= deadline and len(out) < req.max_new_tokens:
                status = "timeout"
                break
        return {"status": status, "tokens": len(out), "started": started, "text": "".join(out)}


def prompt_tokens(req: GenerateRequest, vocab: list[str], max_prompt_chars: int, max_new_tokens: int) -> list[int]:
    """The request's prompt encoded, or the HTTP error that refuses it: too long (413), asking for more tokens than
    the server gives, empty, or a character outside the vocabulary (422)."""
    if len(req.prompt) > max_prompt_chars:
        raise HTTPException(413, f"prompt has {len(req.prompt)} characters; the limit is {max_prompt_chars}")
    if req.max_new_tokens > max_new_tokens:
        raise HTTPException(422, f"max_new_tokens {req.max_new_tokens} is above the limit {max_new_tokens}")
    if not req.prompt:
        raise HTTPException(422, "prompt is empty; give at least one character")
    try:
        return encode(vocab, req.prompt)
    except ValueError as exc:
        raise HTTPException(422, f"prompt: {exc}") from None


def build_app(loaded: Loaded, max_new_tokens: int, max_prompt_chars: int, timeout_s: float, max_queue: int,
              on_device_lost: Callable[[str], None] | None = None) -> FastAPI:
    """The app; `on_device_lost(error)` is called once if a generation breaks the device (`serve` stops then)."""
    app = FastAPI(title="trainers gpt", description=__doc__.split("\n\n")[0])
    app.add_exception_handler(RequestValidationError, invalid_request)
    worker = Worker(loaded, max_queue, on_device_lost)
    params = sum(p.numel() for p in loaded.model.parameters())

    def device_lost() -> str:
        return f"the device broke ({worker.broken}): this server cannot generate again; restart it"

    @app.get("/health")
    def health():
        body = {"status": "ok", "checkpoint_step": loaded.step, "vocab_size": len(loaded.vocab),
                "parameters": params, "device": str(loaded.device), "queue": worker.pending,
                "served": worker.served, "failed": worker.failed, "limits": {"max_new_tokens": max_new_tokens,
                                                    "max_prompt_chars": max_prompt_chars,
                                                    "request_timeout_s": timeout_s, "max_queue": max_queue}}
        if worker.broken is not None:  # a probe (a load balancer, a container's health check) sees it and restarts
            return JSONResponse({**body, "status": "device lost", "detail": device_lost()}, status_code=503)
        return body

    @app.post("/generate")
    async def generate_endpoint(req: GenerateRequest, request: Request):
        arrived = time.monotonic()
        tokens = prompt_tokens(req, loaded.vocab, max_prompt_chars, max_new_tokens)
        if worker.broken is not None:
            raise HTTPException(503, device_lost())
        if not worker.admit():
            raise HTTPException(503, f"{max_queue} requests are already waiting; retry later",
                                headers={"Retry-After": "1"})
        deadline = arrived + timeout_s
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()

        def summary(result: dict) -> dict:
            return {"prompt": req.prompt, "text": result["text"], "tokens": result["tokens"],
                    "status": result["status"], "queued_s": result["started"] - arrived,
                    "seconds": time.monotonic() - arrived, "checkpoint_step": loaded.step}

        if not req.stream:
            try:
                result = await loop.run_in_executor(worker.pool, worker.run, tokens, req, deadline, lambda _c: None,
                                                    cancelled)
            except RuntimeError:
                if worker.broken is None:
                    raise  # (a 500: an error that leaves the device usable is this request's own)
                raise HTTPException(503, device_lost()) from None
            body = summary(result)
            if result["status"] == "timeout":
                return JSONResponse({"detail": f"request timed out after {timeout_s:g} s ({result['tokens']} "
                                               f"characters generated)", **body}, status_code=504)
            return body

        events: asyncio.Queue = asyncio.Queue()

        def emit(char: str) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ("token", char))

        future = loop.run_in_executor(worker.pool, worker.run, tokens, req, deadline, emit, cancelled)

        def ended(f) -> None:
            if not f.cancelled():
                f.exception()  # (read here: a client that left never reads it, and asyncio would log it unread)
            loop.call_soon_threadsafe(events.put_nowait, ("end", f))

        future.add_done_callback(ended)

        async def stream():
            try:
                while True:
                    kind, value = await events.get()
                    if kind == "token":
                        yield f"data: {json.dumps({'token': value})}\n\n"
                        continue
                    try:
                        result = value.result()
                    except Exception as exc:  # noqa: BLE001 - the 200 is sent: the client learns it in an event
                        error = device_lost() if worker.broken is not None else \
                            f"{type(exc).__name__}: {first_line(exc)}"
                        yield f"event: error\ndata: {json.dumps({'error': error})}\n\n"
                        return
                    if result["status"] == "timeout":
                        error = {"error": f"request timed out after {timeout_s:g} s", **summary(result)}
                        yield f"event: error\ndata: {json.dumps(error)}\n\n"
                    else:
                        yield f"event: done\ndata: {json.dumps(summary(result))}\n\n"
                    return
            finally:
                cancelled.set()  # a client that left stops its generation at the next token

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


def serve(run_dir: Path, checkpoint: str, host: str, port: int, device: str, max_new_tokens: int,
          max_prompt_chars: int, timeout_s: float, max_queue: int, threads: int = 0) -> None:
    import uvicorn

    if threads:
        torch.set_num_threads(threads)
    loaded = load_for_inference(Path(run_dir), checkpoint, device)
    lost: list[str] = []

    def device_lost(error: str) -> None:  # the answers in flight finish (503s), then the process leaves
        lost.append(error)
        server.should_exit = True

    app = build_app(loaded, max_new_tokens, max_prompt_chars, timeout_s, max_queue, on_device_lost=device_lost)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    print(f"serving {run_dir} (checkpoint step {loaded.step}, {len(loaded.vocab)} characters) on "
          f"http://{host}:{port}  (GET /health, POST /generate)", flush=True)
    server.run()
    if lost:
        raise RunFailed(f"gpt serve: the device broke ({lost[0]}); no generation can succeed in this process, so "
                        f"the server stopped for whatever runs it (docker --restart, systemd, a pod) to start it again")
