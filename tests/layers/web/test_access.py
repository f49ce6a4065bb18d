"""Access log modes and the token bucket behind `sampled`, with a fake clock."""

from __future__ import annotations

import logging

import pytest

from scalelab.layers.web.access import AccessLog, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_exact() -> None:
    b = TokenBucket(rate=2.0, burst=3.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.take(0.25) is False  # half a token back
    assert b.take(0.5) is True  # one whole token after 0.5 s at 2/s
    assert b.take(100.0) and b.take(100.0) and b.take(100.0) and not b.take(100.0)  # burst cap


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "test.access"]


@pytest.mark.parametrize(("mode", "written"), [("off", 0), ("full", 50), ("sampled", 5)])
def test_modes(mode: str, written: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.access")
    log = AccessLog("test.access", mode, per_second=5, clock=Clock())
    for i in range(50):
        log.log(200, "infer", request_id=f"r{i}")
    assert len(lines(caplog)) == written
    assert log.enabled is (mode != "off")


def test_sampled_keeps_errors_apart_and_counts_skips(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.access")
    clock = Clock()
    log = AccessLog("test.access", "sampled", per_second=2, clock=clock)
    ok = [log.log(200, request_id=f"ok{i}") for i in range(10)]
    assert ok == [True, True] + [False] * 8
    assert log.log(503, request_id="err0") is True  # successes spent their budget, not errors'
    clock.t += 0.5  # one success token back
    assert log.log(200, request_id="ok10") is True
    recs = lines(caplog)
    assert [r.request_id for r in recs] == ["ok0", "ok1", "err0", "ok10"]  # type: ignore[attr-defined]
    assert [r.status for r in recs] == [200, 200, 503, 200]  # type: ignore[attr-defined]
    # the next line written after skips says how many went unwritten since the last one
    assert recs[2].skipped == 8  # type: ignore[attr-defined]
    assert not hasattr(recs[0], "skipped") and not hasattr(recs[3], "skipped")


def test_bad_mode_and_rate() -> None:
    with pytest.raises(ValueError, match="not one of off, sampled, full"):
        AccessLog("x", "some")
    with pytest.raises(ValueError, match="per_second 0"):
        AccessLog("x", "full", per_second=0)
