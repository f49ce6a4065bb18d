"""The routing rule and serving.json transitions."""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_fixtures import add_model

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.system.serve.canary import (
    Routing,
    bucket,
    choose,
    promote,
    read_routing,
    rollback,
    start_candidate,
)


def test_split_is_deterministic_and_close_to_the_weight() -> None:
    r = Routing(current=1, candidate=2, mode="canary", weight=0.25, seed=3)
    ids = [f"req-{i}" for i in range(4000)]
    picks = [choose(r, i, 1) for i in ids]
    assert picks == [choose(r, i, 1) for i in ids]
    share = picks.count(2) / len(picks)
    assert abs(share - 0.25) < 0.03
    assert bucket(3, "x") != bucket(4, "x")
    assert {choose(Routing(current=1), i, 9) for i in ids[:50]} == {1}
    shadow = Routing(current=1, candidate=2, mode="shadow")
    assert {choose(shadow, i, 1) for i in ids[:50]} == {1}


def test_routing_validation() -> None:
    with pytest.raises(BadInputError):
        Routing(weight=1.5)
    with pytest.raises(BadInputError):
        Routing(mode="canary")


def test_candidate_promote_rollback_cycle(tmp_path: Path) -> None:
    add_model(tmp_path, "m", {1: 1, 2: 2, 3: 3})
    r = start_candidate(tmp_path, "m", 3, mode="canary", weight=0.1)
    assert (r.current, r.candidate, r.mode) == (2, 3, "canary")
    r, what = rollback(tmp_path, "m")
    assert (r.current, r.candidate, r.mode) == (2, None, "none") and "stopped" in what
    r = promote(tmp_path, "m", 3)
    assert (r.current, r.previous) == (3, 2)
    r, what = rollback(tmp_path, "m")
    assert r.current == 2 and r.previous is None and "restored version 2" in what
    assert read_routing(tmp_path, "m") == r
    with pytest.raises(BadUsageError, match="no candidate"):
        rollback(tmp_path, "m")
    with pytest.raises(BadUsageError, match="no version 9"):
        start_candidate(tmp_path, "m", 9, mode="shadow", weight=0)
