"""The serve stage's servers started at once (`serve_servers.start_all`): each key its running
server or why it did not start, the others unaffected, and every started one stopped after."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from scalelab.lab.diagnose.stages.serve_servers import Planned, start_all, stop_all
from scalelab.layers.web.spawn import Spawned

READY = ("import http.server, sys\n"
         "class H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n"
         "        self.send_response(200); self.send_header('content-length', '0')\n"
         "        self.end_headers()\n"
         "    def log_message(self, *a): pass\n"
         "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def _ready(port: int) -> list[str]:
    return [sys.executable, "-c", READY, str(port)]


def _exits(port: int) -> list[str]:
    return [sys.executable, "-c", "raise SystemExit(3)"]


def test_a_failed_start_is_its_own_and_the_rest_run(tmp_path: Path) -> None:
    got = start_all([Planned(key="a", command=_ready, log=tmp_path / "logs" / "a.log"),
                     Planned(key="broken", command=_exits, log=tmp_path / "logs" / "b.log"),
                     Planned(key="b", command=_ready, log=tmp_path / "logs" / "c.log")])
    assert list(got) == ["a", "broken", "b"]
    a, broken, b = got["a"], got["broken"], got["b"]
    assert isinstance(a, Spawned) and isinstance(b, Spawned) and a.url != b.url
    assert isinstance(broken, str)
    assert broken.startswith("the server exited (3) before becoming ready; see ")
    assert broken.endswith("b.log")
    stop_all(got)
    assert a.proc.poll() is not None and b.proc.poll() is not None


def test_nothing_planned_starts_nothing() -> None:
    assert start_all([]) == {}


def test_a_start_that_raises_stops_the_servers_that_started(tmp_path: Path) -> None:
    # A command that raises (not a failed start: a bug, or Ctrl-C) ends start_all with that
    # error, and the server that did start is stopped, not left running with no one to stop it.
    pid_file = tmp_path / "a.pid"
    writes_pid = ("import os, sys; open(sys.argv[2], 'w').write(str(os.getpid()))\n" + READY)

    def ready_with_pid(port: int) -> list[str]:
        return [sys.executable, "-c", writes_pid, str(port), str(pid_file)]

    def raises(port: int) -> list[str]:
        raise ValueError("no command for this server")

    with pytest.raises(ValueError, match="no command for this server"):
        start_all([Planned(key="a", command=ready_with_pid, log=tmp_path / "a.log"),
                   Planned(key="bad", command=raises, log=tmp_path / "b.log")])
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
