"""`scalelab load` against HTTP servers nobody here wrote, on 127.0.0.1: Python's http.server
(HTTP/1.0, one answer per connection), uvicorn (keep-alive, chunked bodies, Retry-After, TLS),
gRPC's HTTP/2-only server, and Debian's nginx (closes a connection after keepalive_requests).

What each test checks is the client's correctness with that server's behaviour (no failure
that the server did not cause, every connection the server closed replaced and counted), never
a wall-clock time. The rate against wrk and hey is measured in docs/real-servers.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scalelab.cli import run
from scalelab.lab.core.records import read_records
from scalelab.lab.core.sheet import build_sheet
from scalelab.layers.web.spawn import free_port

HERE = Path(__file__).parent
QUIET = ["--warmup", "0s", "--no-cold-start", "--json"]


def _wait_port(proc: subprocess.Popen[bytes], port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server did not listen on {port} within {timeout_s} s")


def _spawn(cmd: list[str], port: int, cwd: Path | None = None) -> Iterator[str]:
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(proc, port)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """python -m http.server: HTTP/1.0, closes the connection after every answer."""
    root = tmp_path_factory.mktemp("www")
    (root / "index.html").write_text("hello\n")
    port = free_port()
    yield from (f"http://{a}" for a in _spawn(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(root)], port))


def _uvicorn(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "real_apps:app", "--app-dir", str(HERE),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra]


@pytest.fixture(scope="module")
def uvicorn_server() -> Iterator[str]:
    port = free_port()
    yield from (f"http://{a}" for a in _spawn(_uvicorn(port), port))


def _level(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    out = capsys.readouterr()
    return json.loads(out.out)["levels"][0], out.err.strip()


def test_http_server_closed_loop_loses_nothing(http_server: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # Every answer closes its connection: the client opens one per request and counts it
    # (one more may open as the last request goes out on the other client's connection).
    assert run(["load", http_server + "/", "--loop", "closed", "--concurrency", "2",
                "--requests", "50", *QUIET]) == 0
    lv, _ = _level(capsys)
    assert (lv["successes"], lv["failures"], lv["errors_by_kind"]) == (50, 0, {})
    assert lv["server_closes"] == 50 and lv["connections"] in (50, 51)
    assert lv["retries"] == 0 and lv["valid"] and lv["healthy"]


def test_http_server_open_loop_loses_nothing(http_server: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", http_server + "/", "--rate", "100", "--requests", "100", *QUIET]) == 0
    lv, _ = _level(capsys)
    assert (lv["successes"], lv["failures"]) == (100, 0)
    assert lv["server_closes"] == lv["connections"] >= 100


def test_wrong_path_exits_1_with_the_cause(http_server: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", http_server + "/nothing-here", "--concurrency", "1", "--requests",
                "5", *QUIET]) == 1
    lv, err = _level(capsys)
    assert lv["errors_by_status"] == {"404": 5} and not lv["healthy"] and lv["valid"]
    assert err == "every request failed (5 sent): 404: check the path"


def test_not_an_llm_server_exits_1_with_the_cause(http_server: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # http.server answers POST with 501.
    assert run(["load", "llm", http_server, "--concurrency", "1", "--requests", "3",
                "--warmup", "0s", "--json"]) == 1
    out = capsys.readouterr()
    assert json.loads(out.out)["levels"][0]["errors_by_status"] == {"501": 3}
    assert out.err.strip() == ("every request failed (3 sent): 501: the server does not "
                               "implement this endpoint: is it an OpenAI-compatible LLM server?")


def test_uvicorn_keeps_connections_and_chunks(uvicorn_server: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", uvicorn_server + "/chunked", "--concurrency", "2", "--requests", "40",
                *QUIET]) == 0
    lv, _ = _level(capsys)
    assert (lv["successes"], lv["failures"]) == (40, 0)
    assert lv["connections"] == 2 and lv["server_closes"] == 0


def test_retry_after_is_recorded(uvicorn_server: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    recs = tmp_path / "busy.jsonl"
    assert run(["load", uvicorn_server + "/busy", "--concurrency", "1", "--requests", "6",
                "--records", str(recs), *QUIET]) == 1
    lv, err = _level(capsys)
    assert lv["errors_by_status"] == {"503": 6}
    assert (lv["retry_after_count"], lv["retry_after_max_s"]) == (6, 7.0)
    assert "Retry-After up to 7 s" in err
    # The server's side: an admission limit, its refusal rate and its Retry-After, in the
    # record's typed field and the sheet's limiting cell (not "errors").
    (rec,) = read_records(recs)
    sig = rec.server
    assert sig is not None
    assert (sig.refused, sig.refused_by_status, sig.requests) == (6, {"503": 6}, 6)
    assert (sig.retry_after, sig.retry_after_count, sig.retry_after_s) == (True, 6, 7.0)
    assert sig.refused_rps == pytest.approx(6 / rec.wall_s)
    (row,) = build_sheet([rec])
    assert row.limiting_resource.startswith(
        f"admission: 6 refused with 503 = 100.0% of 6 requests ({6 / rec.wall_s:.3g} "
        "refusals/s), Retry-After (up to 7 s): the server turns work away above its "
        "admission limit")


def test_headers_reach_the_server(uvicorn_server: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", uvicorn_server + "/auth", "--concurrency", "1", "--requests", "3",
                *QUIET]) == 1
    _, err = _level(capsys)
    assert err.endswith("401: the server wants credentials; pass the credentials with -H "
                        "'Authorization: Bearer TOKEN'")
    assert run(["load", uvicorn_server + "/auth", "--concurrency", "1", "--requests", "3",
                "-H", "Authorization: Bearer s3cret", "-H", "X-Tenant: a", *QUIET]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["headers"] == ["Authorization", "X-Tenant"]
    assert "s3cret" not in out


def _one_answer_then_silence(port_box: list[int], stop: threading.Event,
                             answers_per_conn: int) -> None:
    """A socket server that answers `answers_per_conn` requests on each connection (keep-alive)
    and then closes it when the next request arrives, writing no byte of an answer: the race a
    server's idle close makes with a client's send, made deterministic."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for _ in range(answers_per_conn):
            if not await r.readuntil(b"\r\n\r\n"):
                return
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await r.readuntil(b"\r\n\r\n")
        w.transport.abort()

    async def main() -> None:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port_box.append(srv.sockets[0].getsockname()[1])
        while not stop.is_set():
            await asyncio.sleep(0.02)
        srv.close()

    asyncio.run(main())


@pytest.fixture
def closing_server() -> Iterator[Callable[[int], str]]:
    stops: list[threading.Event] = []

    def start(answers_per_conn: int) -> str:
        box: list[int] = []
        stop = threading.Event()
        stops.append(stop)
        threading.Thread(target=_one_answer_then_silence, args=(box, stop, answers_per_conn),
                         daemon=True).start()
        deadline = time.monotonic() + 10
        while not box and time.monotonic() < deadline:
            time.sleep(0.01)
        return f"http://127.0.0.1:{box[0]}/"

    yield start
    for s in stops:
        s.set()


def test_a_request_on_a_connection_closed_idle_is_sent_once_more(
        closing_server: Callable[[int], str], capsys: pytest.CaptureFixture[str]) -> None:
    # Each connection answers one request and drops the next: that next is resent once on a
    # fresh connection, where it is the first and is answered. 10 requests: 9 resends.
    assert run(["load", closing_server(1), "--concurrency", "1", "--requests", "10",
                *QUIET]) == 0
    lv, _ = _level(capsys)
    assert (lv["successes"], lv["failures"], lv["retries"]) == (10, 0, 9)


def test_a_fresh_connection_closed_unanswered_is_a_failure(
        closing_server: Callable[[int], str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", closing_server(0), "--concurrency", "1", "--requests", "4",
                *QUIET]) == 1
    lv, err = _level(capsys)
    assert lv["errors_by_kind"] == {"reset": 4} and lv["retries"] == 0
    assert "the server closed every connection before answering" in err


def test_http2_only_server_is_refused_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    srv = grpc.server(futures.ThreadPoolExecutor(1))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        assert run(["load", f"http://127.0.0.1:{port}/", "--concurrency", "1", "--requests",
                    "2", *QUIET]) == 1
    finally:
        srv.stop(0)
    lv, err = _level(capsys)
    assert lv["errors_by_kind"] == {"protocol": 2}
    assert "the server answered in HTTP/2" in err and "HTTP/1.1" in err


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (apt-get install openssl)")
    d = tmp_path_factory.mktemp("tls")
    key, cert = d / "key.pem", d / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    port = free_port()
    for addr in _spawn(_uvicorn(port, "--ssl-keyfile", str(key), "--ssl-certfile", str(cert)),
                       port):
        yield f"https://{addr}/", cert


def test_tls_with_a_ca_bundle_or_insecure(tls_server: tuple[str, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    url, cert = tls_server
    assert run(["load", url, "--concurrency", "1", "--requests", "3", *QUIET]) == 1
    lv, err = _level(capsys)
    assert lv["errors_by_kind"] == {"tls": 3}
    assert "pass --cacert FILE" in err and "--insecure" in err
    for flags in (["--cacert", str(cert)], ["--insecure"]):
        assert run(["load", url, "--concurrency", "1", "--requests", "3", *flags,
                    *QUIET]) == 0
        lv, _ = _level(capsys)
        assert (lv["successes"], lv["failures"]) == (3, 0)


NGINX_CONF = """
daemon off; pid {d}/nginx.pid; error_log {d}/error.log; worker_processes 1;
events {{ worker_connections 64; }}
http {{
  access_log off; client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};
  uwsgi_temp_path {d}; scgi_temp_path {d};
  keepalive_requests 5;
  server {{ listen 127.0.0.1:{port}; location / {{ return 200 "hello\\n"; }} }}
}}
"""


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                    else None)
    if exe is None:
        if os.environ.get("SCALELAB_REQUIRE_DEPS"):
            pytest.fail("nginx is required here (SCALELAB_REQUIRE_DEPS=1): run .ci/nginx")
        pytest.skip("nginx is not installed: apt-get install nginx-light (CI: .ci/nginx)")
    d = tmp_path_factory.mktemp("nginx")
    (d / "index.html").write_text("hello\n")
    port = free_port()
    conf = d / "nginx.conf"
    conf.write_text(NGINX_CONF.format(d=d, port=port))
    yield from (f"http://{a}/" for a in _spawn([exe, "-c", str(conf), "-p", str(d)], port))


def test_nginx_closing_after_keepalive_requests_loses_nothing(
        nginx: str, capsys: pytest.CaptureFixture[str]) -> None:
    # keepalive_requests 5: nginx answers the 5th request of a connection with
    # `Connection: close` (HTTP/1.1) and closes it; the client never sends a 6th there.
    assert run(["load", nginx, "--concurrency", "2", "--requests", "60", *QUIET]) == 0
    lv, _ = _level(capsys)
    assert (lv["successes"], lv["failures"], lv["retries"]) == (60, 0, 0)
    # Every 5th answer closes its connection: 12 closes, each but the last followed by a new
    # connection. Closes are counted when the socket's loss is seen, so the last one may land
    # after the run's last answer ends it (11); on a busy machine one connection may be opened
    # as the last requests are handed out and never carry one (13).
    assert lv["server_closes"] in (11, 12) and lv["connections"] in (12, 13)


def test_a_capacity_search_with_every_request_failed_says_why(
        http_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", "capacity", http_server + "/nothing-here", "--slo", "p95<50ms",
                "--start", "20", "--max-steps", "2", "--min-step", "0.5s", "--max-step", "1s",
                "--warmup", "0s", "--json"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("every request failed (") and err[0].endswith("404: check the path")
