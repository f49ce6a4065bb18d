"""The driver spine alone (`load/driver.py`), under a protocol whose exchange is a loop turn.

The HTTP and streaming drivers are tested against real servers (test_generator.py,
test_llm_stream.py); this pins what they share: warm-up and measured counts, request rotation,
the stopping rule, the closed loop's request count, and what `_finish` fills in.
"""

from __future__ import annotations

import asyncio

from scalelab.lab.load.clock import now
from scalelab.lab.load.driver import Driver
from scalelab.lab.load.result import Part
from scalelab.lab.load.send import SendConfig, Target


class TurnDriver(Driver[Part, int]):
    """Each request is answered on the next loop turn; a request b"bad" fails as "status"."""

    def __init__(self, cfg: SendConfig) -> None:
        super().__init__(cfg, Part())
        self.sent_bytes: list[bytes] = []
        self.flight = 0
        self.progress: list[int] = []

    def _dispatch(self, due: float, measured: bool, woke: float) -> None:
        if measured:
            self._lagged(due, woke)
        self._start(measured)

    def _start(self, measured: bool) -> None:
        req = self._next_request(measured)
        self.sent_bytes.append(req)
        self.flight += 1
        self.loop.call_soon(self._answer, req, measured)

    def _answer(self, req: bytes, measured: bool) -> None:
        self.flight -= 1
        if req == b"bad":
            if measured:
                self.status["500"] += 1
            self._fail("status", measured)
        elif measured:
            self.res.ok += 1
        else:
            self.res.warmup_requests += 1

    async def _clients(self) -> None:
        while self.can_send():
            measured = now() >= self.warm_end
            self._count_closed_send(measured)
            self._start(measured)
            await asyncio.sleep(0)

    def _progress(self) -> int:
        self.progress.append(self.res.sent)
        return self.res.sent

    async def _drain(self) -> None:
        while self.flight:
            await asyncio.sleep(0)

    def _close_all(self) -> None:
        pass


def _cfg(**kw: object) -> SendConfig:
    return SendConfig(target=Target.parse("http://127.0.0.1:9/"),  # never connected
                      requests=[b"a", b"bad", b"c"], **kw)  # type: ignore[arg-type]


def test_open_loop_counts_the_window_and_rotates() -> None:
    async def go() -> tuple[TurnDriver, Part]:
        d = TurnDriver(_cfg(mode="open", warmup_s=0.045))
        times = [i * 0.01 for i in range(12)]  # 0.00 .. 0.11: five in the warm-up
        return d, await d.run_open(times, now() + 0.01)

    d, p = asyncio.run(go())
    assert d.sent_bytes == [b"a", b"bad", b"c"] * 4
    assert p.sent == 7 and p.warmup_requests == 5  # i = 0..4, failed or not
    # measured i = 5..11: c, a, bad, c, a, bad, c
    assert p.ok == 5 and p.errors_by_kind == {"status": 2} and p.errors_by_status == {"500": 2}
    assert not p.stopped_early and p.lag_blob
    assert p.window_start > 0 and p.last_send >= p.window_start


def test_closed_loop_sends_exactly_its_count() -> None:
    async def go() -> Part:
        d = TurnDriver(_cfg(mode="closed", concurrency=1, warmup_s=0.0, max_requests=9))
        return await d.run_closed(now() + 0.01)

    p = asyncio.run(go())
    assert p.sent == 9 and p.ok == 6 and p.errors_by_kind == {"status": 3}
    assert not p.stopped_early


def test_stopping_rule_ends_an_open_run_early() -> None:
    async def go() -> tuple[TurnDriver, Part]:
        d = TurnDriver(_cfg(mode="open", warmup_s=0.0))
        times = [i * 0.01 for i in range(1000)]  # 10 s planned
        return d, await d.run_open(times, now() + 0.01, stop_check=lambda sent, _: sent >= 20)

    d, p = asyncio.run(go())
    assert p.stopped_early
    assert d.progress and d.progress[-1] >= 20  # asked with the counts so far, then stopped
    assert 20 <= p.sent < 1000 and p.sent == p.ok + sum(p.errors_by_kind.values())


def test_a_schedule_started_late_counts_every_measured_send_late() -> None:
    async def go() -> Part:
        d = TurnDriver(_cfg(mode="open", warmup_s=0.045))
        times = [i * 0.01 for i in range(12)]
        # Due a second ago: every send is ~1 s late, far over clock.LATE_S.
        return await d.run_open(times, now() - 1.0)

    p = asyncio.run(go())
    assert p.sent == 7 and p.lag_late == 7
