"""Spawning a real server on a free loopback port, waiting until ready, stopping it."""

import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from scalelab.lab.core.errors import RunFailedError
from scalelab.layers.web.spawn import start_server


def _http_server(tmp_path: Path) -> Callable[[int], list[str]]:
    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                "--directory", str(tmp_path), str(port)]
    return command


def test_server_is_ready_then_stopped(tmp_path: Path) -> None:
    (tmp_path / "ready").write_text("ok")
    with start_server(_http_server(tmp_path), ready_path="/ready", log=tmp_path / "s.log") as s:
        assert s.url.startswith("http://127.0.0.1:") and s.ready_s > 0
        with urllib.request.urlopen(s.url + "/ready", timeout=5) as r:
            assert r.read() == b"ok"
    assert s.proc.poll() is not None  # stopped on exit, not left behind


def test_a_server_that_exits_names_its_log(tmp_path: Path) -> None:
    log = tmp_path / "bad.log"
    with pytest.raises(RunFailedError, match=r"exited \(3\) before becoming ready; see .*bad\.log"):
        start_server(lambda port: [sys.executable, "-c", "raise SystemExit(3)"], log=log)
