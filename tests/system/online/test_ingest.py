"""Validation on arrival against the schema file, quarantine with reasons, reconciliation."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.flights import FEATURES
from scalelab.system.online.ingest import (
    REJECT_SCHEMA,
    ColumnRule,
    load_rules,
    reconcile,
    validate_events,
    validate_labels,
)
from scalelab.system.online.stream import ReplayConfig, build_stream, parse_fault

T = datetime(2013, 1, 1, 5)


def _rules() -> dict[str, ColumnRule]:
    return {"carrier": ColumnRule(name="carrier", type="string", nullable=False,
                                  domain=("AA", "UA")),
            "distance": ColumnRule(name="distance", type="float", nullable=False, min=17.0,
                                   max=4983.0),
            "temp": ColumnRule(name="temp", type="float", nullable=True, max_null_rate=0.5,
                               min=10.0, max=101.0)}


def _batch(**over: list[object]) -> pl.DataFrame:
    cols: dict[str, list[object]] = {
        "event_id": [1, 2, 3, 4], "event_time": [T] * 4, "carrier": ["AA", "UA", "AA", "UA"],
        "distance": [100.0, 200.0, 300.0, 400.0], "temp": [50.0, None, 60.0, 70.0]}
    cols.update(over)
    return pl.DataFrame(cols, schema={"event_id": pl.Int64, "event_time": pl.Datetime("us"),
                                      "carrier": pl.String, "distance": pl.Float64,
                                      "temp": pl.Float64})


def test_each_rule_quarantines_with_its_reason() -> None:
    bad, rej = validate_events(_batch(carrier=["AA", "##", None, "UA"],
                                      distance=[100.0, -1.0, 300.0, 400.0],
                                      temp=[50.0, None, float("nan"), 500.0]), _rules())
    assert bad.tolist() == [False, True, True, True]
    got = sorted(rej.select("event_id", "rule", "column", "value").iter_rows())
    assert got == [(2, "domain", "carrier", "##"), (2, "range", "distance", "-1.0"),
                   (3, "non_finite", "temp", "NaN"), (3, "required", "carrier", None),
                   (4, "range", "temp", "500.0")]


def test_a_wrong_type_or_a_missing_column_quarantines_the_whole_batch() -> None:
    b = _batch().with_columns(pl.col("distance").cast(pl.String))
    bad, rej = validate_events(b, _rules())
    assert bad.all() and set(rej.get_column("rule")) == {"type"}
    bad, rej = validate_events(_batch().drop("temp"), _rules())
    assert bad.all() and rej.get_column("rule").unique().to_list() == ["missing_column"]


def test_labels_must_name_a_class() -> None:
    b = pl.DataFrame({"event_id": [1, 2], "delay_class": [0, 7], "label_time": [T, T]})
    bad, rej = validate_labels(b)
    assert bad.tolist() == [False, True] and rej.get_column("rule").to_list() == ["range"]


def test_reconcile_marks_a_window_over_its_quarantine_tolerance() -> None:
    ok = _batch()
    rej = pl.DataFrame({"event_id": [9, 9], "event_time": [T, T], "rule": ["range", "domain"],
                        "column": ["distance", "carrier"], "value": ["-1", "#"]},
                       schema=REJECT_SCHEMA)
    w = reconcile(ok, rej, _rules(), start=T, end=T, max_quarantine_rate=0.1)
    assert (w.accepted, w.quarantined, w.quarantine_rate) == (4, 1, 0.2)
    assert w.status == "quarantined" and w.rules == {"domain": 1, "range": 1}
    assert reconcile(ok, rej, _rules(), start=T, end=T, max_quarantine_rate=0.25).status == "ok"
    clean = reconcile(ok, pl.DataFrame(schema=REJECT_SCHEMA), _rules(), start=T, end=T)
    assert clean.status == "ok" and clean.null_breaches == {}
    nulls = reconcile(_batch(temp=[None, None, None, 1.0]), pl.DataFrame(schema=REJECT_SCHEMA),
                      _rules(), start=T, end=T)
    assert nulls.null_breaches == {"temp": 0.75} and nulls.status == "ok"  # reported only


def test_a_corrupted_hour_fails_the_real_schema(week_schema: Path) -> None:
    rules = load_rules(week_schema)
    s = build_stream(ReplayConfig(start="2013-01-02T00", end="2013-01-03T00",
                                  faults=[parse_fault("corrupt@2013-01-02T15")], seed=3))
    ev = s.feature_events()
    bad, rej = validate_events(ev, rules)
    hit = (ev.get_column("event_time") == datetime(2013, 1, 2, 15)).to_numpy()
    assert s.faults[0].rows == int(hit.sum()) > 10
    assert bad.tolist() == hit.tolist()  # exactly the corrupted hour, nothing else
    assert set(rej.get_column("rule")) <= {"range", "domain", "non_finite"}


def test_schema_file_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="scalelab data infer"):
        load_rules(tmp_path / "none.json")
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"format": "scalelab.schema/1", "columns": [
        {"name": "carrier", "type": "string"}]}))
    with pytest.raises(BadInputError, match="no rules for feature columns"):
        load_rules(p)
    p.write_text(json.dumps({"format": "other"}))
    with pytest.raises(BadInputError, match="format must be"):
        load_rules(p)
    assert len(FEATURES) == 18
