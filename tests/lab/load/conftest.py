"""Real HTTP servers on 127.0.0.1 for the load tests (subprocesses of tests/lab/load/servers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.clock import realtime

SERVERS = Path(__file__).with_name("servers.py")


def _start(kind: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, str(SERVERS), kind, *args],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("PORT ") or proc.poll() is not None:
            break
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"test server {kind} did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


@pytest.fixture
def server() -> Iterator[Callable[..., str]]:
    """server("fixed", "--service-ms", "20") -> base URL; every server is killed afterwards.
    `realtime=True`: the server runs in SCHED_FIFO (priority 1), as the generator's --realtime
    does (only where `realtime_ok`): a test whose truth is the server's known timing needs
    the server punctual too, or on a loaded machine its wake-ups queue behind other
    processes and its latency is the machine's."""
    procs: list[subprocess.Popen[str]] = []

    def start(kind: str, *args: str, realtime: bool = False) -> str:
        proc, url = _start(kind, *args)
        procs.append(proc)
        if realtime:
            os.sched_setscheduler(proc.pid, os.SCHED_FIFO, os.sched_param(1))
        return url

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


@pytest.fixture(scope="session")
def realtime_ok() -> bool:
    """Whether the generator may run in SCHED_FIFO here (its --realtime): root or CAP_SYS_NICE.

    Tests whose point needs a punctual generator use it where the machine allows: on a busy
    shared machine a normal generator's wake-ups can queue behind other processes for longer
    than a level's gap, and it is rightly flagged for that.
    """
    try:
        with realtime():
            return True
    except BadUsageError:
        return False
