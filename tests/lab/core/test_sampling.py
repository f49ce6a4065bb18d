"""The periodic sampling thread (`core/sampling.py`) under the memory and /metrics samplers."""

from __future__ import annotations

import threading

from scalelab.lab.core.sampling import SamplingThread


class Counting(SamplingThread):
    def __init__(self, period_s: float, more: bool = True) -> None:
        super().__init__(period_s, "counting")
        self.threads: list[str] = []
        self.first = threading.Event()
        self.more = more

    def _sample(self) -> None:
        self.threads.append(threading.current_thread().name)
        self.first.set()

    def _more(self) -> bool:
        return self.more


def test_one_sample_at_the_start_and_one_at_the_stop() -> None:
    with Counting(period_s=60.0) as s:
        assert s.first.wait(10)
    # The thread's first sample, then the last one on the caller's thread: the 60 s wait
    # between them was cut short by the stop.
    assert s.threads == ["counting", threading.current_thread().name]
    assert not s._thread.is_alive()


def test_nothing_left_to_sample_ends_the_thread_early() -> None:
    s = Counting(period_s=0.001, more=False).start()
    s._thread.join(10)
    assert not s._thread.is_alive() and s.threads == ["counting"]
    s.halt()
    assert len(s.threads) == 2
