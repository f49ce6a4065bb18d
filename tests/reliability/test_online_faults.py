"""SIGKILL of the online ingester mid-window (issue 35): killed once in the middle of the event
stream and again in the middle of the label stream, with a corrupted hour in the week so the
quarantine is part of what must survive. Resumed at the committed offsets, the log reconciles
exactly (events in = events stored + quarantined, nothing lost, nothing counted twice) and holds
the same ids, quarantine and labels as an uninterrupted ingest of the same stream, and the
updater's view of it (StreamData, all it reads) is identical, so its decisions and model and
feature versions are too.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "system" / "online"))

from online_fixtures import END, SCHEMA_END, START

from scalelab.system.online.ingest import ingest_source, load_rules
from scalelab.system.online.log import EventLog
from scalelab.system.online.schema import write_schema
from scalelab.system.online.stream import (
    CACHE_ENV,
    EVENT_ID,
    LABEL_TIME,
    ReplayConfig,
    build_stream,
    parse_fault,
)
from scalelab.system.online.updater import StreamData

pytestmark = pytest.mark.reliability

FAULT = "corrupt@2013-01-05T15"
BATCH = 256


def _ingest(log: Path, schema: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scalelab", "online", "ingest", "--log", str(log),
            "--schema", str(schema), "--start", START, "--end", END, "--fault", FAULT,
            "--batch", str(BATCH), *extra]


def _kill_after(cmd: list[str], stream: str, commits: int) -> None:
    """Run `cmd`, SIGKILL it right after its `commits`-th commit of `stream`."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = 0
    for line in proc.stderr:
        if line.startswith(f"committed {stream} "):
            seen += 1
            if seen == commits:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the ingester ended first ({proc.returncode})"


def _contents(path: Path) -> dict[str, object]:
    with EventLog(path) as log:
        ev = log.read("events").get_column(EVENT_ID).to_numpy()
        q = log.quarantine("events")
        lab = log.labels()
        return {"events": sorted(ev.tolist()), "n_events": len(ev),
                "quarantined": sorted(set(q.get_column(EVENT_ID).to_list()))
                if q.height else [],
                "labels": sorted(lab.get_column(EVENT_ID).to_list()),
                "totals": {s: log.totals(s) for s in ("events", "labels")},
                "offsets": {s: log.offset(s) for s in ("events", "labels")}}


def test_sigkill_mid_window_loses_nothing_and_counts_nothing_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # the flights table: never in $HOME
    schema = write_schema(tmp_path / "schema.json", ReplayConfig(end=SCHEMA_END))
    stream = build_stream(ReplayConfig(start=START, end=END, faults=[parse_fault(FAULT)]))
    rows = stream.events.height

    killed = tmp_path / "killed.sqlite"
    _kill_after(_ingest(killed, schema, "--progress"), "events", 9)  # mid events (~day 3)
    mid = _contents(killed)
    # killed after its 9th commit (a later one may land before the signal), never mid-batch
    assert mid["offsets"]["labels"] == 0 and mid["offsets"]["events"] % BATCH == 0  # type: ignore
    assert 9 * BATCH <= mid["offsets"]["events"] < rows  # type: ignore[index, operator]
    _kill_after(_ingest(killed, schema, "--progress"), "labels", 4)  # resumed; mid labels
    r = subprocess.run(_ingest(killed, schema, "--json"), capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout)
    assert last["events"]["received"] == 0  # the events were all in before this run
    assert last["events"]["duplicates"] == last["labels"]["duplicates"] == 0

    # an uninterrupted ingest of the same stream, for comparison
    whole = tmp_path / "whole.sqlite"
    rules = load_rules(schema)
    with EventLog(whole) as log:
        for name, src in (("events", stream.feature_events()),
                          ("labels", stream.label_events())):
            ingest_source(log, rules, name, src, batch_size=BATCH)

    got, want = _contents(killed), _contents(whole)
    for s in ("events", "labels"):
        t = got["totals"][s]  # type: ignore[index]
        assert t["consumed_ids"] == t["received"] == rows and t["duplicates"] == 0
        assert t["accepted"] + t["quarantined"] == rows  # events in = stored + quarantined
        assert got["offsets"][s] == rows  # type: ignore[index]
    ev, quar = got["events"], got["quarantined"]
    assert len(ev) == got["n_events"] == got["totals"]["events"]["accepted"]  # type: ignore
    assert not set(ev) & set(quar) and len(ev) + len(quar) == rows  # type: ignore[arg-type]
    assert len(quar) > 0  # type: ignore[arg-type]  # the corrupted hour was quarantined
    assert set(ev) | set(quar) == set(stream.events.get_column(EVENT_ID).to_list())  # type: ignore
    for k in ("events", "quarantined", "labels", "offsets"):
        assert got[k] == want[k], k
    assert {s: {k: v for k, v in t.items() if k != "batches"}  # type: ignore[attr-defined]
            for s, t in got["totals"].items()} == {  # type: ignore[attr-defined]
        s: {k: v for k, v in t.items() if k != "batches"}  # type: ignore[attr-defined]
        for s, t in want["totals"].items()}  # type: ignore[attr-defined]

    # the updater reads the log only through StreamData (sorted by time and id): it sees the
    # very same arrays, so its windows, decisions and model and feature versions are the same
    with EventLog(killed) as a, EventLog(whole) as b:
        da = StreamData.from_frames(a.read("events"), a.labels(), a.quarantine())
        db = StreamData.from_frames(b.read("events"), b.labels(), b.quarantine())
    for field in ("ids", "t_event", "label", "t_label"):
        np.testing.assert_array_equal(getattr(da, field), getattr(db, field))
    assert da.events.equals(db.events) and da.rejects.sort(EVENT_ID).equals(
        db.rejects.sort(EVENT_ID))
    assert (da.label >= 0).sum() == len(ev)  # type: ignore[arg-type]  # every stored event labelled


def test_labels_past_the_horizon_are_counted_not_used_and_the_log_stays_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every 7th label arrives 48 h late; with a 24 h horizon those are counted past the
    horizon and treated as never arrived; labels of quarantined events are counted unjoined.
    stored = joined + past_horizon + unjoined, and the log's own totals still reconcile."""
    from scalelab.cli import run

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    schema = write_schema(tmp_path / "schema.json", ReplayConfig(end=SCHEMA_END))
    stream = build_stream(ReplayConfig(start=START, end=END, faults=[parse_fault(FAULT)]))
    labels = stream.label_events()
    late = pl.col(EVENT_ID) % 7 == 0
    labels = labels.with_columns(
        pl.when(late).then(pl.col(LABEL_TIME) + pl.duration(hours=48))
        .otherwise(pl.col(LABEL_TIME)).alias(LABEL_TIME)).sort([LABEL_TIME, EVENT_ID])
    log_path = tmp_path / "log.sqlite"
    with EventLog(log_path) as log:
        ingest_source(log, load_rules(schema), "events", stream.feature_events(),
                      batch_size=BATCH)
        ingest_source(log, load_rules(schema), "labels", labels, batch_size=BATCH)
        stored = set(log.read("events").get_column(EVENT_ID).to_list())
        quarantined = set(log.quarantine("events").get_column(EVENT_ID).to_list())
        lt = log.totals("labels")
    rows = stream.events.height
    assert lt["received"] == lt["accepted"] + lt["quarantined"] == rows
    n_late = len([i for i in stored if i % 7 == 0])

    def replay(*extra: str) -> dict[str, Any]:
        assert run(["online", "replay", "--log", str(log_path), "--schema", str(schema),
                    "--bootstrap-days", "4", "--policy", "never", "--json", *extra]) == 0
        return dict(json.loads(capsys.readouterr().out))

    h = replay("--label-horizon-hours", "24")
    assert h["labels"] == {"log_accepted": rows, "stored": rows, "joined": len(stored) - n_late,
                           "past_horizon": n_late, "unjoined": len(quarantined),
                           "horizon_h": 24.0}
    assert n_late > 0 and len(quarantined) > 0
    every = replay()  # no horizon: the late labels are used
    assert every["labels"]["past_horizon"] == 0
    assert every["labels"]["joined"] == len(stored) == rows - len(quarantined)
    assert h["scored"] < every["scored"]  # the late labels scored nothing under the horizon
    with EventLog(log_path) as log:  # reading never changes the log
        assert log.totals("labels") == lt
