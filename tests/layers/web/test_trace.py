"""web.trace and web.traceparent: the sampler honours a client's traceparent, sample 0 records
nothing, spans nest under the request, and the JSON Lines exporter round-trips through
observe.traces."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.observe.traces import assemble, read_spans
from scalelab.layers.web import traceparent
from scalelab.layers.web.trace import TraceConfig, Tracing

CLIENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
T0 = 1_700_000_000_000_000_000


def tracing(sample: float) -> tuple[Tracing, InMemorySpanExporter]:
    mem = InMemorySpanExporter()
    return Tracing(TraceConfig(sample=sample, out="unused.jsonl"), "svc", exporter=mem), mem


def headers(tp: str | None) -> list[tuple[bytes, bytes]]:
    base = [(b"host", b"x"), (b"content-type", b"application/json")]
    return base if tp is None else [*base, (b"traceparent", tp.encode())]


def test_one_request_one_trace_with_parent_links() -> None:
    tr, mem = tracing(1.0)
    rt = tr.begin("infer", headers(None), T0)
    assert rt is not None
    rt.span("queue wait", T0 + 10, T0 + 50, {"k": 1})
    rt.span("model compute", T0 + 50, T0 + 90)
    rt.end(200, T0 + 100)
    spans = mem.get_finished_spans()
    assert [s.name for s in spans] == ["queue wait", "model compute", "infer"]
    root = spans[-1]
    assert root.parent is None and root.attributes["http.response.status_code"] == 200
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    assert [s.parent.span_id for s in spans[:2]] == [root.context.span_id] * 2
    assert (spans[0].start_time, spans[0].end_time) == (T0 + 10, T0 + 50)
    assert rt.traceparent() == f"00-{rt.trace_id}-{rt.span_id}-01"


def test_a_client_traceparent_is_honoured_at_sample_zero() -> None:
    tr, mem = tracing(0.0)
    assert tr.begin("infer", headers(None), T0) is None
    rt = tr.begin("infer", headers(CLIENT), T0)
    assert rt is not None
    rt.end(200, T0 + 5)
    (root,) = mem.get_finished_spans()
    assert format(root.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert format(root.parent.span_id, "016x") == "b7ad6b7169203331"


def test_sampling_zero_creates_no_spans_and_unsampled_parents_are_followed() -> None:
    tr, mem = tracing(0.0)
    for _ in range(50):
        assert tr.begin("infer", headers(None), T0) is None
    tr1, mem1 = tracing(1.0)
    assert tr1.begin("infer", headers(CLIENT[:-2] + "00"), T0) is None  # client said no
    assert tr1.begin("infer", headers("garbage"), T0) is not None  # malformed: a new trace
    assert tr.begin("infer", headers("garbage"), T0) is None  # ... drawn at the sample rate
    assert mem.get_finished_spans() == () and mem1.get_finished_spans() == ()


def test_roots_are_drawn_at_the_sample_rate() -> None:
    tr, _ = tracing(0.5)
    n = sum(tr.begin("infer", headers(None), T0) is not None for _ in range(400))
    assert 120 < n < 280  # binomial(400, 0.5): 8 standard deviations either side
    tr1, _ = tracing(1.0)
    assert all(tr1.begin("infer", headers(None), T0) is not None for _ in range(50))


def test_a_5xx_marks_the_root_as_an_error() -> None:
    tr, mem = tracing(1.0)
    rt = tr.begin("infer", [], T0)
    assert rt is not None
    rt.end(503, T0 + 1)
    assert mem.get_finished_spans()[0].status.status_code.name == "ERROR"


def test_config_checks() -> None:
    assert not TraceConfig().enabled
    assert TraceConfig(out="t.jsonl").enabled  # sample 0: follow clients only
    assert Tracing.build(TraceConfig(), "svc") is None
    with pytest.raises(BadUsageError, match=r"--trace-sample 1.5 must lie in \[0, 1\]"):
        TraceConfig(sample=1.5, out="t.jsonl")
    with pytest.raises(BadUsageError, match=r"--trace-out FILE\.jsonl or --otlp-endpoint"):
        TraceConfig(sample=0.1)
    with pytest.raises(BadUsageError, match="must be an http"):
        TraceConfig(otlp_endpoint="localhost:4318")
    assert TraceConfig.of({"sample": 0.5, "out": "x"}) == TraceConfig(sample=0.5, out="x")


def test_jsonl_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "spans" / "s.jsonl"
    tr = Tracing(TraceConfig(sample=1.0, out=str(out)), "scalelab-test")
    rt = tr.begin("infer", headers(CLIENT), T0, attributes={"scalelab.model": "m"})
    assert rt is not None
    rt.span("queue wait", T0 + 1000, T0 + 3000, {"scalelab.batch.size": 4})
    child = rt.start("generate", client=True, start_ns=T0 + 3000)
    assert rt.traceparent(child).split("-")[1] == rt.trace_id
    child.end(end_time=T0 + 4000)
    rt.end(200, T0 + 5000)
    tr.shutdown()  # flushes the batch processor
    (t,) = assemble(read_spans([out]))
    assert t.trace_id == "0af7651916cd43dd8448eb211c80319c" and t.duration_ns == 5000
    by = {s.name: s for s in t.spans}
    assert set(by) == {"infer", "queue wait", "generate"}
    assert by["infer"].parent_id == "b7ad6b7169203331" and by["infer"].service == "scalelab-test"
    assert by["queue wait"].parent_id == by["infer"].span_id
    assert by["queue wait"].attributes == {"scalelab.batch.size": 4}
    assert by["infer"].attributes["scalelab.model"] == "m"


def test_traceparent_helpers() -> None:
    p = traceparent.parse(CLIENT)
    assert p is not None and p.sampled and p.header() == CLIENT
    assert traceparent.parse("00-" + "0" * 32 + "-b7ad6b7169203331-01") is None
    assert traceparent.parse("ff" + CLIENT[2:]) is None
    assert traceparent.parse(CLIENT.upper()) is None
    f = traceparent.fresh()
    assert traceparent.parse(f.header()) == f
    req = b"POST /x HTTP/1.1\r\nhost: a\r\n\r\n{}"
    assert traceparent.with_header(req, CLIENT) == (
        b"POST /x HTTP/1.1\r\ntraceparent: " + CLIENT.encode() + b"\r\nhost: a\r\n\r\n{}")


def test_otlp_http_export_reaches_a_collector() -> None:
    """--otlp-endpoint: spans leave as OTLP/HTTP protobuf (a stand-in collector on 127.0.0.1
    decodes them with the OTLP proto package)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from typing import Any, ClassVar

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    class Collector(BaseHTTPRequestHandler):
        got: ClassVar[list[tuple[str, str, bytes]]] = []

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            Collector.got.append((self.path, self.headers["content-type"], body))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/v1/traces"
        tr = Tracing(TraceConfig(sample=1.0, otlp_endpoint=url), "scalelab-otlp")
        rt = tr.begin("infer", headers(CLIENT), T0)
        assert rt is not None
        rt.span("model compute", T0 + 10, T0 + 20)
        rt.end(200, T0 + 30)
        tr.shutdown()
    finally:
        srv.shutdown()
        srv.server_close()
    (path, ctype, body), *_ = Collector.got
    assert path == "/v1/traces" and ctype == "application/x-protobuf"
    req = ExportTraceServiceRequest.FromString(body)
    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sorted(s.name for s in spans) == ["infer", "model compute"]
    assert {s.trace_id.hex() for s in spans} == {"0af7651916cd43dd8448eb211c80319c"}
    svc = {a.key: a.value.string_value for a in req.resource_spans[0].resource.attributes}
    assert svc["service.name"] == "scalelab-otlp"


def test_trace_settings_survive_the_json_hop_to_workers(tmp_path: Path) -> None:
    """Servers pass their settings to uvicorn workers as JSON: the trace config comes back."""
    import dataclasses
    import json

    from scalelab.system.generate.app import ApiSettings
    from scalelab.system.retrieval.settings import RetrievalServerSettings
    from scalelab.system.serve.settings import ServerSettings

    cfg = TraceConfig(sample=0.25, out=str(tmp_path / "s.jsonl"))
    s = ServerSettings(model_repo=tmp_path, trace=cfg)
    assert ServerSettings.from_json(s.to_json()).trace == cfg
    assert ApiSettings.from_json(ApiSettings(model="tiny", trace=cfg).to_json()).trace == cfg
    r = RetrievalServerSettings(index_dir=str(tmp_path), trace=cfg)
    assert RetrievalServerSettings(**json.loads(json.dumps(dataclasses.asdict(r)))).trace == cfg
