"""The OTLP collector down (issue 35): a generative server tracing every request to an OTLP/HTTP
endpoint that is not listening, or that dies mid-run, answers exactly as before, and its export
queue never holds more than the configured bound (the SDK's BatchSpanProcessor drops the newest
spans once full; no request waits on the collector).

The server runs under uvicorn in a thread of this process, so the test can read the tracer's
queue while requests flow (a process would hide it); the traffic is real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from requires import requires

sys.path.insert(0, str(Path(__file__).parent))

from generate_server import TOK, assert_pool_whole, complete, greedy_text

from scalelab.layers.web.spawn import free_port
from scalelab.layers.web.trace import TraceConfig, Tracing

pytestmark = pytest.mark.reliability
requires("opentelemetry.exporter.otlp.proto.http")

MAX_QUEUE = 16
MAX_LEN = 256
PROMPTS = [TOK.encode(f"traced request {i}") for i in range(4)]


class Collector(BaseHTTPRequestHandler):
    """A stand-in OTLP/HTTP collector that counts the requests it accepted."""

    posts: ClassVar[int] = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        Collector.posts += 1
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def traced_server(endpoint: str) -> Iterator[tuple[str, Tracing, list[int]]]:
    """The generative server (tiny model) tracing every request to `endpoint`; yields its
    URL, its tracer and a list that counts every span handed to the export queue."""
    import uvicorn

    from scalelab.system.generate.app import ApiSettings, build_app, engine_from_settings, wrap

    settings = ApiSettings(model="tiny", engine={"max_model_len": MAX_LEN, "block_size": 8,
                                                 "kv_cache_bytes": 1 << 20, "max_num_seqs": 4},
                           trace=TraceConfig(sample=1.0, otlp_endpoint=endpoint,
                                             max_queue=MAX_QUEUE, flush_ms=20))
    inner = build_app(settings, engine_from_settings(settings))
    tracing: Tracing = inner.state.tracing
    seen = [0]
    on_end = tracing.processor.on_end

    def counting(span: Any) -> None:
        seen[0] += 1
        on_end(span)

    tracing.processor.on_end = counting  # type: ignore[method-assign]
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(wrap(inner, settings), host="127.0.0.1", port=port,
                                        log_config=None, access_log=False, lifespan="on"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", tracing, seen
    finally:
        srv.should_exit = True
        thread.join(timeout=60)
        assert not thread.is_alive(), "the server did not stop (a dead collector held it)"


def _burst(url: str, tracing: Tracing, n: int, peak: list[int]) -> None:
    """n requests from 4 clients, each answer exact; the queue's depth sampled meanwhile."""
    want = {i: greedy_text(p, 3, MAX_LEN) for i, p in enumerate(PROMPTS)}
    done = threading.Event()
    unread: list[float] = []  # an assert in the watcher's thread would fail unseen

    def watch() -> None:
        while not done.is_set():
            q = tracing.queued
            if q is None:
                unread.append(time.monotonic())
            else:
                peak[0] = max(peak[0], q)
            time.sleep(0.002)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    try:
        with cf.ThreadPoolExecutor(4) as ex:
            answers = list(ex.map(lambda i: complete(url, PROMPTS[i % 4], 3), range(n)))
    finally:
        done.set()
        w.join(timeout=10)
    assert not w.is_alive() and not unread, "the export queue's depth could not be read"
    assert [r.status_code for r in answers] == [200] * n
    assert [r.json()["choices"][0]["text"] for r in answers] == [want[i % 4] for i in range(n)]


def test_collector_not_listening_leaves_answers_alone_and_the_queue_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2")  # bounds each export's retries
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"  # nothing listens there
    peak = [0]
    with traced_server(dead) as (url, tracing, seen):
        _burst(url, tracing, 60, peak)
        assert seen[0] > 3 * MAX_QUEUE  # far more spans than the queue holds were made
        assert 0 < peak[0] <= MAX_QUEUE
        assert tracing.queued is not None and tracing.queued <= MAX_QUEUE
        assert_pool_whole(url)
        assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_collector_dying_mid_run_leaves_answers_alone_and_the_queue_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2")
    Collector.posts = 0
    col = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    col_thread = threading.Thread(target=col.serve_forever, daemon=True)
    col_thread.start()
    endpoint = f"http://127.0.0.1:{col.server_address[1]}/v1/traces"
    peak = [0]
    with traced_server(endpoint) as (url, tracing, seen):
        _burst(url, tracing, 20, peak)
        tracing.flush()
        assert Collector.posts > 0  # the collector was up and took spans
        col.shutdown()
        col.server_close()  # the collector dies: its port refuses connections from now on
        before = seen[0]
        _burst(url, tracing, 60, peak)
        assert seen[0] - before > 3 * MAX_QUEUE
        assert 0 < peak[0] <= MAX_QUEUE
        assert_pool_whole(url)
