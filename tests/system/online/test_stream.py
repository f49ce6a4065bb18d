"""The replayed stream: time order, late labels, seeded faults recorded with their rows."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.system.online.stream import ReplayConfig, build_stream, parse_fault, replay

SPAN = {"start": "2013-01-02T00", "end": "2013-01-04T00"}


def test_labels_arrive_after_their_delay_and_ticks_cover_every_event() -> None:
    s = build_stream(ReplayConfig(label_delay_hours=5, **SPAN))
    ev, seen_labels = 0, 0
    arrived: set[int] = set()
    for tick in replay(s, step_hours=3):
        ev += tick.events.height
        seen_labels += tick.labels.height
        assert (tick.events.get_column("event_time") < tick.now).all()
        assert (tick.labels.get_column("label_time") < tick.now).all()
        arrived |= set(tick.labels.get_column("event_id").to_list())
    assert ev == s.events.height == seen_labels == len(arrived)
    gap = s.events.select(pl.col("label_time") - pl.col("event_time")).to_series().unique()
    assert gap.to_list() == [timedelta(hours=5)]


def test_faults_are_seeded_and_recorded() -> None:
    faults = ["corrupt@2013-01-02T15", "label_flip@2013-01-03T00:hours=6",
              "rescale@2013-01-03T12:hours=12:column=distance:scale=2:offset=1"]
    a = build_stream(ReplayConfig(faults=[parse_fault(f) for f in faults], seed=1, **SPAN))
    b = build_stream(ReplayConfig(faults=[parse_fault(f) for f in faults], seed=1, **SPAN))
    clean = build_stream(ReplayConfig(**SPAN))
    assert a.events.equals(b.events)
    assert [f.rows > 0 for f in a.faults] == [True, True, True]
    m = a.manifest()
    assert [f["kind"] for f in m["faults"]] == ["corrupt", "label_flip", "rescale"]
    flip = (a.events.get_column("delay_class") != clean.events.get_column("delay_class"))
    assert int(flip.sum()) == a.faults[1].rows
    assert ((clean.events.get_column("delay_class").filter(flip) + 1) % 4
            == a.events.get_column("delay_class").filter(flip)).all()
    scaled = a.events.get_column("distance") != clean.events.get_column("distance")
    assert int(scaled.sum()) >= a.faults[2].rows  # the corrupted hour may also touch distance
    # corruption never turns a missing value into a present one elsewhere
    other = ~(a.events.get_column("event_time").dt.hour() == 15)
    assert a.events.filter(other)["temp"].null_count() == \
        clean.events.filter(other)["temp"].null_count()


def test_bad_fault_specs_say_how_to_write_one() -> None:
    with pytest.raises(BadInputError, match="KIND@START"):
        parse_fault("corrupt")
    with pytest.raises(BadInputError, match="rescale needs column"):
        parse_fault("rescale@2013-01-01T00")
    with pytest.raises(BadInputError, match="option 'x=1'"):
        parse_fault("corrupt@2013-01-01T00:x=1")
