"""A real tabular server with tracing on: one request, one trace, the expected spans and links.

The server runs under uvicorn on 127.0.0.1 in a thread (tests/layers/web/inproc.py), so its
tracer is flushed directly once a response is in."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "system" / "serve"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from inproc import serving
from serve_fixtures import add_model, infer_body

from scalelab.layers.observe.traces import assemble, read_spans
from scalelab.layers.web.trace import TraceConfig
from scalelab.system.serve.app import ServeApp
from scalelab.system.serve.context import ServeContext
from scalelab.system.serve.settings import ServerSettings

CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
SPANS = ["infer", "admission", "queue wait", "batch formation", "thread hand-off",
         "model compute", "wake-up", "post-processing"]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServeContext, Path]]:
    root = tmp_path_factory.mktemp("trace-repo")
    add_model(root, "flights", {1: 1})
    out = root.parent / "spans.jsonl"
    # sample 0: only requests whose client sent a sampled traceparent are traced
    ctx = ServeContext.build(ServerSettings(model_repo=root, access_log="off",
                                            trace=TraceConfig(sample=0.0, out=str(out))))
    switch = sys.getswitchinterval()
    try:
        with serving(ServeApp(ctx)) as url:
            yield url, ctx, out
    finally:  # the server's lifespan tunes these for a server process, not a test run
        sys.setswitchinterval(switch)
        gc.unfreeze()


def test_client_trace_through_the_tabular_server(
        traced: tuple[str, ServeContext, Path]) -> None:
    base, ctx, out = traced
    url = f"{base}/v2/models/flights/infer"
    untraced = httpx.post(url, json=infer_body(1, seed=1))
    assert untraced.status_code == 200 and "traceparent" not in untraced.headers
    r = httpx.post(url, json=infer_body(3, seed=2),
                   headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert r.status_code == 200
    assert ctx.tracing is not None
    ctx.tracing.flush()
    traces = assemble(read_spans([out]))
    # sampling 0: the request without a traceparent left no span
    assert [t.trace_id for t in traces] == [CLIENT_TRACE]
    (t,) = traces
    by = {s.name: s for s in t.spans}
    assert sorted(by) == sorted(SPANS) and len(t.spans) == len(SPANS)
    root = by["infer"]
    assert root.parent_id == CLIENT_SPAN and root.service == "scalelab-serve"
    assert all(s.parent_id == root.span_id for s in t.spans if s is not root)
    # the response names the server's span as the parent of whatever the client does next
    assert r.headers["traceparent"] == f"00-{CLIENT_TRACE}-{root.span_id}-01"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["scalelab.model.version"] == 1
    compute = by["model compute"].attributes
    assert (compute["scalelab.model"], compute["scalelab.batch.size"]) == ("flights", 3)
    assert compute["scalelab.batch.requests"] == 1
    order = SPANS[1:]
    starts = [by[n].start_ns for n in order]
    assert starts == sorted(starts)
    assert root.start_ns <= starts[0] and by["post-processing"].end_ns <= root.end_ns
