"""A small HTTP client for `trainers gpt serve` (standard library only): one request, one streamed
request, and a bounded load test (N clients x M requests each, in threads) reporting latency
percentiles and throughput. Used by the server's tests and by bench/gpt_serve.py."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np


def post(url: str, body: dict, timeout: float = 60.0) -> tuple[int, dict]:
    """(HTTP status, JSON body) of POST url, errors included."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def get(url: str, timeout: float = 10.0) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def stream(url: str, body: dict, timeout: float = 60.0) -> tuple[str, list[tuple[str, dict]]]:
    """(content type, [(event name, data)]) of a server-sent-events response, read as it arrives."""
    req = urllib.request.Request(url, data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    events, name = [], "message"
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        kind = resp.headers.get("Content-Type", "")
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: "):])))
                name = "message"
    return kind, events


def load_test(url: str, clients: int, requests_per_client: int, body: dict) -> dict:
    """Every client sends its requests one after another; all clients at once. Latency per request
    (ms, p50/p99), generated characters per second over the whole test, and every failure."""
    latencies: list[float] = []
    failures: list[str] = []
    tokens = [0]
    lock = threading.Lock()

    def client(index: int) -> None:
        for i in range(requests_per_client):
            t0 = time.perf_counter()
            status, out = post(url, dict(body, seed=index * 1000 + i))
            dt = time.perf_counter() - t0
            with lock:
                if status == 200:
                    latencies.append(dt)
                    tokens[0] += out["tokens"]
                else:
                    failures.append(f"{status}: {out}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ms = np.array(latencies) * 1000.0
    return {"clients": clients, "requests_per_client": requests_per_client, "ok": len(latencies),
            "failures": failures, "wall_s": wall, "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None, "tokens": tokens[0],
            "tokens_per_s": tokens[0] / wall, "requests_per_s": len(latencies) / wall,
            "max_new_tokens": body.get("max_new_tokens")}
