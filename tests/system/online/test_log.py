"""The event log: exactly-once per event id, across a SIGKILL of the ingesting process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from online_fixtures import END, START

from scalelab.lab.core.errors import BadInputError
from scalelab.system.online.ingest import ingest_source, load_rules
from scalelab.system.online.log import EventLog
from scalelab.system.online.stream import EVENT_ID, ReplayConfig, build_stream


def _ingest_cmd(log: Path, schema: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scalelab", "online", "ingest", "--log", str(log),
            "--schema", str(schema), "--start", START, "--end", END, "--batch", "256", *extra]


def test_exactly_once_across_sigkill_and_a_full_resend(tmp_path: Path, week_schema: Path) -> None:
    log_path = tmp_path / "log.sqlite"
    proc = subprocess.Popen(_ingest_cmd(log_path, week_schema, "--progress"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    committed = 0
    for line in proc.stderr:  # the child reports each commit; kill it mid-stream
        if line.startswith("committed events"):
            committed += 1
            if committed == 5:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with EventLog(log_path) as log:
        before = log.totals("events")
        offset = log.offset("events")
    # Killed after at least 5 commits, before the end: the 6th may or may not have landed,
    # never half of it.
    assert before["batches"] >= 5 and before["consumed_ids"] == offset
    assert offset % 256 == 0

    # Restart from the very first event: everything consumed before the kill is a duplicate.
    r = subprocess.run(_ingest_cmd(log_path, week_schema, "--from-start", "--json"),
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    n = out["stream"]["rows"]
    assert out["events"]["duplicates"] == offset
    assert out["events"]["accepted"] + out["events"]["quarantined"] == n - offset
    with EventLog(log_path) as log:
        t = log.totals("events")
        ids = log.read("events").get_column(EVENT_ID).to_numpy()
    assert t["consumed_ids"] == n
    assert t["accepted"] + t["quarantined"] == n
    assert len(ids) == t["accepted"] and len(np.unique(ids)) == len(ids)
    expected = build_stream(ReplayConfig(start=START, end=END)).events.get_column(EVENT_ID)
    assert set(ids.tolist()) == set(expected.to_list())  # a clean week: nothing quarantined


def test_resume_continues_at_the_committed_offset(tmp_path: Path, week_schema: Path) -> None:
    s = build_stream(ReplayConfig(start=START, end=END))
    ev = s.feature_events()
    rules = load_rules(week_schema)
    with EventLog(tmp_path / "log.sqlite") as log:
        first = ingest_source(log, rules, "events", ev.head(1000), batch_size=300)
        assert first["batches"] == 4 and log.offset("events") == 1000
        rest = ingest_source(log, rules, "events", ev, batch_size=300)
        assert rest["received"] == ev.height - 1000 and rest["duplicates"] == 0
        again = ingest_source(log, rules, "events", ev, batch_size=300, resume=False)
        assert again["duplicates"] == ev.height and again["accepted"] == 0
        assert log.totals("events")["consumed_ids"] == ev.height


def test_the_id_index_refuses_a_second_write_of_an_id(tmp_path: Path) -> None:
    """Even a caller that skips the duplicate check cannot write an id twice."""
    import sqlite3

    frame = pl.DataFrame({EVENT_ID: [1, 2], "event_time": [None, None]},
                         schema={EVENT_ID: pl.Int64, "event_time": pl.Datetime("us")})
    with EventLog(tmp_path / "log.sqlite") as log:
        log.append("events", accepted=frame, rejects=pl.DataFrame(),
                   rejected_ids=np.zeros(0, dtype=np.int64), duplicates=0, received=2,
                   source_offset=2)
        with pytest.raises(sqlite3.IntegrityError):
            log.append("events", accepted=frame.head(1), rejects=pl.DataFrame(),
                       rejected_ids=np.zeros(0, dtype=np.int64), duplicates=0, received=1,
                       source_offset=3)
        assert log.offset("events") == 2 and log.totals("events")["batches"] == 1


def test_a_file_that_is_not_a_log_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "notes.sqlite"
    p.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(BadInputError, match="not a scalelab event log"):
        EventLog(p)
    os.remove(p)
