"""The serve stage's servers, all started at once before anything is measured.

A server start is mostly one core's work (the interpreter, torch and the model loaded), so on
2 cores the five default servers (batching off and on, the sweep's replicas=1, replicas=2 and
threads=2) start in about the time of two or three started one after the other. They all
start before the first level and each then waits idle (its repository poll stats a file twice
a second) until its turn, so no start shares the CPU with a measurement; each server is
measured alone, as before. Where a server fails to start, its part of the stage fails and the
others run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from scalelab.lab.core.errors import RunFailedError
from scalelab.layers.web.spawn import Spawned, start_server, stop_group

WORKERS_READY_S = 120.0
"""How long a multi-worker server is waited for until every worker finished start-up (the
first one answering ready says nothing of the others, which share its port)."""


@dataclass(frozen=True, kw_only=True)
class Planned:
    """One server to start."""

    key: str
    """What the stage calls it ('batching=off', 'replicas=2', ...)."""
    command: Callable[[int], list[str]]
    """Its command line on a given port."""
    log: Path
    """Where its output goes."""
    workers: int = 1
    """Worker processes behind its port that must all finish start-up."""
    prom: Path | None = None
    """Its prometheus-client multiprocess directory (made empty here): every worker leaves a
    file there as it finishes start-up, which is how all of them are seen ready."""
    ready_path: str = "/v2/health/ready"
    """What answers 200 once it is ready (the OIP server's; the generation server's /health)."""


def worker_pids(prom_dir: Path) -> set[int]:
    """Worker processes that finished start-up: each writes prometheus-client's multiprocess
    files (`histogram_<pid>.db`, ...) from its lifespan, after its models loaded."""
    out = set()
    for f in prom_dir.glob("*.db"):
        tail = f.stem.rsplit("_", 1)[-1]
        if tail.isdigit():
            out.add(int(tail))
    return out


def all_started(proc: subprocess.Popen[bytes], prom_dir: Path, workers: int,
                wait_s: float = WORKERS_READY_S) -> bool:
    """Wait until `workers` processes finished start-up (see `worker_pids`); False when the
    server exits or the wait runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s:
        if proc.poll() is not None:
            return False
        if len(worker_pids(prom_dir)) >= workers:
            return True
        # The files are the only signal a worker gives; 0.1 s bounds how late we notice.
        time.sleep(0.1)
    return False


def _start(p: Planned, timeout_s: float) -> Spawned | str:
    env = None
    if p.prom is not None:
        shutil.rmtree(p.prom, ignore_errors=True)
        p.prom.mkdir(parents=True)
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(p.prom)}
    try:
        spawned = start_server(p.command, ready_path=p.ready_path, log=p.log, env=env,
                               timeout_s=timeout_s)
    except RunFailedError as e:
        return str(e)
    if p.prom is not None and not all_started(spawned.proc, p.prom, p.workers):
        stop_group(spawned.proc, grace_s=5.0)
        return (f"{p.workers} workers did not all start within {WORKERS_READY_S:g} s; "
                f"see {p.log}")
    return spawned


def start_all(planned: list[Planned], *,
              timeout_s: float = WORKERS_READY_S) -> dict[str, Spawned | str]:
    """Start every planned server at once (a thread each, waiting on its ready answer); each
    key's running server, or why it did not start."""
    if not planned:
        return {}
    for p in planned:
        p.log.parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=len(planned)) as pool:
        futures = [pool.submit(_start, p, timeout_s) for p in planned]
        try:
            started = [f.result() for f in futures]
        except BaseException:
            # Ctrl-C, or a start that raised something else than a failed start: let the other
            # starts finish, then stop every server that did start (each runs in its own
            # process group, which an interrupt here does not reach), so none outlives the run.
            pool.shutdown(wait=True)
            stop_all({str(i): f.result() for i, f in enumerate(futures)
                      if f.exception() is None})
            raise
    return {p.key: s for p, s in zip(planned, started, strict=True)}


def stop_all(servers: dict[str, Spawned | str]) -> None:
    """Stop every server that started (its process group), all at once: each one's graceful
    shutdown overlaps the others'."""
    running = [s.proc for s in servers.values() if isinstance(s, Spawned)]
    if running:
        with ThreadPoolExecutor(max_workers=len(running)) as pool:
            list(pool.map(lambda p: stop_group(p, grace_s=5.0), running))
