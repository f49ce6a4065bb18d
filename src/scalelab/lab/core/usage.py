"""What a piece of work cost the machine: CPU time of this process and its children over wall
time (busy cores), and the machine's I/O wait share, from the kernel's own counters.

`UsageMeter` brackets work done in this process or in children it waits for (a pipeline run
in-process, a torchrun job): CPU time comes from getrusage (self + waited-for children), which
is exact and costs two system calls. I/O wait comes from /proc/stat (Linux) and is the share of
the machine's CPU time spent waiting for I/O while the work ran: machine-wide, because per-task
delay accounting is off on most kernels; it is None where /proc/stat is not there.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.lab.core.signals import Resources

PROC_STAT = Path("/proc/stat")


def cpu_times() -> float:
    """CPU seconds (user + system) of this process plus its waited-for children so far."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def iowait_ticks(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """(iowait, total) clock ticks of all CPUs from /proc/stat's first line, or None."""
    try:
        first = path.read_text(encoding="ascii").split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 6:
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guests are already
    # counted in user and nice, so they are left out of the total.
    ticks = [int(x) for x in first[1:9]]
    return ticks[4], sum(ticks)


def iowait_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time in I/O wait between two `iowait_ticks` readings (pure)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def busy_ticks(path: Path = PROC_STAT) -> tuple[int, int, int] | None:
    """(busy, total) clock ticks of all CPUs from /proc/stat's first line and the number of
    CPUs it sums (its cpuN lines), or None: busy is everything but idle and I/O wait."""
    try:
        lines = path.read_text(encoding="ascii").split("\n")
    except OSError:
        return None
    first = lines[0].split()
    if not first or first[0] != "cpu" or len(first) < 6:
        return None
    ticks = [int(x) for x in first[1:9]]
    total = sum(ticks)
    cpus = sum(1 for ln in lines[1:] if ln.startswith("cpu") and ln[3:4].isdigit())
    return total - ticks[3] - ticks[4], total, max(1, cpus)


def busy_cores(before: tuple[int, int, int] | None,
               after: tuple[int, int, int] | None) -> float | None:
    """How many of the machine's cores were busy between two `busy_ticks` readings (pure)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * after[2]


SCHEDSTAT = Path("/proc/thread-self/schedstat")


def sched_times(path: Path = SCHEDSTAT) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for a CPU) of the calling thread so
    far, from the kernel's schedstat, or None where the kernel does not keep it. The wait is
    what a starved process cannot see in its own CPU time: it was ready and got no core."""
    try:
        fields = path.read_text(encoding="ascii").split()
    except OSError:
        return None
    if len(fields) < 2:
        return None
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


@dataclass(frozen=True, kw_only=True)
class Usage:
    cpu_s: float
    wall_s: float
    iowait_share: float | None
    """Machine-wide share of CPU time in I/O wait over the interval (None: not measured)."""

    @property
    def busy_cores(self) -> float | None:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else None

    def extras(self) -> dict[str, Any]:
        """The CPU seconds as a record extra (what energy is estimated from)."""
        return {"cpu_s": self.cpu_s}

    def resources(self, **more: float | int | None) -> Resources:
        """Busy cores and I/O wait as the record's typed signals (what the verdict reads),
        with any `more` of them the stage measured (comm_share, spilled_bytes)."""
        return Resources(cpu_busy_cores=self.busy_cores, iowait_share=self.iowait_share,
                         **more)  # type: ignore[arg-type]


class UsageMeter:
    """`with UsageMeter() as m: work()` then `m.usage`."""

    def __enter__(self) -> UsageMeter:
        self._cpu, self._io, self._t = cpu_times(), iowait_ticks(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.usage = Usage(cpu_s=cpu_times() - self._cpu, wall_s=time.perf_counter() - self._t,
                           iowait_share=iowait_share(self._io, iowait_ticks()))
