"""Row validation: one typing pass for all rows, rule-by-rule records for the failing ones."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from scalelab.system.data.flights import FLIGHT_COLUMNS
from scalelab.system.data.quarantine import NARROW, RANGES, validate

ROW = dict(zip(FLIGHT_COLUMNS, [
    "2013", "1", "1", "517", "515", "2", "830", "819", "11", "UA", "1545", "N14228", "EWR",
    "IAH", "227", "1400", "5", "15", "2013-01-01T10:00:00Z"], strict=True))


def _frame(*changes: dict[str, str | None]) -> pl.DataFrame:
    rows = [{**ROW, **c} for c in changes]
    return pl.DataFrame(rows, schema=dict.fromkeys(FLIGHT_COLUMNS, pl.String)).with_columns(
        pl.lit("f.csv").alias("_file"), pl.int_range(1, len(rows) + 1).alias("_row"))


def test_rows_only_the_full_typing_accepts_stay_valid_in_order() -> None:
    frame = _frame({}, {"dep_delay": " -5 "}, {"month": "13"},
                   {"time_hour": "2013-01-01 11:00:00"}, {"flight": "\t7\n"}, {})
    good, q = validate(frame, carriers=["UA"], origins=["EWR"])
    assert good["_row"].to_list() == [1, 2, 4, 5, 6]
    assert good["dep_delay"].to_list() == [2, -5, 2, 2, 2]
    assert good["flight"].to_list() == [1545, 1545, 1545, 7, 1545]
    assert good["time_hour"][2] == datetime(2013, 1, 1, 11)
    assert q.select("row", "column", "rule", "value").rows() == [(3, "month", "range", "13")]


def test_every_failed_rule_of_a_row_is_recorded_with_its_raw_value() -> None:
    frame = _frame({"year": "20x3", "carrier": "ZZ", "dep_delay": None, "distance": "99999"},
                   {"dest": "iah", "origin": None, "sched_dep_time": "1275"}, {})
    good, q = validate(frame, carriers=["UA"], origins=["EWR"])
    assert good["_row"].to_list() == [3]
    assert sorted(q.select("row", "column", "rule", "value").rows()) == [
        (1, "carrier", "domain", "ZZ"), (1, "dep_delay", "label", None),
        (1, "distance", "range", "99999"), (1, "year", "type", "20x3"),
        (2, "dest", "domain", "iah"), (2, "origin", "required", None),
        (2, "sched_dep_time", "range", "1275")]


def test_valid_integers_come_narrow_and_every_range_fits() -> None:
    good, _ = validate(_frame({}), carriers=["UA"], origins=["EWR"])
    assert {c: good.schema[c] for c in NARROW} == NARROW
    for c, (lo, hi) in RANGES.items():
        assert pl.Series([lo, hi]).cast(NARROW[c], strict=True).to_list() == [lo, hi]
