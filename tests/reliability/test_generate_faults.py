"""The generation server's failure matrix (issue 35), each case ending with the KV pool whole
again: every block free, ref counts and the prefix cache consistent, no request outstanding,
live, running or waiting, and the server still answering correctly.

1. 200 clients that open an SSE stream and drop the connection (before the first chunk, after
   one, after a few; completions and chat; shared prompt prefixes so the prefix cache is in play).
2. A KV pool too small for the batch: more concurrent sequences than its blocks can hold. The
   scheduler preempts and recomputes; every request completes with the exact greedy answer; a
   request that can never fit is a 400 that names the pool.

Bounded (a few seconds each on two cores); SCALELAB_LONG=1 runs 2,000 disconnects.
"""

from __future__ import annotations

import concurrent.futures as cf
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from generate_server import (
    MODEL,
    STREAM_USAGE,
    TOK,
    assert_pool_whole,
    complete,
    generate_server,
    greedy_text,
    pool,
    stream_text,
)
from serve_helpers import LONG

from scalelab.layers.web.spawn import Spawned

pytestmark = pytest.mark.reliability

DISCONNECTS = 2_000 if LONG else 200
CLIENTS = 8
MAX_LEN = 256


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    """8 running + 64 waiting; 40 blocks of 8 tokens, so eight long streams outgrow the pool
    and the disconnects also land on preempted (waiting) sequences."""
    log = tmp_path_factory.mktemp("gen-faults") / "server.log"
    with generate_server(log, "--max-num-seqs", "8", "--max-waiting", "64",
                         "--block-size", "8", "--kv-cache-bytes", str(40 * 8 * 512),
                         "--max-output-tokens", "200", "--request-timeout", "60",
                         max_model_len=MAX_LEN) as s:
        yield s


def _prompt(i: int) -> list[int]:
    # three families share a 24-token prefix (3 full blocks): prefix-cache hits and evictions
    return TOK.encode(f"system prompt number {i % 3} of three. " + f"user {i}: go on")


def _drop_after(url: str, i: int) -> int:
    """Client i opens a stream and drops the connection: i % 4 == 0 closes the socket right
    after sending the request (before any response byte), the others after reading
    i % 4 (1..3) data events. Returns the events read."""
    body = {"model": MODEL, "max_tokens": 200, "ignore_eos": True, "stream": True}
    if i % 2:
        route, body = "/v1/completions", {**body, "prompt": _prompt(i)}
    else:
        route, body = "/v1/chat/completions", {
            **body, "messages": [{"role": "user", "content": f"drop {i}"}]}
    if i % 4 == 0:
        u = urlsplit(url)
        raw = httpx.Request("POST", url + route, json=body)
        head = (f"POST {route} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(raw.content)}\r\n\r\n").encode()
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            s.sendall(head + raw.content)
        return 0
    read = 0
    with httpx.stream("POST", url + route, json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                assert line != "data: [DONE]", f"client {i}: the stream ended before the drop"
                read += 1
                if read == i % 4:
                    break  # leaving the block closes the connection mid-stream
    return read


def test_200_client_disconnects_mid_stream_leave_the_pool_whole(roomy: Spawned) -> None:
    before = pool(roomy.url)
    with cf.ThreadPoolExecutor(CLIENTS) as ex:
        read = list(ex.map(lambda i: _drop_after(roomy.url, i), range(DISCONNECTS)))
    assert read == [i % 4 for i in range(DISCONNECTS)]
    after = assert_pool_whole(roomy.url)
    assert after["num_blocks"] == before["num_blocks"] == 40
    assert after["cached_blocks"] > 0  # the shared prefixes were cached, and stay consistent

    # still correct afterwards: a prefix-cache hit and a cold prompt, whole and streamed
    for prompt in (_prompt(1), TOK.encode("a fresh prompt after the storm")):
        want = greedy_text(prompt, 30, MAX_LEN)
        r = complete(roomy.url, prompt, 30)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
        with httpx.stream("POST", roomy.url + "/v1/completions", timeout=60, json={
                "model": MODEL, "prompt": prompt, "max_tokens": 30, "temperature": 0,
                "ignore_eos": True, **STREAM_USAGE}) as s:
            text, use = stream_text([ln for ln in s.iter_lines() if ln])
        assert text == want and use["completion_tokens"] == 30
    assert_pool_whole(roomy.url)
    assert roomy.proc.poll() is None


@pytest.fixture(scope="module")
def cramped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    """8 blocks of 8 tokens (64 token slots) for up to 6 running sequences of ~40 tokens."""
    log = tmp_path_factory.mktemp("gen-cramped") / "server.log"
    with generate_server(log, "--max-num-seqs", "6", "--max-waiting", "16",
                         "--block-size", "8", "--kv-cache-bytes", str(8 * 8 * 512),
                         "--max-output-tokens", "100", "--request-timeout", "60",
                         "--no-prefix-cache", max_model_len=128) as s:
        yield s


def test_kv_pool_too_small_for_the_batch_preempts_and_answers_every_request(
        cramped: Spawned) -> None:
    assert pool(cramped.url)["num_blocks"] == 8
    prompts = [TOK.encode(f"request {i} wants room") for i in range(12)]
    n = 24  # ~44 tokens each = 6 blocks: two fit at once, twelve arrive together

    def one(i: int) -> tuple[int, str]:
        if i % 2:
            r = complete(cramped.url, prompts[i], n)
            return r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else ""
        with httpx.stream("POST", cramped.url + "/v1/completions", timeout=60, json={
                "model": MODEL, "prompt": prompts[i], "max_tokens": n, "temperature": 0,
                "ignore_eos": True, **STREAM_USAGE}) as s:
            return s.status_code, stream_text([ln for ln in s.iter_lines() if ln])[0]

    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        answers = list(ex.map(one, range(len(prompts))))
    assert [code for code, _ in answers] == [200] * len(prompts)
    assert [text for _, text in answers] == [greedy_text(p, n, 128) for p in prompts]
    p = assert_pool_whole(cramped.url)
    assert p["preemptions"] > 0  # the pool really was too small for the batch

    # one request that could never fit, even alone: a 400 naming the pool, nothing taken
    r = complete(cramped.url, TOK.encode("too big"), 90)
    assert r.status_code == 400
    err = r.json()["error"]
    assert "whole pool (64 tokens)" in err["message"] and "lower max_tokens" in err["message"]
    assert err["code"] == "context_length_exceeded"
    assert_pool_whole(cramped.url)
    assert cramped.proc.poll() is None
