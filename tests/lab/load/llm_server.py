"""A deterministic OpenAI-compatible streaming server for the LLM load tests (127.0.0.1).

    python tests/lab/load/llm_server.py [--ttft-ms MS] [--gap-ms MS] [--tokens-per-chunk K]
        [--max-streams M] [--stall-period-s S --stall-s S] [--drop-every N] [--diverge-at N]

prints "PORT <n>" once listening. POST /v1/chat/completions or /v1/completions with
"stream": true answers `max_tokens` (or `max_completion_tokens`) tokens (default 16) as SSE:
a role-only chunk at once (as vLLM sends one), then chunk j at exactly arrival + TTFT + j × gap
carrying K tokens (the last one fewer), the last with finish_reason "length", a usage chunk
when stream_options asks for it (in every chunk with continuous_usage_stats), then
`data: [DONE]`. Every send is scheduled at an absolute time, so timer jitter does not
accumulate along a stream. Each token is the text " t" (two characters), so a
character-proportional split is exact.

--max-streams M: at most M streams decode at once; the rest wait FIFO (a virtual clock: a
stream's start is max(arrival, the earliest slot's end)), so capacity is exactly
M / (TTFT + (chunks - 1) × gap) requests/s. --stall-*: every period the server freezes for
stall seconds (from period/2 on): any send due in a freeze goes out when it ends.
--drop-every N: every N-th request's connection is closed after half of its chunks.
--diverge-at N: deterministic text that changes with concurrency, for the greedy-agreement
probe: token t is " " + a letter fixed by the prompt (crc32) and t; when the chunk carrying
token N is sent while another stream is between its arrival and its last chunk, tokens N,
N+1, ... are upper-case instead. One request at a time never diverges (a client sends its
next request only after the last chunk of its previous one); overlapping streams diverge.
GET /v1/models lists one model "test-llm"; GET /health answers 200; GET /metrics gives
vllm:num_requests_running / _waiting and vllm:kv_cache_usage_perc (a pool of 2 × max-streams);
--no-metrics: none (an engine that publishes nothing, answered as any unknown path).
GET /truth gives the server's side of every stream that ended (arrival order): {"ttft_ms":
[...], "e2e_ms": [...]}, from its reading of the request to the writes of its first and last
token chunks as they happened (a late timer included), so a test can hold a client's
measurement to what the server really did: never less, and more only by the client's own lag.
It gives the same as absolute times too (time.monotonic, the load tester's clock), with each
stream's index where its prompt carries "i=<index>" (-1 elsewhere): "index", "arrival_s",
"first_s", "last_s", so a test that knows the schedule can time each stream from its due time.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import re
import time
import zlib


def _response(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n"
            .encode() + body)


_STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")


def _text(content: object) -> str:
    """A message's text: a string, or OpenAI's list of {"type": "text", "text": ...} parts."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: object) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


class Server:
    def __init__(self, a: argparse.Namespace) -> None:
        self.ttft = a.ttft_ms / 1e3
        self.gap = a.gap_ms / 1e3
        self.k = a.tokens_per_chunk
        self.period = a.stall_period_s
        self.stall = a.stall_s
        self.drop_every = a.drop_every
        self.diverge_at = a.diverge_at
        self.active = 0  # streams between their arrival and their last chunk (--diverge-at)
        self.slots = [0.0] * a.max_streams if a.max_streams else []
        self.max_streams = a.max_streams
        self.no_metrics = a.no_metrics
        self.t0 = time.monotonic()
        self.count = 0
        self.spans: list[tuple[float, float, float]] = []  # (arrival, start, end) per stream
        # (arrival, first token chunk written, last written, index) per stream that ended, for
        # GET /truth
        self.truth: list[tuple[float, float, float, int]] = []

    def unstall(self, t: float) -> float:
        if not self.stall:
            return t
        phase = (t - self.t0 - self.period / 2) % self.period
        return t + (self.stall - phase) if phase < self.stall else t

    def plan(self, arrival: float, n_chunks: int) -> float:
        """When this stream starts decoding (its slot, on the virtual clock)."""
        start = arrival
        if self.slots:
            start = max(arrival, heapq.heappop(self.slots))
        end = start + self.ttft + (n_chunks - 1) * self.gap
        if self.max_streams:
            heapq.heappush(self.slots, end)
        self.spans.append((arrival, start, end))
        return start

    def metrics(self, now: float) -> bytes:
        """vLLM's gauge names: streams decoding, streams waiting for a slot, KV usage."""
        self.spans = [x for x in self.spans if x[2] > now - 1.0]
        running = sum(1 for a, s, e in self.spans if s <= now < e)
        waiting = sum(1 for a, s, e in self.spans if a <= now < s)
        # A KV pool with room for twice the slots: the slots, not the memory, are the limit.
        usage = running / (2 * self.max_streams) if self.max_streams else 0.0
        return (f"# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="test-llm"}} {running}\n'
                f'vllm:num_requests_waiting{{model_name="test-llm"}} {waiting}\n'
                f'vllm:kv_cache_usage_perc{{model_name="test-llm"}} {usage}\n').encode()


class Handler(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.s = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.dead = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            method, path = lines[0].split(" ")[:2]
            n = 0
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                if k.strip().lower() == "content-length":
                    n = int(v.strip())
            if len(self.buf) < end + 4 + n:
                return
            body = bytes(self.buf[end + 4: end + 4 + n])
            del self.buf[: end + 4 + n]
            self.handle(method, path, body)

    def write(self, data: bytes) -> None:
        if not self.dead and self.transport is not None:
            self.transport.write(data)

    def handle(self, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path == "/health":
            self.write(_response(200, b"{}"))
            return
        if method == "GET" and path == "/metrics" and not self.s.no_metrics:
            self.write(_response(200, self.s.metrics(self.loop.time()), "text/plain"))
            return
        if method == "GET" and path == "/truth":
            ended = sorted(self.s.truth)
            self.write(_response(200, json.dumps(
                {"ttft_ms": [(f - a) * 1e3 for a, f, _, _ in ended],
                 "e2e_ms": [(e - a) * 1e3 for a, _, e, _ in ended],
                 "index": [i for *_, i in ended], "arrival_s": [a for a, *_ in ended],
                 "first_s": [f for _, f, _, _ in ended],
                 "last_s": [e for _, _, e, _ in ended]}).encode()))
            return
        if method == "GET" and path == "/v1/models":
            self.write(_response(200, json.dumps(
                {"object": "list", "data": [{"id": "test-llm", "object": "model"}]}).encode()))
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            self.write(_response(404, b'{"error": "not found"}'))
            return
        try:
            req = json.loads(body)
        except json.JSONDecodeError:
            self.write(_response(400, b'{"error": "body is not JSON"}'))
            return
        if not req.get("stream"):
            self.write(_response(400, b'{"error": "only stream: true is served"}'))
            return
        chat = path.endswith("chat/completions")
        if chat:
            prompt = " ".join(_text(m.get("content", "")) for m in req.get("messages", []))
        else:
            prompt = str(req.get("prompt", ""))
        limit = req.get("max_tokens") or req.get("max_completion_tokens") or 16
        self.stream(chat, prompt, int(limit), req.get("stream_options") or {})

    def stream(self, chat: bool, prompt: str, max_tokens: int, so: dict[str, bool]) -> None:
        s = self.s
        prompt_tokens = len(prompt.split())
        seed = zlib.crc32(prompt.encode())
        tag = re.search(r"\bi=(\d+)", prompt)
        index = int(tag.group(1)) if tag else -1
        state = {"diverged": False}

        def text_of(first: int, tokens: int) -> str:
            if s.diverge_at < 0:
                return " t" * tokens
            return "".join(" " + (str.upper if state["diverged"] and t >= s.diverge_at else
                                  str.lower)(chr(97 + (seed + 7 * t) % 26))
                           for t in range(first, first + tokens))
        s.count += 1
        drop = bool(s.drop_every) and s.count % s.drop_every == 0
        now = self.loop.time()
        n_chunks = math.ceil(max_tokens / s.k)
        start = s.plan(now, n_chunks)
        cont = bool(so.get("continuous_usage_stats"))
        final_usage = bool(so.get("include_usage"))
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(tokens: int, done_so_far: int, finish: str | None) -> dict[str, object]:
            text = text_of(done_so_far - tokens, tokens)
            choice: dict[str, object] = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            c: dict[str, object] = {"id": "x", "object": obj, "model": "test-llm",
                                    "choices": [choice]}
            if cont:
                c["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": done_so_far,
                              "total_tokens": prompt_tokens + done_so_far}
            return c

        self.write(_STREAM_HEAD)
        if chat:
            first: dict[str, object] = {"id": "x", "object": obj, "model": "test-llm",
                                        "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                     "finish_reason": None}]}
            self.write(_event(first))
        def payload(j: int, k: int, done: int) -> bytes:
            out = _event(chunk(k, done, "length" if done == max_tokens else None))
            if j == n_chunks - 1:
                if final_usage:
                    out += _event({"id": "x", "object": obj, "model": "test-llm",
                                   "choices": [], "usage": {
                                       "prompt_tokens": prompt_tokens,
                                       "completion_tokens": max_tokens,
                                       "total_tokens": prompt_tokens + max_tokens}})
                out += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
            return out

        def send_late(j: int, k: int, done: int) -> None:
            # The text is decided when its chunk goes out: who else is streaming then.
            if done - k <= s.diverge_at < done and s.active > 1:
                state["diverged"] = True
            self.write(payload(j, k, done))
            if j == n_chunks - 1:
                s.active -= 1

        first_write = [0.0]

        def send(j: int, data: bytes) -> None:
            # Read before the write: a client cannot receive the bytes earlier than this.
            t = self.loop.time()
            self.write(data)
            if j == 0:
                first_write[0] = t
            if j == n_chunks - 1:
                s.truth.append((now, first_write[0], t, index))

        s.active += 1
        done = 0
        at = -math.inf
        for j in range(n_chunks):
            k = min(s.k, max_tokens - done)
            done += k
            # Chunks held by a freeze all fall due when it ends; asyncio's timer heap does not
            # keep the order of equal times, so each is a microsecond after the one before.
            at = max(s.unstall(start + s.ttft + j * s.gap), at + 1e-6)
            if drop and j >= n_chunks // 2:
                self.loop.call_at(at, self.cut, s.diverge_at >= 0)
                return
            if s.diverge_at >= 0:
                self.loop.call_at(at, send_late, j, k, done)
            else:
                self.loop.call_at(at, send, j, payload(j, k, done))

    def cut(self, release: bool = False) -> None:
        if release:
            self.s.active -= 1
        if self.transport is not None and not self.dead:
            self.transport.close()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--max-streams", type=int, default=0)
    p.add_argument("--stall-period-s", type=float, default=1.0)
    p.add_argument("--stall-s", type=float, default=0.0)
    p.add_argument("--drop-every", type=int, default=0)
    p.add_argument("--diverge-at", type=int, default=-1)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--no-metrics", action="store_true")
    a = p.parse_args()
    server = Server(a)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Handler(server), "127.0.0.1", a.port, backlog=4096)
    port = srv.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    async with srv:
        await srv.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
