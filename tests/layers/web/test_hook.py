"""The shared request hook's pieces: the in-flight bound, tracing off (no tracer, no header, no
span), and a request made without a socket."""

from __future__ import annotations

import asyncio

import pytest
from starlette.responses import JSONResponse

from scalelab.layers.web.hook import Hook, Inflight, local_request
from scalelab.layers.web.trace import TraceConfig


def test_inflight_admits_exactly_its_limit() -> None:
    bound = Inflight(3)
    assert not bound.full(3) and bound.full(4)
    bound.enter(2)
    assert (bound.count, bound.full(), bound.full(2)) == (2, False, True)
    bound.enter()
    assert bound.full()
    bound.leave(3)
    assert bound.count == 0
    with pytest.raises(ValueError, match="admits nothing"):
        Inflight(0)


def test_tracing_off_records_nothing_and_adds_no_header() -> None:
    hook = Hook(TraceConfig(), "svc")
    assert hook.tracing is None
    req = local_request("POST", "/x", json_body={})
    assert hook.begin(req, "POST /x", 0.0) is None and Hook.of(req) is None
    resp = JSONResponse({"ok": True})
    assert Hook.end(None, resp) is resp and "traceparent" not in resp.headers
    Hook.child(None, "phase", 0.0, 1.0)  # a no-op, not an error
    with Hook.call(None, "downstream") as call:
        call.status(200)
        assert call.headers == {}
    hook.shutdown()


def test_local_request_delivers_the_body_once_then_stays_connected() -> None:
    req = local_request("POST", "/v1/x?k=3", json_body={"a": [1, 2]},
                        headers={"Authorization": "Bearer t"})
    assert (req.method, req.url.path, req.query_params["k"]) == ("POST", "/v1/x", "3")
    assert req.headers["authorization"] == "Bearer t"
    assert req.headers["content-type"] == "application/json"

    async def read() -> tuple[object, bool]:
        body = await req.json()
        nxt = asyncio.ensure_future(req.receive())
        done, _ = await asyncio.wait({nxt}, timeout=0.05)  # no disconnect ever comes
        nxt.cancel()
        return body, bool(done)

    assert asyncio.run(read()) == ({"a": [1, 2]}, False)
    raw = local_request("POST", "/y", body=b"not json")
    assert asyncio.run(raw.body()) == b"not json"
    assert raw.headers["content-length"] == "8"
