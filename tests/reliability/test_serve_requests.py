"""Issue 9 item 5: bad requests against a real server — no 5xx for any request schemathesis
generates from the server's own OpenAPI document and no 2xx for a body it generates to break
that document (negative mode), 413 for oversized bodies, 400/422 naming the
field for a table of malformed tensors, and slow clients (slowloris) that neither starve others
nor keep their connections."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serve_helpers import LONG, Server, add_model, infer_body, start_server

pytestmark = [pytest.mark.reliability,
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

TOKEN = "s3cret"
READ_TIMEOUT_S = 2.0
MAX_BODY = 64 * 1024
EXAMPLES = 200 if LONG else 25


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("repo")
    add_model(root, "flights", {1: 1, 2: 2})
    log = tmp_path_factory.mktemp("log") / "server.log"
    srv = start_server(root, log, "--admin-token", TOKEN, "--max-body", "64KiB",
                       "--read-timeout", str(READ_TIMEOUT_S))
    yield srv
    srv.stop()


# -- schemathesis ----------------------------------------------------------------------------


def test_openapi_document_describes_the_protocol(server: Server) -> None:
    doc = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    paths = doc["paths"]
    assert "/v2/models/{name}/infer" in paths
    body = paths["/v2/models/{name}/infer"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert "inputs" in schema["required"]
    assert "$ref" not in json.dumps(schema)  # inlined: fuzzers and clients can use it as is


def test_schemathesis_no_5xx(server: Server) -> None:
    """Every operation in /openapi.json, positive and negative bodies, with random model names
    and with the real one (so bodies reach tensor validation), admin calls with the token (on
    this test's own repository) except unload, which is sent without it (401; it would empty
    the repository for the rest of the run)."""
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    failures: list[str] = []
    negatives: list[int] = []  # statuses of the bodies generated to break the schema
    seen: dict[str, dict[int, int]] = {}
    results: list[Any] = list(schema.get_all_operations())
    ops = [r.ok() for r in results]  # raises on an operation the schema cannot describe
    assert len(ops) >= 10
    for op in ops:
        fixed: dict[str, Any] = {}
        names = {p.name for p in op.path_parameters}
        if "name" in names:
            fixed["name"] = "flights"
        if "version" in names:
            fixed["version"] = "1"
        modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
        strategies = [op.as_strategy(m) for m in modes]
        if fixed:
            strategies += [op.as_strategy(m, path_parameters=fixed) for m in modes]
        admin = op.path.startswith("/v2/repository")
        headers = {"Authorization": f"Bearer {TOKEN}"} if admin and "unload" not in op.path \
            else {}
        counts = seen.setdefault(f"{op.method.upper()} {op.path}", {})
        _fuzz(server.url, strategies, headers, counts, failures, negatives)
    assert not failures, "\n".join(failures[:10])
    assert len(negatives) >= 10, negatives  # malformed bodies were sent, not just valid ones
    assert server.proc.poll() is None
    assert "Traceback" not in server.logs()
    total = sum(sum(c.values()) for c in seen.values())
    print(f"\nschemathesis: {len(ops)} operations, {total} requests, no 5xx: {seen}")


def _fuzz(url: str, strategies: list[Any], headers: dict[str, str], counts: dict[int, int],
          failures: list[str], negatives: list[int]) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from schemathesis.core.parameters import ParameterLocation

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(*strategies))
    def check(case: Any) -> None:
        r = case.call(base_url=url, headers=headers, timeout=30)
        counts[r.status_code] = counts.get(r.status_code, 0) + 1
        if r.status_code >= 500:
            failures.append(f"{r.status_code} {case.as_curl_command()} -> {r.text[:300]}")
        # A body that breaks the server's own schema must be refused (4xx), never served:
        # answered 2xx, the server read something its document says it does not take.
        elif case.meta is not None and case.meta.is_negative_at(ParameterLocation.BODY):
            negatives.append(r.status_code)
            if r.status_code < 400:
                failures.append(f"malformed body answered {r.status_code}: "
                                f"{case.as_curl_command()} -> {r.text[:300]}")

    check()


# -- oversized bodies ------------------------------------------------------------------------


def test_oversized_body_is_413(server: Server) -> None:
    url = f"{server.url}/v2/models/flights/infer"
    big = json.dumps({**infer_body(1), "pad": "x" * (MAX_BODY + 1)}).encode()
    r = httpx.post(url, content=big, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413, r.text
    assert "limit" in r.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(big), 8192):
            yield big[i:i + 8192]

    r = httpx.post(url, content=chunks(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413, r.text
    # a body just under the limit is read (and then judged on its content)
    ok = httpx.post(url, json=infer_body(1), timeout=30)
    assert ok.status_code == 200


# -- malformed tensors -------------------------------------------------------------------------


def _body(**change: Any) -> dict[str, Any]:
    b = infer_body(1)
    for key, value in change.items():
        which, field = key.split("__")
        b["inputs"][0 if which == "cat" else 1][field] = value
    return b


GOOD = infer_body(1)
CASES: list[tuple[str, Any, int, str]] = [
    ("not json", b"{", 400, "not valid JSON"),
    ("json array", b"[]", 400, "JSON object"),
    ("nested too deep", b"[" * 100_000 + b"]" * 100_000, 413, "limit"),
    ("nested deep, small", b"[" * 20_000 + b"]" * 20_000, 400, "nested too deeply"),
    ("invalid utf-8", b'{"inputs": "\xff"}', 400, "not valid JSON"),
    ("empty object", {}, 422, "inputs"),
    ("no inputs", {"inputs": []}, 422, "inputs"),
    ("input without name", {"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]},
     422, "inputs.0.name"),
    ("shape not a list", _body(cat__shape="1x4"), 422, "inputs.0.shape"),
    ("id not a string", {**GOOD, "id": {"a": 1}}, 422, "id"),
    ("wrong datatype", _body(cat__datatype="FP32"), 400, "categorical"),
    ("shape mismatch", _body(cat__shape=[1, 3]), 400, "categorical"),
    ("too many dims", _body(num__shape=[1, 14, 1]), 400, "numeric"),
    ("batch too large", _body(cat__shape=[2**70, 4]), 400, "categorical"),
    ("too few values", _body(num__data=[0.0] * 13), 400, "numeric"),
    ("ragged rows", _body(cat__data=[[0, 0, 0], [0]]), 400, "categorical"),
    ("float in INT64", _body(cat__data=[[0.5, 0, 0, 0]]), 400, "categorical"),
    ("bool in INT64", _body(cat__data=[[True, False, True, False]]), 400, "categorical"),
    ("index out of vocabulary", _body(cat__data=[[99, 0, 0, 0]]), 400, "categorical"),
    ("negative index", _body(cat__data=[[0, -1, 0, 0]]), 400, "categorical"),
    ("int beyond int64", _body(cat__data=[[2**70, 0, 0, 0]]), 400, "categorical"),
    ("strings as numbers", _body(num__data=["1"] * 14), 400, "numeric"),
    ("nulls", _body(num__data=[None] * 14), 400, "numeric"),
    ("objects", _body(num__data=[{"a": 1}] * 14), 400, "numeric"),
    ("data not an array", _body(num__data="zeros"), 400, "numeric"),
    ("no data", _body(num__data=None), 400, "numeric"),
    ("infinity", b"", 400, "numeric"),  # body built below: JSON has no literal for it
    ("unknown input", {"inputs": [*GOOD["inputs"], {"name": "extra", "datatype": "FP32",
                                                    "shape": [1], "data": [1]}]},
     400, "extra"),
    ("missing input", {"inputs": GOOD["inputs"][:1]}, 400, "numeric"),
    ("input twice", {"inputs": [GOOD["inputs"][0], *GOOD["inputs"]]}, 400, "categorical"),
    ("batch disagreement", _body(num__shape=[2, 14], num__data=[0.0] * 28), 400, "batch"),
    ("unknown output", {**GOOD, "outputs": [{"name": "nope"}]}, 400, "nope"),
    ("binary size wrong", _body(cat__parameters={"binary_data_size": 3}, cat__data=None),
     400, "categorical"),
]


@pytest.mark.parametrize(("what", "body", "status", "names"), CASES, ids=[c[0] for c in CASES])
def test_malformed_tensor_is_4xx_naming_the_field(server: Server, what: str, body: Any,
                                                   status: int, names: str) -> None:
    if what == "infinity":
        body = json.dumps(_body(num__data=[0.0] * 14)).replace("0.0", "1e400", 1).encode()
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server.url}/v2/models/flights/infer", content=content,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, (what, r.status_code, r.text)
    msg = r.json()["error"]
    assert names in msg, (what, msg)
    assert "Traceback" not in msg


@pytest.mark.parametrize(("header", "value"), [
    ("X-Request-Timeout-Ms", "soon"), ("X-Request-Timeout-Ms", "nan"),
    ("X-Request-Timeout-Ms", "-5"), ("X-Request-Timeout-Ms", "1e309"),
    ("Inference-Header-Content-Length", "zz"), ("Inference-Header-Content-Length", "-1"),
    ("Inference-Header-Content-Length", "99999999999999999999999"),
])
def test_malformed_protocol_header_is_400_naming_it(server: Server, header: str,
                                                     value: str) -> None:
    r = httpx.post(f"{server.url}/v2/models/flights/infer", json=infer_body(1),
                   headers={header: value}, timeout=30)
    assert r.status_code == 400, r.text
    assert header in r.json()["error"]


# -- slow clients ------------------------------------------------------------------------------


def _fd_count(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


class Trickler(threading.Thread):
    """A client that opens a connection and sends `prefix`, then one more byte of `rest` every
    `gap_s`, until the server closes the connection (recorded in `closed_after`)."""

    def __init__(self, url: str, prefix: bytes, rest: bytes, gap_s: float) -> None:
        super().__init__(daemon=True)
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.prefix, self.rest, self.gap_s = prefix, rest, gap_s
        self.closed_after: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            if self.prefix:
                self.sock.sendall(self.prefix)
            for b in self.rest:
                if self.stop.wait(self.gap_s):
                    return
                self.sock.sendall(bytes([b]))
                self.sock.settimeout(0.001)
                try:
                    if self.sock.recv(4096) == b"":
                        break
                except TimeoutError:
                    pass
                finally:
                    self.sock.settimeout(30)
            else:  # sent everything without being cut off: wait for the close
                self.sock.settimeout(30)
                while self.sock.recv(4096):
                    pass
        except OSError:
            pass  # reset / broken pipe: closed by the server
        finally:
            self.closed_after = time.monotonic() - t0
            self.sock.close()


def test_slowloris_neither_starves_others_nor_keeps_connections(server: Server) -> None:
    pid = server.proc.pid
    with httpx.Client(timeout=10) as c:  # warm: connections, model
        assert c.post(f"{server.url}/v2/models/flights/infer", json=infer_body(1)).is_success
    fds_before = _fd_count(pid)
    body = json.dumps(infer_body(1)).encode()
    head = (b"POST /v2/models/flights/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n" + b"X-Slow: " + b"a" * 400 + b"\r\n")
    n = 8
    slow = [Trickler(server.url, b"", head, 0.05) for _ in range(n // 2)]  # slow headers
    slow += [Trickler(server.url, head + f"Content-Length: {len(body)}\r\n\r\n".encode(), body,
                      0.05) for _ in range(n // 4)]  # complete headers, slow body
    slow += [Trickler(server.url, b"", b"", 0.05) for _ in range(n - len(slow))]  # silent
    for t in slow:
        t.start()
    try:
        # while they trickle, normal clients are served (each on a fresh connection)
        for i in range(5):
            with httpx.Client(timeout=httpx.Timeout(5.0)) as c:
                r = c.post(f"{server.url}/v2/models/flights/infer", json=infer_body(1, seed=i))
                assert r.status_code == 200
        assert all(t.closed_after is None for t in slow if t.rest), \
            "a slow client was cut off before the read timeout"
        # every slow connection is closed by the server's read timeout (bounded wait)
        for t in slow:
            t.join(timeout=READ_TIMEOUT_S + 15)
        assert all(t.closed_after is not None for t in slow), "slow connections still open"
        # the trickled headers alone take 0.05 s x 440 bytes = 22 s: cut off near the timeout
        for t in slow:
            assert t.closed_after is not None and t.closed_after < READ_TIMEOUT_S + 10
    finally:
        for t in slow:
            t.stop.set()
    # no descriptor kept for them (a small allowance for the server's own files)
    deadline = time.monotonic() + 10
    while _fd_count(pid) > fds_before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _fd_count(pid) <= fds_before + 2
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200


def test_slow_but_complete_request_within_the_timeout_is_served(server: Server) -> None:
    """The timeout bounds a whole request, not a byte gap: a client that takes half of it to
    send a valid request still gets its answer."""
    body = json.dumps(infer_body(1)).encode()
    raw = (b"POST /v2/models/flights/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           b"Content-Type: application/json\r\nConnection: close\r\n"
           + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        step = max(1, len(raw) // 10)
        for i in range(0, len(raw), step):
            s.sendall(raw[i:i + step])
            time.sleep(READ_TIMEOUT_S / 2 / 10)  # pacing the client, not synchronisation
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
