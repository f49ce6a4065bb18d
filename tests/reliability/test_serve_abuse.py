"""Issue 9 item 6: abuse of a real server — admin endpoints without or with a wrong token,
model names and paths that try to leave the repository, a model file that is a pickle payload,
and the default bind address."""

from __future__ import annotations

import pickle
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serve_helpers import Evil, Server, add_model, infer_body, start_server

pytestmark = pytest.mark.reliability

TOKEN = "s3cret-token"
SECRET = "TOP-SECRET-OUTSIDE-THE-REPOSITORY"
ADMIN = [("GET", "/v2/repository/index"), ("POST", "/v2/repository/index"),
         ("POST", "/v2/repository/models/flights/load"),
         ("POST", "/v2/repository/models/flights/unload")]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """REPO beside an OUTSIDE folder holding a secret file and a complete model."""
    base = tmp_path_factory.mktemp("world")
    root = base / "repo"
    add_model(root, "flights", {1: 1})
    # model files that are pickle payloads: unpickling them would create base/PWNED*
    add_model(root, "pickled", {1: 2})
    evil = pickle.dumps(Evil(str(base / "PWNED-safetensors")))
    (root / "pickled" / "1" / "model.safetensors").write_bytes(evil)
    add_model(root, "ptonly", {1: 3})
    (root / "ptonly" / "1" / "model.safetensors").unlink()
    (root / "ptonly" / "1" / "model.pt").write_bytes(pickle.dumps(Evil(str(base / "PWNED-pt"))))
    # outside the repository: a secret, a whole model, and symlinks pointing at them
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    add_model(outside, "escape", {1: 4})
    (root / "escape").symlink_to(outside / "escape", target_is_directory=True)
    add_model(root, "vlink", {1: 5})
    (root / "vlink" / "2").symlink_to(outside / "escape" / "1", target_is_directory=True)
    return base


@pytest.fixture(scope="module")
def server(world: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("log") / "server.log"
    srv = start_server(world / "repo", log, "--admin-token", TOKEN)
    yield srv
    srv.stop()


def _pwned(world: Path) -> list[Path]:
    return sorted(world.glob("PWNED*"))


# -- admin auth ------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), ADMIN)
def test_admin_without_token_is_401(server: Server, method: str, path: str) -> None:
    r = httpx.request(method, server.url + path, timeout=30)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path"), ADMIN)
@pytest.mark.parametrize("auth", [
    f"Bearer {TOKEN}x", "Bearer", "Bearer s3cret", f"Basic {TOKEN}", TOKEN,
    f"Bearer {TOKEN[:-1]}", "Bearer " + "A" * 10_000,
])
def test_admin_with_wrong_token_is_403(server: Server, method: str, path: str,
                                       auth: str) -> None:
    r = httpx.request(method, server.url + path, headers={"Authorization": auth}, timeout=30)
    assert r.status_code == 403, r.text
    # nothing was unloaded by the refused calls
    assert httpx.get(f"{server.url}/v2/models/flights/ready", timeout=30).status_code == 200


def test_admin_with_the_token_works(server: Server) -> None:
    r = httpx.get(f"{server.url}/v2/repository/index",
                  headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 200
    states = {(e["name"], e["version"]): e["state"] for e in r.json()}
    assert states[("flights", "1")] == "READY"


def test_admin_disabled_without_a_configured_token(world: Path, tmp_path: Path) -> None:
    """No --admin-token and no SCALELAB_ADMIN_TOKEN: every admin call is 403, whatever is sent;
    and the default bind address is loopback."""
    srv = start_server(world / "repo", tmp_path / "server.log")
    try:
        for method, path in ADMIN:
            for headers in ({}, {"Authorization": f"Bearer {TOKEN}"},
                            {"Authorization": "Bearer"}):
                r = httpx.request(method, srv.url + path, headers=headers, timeout=30)
                assert r.status_code == 403, (path, headers, r.text)
                assert "disabled" in r.json()["error"], r.text
        listening = [c.laddr for c in psutil.Process(srv.proc.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening, "no listening socket found"
        assert all(a.ip == "127.0.0.1" for a in listening), listening
    finally:
        srv.stop()


# -- paths out of the repository ------------------------------------------------------------

# literal `..` and `.` segments are normalised away by httpx; test_raw_dot_segments_in_the_
# request_line sends them on a raw socket
TRAVERSALS = [
    "...", "..%2F..%2Foutside", "%2e%2e", "%2e%2e%2f%2e%2e%2foutside",
    "%252e%252e%252f", "..%5C..%5Coutside", "%2Fetc%2Fpasswd", "%2F" + "x", "~root",
    "flights%2F..%2F..%2Foutside", "escape", "a" * 300, "%00flights", "flights%00",
]


def _no_secret(r: httpx.Response) -> None:
    assert SECRET not in r.text
    assert "root:" not in r.text


@pytest.mark.parametrize("name", TRAVERSALS)
def test_model_names_that_leave_the_repository_are_refused(server: Server, world: Path,
                                                           name: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    calls = [("GET", f"/v2/models/{name}", {}), ("GET", f"/v2/models/{name}/ready", {}),
             ("GET", f"/v2/models/{name}/versions/1", {}),
             ("POST", f"/v2/models/{name}/infer", {}),
             ("POST", f"/v2/repository/models/{name}/load", auth)]
    for method, path, headers in calls:
        r = httpx.request(method, server.url + path, headers=headers, timeout=30,
                          json={"inputs": []} if method == "POST" else None)
        assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text)
        _no_secret(r)
    assert not _pwned(world)


@pytest.mark.parametrize("version", ["%2e%2e", "..%2F..%2Foutside", "-1", "0", "1.0",
                                     "01x", "%2Fetc", "99999999999999999999999", "2"])
def test_version_paths_that_leave_the_repository_are_refused(server: Server,
                                                             version: str) -> None:
    for path in (f"/v2/models/flights/versions/{version}",
                 f"/v2/models/vlink/versions/{version}/ready"):
        r = httpx.get(server.url + path, timeout=30)
        if r.status_code == 503:  # only as readiness's own answer: that version is not ready
            assert path.endswith("/ready") and r.json() == {"name": "vlink", "ready": False}
        else:
            assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
        _no_secret(r)


def test_raw_dot_segments_in_the_request_line(server: Server) -> None:
    """httpx normalises `..` away; a raw socket sends it as is."""
    host, port = server.url.removeprefix("http://").split(":")
    for target in ("/v2/models/../../outside/secret.txt", "/../../../../etc/passwd",
                   "/v2/models/../infer", "/v2/models/flights/versions/../../../outside",
                   "/v2/models/./flights/versions/./1/../../../../outside/secret.txt",
                   "/v2/models/flights/../../../outside", "//etc/passwd",
                   "/v2/models/%2e%2e/%2e%2e/outside/secret.txt"):
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        status = int(reply.split(b" ", 2)[1])
        assert 400 <= status < 500, (target, reply[:200])
        assert SECRET.encode() not in reply


def test_symlinked_model_out_of_the_repository_is_refused(server: Server) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    index = httpx.get(f"{server.url}/v2/repository/index", headers=auth, timeout=30).json()
    assert not any(e["name"] == "escape" and e["state"] == "READY" for e in index)
    r = httpx.post(f"{server.url}/v2/repository/models/escape/load", headers=auth, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    r = httpx.get(f"{server.url}/v2/models/escape/ready", timeout=30)
    assert r.status_code != 200
    # a version directory that is a symlink out of the repository: not served either
    r = httpx.get(f"{server.url}/v2/models/vlink/versions/2/ready", timeout=30)
    assert r.status_code != 200, r.text
    r = httpx.post(f"{server.url}/v2/models/vlink/versions/2/infer", timeout=30,
                   json={"inputs": []})
    assert r.status_code >= 400


# -- pickle payloads -------------------------------------------------------------------------


def test_pickle_model_files_are_refused_not_executed(server: Server, world: Path) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for name in ("pickled", "ptonly"):
        r = httpx.get(f"{server.url}/v2/models/{name}/ready", timeout=30)
        assert r.status_code == 503, r.text
        r = httpx.post(f"{server.url}/v2/repository/models/{name}/load", headers=auth,
                       timeout=30)
        assert r.status_code == 400, r.text
        r = httpx.post(f"{server.url}/v2/models/{name}/infer", json=infer_body(1), timeout=30)
        assert r.status_code == 503, r.text
    index = httpx.get(f"{server.url}/v2/repository/index", headers=auth, timeout=30).json()
    states = {e["name"]: e["state"] for e in index if e["name"] in ("pickled", "ptonly")}
    assert states == {"pickled": "UNAVAILABLE", "ptonly": "UNAVAILABLE"}, index
    assert not _pwned(world), "a pickle payload was executed"
    # the other models keep serving
    assert httpx.get(f"{server.url}/v2/models/flights/ready", timeout=30).status_code == 200
