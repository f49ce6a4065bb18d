"""The durable, append-only event log: SQLite in WAL mode, one transaction per arriving batch.

Exactly-once per event id across a crash: every batch commits, in ONE transaction, its accepted
events (an Arrow IPC segment), its quarantined events with reasons, the ids it consumed and the
ingester's source offset. An event id is consumed once (accepted or quarantined); a re-sent event
(the ingester restarted from an earlier offset, or a producer retried) is counted as a duplicate
and dropped. SIGKILL between two statements leaves the last committed batch and nothing of the
next: SQLite's WAL makes a commit atomic. `synchronous=NORMAL` survives a killed process (the
commit is in the OS's hands); pass durable=True (`synchronous=FULL`, an fsync per commit) to also
survive power loss.

Segments are columnar (a batch of 4,096 events is one ~0.5 MB blob) so appends and window reads
cost a handful of statements, not one per event; only the id index is per event (an INTEGER
PRIMARY KEY table without rowid, the uniqueness check).

For users who outgrow one machine, the same contract (idempotent append keyed by event id, offset
committed with the data) maps onto Kafka with a transactional producer; see docs/online.md.
"""

from __future__ import annotations

import io
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

import numpy as np
import polars as pl

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.flights import LABEL
from scalelab.system.online.stream import EVENT_ID, EVENT_TIME, LABEL_TIME

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches(
    batch INTEGER PRIMARY KEY, stream TEXT NOT NULL, source_offset INTEGER NOT NULL,
    t_min INTEGER, t_max INTEGER, received INTEGER NOT NULL, accepted INTEGER NOT NULL,
    quarantined INTEGER NOT NULL, duplicates INTEGER NOT NULL, committed_at REAL NOT NULL,
    data BLOB, rejects BLOB);
CREATE INDEX IF NOT EXISTS batches_time ON batches(stream, t_min, t_max);
CREATE TABLE IF NOT EXISTS seen(stream TEXT NOT NULL, event_id INTEGER NOT NULL,
    batch INTEGER NOT NULL, PRIMARY KEY(stream, event_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS offsets(stream TEXT PRIMARY KEY, source_offset INTEGER NOT NULL);
"""
STREAMS = ("events", "labels")


@dataclass(frozen=True, kw_only=True)
class Appended:
    """What one append committed."""

    batch: int
    received: int
    accepted: int
    quarantined: int
    duplicates: int


def _us(t: object) -> int | None:
    if t is None:
        return None
    assert isinstance(t, datetime)
    return int((t - datetime(1970, 1, 1)).total_seconds() * 1_000_000)


def _to_ipc(frame: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.write_ipc(buf, compression="uncompressed")
    return buf.getvalue()


def _from_ipc(blob: bytes) -> pl.DataFrame:
    return pl.read_ipc(io.BytesIO(blob))


class EventLog:
    """One SQLite file; a single writer (the ingester), any number of readers."""

    def __init__(self, path: str | Path, *, durable: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise BadInputError(f"event log {self.path} is not a file; pass a path like "
                                "log.sqlite")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a batch is one transaction.
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise BadInputError(f"{self.path} is not a scalelab event log ({e}); remove it or "
                                "pass another --log") from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------

    def new_ids(self, stream: str, ids: np.ndarray) -> np.ndarray:
        """Mask of `ids` not consumed yet (one range query, then a vectorised membership)."""
        if ids.size == 0:
            return np.zeros(0, dtype=bool)
        lo, hi = int(ids.min()), int(ids.max())
        rows = self.db.execute(
            "SELECT event_id FROM seen WHERE stream = ? AND event_id BETWEEN ? AND ?",
            (stream, lo, hi)).fetchall()
        if not rows:
            return np.ones(ids.size, dtype=bool)
        return ~np.isin(ids, np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)))

    def append(self, stream: str, *, accepted: pl.DataFrame, rejects: pl.DataFrame,
               rejected_ids: np.ndarray, duplicates: int, received: int,
               source_offset: int) -> Appended:
        """Commit one batch atomically: segments, consumed ids and the source offset.

        The caller (ingest.Ingester) has already dropped ids `new_ids` said were consumed; the
        PRIMARY KEY on `seen` would abort the transaction if one slipped through, so a bug can
        never write an event twice."""
        if stream not in STREAMS:
            raise BadInputError(f"stream {stream!r} must be one of {STREAMS}")
        ids = np.concatenate([accepted.get_column(EVENT_ID).to_numpy().astype(np.int64),
                              rejected_ids.astype(np.int64)])
        tcol = EVENT_TIME if stream == "events" else LABEL_TIME
        times = accepted.get_column(tcol) if accepted.height else None
        self.db.execute("BEGIN IMMEDIATE")
        try:
            cur = self.db.execute(
                "INSERT INTO batches(stream, source_offset, t_min, t_max, received, accepted, "
                "quarantined, duplicates, committed_at, data, rejects) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (stream, source_offset, _us(times.min()) if times is not None else None,
                 _us(times.max()) if times is not None else None, received, accepted.height,
                 int(rejected_ids.size), duplicates, time.time(),
                 _to_ipc(accepted) if accepted.height else None,
                 _to_ipc(rejects) if rejects.height else None))
            batch = int(cur.lastrowid or 0)
            self.db.executemany("INSERT INTO seen(stream, event_id, batch) VALUES (?, ?, ?)",
                                ((stream, int(i), batch) for i in ids.tolist()))
            self.db.execute(
                "INSERT INTO offsets(stream, source_offset) VALUES (?, ?) "
                "ON CONFLICT(stream) DO UPDATE SET source_offset = excluded.source_offset",
                (stream, source_offset))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return Appended(batch=batch, received=received, accepted=accepted.height,
                        quarantined=int(rejected_ids.size), duplicates=duplicates)

    # -- reading -------------------------------------------------------------------------------

    def offset(self, stream: str) -> int:
        """The source offset after the last committed batch (0 when none): where to resume."""
        row = self.db.execute("SELECT source_offset FROM offsets WHERE stream = ?",
                              (stream,)).fetchone()
        return int(row[0]) if row else 0

    def read(self, stream: str, start: datetime | None = None,
             end: datetime | None = None) -> pl.DataFrame:
        """Accepted events of `stream` whose time lies in [start, end), in commit order."""
        q = "SELECT data FROM batches WHERE stream = ? AND data IS NOT NULL"
        args: list[object] = [stream]
        if end is not None:
            q += " AND t_min < ?"
            args.append(_us(end))
        if start is not None:
            q += " AND t_max >= ?"
            args.append(_us(start))
        frames = [_from_ipc(r[0]) for r in self.db.execute(q + " ORDER BY batch", args)]
        if not frames:
            return pl.DataFrame()
        out = pl.concat(frames, how="vertical")
        tcol = EVENT_TIME if stream == "events" else LABEL_TIME
        if start is not None:
            out = out.filter(pl.col(tcol) >= start)
        if end is not None:
            out = out.filter(pl.col(tcol) < end)
        return out

    def quarantine(self, stream: str = "events") -> pl.DataFrame:
        """Every quarantine record (event id, rule, column, value) of `stream`."""
        frames = [_from_ipc(r[0]) for r in self.db.execute(
            "SELECT rejects FROM batches WHERE stream = ? AND rejects IS NOT NULL "
            "ORDER BY batch", (stream,))]
        return pl.concat(frames, how="vertical") if frames else pl.DataFrame()

    def totals(self, stream: str) -> dict[str, int]:
        row = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(received), 0), COALESCE(SUM(accepted), 0), "
            "COALESCE(SUM(quarantined), 0), COALESCE(SUM(duplicates), 0) FROM batches "
            "WHERE stream = ?", (stream,)).fetchone()
        consumed = self.db.execute("SELECT COUNT(*) FROM seen WHERE stream = ?",
                                   (stream,)).fetchone()[0]
        return {"batches": row[0], "received": row[1], "accepted": row[2],
                "quarantined": row[3], "duplicates": row[4], "consumed_ids": int(consumed)}

    def labels(self, until: datetime | None = None) -> pl.DataFrame:
        """Labels that had arrived before `until` (all when None): event_id, label, label_time."""
        out = self.read("labels", None, until)
        return out if out.height else pl.DataFrame(
            schema={EVENT_ID: pl.Int64, LABEL: pl.Int8, LABEL_TIME: pl.Datetime("us")})
