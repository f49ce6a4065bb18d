"""A daemon thread that takes a sample now and every `period_s` until stopped, and a last one then.

What the periodic samplers share: a process tree's peak memory (`peak_memory.TreeSampler`), a
data stage's memory (`data.meter.MemorySampler`) and a server's /metrics and CPU
(`load.scrape.Sampler`). What one sample is, and where it goes, is theirs (`_sample`).
"""

from __future__ import annotations

import abc
import threading
from typing import Self


class SamplingThread(abc.ABC):
    """`start()` ... `stop()`, or `with`: `_sample` runs in a daemon thread at the start, every
    `period_s`, and once more at the stop (the counters' final value)."""

    def __init__(self, period_s: float, name: str) -> None:
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @abc.abstractmethod
    def _sample(self) -> None:
        """Take one sample (on the thread, and once more on the caller's at the stop)."""

    def _more(self) -> bool:
        """Whether there is anything left to sample (False ends the thread early)."""
        return True

    def _loop(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.period_s) or not self._more():
                return

    def start(self) -> Self:
        self._thread.start()
        return self

    def halt(self) -> None:
        """Stop the thread (a bounded wait for it) and take the last sample."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.halt()
