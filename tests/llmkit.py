"""The OpenAI-compatible servers the tests start: the deterministic test server
(tests/lab/load/llm_server.py) and the project's own `scalelab generate serve` (tiny model).

    with llm_server("--ttft-ms", "20", "--gap-ms", "10") as url: ...
    with generate_server(log, "--max-num-seqs", "2") as spawned: ...

each yields once its server listens on 127.0.0.1 and kills it afterwards, whatever the test did.
`server_truth`, `quantile_bounds` and `StallWatch` hold a client's timing to what the server really
did, with the client's own measured starvation as the only slack.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from scalelab.lab.load.llm.result import LlmResult
from scalelab.layers.web.spawn import Spawned, start_server

SERVER = Path(__file__).parent / "lab" / "load" / "llm_server.py"
PREC = 0.999  # HdrHistogram at 3 significant digits reads within 0.1% of the sample
JITTER_MS = 8.0  # what an unstarved but busy client's event loop may add to a read


@contextlib.contextmanager
def llm_server(*args: str, realtime: bool = False) -> Iterator[str]:
    """`realtime`: the server in SCHED_FIFO (priority 1; only where `realtime_ok`), so that on
    a loaded machine its chunks go out at their due times, not in a late burst."""
    proc = subprocess.Popen([sys.executable, str(SERVER), *args], stdout=subprocess.PIPE,
                            text=True)
    if realtime:
        os.sched_setscheduler(proc.pid, os.SCHED_FIFO, os.sched_param(1))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"llm test server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.contextmanager
def generate_server(log: Path, *flags: str, env: Mapping[str, str] | None = None,
                    unset: Sequence[str] = ()) -> Iterator[Spawned]:
    """`scalelab generate serve --model tiny` with one torch thread and `flags`, its output in
    `log` and its cache ($SCALELAB_CACHE) beside it, ready once /health answers. Its
    environment is this process's without `unset`, with `env` added."""

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "scalelab", "generate", "serve", "--model", "tiny",
                "--port", str(port), "--torch-threads", "1", *flags]

    full = {k: v for k, v in os.environ.items() if k not in unset}
    full.update({"SCALELAB_CACHE": str(log.parent), **(env or {})})
    with start_server(command, ready_path="/health", log=log, env=full, timeout_s=180) as s:
        yield s


def server_truth(url: str, skip: int = 0) -> dict[str, list[float]]:
    """GET /truth of a running test server: its own TTFT and e2e (ms) of every stream that
    ended, as it really sent them (see llm_server.py), in arrival order from the `skip`-th on
    (a server shared by a module's tests has the earlier tests' streams first)."""
    with urllib.request.urlopen(url + "/truth", timeout=10) as r:
        out: dict[str, list[float]] = json.loads(r.read())
    return {k: v[skip:] for k, v in out.items()}


def quantile_bounds(truth: list[float], q: float, n: int) -> tuple[float, float]:
    """Where a client's q-quantile of n samples must lie, read off the server's `truth` values
    (len(truth) - n of them for warm-up streams the client did not count).

    HdrHistogram reads a q-quantile as the k-th smallest sample, k = round(q n). Each sample
    is at least its stream's truth value, so the k-th smallest sample is at least the k-th
    smallest truth; it is at most the (k + extra)-th smallest truth plus the most any sample
    exceeded its truth (the client's lag): an order statistic keeps what holds element by
    element, and dropping `extra` values moves one by at most `extra` ranks.
    """
    extra = len(truth) - n
    assert extra >= 0, (len(truth), n)
    k = max(int(q * n + 0.5), 1)
    s = sorted(truth)
    return s[k - 1], s[k - 1 + extra]


class StallWatch:
    """The longest a thread that asks to wake every millisecond was kept waiting (ms), in this
    process, from start() to stop(): how long a client here could be starved (not scheduled,
    or held off the GIL) and read a server's chunks in one late burst.

    A start()/stop() pair of plain functions as well (`watch_start`, `watch_stop`), so a Dask
    worker can run one in its own process (Client.run)."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t = time.monotonic()
        while not self._stop.is_set():
            time.sleep(0.001)
            t2 = time.monotonic()
            self.worst_s = max(self.worst_s, t2 - t - 0.001)
            t = t2

    def start(self) -> StallWatch:
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.worst_s * 1e3


_WATCH: list[StallWatch] = []


def fifo_threads(on: bool) -> None:
    """Every thread of this process in SCHED_FIFO (priority 1), or all back to the normal
    policy: `clock.realtime` for a whole process whose work runs on threads of its own (a Dask
    worker's event loop and task thread, a client's loop). Threads it makes afterwards inherit
    the policy. Linux, root or CAP_SYS_NICE (`realtime_ok`); a plain function, so a Dask
    worker or scheduler can run it (Client.run, Client.run_on_scheduler)."""
    policy, priority = (os.SCHED_FIFO, 1) if on else (os.SCHED_OTHER, 0)
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setscheduler(int(tid), policy, os.sched_param(priority))


def watch_start() -> None:
    _WATCH.append(StallWatch().start())


def watch_stop() -> float:
    return _WATCH.pop().stop()


def assert_within_truth(r: LlmResult, truth: dict[str, list[float]], lag: float) -> None:
    """A result's TTFT, e2e and TPOT medians against the server's own times (12 tokens each).

    Each request's TTFT and e2e are at least the server's (a client cannot send after the
    server read the request nor read before it wrote) and more only by the client's lag; its
    TPOT, (e2e - TTFT) / 11, is within lag / 11 of the server's either side. `lag` is the
    client's measured starvation plus JITTER_MS for what a busy event loop adds unstarved.
    """
    n = r.successes
    # TPOT is (e2e - TTFT) over the 11 tokens after the first.
    tpot = [(e - f) / 11 for f, e in zip(truth["ttft_ms"], truth["e2e_ms"], strict=True)]
    for name, got, values, slack in (("ttft", r.ttft.p50_ms, truth["ttft_ms"], (0.0, lag)),
                                     ("e2e", r.e2e.p50_ms, truth["e2e_ms"], (0.0, lag)),
                                     ("tpot", r.tpot.p50_ms, tpot, (lag / 11, lag / 11))):
        lo, hi = quantile_bounds(values, 0.5, n)
        assert got is not None
        assert (lo - slack[0]) * PREC <= got <= (hi + slack[1]) / PREC, (name, got, lo, hi, lag)
