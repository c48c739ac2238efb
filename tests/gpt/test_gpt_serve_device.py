"""The GPT server after its device broke: a generation that raised CUDA's context-breaking error (a kernel
fault; every later call on the device fails the same way until the process restarts) left /health saying
"ok" and every later request a 500, so nothing that probes the server knew to restart it. Now /health and
/generate answer 503 naming the error; an error that leaves the device usable stays that request's 500."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import uvicorn  # noqa: E402

import trainers.gpt.serve as serve  # noqa: E402
from trainers.gpt.config import GptConfig  # noqa: E402
from trainers.gpt.infer import Loaded  # noqa: E402
from trainers.gpt.loadtest import post, stream  # noqa: E402
from trainers.gpt.model import GPT  # noqa: E402

VOCAB = list("abcdefgh")
KERNEL_FAULT = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be reported later"


def get(url: str) -> tuple[int, dict]:
    """(HTTP status, JSON body) of GET url, an error status included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def serving(app):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not come up"
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture
def app_with_generate(monkeypatch):
    """The real app on a tiny untrained GPT, its generation replaced by `raising` (an error) after a first
    request that generates normally."""
    def make(error: Exception):
        real, calls = serve.generate, []

        def generate(*args, **kwargs):
            calls.append(1)
            if len(calls) > 1:
                raise error
            yield from real(*args, **kwargs)

        monkeypatch.setattr(serve, "generate", generate)
        torch.manual_seed(0)
        loaded = Loaded(GptConfig(), VOCAB, GPT(len(VOCAB), 1, 16, 32).eval(), 7, torch.device("cpu"))
        return serve.build_app(loaded, 64, 100, timeout_s=30, max_queue=4)
    return make


def test_a_broken_device_makes_health_and_generate_answer_503_with_cudas_words(app_with_generate):
    server, thread, url = serving(app_with_generate(RuntimeError(KERNEL_FAULT)))
    try:
        status, out = post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})
        assert status == 200 and out["tokens"] == 4
        status, out = post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})  # the generation that broke it
        assert status == 503 and "an illegal memory access" in out["detail"] and "restart it" in out["detail"]
        status, health = get(url + "/health")
        assert status == 503 and health["status"] == "device lost" and "an illegal memory access" in health["detail"]
        status, out = post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})  # refused before queueing
        assert status == 503 and "cannot generate again" in out["detail"]
        with pytest.raises(urllib.error.HTTPError) as refused:  # a stream is refused the same way
            stream(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})
        assert refused.value.code == 503 and "cannot generate again" in refused.value.read().decode()
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_streamed_generation_that_breaks_the_device_ends_with_an_error_event(app_with_generate):
    server, thread, url = serving(app_with_generate(RuntimeError(KERNEL_FAULT)))
    try:
        assert post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})[0] == 200
        _, events = stream(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})
        assert events and events[-1][0] == "error" and "an illegal memory access" in events[-1][1]["error"]
        assert get(url + "/health")[0] == 503
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_an_error_that_leaves_the_device_usable_is_that_requests_500_and_health_stays_ok(app_with_generate):
    server, thread, url = serving(app_with_generate(RuntimeError("a bug in one request's generation")))
    try:
        assert post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})[0] == 200
        request = urllib.request.Request(url + "/generate", data=b'{"prompt": "ab", "max_new_tokens": 4}',
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as failed:  # (its body is uvicorn's plain text)
            urllib.request.urlopen(request, timeout=30)
        assert failed.value.code == 500
        status, health = get(url + "/health")
        assert status == 200 and health["status"] == "ok" and health["served"] == 2
    finally:
        server.should_exit = True
        thread.join(timeout=10)
