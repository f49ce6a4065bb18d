"""Spawn a server on a free loopback port, wait until it answers ready, stop it.

One routine for everything that starts a server to measure it: `diagnose` (the reference model
server), `deploy k8s`'s start-up measurement and the serving benchmark. The server runs in its
own session (process group), so stopping it also stops the workers it forked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from scalelab.lab.core.errors import RunFailedError

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port the OS reports free right now (another process may take it before we bind)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, kw_only=True)
class Spawned:
    proc: subprocess.Popen[bytes]
    url: str
    """Base URL, e.g. http://127.0.0.1:40123."""
    ready_s: float
    """Seconds from the start of the process until the ready path answered 200."""

    def __enter__(self) -> Spawned:
        return self

    def __exit__(self, *exc: object) -> None:
        # `with start_server(...) as s:` stops the server on exit, Ctrl-C included.
        stop_group(self.proc)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def stop_group(proc: subprocess.Popen[bytes], *, grace_s: float = 10.0) -> None:
    """SIGTERM the process group (a server and its workers, a step and its children), then
    SIGKILL what is left after `grace_s`."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_server(
    command: Callable[[int], list[str]],
    *,
    ready_path: str = "/v2/health/ready",
    timeout_s: float = 120.0,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    poll_s: float = 0.1,
) -> Spawned:
    """Start `command(port)` on a free loopback port and return once `ready_path` answers 200.

    Raises RunFailedError (the log named) when the process exits first or is not ready within
    `timeout_s`; the process is stopped before raising. Used as a context (`with
    start_server(...) as s:`), the server is stopped when the block ends.
    """
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    out = log.open("wb") if log is not None else None
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            command(port),
            stdout=out or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    finally:
        if out is not None:
            out.close()  # the child holds its own copy of the descriptor
    where = f"; see {log}" if log is not None else ""
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RunFailedError(
                f"the server exited ({proc.returncode}) before becoming ready{where}"
            )
        if _ready(url + ready_path):
            return Spawned(proc=proc, url=url, ready_s=time.monotonic() - t0)
        # Polling is the only signal a foreign server gives; the interval bounds the error
        # of `ready_s`.
        time.sleep(poll_s)
    stop_group(proc)
    raise RunFailedError(f"the server was not ready within {timeout_s:g} s{where}")
