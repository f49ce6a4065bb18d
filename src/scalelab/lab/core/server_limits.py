"""What the server's own signals of one level say limited it, each phrase citing its number and
where it came from: refusals at admission, an engine's full slots or KV cache, a queue longer
than the compute, the server's CPU (and whether one thread does all the work), its GPU.

Pure: a level's `ServerSignals` in, a phrase out. The sheet's limiting cell and the limit
inference (core/limits.py) read it; the inferences across levels from the client's own records
(a throughput plateau, TTFT growing per stream) are limits.py's, which sees every level.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.lab.core.signals import ServerSignals
from scalelab.lab.core.units import format_bytes

SERVER_CPU_BUSY = 0.85
"""The server's busy cores at or above this share of its cores: its CPU is the limit."""
ONE_THREAD = 0.85
"""A thread busy at least this share of one core, with the process under one and a half cores:
one thread does the work."""
KV_FULL = 0.95
GPU_BUSY = 0.9


@dataclass(frozen=True, kw_only=True)
class ServerFinding:
    resource: str
    detail: str
    saturated: bool
    """False: what the server showed, none of it at its limit."""


def _src(sig: ServerSignals, *fields: str) -> str:
    kinds = {sig.sources[f] for f in fields if f in sig.sources}
    return f" ({'; '.join(sorted(kinds))})" if kinds else ""


def _refusals(sig: ServerSignals, trials: int | None) -> ServerFinding | None:
    if not sig.refused:
        return None
    codes = "/".join(sorted(sig.refused_by_status)) or "503/429"
    trials = sig.requests or trials
    share = f" = {sig.refused / trials:.1%} of {trials:,} requests" if trials else ""
    rate = f" ({sig.refused_rps:.3g} refusals/s)" if sig.refused_rps else ""
    return ServerFinding(resource="admission", saturated=True,
                         detail=f"{sig.refused:,} refused with {codes}{share}{rate}"
                                f"{_retry_after(sig)}: the server turns work away above its "
                                "admission limit")


def _retry_after(sig: ServerSignals) -> str:
    """What the refusals said of when to come back: Retry-After, its longest value."""
    if sig.retry_after is None:
        return ""
    if not sig.retry_after:
        return ", without Retry-After"
    some = (f" on {sig.retry_after_count:,} of them" if sig.retry_after_count is not None
            and sig.refused and sig.retry_after_count < sig.refused else "")
    longest = f" (up to {sig.retry_after_s:.3g} s)" if sig.retry_after_s is not None else ""
    return f", Retry-After{longest}{some}"


def _engine(sig: ServerSignals) -> ServerFinding | None:
    if (sig.preemptions or 0) > 0 or (sig.kv_cache_use or 0) >= KV_FULL:
        kv = f"KV cache {sig.kv_cache_use:.0%} used" if sig.kv_cache_use is not None else ""
        pre = f"{sig.preemptions:g} preemptions" if sig.preemptions else ""
        return ServerFinding(resource="kv-cache", saturated=True,
                             detail=", ".join(x for x in (kv, pre) if x)
                             + _src(sig, "kv_cache_use", "preemptions"))
    if sig.queue_ms is not None and sig.compute_ms and sig.queue_ms >= sig.compute_ms:
        return ServerFinding(resource="queue", saturated=True,
                             detail=f"{sig.queue_ms:.3g} ms queued vs {sig.compute_ms:.3g} ms "
                                    f"computing per request" + _src(sig, "queue_ms"))
    if sig.waiting is not None and sig.waiting >= 1:
        running = f"up to {sig.running:g} running" if sig.running is not None else ""
        slots = f" of {sig.slots} slots" if sig.slots is not None and running else ""
        return ServerFinding(resource="engine slots", saturated=True,
                             detail=", ".join(x for x in (running + slots,
                                                          f"up to {sig.waiting:g} waiting")
                                              if x) + _src(sig, "waiting", "running"))
    if sig.slots is not None and sig.running is not None and sig.running >= sig.slots:
        return ServerFinding(resource="engine slots", saturated=True,
                             detail=f"{sig.running:g} of {sig.slots} slots busy"
                                    + _src(sig, "running", "slots"))
    return None


def _cpu(sig: ServerSignals) -> ServerFinding | None:
    busy, cores = sig.busy_cores, sig.cores
    if busy is None or cores is None:
        return None
    wait = sig.cpu_wait_cores or 0.0
    wanted = busy + wait
    head = f"{busy:.2f} of {cores} cores busy"
    if wait >= 0.05:
        head += f", {wanted:.2f} wanted ({wait:.2f} runnable but waiting for a CPU)"
    if wanted >= SERVER_CPU_BUSY * cores:
        return ServerFinding(resource="server cpu", saturated=True,
                             detail=head + _src(sig, "busy_cores"))
    thread = sig.busiest_thread_cores
    thread_wanted = None if thread is None else thread + (sig.busiest_thread_wait_cores or 0)
    one = (thread_wanted is not None and thread_wanted >= ONE_THREAD and wanted < 1.5) or (
        thread_wanted is None and sig.threads is None and ONE_THREAD <= busy < 1.15)
    if cores >= 2 and one:
        said = ""
        if thread is not None and thread_wanted is not None:
            said = (f" (its busiest thread ran {thread:.2f} cores"
                    + (f" and waited {thread_wanted - thread:.2f} for a CPU other work held)"
                       if thread_wanted - thread >= 0.05 else ")"))
        return ServerFinding(resource="server cpu", saturated=True,
                             detail=f"{head}: one core saturated, the work runs on one thread"
                                    f"{said}" + _src(sig, "busy_cores"))
    return None


def _gpu(sig: ServerSignals) -> ServerFinding | None:
    if sig.gpu_util is None or sig.gpu_util < GPU_BUSY:
        return None
    mem = f", {format_bytes(sig.gpu_memory_bytes)} GPU memory" if sig.gpu_memory_bytes else ""
    return ServerFinding(resource="gpu", saturated=True,
                         detail=f"GPU {sig.gpu_util:.0%} busy{mem}" + _src(sig, "gpu_util"))


def server_finding(sig: ServerSignals, *, trials: int | None = None) -> ServerFinding | None:
    """The server's limit at a level, strongest first (refusals, the engine's slots or KV
    cache or queue, the CPU, the GPU); else what it showed, unsaturated; None when it showed
    nothing."""
    for f in (_refusals(sig, trials), _engine(sig), _cpu(sig), _gpu(sig)):
        if f is not None:
            return f
    seen = [
        *([f"cpu {sig.busy_cores:.2f}"
           + (f" of {sig.cores} cores" if sig.cores else " cores")] if sig.busy_cores is not None
          else []),
        *([f"rss {format_bytes(sig.rss_bytes)}"] if sig.rss_bytes is not None else []),
        *([f"{sig.running:g} running"] if sig.running is not None else []),
        *([f"GPU {sig.gpu_util:.0%}"] if sig.gpu_util is not None else []),
    ]
    if not seen:
        return None
    return ServerFinding(resource="server", saturated=False,
                         detail=", ".join(seen) + _src(sig, "busy_cores", "rss_bytes",
                                                       "running", "gpu_util"))


ENGINE_RESOURCES = ("engine slots", "kv-cache", "queue")


def server_cell(sig: ServerSignals | None, machine: str, *, trials: int | None = None,
                stage_said: bool = False) -> str:
    """The sheet's limiting cell with the server's finding: a saturated server resource leads
    (before the machine's line when that is saturated too); an unsaturated one is said where
    the machine's line says nothing saturated or nothing measured. `stage_said`: the cell
    already leads with the stage's own engine line (the reference engine's sampler), which an
    engine finding would only repeat."""
    f = server_finding(sig, trials=trials) if sig is not None else None
    if f is None or (stage_said and f.resource in ENGINE_RESOURCES):
        return machine
    quiet = machine.startswith(("none saturated", "not measured"))
    if f.saturated:
        return f"{f.resource}: {f.detail}" + ("" if quiet else f"; {machine}")
    return f"none saturated (server {f.detail})" if quiet else machine
