"""The serve stage's fixed work (issue #34): its servers started at once, one `load run` step
over every level of a server, and the minimum the budget gives it (pure pieces; the stage end
to end is in test_serve_replicas.py and test_serve_search.py)."""

from __future__ import annotations

import pytest

from recordkit import rec
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.sizing import size_level
from scalelab.lab.diagnose.stages import serve
from scalelab.lab.diagnose.stages.serve import Lent, ServeStage, by_rate, servers_start_s


def test_starts_overlap_up_to_the_cores() -> None:
    assert servers_start_s(0, 2) == 0.0
    assert servers_start_s(1, 2) == 3.0
    assert servers_start_s(2, 2) == 3.0
    assert servers_start_s(7, 2) == 10.5  # the default's five servers: replicas=2 is three
    assert servers_start_s(6, 1) == 18.0
    assert servers_start_s(3, 8) == 3.0


def test_the_default_minimum_on_two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers 10.5 s (seven processes at once: replicas=2 is a master and two workers) + two
    steps of 1.5 s + 4 levels x 3 s + the batching=off search 17 s + three sweep searches of
    12 s = 90.5 s (96 s before)."""
    monkeypatch.setattr(serve.os, "cpu_count", lambda: 2)
    s = load_config(None, "default").stages.serve
    assert ServeStage().minimum_s(s, 1) == 10.5 + 2 * 13.5 + 17.0 + 3 * 12.0 == 90.5
    assert ServeStage().count(s, 1) == 2 + 1 + 3  # two level steps, four searches
    off = s.model_copy(update={"capacity": False})
    assert ServeStage().minimum_s(off, 2) == 3.0 + 4 * 13.5  # two servers, no search


def test_the_step_records_by_the_rate_each_offered() -> None:
    recs = [rec("serve", "rate", x) for x in (40.0, 80.0)]  # a step that failed at its third
    got = by_rate(recs, [40.0, 80.0, 200.0, 400.0])
    assert list(got) == [40.0, 80.0] and got[80.0] is recs[1]
    assert by_rate([rec("serve", "rate", 80.0)], [40.0, 80.0]) == {}  # out of order: not its


def test_a_first_chunk_from_the_shared_step_counts_its_part_of_that_step() -> None:
    """The level's sizing sees its first chunk take the step's time over its levels (here
    13.6 s over 4), as if the chunk had been its own step; the clock itself stands still."""
    lent = Lent(per_level_s=13.6 / 4, base=lambda: 100.0)
    first = rec("serve", "rate", 40.0)

    def chunk(seconds: float, index: int) -> object:
        assert index == 0
        lent.lend()
        return first

    got = size_level(chunk, [], first_s=2.0, share_s=10.0, clock=lent.clock)  # type: ignore[arg-type]
    assert got is not None
    assert got.extras["sizing"]["spent_s"] == 3.4 and got.extras["sizing"]["chunks"] == 1
    assert got.extras["sizing"]["stopped"] == "decided"
