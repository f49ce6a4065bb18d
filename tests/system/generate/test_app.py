"""The OpenAI-compatible server as a real uvicorn process on 127.0.0.1 (tiny model): the
official openai client streaming and not, continuous batching seen from outside, and every
fault answered with a specific 4xx or a clean stream end, the KV pool whole after each."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from llmkit import generate_server
from requires import requires
from scalelab.layers.web.spawn import Spawned

openai = requires("openai")

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    log = tmp_path_factory.mktemp("gen") / "server.log"
    with generate_server(log, "--max-num-seqs", "2", "--max-waiting", "2", "--max-model-len",
                         "1200", "--max-output-tokens", "1100", "--kv-cache-bytes", "4MiB",
                         "--block-size", "8", "--request-timeout", "30",
                         "--max-body", "64KiB") as s:
        yield s


def pool(server: Spawned) -> dict[str, object]:
    return dict(httpx.get(server.url + "/v1/debug/pool", timeout=10).json())


def assert_pool_whole(server: Spawned) -> None:
    """The engine drops an aborted request before its next step; poll until it has."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 15:
        p = pool(server)
        if p["whole"] and p["outstanding"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"KV pool not whole again: {pool(server)}")


def client(server: Spawned) -> object:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_completions_and_chat(server: Spawned) -> None:
    c = client(server)
    r = c.completions.create(model=MODEL, prompt="hello", max_tokens=7, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens == 5
    assert r.choices[0].finish_reason == "length"
    again = c.completions.create(model=MODEL, prompt="hello", max_tokens=7, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert again.choices[0].text == r.choices[0].text  # greedy is deterministic
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 5
    models = c.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert_pool_whole(server)


def test_openai_client_streams_the_same_text(server: Spawned) -> None:
    c = client(server)
    whole = c.completions.create(model=MODEL, prompt="stream me", max_tokens=12, temperature=0,
                                 extra_body={"ignore_eos": True})
    chunks = list(c.completions.create(model=MODEL, prompt="stream me", max_tokens=12,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    chat = list(c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0,
        stream=True, extra_body={"ignore_eos": True}))
    assert chat[0].choices[0].delta.role == "assistant"
    assert chat[-1].choices[0].finish_reason == "length"
    # The raw stream: SSE data lines, then [DONE]; no usage unless asked (OpenAI's stream).
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": "x", "max_tokens": 3, "stream": True,
            "ignore_eos": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines)
    assert lines[-1] == "data: [DONE]"
    docs = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all("usage" not in d for d in docs)
    assert docs[-1]["choices"][0]["finish_reason"] == "length"
    assert_pool_whole(server)


def test_late_short_request_finishes_first_through_the_server(server: Spawned) -> None:
    body = {"model": MODEL, "temperature": 0, "ignore_eos": True, "stream": True}
    order: list[str] = []

    def run(name: str, prompt: str, n: int, started: cf.Future[None] | None) -> None:
        with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                          json={**body, "prompt": prompt, "max_tokens": n}) as r:
            for ln in r.iter_lines():
                if started is not None and not started.done():
                    started.set_result(None)
                if ln == "data: [DONE]":
                    order.append(name)

    with cf.ThreadPoolExecutor(2) as pool_:
        started: cf.Future[None] = cf.Future()
        long = pool_.submit(run, "long", "a long one", 300, started)
        started.result(timeout=60)  # the long request is decoding
        short = pool_.submit(run, "short", "short", 4, None)
        short.result(timeout=60)
        long.result(timeout=60)
    assert order == ["short", "long"]
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert "vllm:time_to_first_token_seconds_bucket" in metrics
    assert "vllm:kv_cache_usage_perc" in metrics
    assert_pool_whole(server)


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        ({"model": "gpt-4", "prompt": "x"}, 404, "does not exist"),
        ({"model": MODEL, "prompt": "x", "max_tokens": "7"}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 5000}, 400, "max_output_tokens=1100"),
        ({"model": MODEL, "prompt": "y" * 1300}, 400, "max_prompt_tokens is 1199"),
        ({"model": MODEL, "prompt": 5}, 400, "prompt"),
        ({"model": MODEL, "prompt": "x", "temperature": 9}, 400, "temperature"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "prompt": "x" * 70_000}, 413, "limit"),
    ],
)
def test_bad_requests_get_specific_4xx(server: Spawned, body: object, status: int,
                                       needle: str) -> None:
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else (
        "/v1/completions")
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    assert_pool_whole(server)


def test_client_disconnect_mid_stream_frees_blocks(server: Spawned) -> None:
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": "go on", "max_tokens": 1000, "stream": True,
            "ignore_eos": True}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 5:
                break  # leaving the block closes the connection mid-stream
    assert_pool_whole(server)
    # A non-streaming client that gives up early is aborted too.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", timeout=0.3, json={
            "model": MODEL, "prompt": "go on", "max_tokens": 1000, "ignore_eos": True})
    assert_pool_whole(server)


def test_deadline_ends_a_request_with_504(server: Spawned) -> None:
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "x", "max_tokens": 1100, "ignore_eos": True, "timeout": 0.2})
    assert r.status_code == 504 and "deadline" in r.json()["error"]["message"]
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "x", "max_tokens": 1100, "ignore_eos": True,
            "timeout": 0.2, "stream": True}) as s:
        lines = [ln for ln in s.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["error"]["type"] == "timeout"
    assert_pool_whole(server)


def test_burst_over_capacity_answers_every_request_2xx_or_429(server: Spawned) -> None:
    def one(i: int) -> httpx.Response:
        return httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": f"burst {i}", "max_tokens": 20, "ignore_eos": True})

    with cf.ThreadPoolExecutor(16) as ex:
        answers = list(ex.map(one, range(16)))
    codes = [r.status_code for r in answers]
    assert len(codes) == 16 and set(codes) <= {200, 429}
    assert codes.count(429) > 0 and codes.count(200) >= 4  # 2 running + 2 waiting admitted
    assert all(r.headers["retry-after"] == "1" for r in answers if r.status_code == 429)
    assert all(r.json()["usage"]["completion_tokens"] == 20 for r in answers
               if r.status_code == 200)
    assert_pool_whole(server)
