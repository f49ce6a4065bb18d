"""A local server's process tree, read from outside it: found from the port it listens on (or
given by pid), its CPU seconds, resident memory and threads, and how busy its busiest thread
was — what tells "one core saturated, the work runs on one thread" from "the CPU is full"."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil


def local_port(url: str) -> int | None:
    """The port of `url` when its host is this machine (loopback or one of its addresses)."""
    p = urlsplit(url)
    host = p.hostname or ""
    port = p.port or (443 if p.scheme == "https" else 80)
    if host == "localhost":
        return port
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    if addr.is_loopback:
        return port
    with contextlib.suppress(OSError):
        mine = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
        if str(addr) in mine:
            return port
    return None


def pid_on_port(port: int) -> int | None:
    """The process listening on TCP `port` on this machine (its topmost listener when a
    parent and its workers share the socket); None when none is visible to this user."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    pids = {c.pid for c in conns
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    for pid in sorted(pids):
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(pid).parent()
            if parent is None or parent.pid not in pids:
                return pid
    return None


@dataclass(frozen=True, kw_only=True)
class TreeSample:
    """One read of the tree: CPU seconds (user + system), resident bytes, threads, and each
    thread's (seconds on a CPU, seconds runnable but waiting for one) by (pid, thread id)."""

    cpu_s: float
    rss_bytes: int
    threads: int
    per_thread: dict[tuple[int, int], tuple[float, float]]


def _schedstat(pid: int, tid: int) -> tuple[float, float] | None:
    """(on-CPU, run-queue wait) seconds of one thread from Linux's /proc schedstat: the wait is
    what tells a thread that wanted a whole core but got a share of it on a busy machine."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
            run_ns, wait_ns, *_ = f.read().split()
    except (OSError, ValueError):
        return None
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def read_tree(pid: int) -> TreeSample | None:
    """The process and its descendants now; None when the process is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    cpu, rss, threads = 0.0, 0, 0
    per: dict[tuple[int, int], tuple[float, float]] = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            cpu += t.user + t.system
            rss += p.memory_info().rss
            ts = p.threads()
            threads += len(ts)
            for th in ts:
                per[(p.pid, th.id)] = _schedstat(p.pid, th.id) or (
                    th.user_time + th.system_time, 0.0)
    return TreeSample(cpu_s=cpu, rss_bytes=rss, threads=threads, per_thread=per)


def busiest_thread(first: TreeSample, last: TreeSample) -> tuple[float, float]:
    """(seconds on a CPU, seconds waiting for one) of the thread that ran the most between two
    reads."""
    deltas = [(run - first.per_thread.get(k, (0.0, 0.0))[0],
               wait - first.per_thread.get(k, (0.0, 0.0))[1])
              for k, (run, wait) in last.per_thread.items()]
    return max(deltas, default=(0.0, 0.0))


def run_queue_wait(first: TreeSample, last: TreeSample) -> float:
    """Seconds the tree's threads spent runnable, waiting for a CPU, between two reads."""
    return sum(max(0.0, wait - first.per_thread.get(k, (0.0, 0.0))[1])
               for k, (_, wait) in last.per_thread.items())
