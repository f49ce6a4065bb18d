"""Peak resident memory of one piece of work done in this process (and its children), not of
everything the process did before it.

`getrusage`'s ru_maxrss only grows: the second of several variants measured in one process
reads the first one's peak. Here the kernel's high-water mark is reset first where Linux allows
(writing "5" to /proc/self/clear_refs resets VmHWM to the current RSS), and the process tree's
resident memory is also sampled every `period_s` while the work runs (psutil), which covers
children and kernels without clear_refs. The peak is the larger of the two; it includes what
the process already held (interpreter, data, models): the memory the machine needed while
this work ran.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import psutil

from scalelab.lab.core.sampling import SamplingThread

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")


def reset_high_water(path: Path = CLEAR_REFS) -> bool:
    """Reset this process's VmHWM to its current RSS; False where the kernel does not allow."""
    try:
        path.write_text("5", encoding="ascii")
    except OSError:
        return False
    return True


def high_water(path: Path = STATUS) -> int | None:
    """This process's VmHWM in bytes, or None where /proc does not say."""
    try:
        m = re.search(r"^VmHWM:\s+(\d+)\s+kB", path.read_text(encoding="ascii"), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def tree_rss(proc: psutil.Process, children: list[psutil.Process] | None = None) -> int:
    """Resident bytes of a process and its live descendants, or of the `children` given (a
    list kept between samples: listing them scans all of /proc); vanished ones are skipped,
    0 where none can be read."""
    total = 0
    try:
        procs = [proc, *(proc.children(recursive=True) if children is None else children)]
    except psutil.Error:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


class TreeSampler(SamplingThread):
    """The largest resident memory of a process tree, sampled every `period_s` between
    `start()` and `stop()` (e.g. a server's over one load level, read from outside it)."""

    def __init__(self, pid: int | None = None, period_s: float = 0.02) -> None:
        super().__init__(period_s, "peak-memory")
        self.peak_bytes = 0
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._proc = None

    def _sample(self) -> None:
        if self._proc is not None:
            self.peak_bytes = max(self.peak_bytes, tree_rss(self._proc))

    def _more(self) -> bool:
        # A tree whose root has exited has nothing left to sample (a step that never
        # reached stop() must not leave the thread polling).
        try:
            return self._proc is not None and self._proc.is_running()
        except psutil.Error:
            return False

    def stop(self) -> int:
        """Stop sampling; the peak in bytes (0: nothing could be read)."""
        self.halt()
        return self.peak_bytes


class PeakMemory:
    """`with PeakMemory() as m: work()` then `m.peak_bytes`: see the module docstring."""

    def __init__(self, period_s: float = 0.02) -> None:
        self.peak_bytes = 0
        self._reset = False
        self._sampler = TreeSampler(period_s=period_s)

    def __enter__(self) -> PeakMemory:
        self._reset = reset_high_water()
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        sampled = self._sampler.stop()
        hwm = high_water() if self._reset else None
        self.peak_bytes = max(sampled, hwm or 0)
