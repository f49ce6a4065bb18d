"""The promotion gate's arithmetic and its refusal rule (exact)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from serve_fixtures import add_model, write_holdout

from scalelab.lab.core.gate import HoldoutQuality
from scalelab.lab.core.quality import scores
from scalelab.system.serve.promote import compare, gate


def test_per_class_f1_exact() -> None:
    y = np.array([0, 0, 1, 1, 2, 2])
    p = np.array([0, 1, 1, 1, 0, 2])
    # class 0: tp1 fp1 fn1 -> 2/4; class 1: tp2 fp1 fn0 -> 4/5; class 2: tp1 fp0 fn1 -> 2/3
    assert scores(y, p, list("abcd")).per_class_f1 == {"a": 0.5, "b": 0.8, "c": 2 / 3,
                                                         "d": None}


def ev(acc: float, macro: float, per: dict[str, float | None]) -> HoldoutQuality:
    return HoldoutQuality(version=1, rows=10, accuracy=acc, macro_f1=macro, per_class_f1=per)


def test_compare_refuses_any_class_beyond_tolerance() -> None:
    cur = ev(0.80, 0.60, {"a": 0.9, "b": 0.3, "c": None})
    assert compare(cur, ev(0.795, 0.595, {"a": 0.895, "b": 0.295, "c": 0.1}), 0.01) == []
    reasons = compare(cur, ev(0.85, 0.65, {"a": 0.95, "b": 0.25, "c": None}), 0.01)
    assert len(reasons) == 1 and "class 'b'" in reasons[0]
    reasons = compare(cur, ev(0.70, 0.60, {"a": 0.9, "b": 0.3, "c": None}), 0.01)
    assert len(reasons) == 1 and reasons[0].startswith("accuracy")


def test_gate_on_a_holdout(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "m", {1: 1, 2: 2})
    worse = write_holdout(tmp_path / "h1.parquet", repo, "m", 1)
    d = gate(repo, "m", 2, worse, tolerance=0.0)
    assert not d.accepted and d.current.accuracy == 1.0 and d.candidate.accuracy < 1.0
    assert not (repo / "m" / "serving.json").exists()
    better = write_holdout(tmp_path / "h2.parquet", repo, "m", 2)
    d = gate(repo, "m", 2, better, dry_run=True)
    assert d.accepted and d.routing is None and not (repo / "m" / "serving.json").exists()
    d = gate(repo, "m", 2, better)
    assert d.accepted and d.routing is not None and d.routing.current == 2
