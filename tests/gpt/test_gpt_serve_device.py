"""The GPT server after its device broke: a generation that raised CUDA's context-breaking error (a kernel
fault; every later call on the device fails the same way until the process restarts) left /health saying
"ok" and every later request a 500, so nothing that probes the server knew to restart it. Now /health and
/generate answer 503 naming the error; an error that leaves the device usable stays that request's 500."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import trainers.gpt.serve as serve  # noqa: E402
from conftest import free_port, serving_in_thread  # noqa: E402
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


def post_status(url: str, body: dict) -> int:
    """The HTTP status of POST /generate (a 500's body is uvicorn's plain text, not JSON)."""
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


CALLS: list[int] = []  # the generations started (the app's generate), per test


@pytest.fixture
def app_with_generate(monkeypatch):
    """The real app on a tiny untrained GPT; after a first request that generates normally, each generation
    yields `after` characters, then raises `error`."""
    CALLS.clear()

    def make(error: Exception, after: int = 0):
        real = serve.generate

        def generate(*args, **kwargs):
            CALLS.append(1)
            for i, token in enumerate(real(*args, **kwargs)):
                if len(CALLS) > 1 and i == after:
                    raise error
                yield token

        monkeypatch.setattr(serve, "generate", generate)
        torch.manual_seed(0)
        loaded = Loaded(GptConfig(), VOCAB, GPT(len(VOCAB), 1, 16, 32).eval(), 7, torch.device("cpu"))
        return serve.build_app(loaded, 64, 100, timeout_s=30, max_queue=4)
    return make


def test_a_broken_device_makes_health_and_generate_answer_503_with_cudas_words(app_with_generate):
    with serving_in_thread(app_with_generate(RuntimeError(KERNEL_FAULT))) as url:
        status, out = post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})
        assert status == 200 and out["tokens"] == 4
        status, out = post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})  # the generation that broke it
        assert status == 503 and "an illegal memory access" in out["detail"] and "restart it" in out["detail"]
        status, health = get(url + "/health")
        assert status == 503 and health["status"] == "device lost" and "an illegal memory access" in health["detail"]
        assert (health["served"], health["failed"]) == (1, 1)  # the generation that broke it is no answer
        status, out = post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})
        assert status == 503 and "cannot generate again" in out["detail"] and len(CALLS) == 2
        health = get(url + "/health")[1]
        assert (health["served"], health["failed"]) == (1, 1)  # refused before queueing: the worker never saw it
        with pytest.raises(urllib.error.HTTPError) as refused:  # a stream is refused the same way
            stream(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})
        assert refused.value.code == 503 and "cannot generate again" in refused.value.read().decode()


def test_a_streamed_generation_that_breaks_the_device_ends_with_an_error_event(app_with_generate):
    with serving_in_thread(app_with_generate(RuntimeError(KERNEL_FAULT), after=2)) as url:
        assert post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})[0] == 200
        _, events = stream(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})
        assert [name for name, _ in events] == ["message", "message", "error"]  # 2 characters, then the error
        assert "an illegal memory access" in events[-1][1]["error"]
        assert get(url + "/health")[0] == 503


def test_an_error_that_leaves_the_device_usable_is_that_requests_500_and_health_stays_ok(app_with_generate):
    with serving_in_thread(app_with_generate(RuntimeError("a bug in one request's generation"))) as url:
        assert post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})[0] == 200
        assert post_status(url, {"prompt": "ab", "max_new_tokens": 4}) == 500
        status, health = get(url + "/health")
        assert status == 200 and health["status"] == "ok" and (health["served"], health["failed"]) == (1, 1)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   ValueError("a bug in one request's generation")], ids=["out-of-memory", "other"])
def test_a_stream_that_fails_otherwise_ends_with_an_error_event_and_the_server_stays_healthy(app_with_generate,
                                                                                            error):
    """Out of memory leaves the device usable (not a broken context); any failure after the stream's 200 is
    told in an error event (the stream used to break off without one)."""
    with serving_in_thread(app_with_generate(error, after=1)) as url:
        assert post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})[0] == 200
        _, events = stream(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})
        assert [name for name, _ in events] == ["message", "error"]
        assert events[-1][1]["error"].startswith(type(error).__name__) and "restart" not in events[-1][1]["error"]
        status, health = get(url + "/health")
        assert status == 200 and health["status"] == "ok"
        assert post_status(url, {"prompt": "ab", "max_new_tokens": 4}) == 500  # its own error again, no 503


def test_the_server_stops_after_the_device_broke_and_exits_1_naming_the_error(app_with_generate, monkeypatch, tmp_path,
                                                                             capsys):
    """`trainers gpt serve`: a server that can never generate again, answering 503 forever, is restarted only where
    something probes /health; under `docker run --restart on-failure` or systemd it must exit. It finishes the
    answer in flight (the 503 of the generation that broke the device), then exits 1 with one line naming it."""
    from trainers.cli import main

    app_with_generate(RuntimeError(KERNEL_FAULT))  # (patches serve.generate)
    torch.manual_seed(0)
    loaded = Loaded(GptConfig(), VOCAB, GPT(len(VOCAB), 1, 16, 32).eval(), 7, torch.device("cpu"))
    monkeypatch.setattr(serve, "load_for_inference", lambda *_a, **_k: loaded)
    port = free_port()
    codes = []
    thread = threading.Thread(target=lambda: codes.append(main(["gpt", "serve", "--run-dir", str(tmp_path),
                                                                "--port", str(port)])), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            assert get(url + "/health")[0] == 200
            break
        except OSError:
            assert time.monotonic() < deadline and thread.is_alive(), "server did not come up"
            time.sleep(0.05)
    assert post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})[0] == 200
    status, out = post(url + "/generate", {"prompt": "ab", "max_new_tokens": 4})
    assert status == 503 and "an illegal memory access" in out["detail"]
    thread.join(timeout=20)
    assert not thread.is_alive() and codes == [1]
    err = capsys.readouterr().err
    assert "the device broke (CUDA error: an illegal memory access was encountered)" in err and "Traceback" not in err
