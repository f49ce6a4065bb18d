"""Tiny HTTP/1.1 test servers for the load tests, run as a subprocess on 127.0.0.1.

    python tests/lab/load/servers.py KIND [--service-ms MS] [--period-s S] [--stall-s S]

prints "PORT <n>" once listening. Kinds:
  fast    answer at once (generator-bound tests, the benchmark's trivial endpoint)
  fixed   answer after exactly --service-ms, any number in parallel (infinite servers)
  queue   one server, FIFO, deterministic --service-ms: capacity is exactly 1000/service-ms
          requests/s (a virtual clock, so timer jitter does not accumulate)
  stall   like fixed, but every --period-s the server freezes for --stall-s: anything that
          arrives in a freeze is answered when it ends
  admit   like fixed, but at most --limit requests in service: one arriving above that is
          answered 503 at once (an admission limit; accepted requests stay fast). With Poisson
          arrivals the refused share is Erlang B(limit, rate × service)
Any kind also serves GET /status/<code> (that status), GET /reset (drops the connection),
GET /v2/models/<m> (OIP metadata: INT64 [-1,4] "categorical", FP32 [-1,14] "numeric"),
POST /v2/models/<m>/infer (checks the OIP body, answers with a label per row) and GET /metrics
(the responses answered so far, as the reference server's `scalelab_responses_total`).
GET /truth gives the server's own times of every request whose path carries `?i=<index>`:
{"index": [...], "arrival_s": [...], "done_s": [...]} (time.monotonic, the clock the load
tester reads too), from its reading of the request to the write of its answer as it happened (a
late timer included), so a test can hold the tester's latencies to what the server really did.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

_META = {"name": "m", "versions": ["1"], "platform": "test",
         "inputs": [{"name": "categorical", "datatype": "INT64", "shape": [-1, 4]},
                    {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}],
         "outputs": [{"name": "label", "datatype": "INT64", "shape": [-1]}]}


def _response(status: int, body: bytes, ctype: str = "text/plain") -> bytes:
    return (f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n"
            .encode() + body)


_OK = _response(200, b"ok")


class Server:
    def __init__(self, kind: str, service_s: float, period_s: float, stall_s: float,
                 limit: int = 0) -> None:
        self.kind = kind
        self.limit = limit
        self.in_service = 0
        self.service_s = service_s
        self.period_s = period_s
        self.stall_s = stall_s
        self.t0 = time.monotonic()
        self.last_done = 0.0
        self.served = 0
        self.truth: list[tuple[int, float, float]] = []  # (index, arrival, answer written)

    def answer_at(self, now: float) -> float:
        if self.kind == "fast":
            return now
        if self.kind == "queue":
            self.last_done = max(now, self.last_done) + self.service_s
            return self.last_done
        done = now + self.service_s
        if self.kind == "stall":
            # Freezes occupy [k*period + period/2, ... + stall) after start.
            phase = (done - self.t0 - self.period_s / 2) % self.period_s
            if phase < self.stall_s:
                done += self.stall_s - phase
        return done


class Handler(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            n = 0
            i = head.find(b"content-length:")
            if i >= 0:
                j = head.find(b"\r\n", i)
                n = int(head[i + 15: j if j >= 0 else None])
            if len(self.buf) < end + 4 + n:
                return
            body = bytes(self.buf[end + 4: end + 4 + n])
            del self.buf[: end + 4 + n]
            method, path = head.split(b" ", 2)[:2]
            self.handle(method, path.decode(), body)

    def handle(self, method: bytes, path: str, body: bytes) -> None:
        assert self.transport is not None
        if path == "/reset":
            self.transport.abort()
            return
        resp = _OK
        if path == "/truth":
            idx, arr, done = (list(x) for x in zip(*self.server.truth, strict=True)) \
                if self.server.truth else ([], [], [])
            self.transport.write(_response(200, json.dumps(
                {"index": idx, "arrival_s": arr, "done_s": done}).encode(), "application/json"))
            return
        if path == "/metrics":
            text = f'scalelab_responses_total{{status="200"}} {self.server.served}\n'
            self.transport.write(_response(200, text.encode()))
            return
        self.server.served += 1
        if path.startswith("/status/"):
            resp = _response(int(path.rsplit("/", 1)[1]), b"status")
        elif path.startswith("/v2/models/") and method == b"get":
            resp = _response(200, json.dumps(_META).encode(), "application/json")
        elif path.startswith("/v2/models/") and path.endswith("/infer"):
            try:
                req = json.loads(body)
                rows = {t["name"]: t["shape"][0] for t in req["inputs"]}
                assert set(rows) == {"categorical", "numeric"}, rows
                for t in req["inputs"]:
                    assert len(t["data"]) == t["shape"][0] * t["shape"][1]
                out = {"model_name": "m", "outputs": [
                    {"name": "label", "datatype": "INT64", "shape": [rows["numeric"]],
                     "data": [0] * rows["numeric"]}]}
                resp = _response(200, json.dumps(out).encode(), "application/json")
            except (ValueError, KeyError, AssertionError, TypeError) as e:
                resp = _response(400, json.dumps({"error": repr(e)}).encode())
        if self.server.kind == "admit":
            if self.server.in_service >= self.server.limit:
                self.transport.write(_response(503, b"busy"))
                return
            self.server.in_service += 1
        now = time.monotonic()
        index = int(path.split("?i=", 1)[1]) if "?i=" in path else None
        when = self.server.answer_at(now)
        if when <= now:
            self._write(resp, index, now)
        else:
            self.loop.call_at(self.loop.time() + (when - now), self._write, resp, index, now)

    def _write(self, resp: bytes, index: int | None = None, arrival: float = 0.0) -> None:
        if self.server.kind == "admit":
            self.server.in_service -= 1
        if self.transport is not None and not self.transport.is_closing():
            # Read before the write: the tester cannot receive the answer earlier than this.
            t = time.monotonic()
            self.transport.write(resp)
            if index is not None:
                self.server.truth.append((index, arrival, t))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["fast", "fixed", "queue", "stall", "admit"])
    ap.add_argument("--service-ms", type=float, default=20.0)
    ap.add_argument("--period-s", type=float, default=4.0)
    ap.add_argument("--stall-s", type=float, default=1.0)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    srv = Server(a.kind, a.service_ms / 1e3, a.period_s, a.stall_s, a.limit)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Handler(srv), "127.0.0.1", a.port, backlog=4096)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
