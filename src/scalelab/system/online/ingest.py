"""Continuous ingestion: validate each arriving batch against the data part's schema file,
quarantine what fails with its reasons, append the rest to the event log exactly once, and
reconcile per window.

The rules are read from the schema file `scalelab data infer` writes (format scalelab.schema/1:
per column its type, nullability, null-rate bound, [min, max] and domain), through the one
reader of that format (nets.table_schema); this part never imports the data part's code. Row
rules (one quarantine record per failing row, column and rule):
``type`` (the column's dtype is not the schema's type: every row), ``missing_column``,
``required`` (null where the schema allows none), ``non_finite``, ``range``, ``domain``. Window
rules (reconcile): a quarantine rate above the tolerance marks the whole window quarantined;
null rates above the schema's max_null_rate are reported. The log's totals keep received =
accepted + quarantined + duplicates.

Every check is one polars expression over the whole batch (no per-event Python).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.flights import CLASSES, FEATURES, LABEL
from scalelab.layers.nets.table_schema import ColumnSchema, Schema, logical_type, type_ok
from scalelab.system.online.log import Appended, EventLog
from scalelab.system.online.stream import EVENT_COLUMNS, EVENT_ID, EVENT_TIME, LABEL_TIME

REJECT_SCHEMA = pl.Schema({
    EVENT_ID: pl.Int64(), EVENT_TIME: pl.Datetime("us"), "rule": pl.String(),
    "column": pl.String(), "value": pl.String()})


@dataclass(kw_only=True)
class ColumnRule(ColumnSchema):
    """One column's rules as the schema file states them, with its skew thresholds resolved
    (the column's own, else the schema's defaults)."""

    psi: float | None = None
    """Numeric skew threshold (population stability index between windows; None: off)."""
    linf: float | None = None
    """Categorical skew threshold (L-infinity distance of value shares; None: off)."""


def load_rules(path: str | Path) -> dict[str, ColumnRule]:
    """The feature columns' rules from a scalelab.schema/1 file (other columns are ignored)."""
    p = Path(path)
    schema = Schema.load(p)
    missing = [c for c in FEATURES if schema.column(c) is None]
    if missing:
        raise BadInputError(f"{p} has no rules for feature columns {', '.join(missing)}; infer "
                            "it from a table of feature events")
    rules: dict[str, ColumnRule] = {}
    for name in FEATURES:
        c = schema.column(name)
        assert c is not None  # checked above
        skew = schema.skew_for(name)
        rules[name] = ColumnRule(
            name=name, type=c.type, nullable=c.nullable, max_null_rate=c.max_null_rate,
            min=c.min, max=c.max, domain=c.domain, psi=skew.psi, linf=skew.linf)
    return rules


def _violations(batch: pl.DataFrame, rules: dict[str, ColumnRule]
                ) -> tuple[list[tuple[str, str]], list[pl.Expr], list[tuple[str, str]]]:
    """(column, rule) pairs with one boolean expression each, and whole-batch failures."""
    names: list[tuple[str, str]] = []
    exprs: list[pl.Expr] = []
    whole: list[tuple[str, str]] = []
    for c, r in rules.items():
        if c not in batch.columns:
            whole.append((c, "missing_column"))
            continue
        actual = logical_type(batch.schema[c])
        if not type_ok(r.type, actual):
            whole.append((c, "type"))
            continue
        col = pl.col(c)
        if not r.nullable:
            names.append((c, "required"))
            exprs.append(col.is_null())
        if actual == "float":
            names.append((c, "non_finite"))
            exprs.append((col.is_nan() | col.is_infinite()).fill_null(False))
        if r.min is not None or r.max is not None:
            lo = col < r.min if r.min is not None else pl.lit(False)
            hi = col > r.max if r.max is not None else pl.lit(False)
            out = lo | hi
            if actual == "float":
                out = out & ~col.is_nan()  # NaN is non_finite's, not also a range failure
            names.append((c, "range"))
            exprs.append(out.fill_null(False))
        if r.domain is not None:
            names.append((c, "domain"))
            exprs.append((~col.is_in(list(r.domain))).fill_null(False))
    return names, exprs, whole


def validate_events(batch: pl.DataFrame, rules: dict[str, ColumnRule]
                    ) -> tuple[np.ndarray, pl.DataFrame]:
    """(bad-row mask, quarantine records) for a batch of feature events (pure)."""
    for c in (EVENT_ID, EVENT_TIME):
        if c not in batch.columns:
            raise BadInputError(f"feature events need an {c!r} column; got {batch.columns}")
    n = batch.height
    names, exprs, whole = _violations(batch, rules)
    masks = batch.select([e.alias(f"m{i}") for i, e in enumerate(exprs)]).to_numpy() \
        if exprs else np.zeros((n, 0), dtype=bool)
    bad = np.asarray(masks.any(axis=1), dtype=bool) if masks.size else np.zeros(n, dtype=bool)
    if whole:
        bad = np.ones(n, dtype=bool)
    parts: list[pl.DataFrame] = []
    for col, rule in whole:
        parts.append(batch.select(EVENT_ID, EVENT_TIME).with_columns(
            pl.lit(rule).alias("rule"), pl.lit(col).alias("column"),
            pl.lit(str(batch.schema.get(col, "absent"))).alias("value")))
    if masks.size and bad.any():
        for j in np.flatnonzero(masks.any(axis=0)):
            col, rule = names[j]
            rows = batch.filter(pl.Series(masks[:, j]))
            parts.append(rows.select(
                EVENT_ID, EVENT_TIME, pl.lit(rule).alias("rule"), pl.lit(col).alias("column"),
                pl.col(col).cast(pl.String).alias("value")))
    rejects = pl.concat([p.cast(REJECT_SCHEMA) for p in parts]) if parts \
        else pl.DataFrame(schema=REJECT_SCHEMA)
    return np.asarray(bad, dtype=bool), rejects


def validate_labels(batch: pl.DataFrame) -> tuple[np.ndarray, pl.DataFrame]:
    """Labels must name a class and an event, and carry their arrival time (pure)."""
    for c in (EVENT_ID, LABEL, LABEL_TIME):
        if c not in batch.columns:
            raise BadInputError(f"label events need a {c!r} column; got {batch.columns}")
    checks = {"required": pl.col(LABEL_TIME).is_null() | pl.col(EVENT_ID).is_null(),
              "range": ~pl.col(LABEL).is_between(0, len(CLASSES) - 1).fill_null(False)}
    m = batch.select([e.alias(k) for k, e in checks.items()])
    bad = np.zeros(batch.height, dtype=bool)
    parts = []
    for rule in checks:
        mask = m.get_column(rule).to_numpy()
        if mask.any():
            bad |= mask
            parts.append(batch.filter(pl.Series(mask)).select(
                EVENT_ID, pl.col(LABEL_TIME).alias(EVENT_TIME), pl.lit(rule).alias("rule"),
                pl.lit(LABEL).alias("column"), pl.col(LABEL).cast(pl.String).alias("value")))
    rejects = pl.concat([p.cast(REJECT_SCHEMA) for p in parts]) if parts \
        else pl.DataFrame(schema=REJECT_SCHEMA)
    return np.asarray(bad, dtype=bool), rejects


class Ingester:
    """Drop already-consumed ids, validate, and commit one batch (one transaction)."""

    def __init__(self, log: EventLog, rules: dict[str, ColumnRule]) -> None:
        self.log = log
        self.rules = rules

    def ingest(self, stream: str, batch: pl.DataFrame, source_offset: int) -> Appended:
        """`source_offset`: the position in the source after this batch (stored with it, so a
        restarted ingester resumes there)."""
        received = batch.height
        fresh = self.log.new_ids(stream, batch.get_column(EVENT_ID).to_numpy())
        dup = int(received - fresh.sum())
        if dup:
            batch = batch.filter(pl.Series(fresh))
        if stream == "events":
            cols = [c for c in EVENT_COLUMNS if c in batch.columns]
            bad, rejects = validate_events(batch, self.rules)
            batch = batch.select(cols)
        else:
            bad, rejects = validate_labels(batch)
            batch = batch.select(EVENT_ID, pl.col(LABEL).cast(pl.Int8), LABEL_TIME)
        good = batch.filter(pl.Series(~bad)) if bad.any() else batch
        bad_ids = batch.get_column(EVENT_ID).to_numpy()[bad] if bad.any() \
            else np.zeros(0, dtype=np.int64)
        return self.log.append(stream, accepted=good, rejects=rejects, rejected_ids=bad_ids,
                               duplicates=dup, received=received, source_offset=source_offset)


@dataclass(kw_only=True)
class WindowCheck:
    """Reconciliation of one window of feature events."""

    start: str
    end: str
    accepted: int
    quarantined: int
    quarantine_rate: float
    null_breaches: dict[str, float] = field(default_factory=dict)
    """Column -> null rate above the schema's max_null_rate (reported, not enforced)."""
    rules: dict[str, int] = field(default_factory=dict)
    """Quarantine records per rule."""
    status: str = "ok"
    """ok, or quarantined: the updater does not train on the window."""
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reconcile(accepted: pl.DataFrame, rejects: pl.DataFrame, rules: dict[str, ColumnRule], *,
              start: datetime, end: datetime, max_quarantine_rate: float = 0.01) -> WindowCheck:
    """Check one window (pure): `accepted` are its accepted events, `rejects` its quarantine
    records. A window with more quarantined events than `max_quarantine_rate` is marked
    quarantined as a whole: one broken upstream hour usually means the rest of that window is
    suspect too. Null rates above the schema's bound are reported (`null_breaches`), not
    enforced: a bound inferred from a whole year is exceeded on normal days (2013's pressure is
    missing for whole hours: 112 of 366 days exceed the year's rate x 1.1 + 1%), and a null is
    imputed, not wrong."""
    q_ids = rejects.get_column(EVENT_ID).n_unique() if rejects.height else 0
    total = accepted.height + q_ids
    rate = q_ids / total if total else 0.0
    breaches: dict[str, float] = {}
    if accepted.height:
        nulls = accepted.select([pl.col(c).null_count() for c in rules if c in accepted.columns]
                                ).row(0, named=True)
        for c, k in nulls.items():
            bound = rules[c].max_null_rate if rules[c].nullable else 0.0
            if bound is not None and k / accepted.height > bound:
                breaches[c] = k / accepted.height
    per_rule = ({str(k): int(v) for k, v in rejects.group_by("rule").len().iter_rows()}
                if rejects.height else {})
    reasons = []
    if rate > max_quarantine_rate:
        reasons.append(f"{q_ids} of {total} events quarantined ({rate:.2%} > "
                       f"{max_quarantine_rate:.2%})")
    return WindowCheck(start=start.isoformat(), end=end.isoformat(), accepted=accepted.height,
                       quarantined=q_ids, quarantine_rate=rate, null_breaches=breaches,
                       rules=dict(sorted(per_rule.items())),
                       status="quarantined" if reasons else "ok", reasons=reasons)


def ingest_source(log: EventLog, rules: dict[str, ColumnRule], stream: str,
                  source: pl.DataFrame, *, batch_size: int = 4096, resume: bool = True,
                  on_commit: Any = None) -> dict[str, int]:
    """Feed `source` (rows in arrival order) to the log in batches of `batch_size`.

    resume=True starts at the offset the log committed last (a restarted ingester picks up
    where the killed one stopped); False starts at 0 and relies on the id check, so nothing
    already consumed is written again. `on_commit(appended, offset)` runs after each commit."""
    if batch_size < 1:
        raise BadInputError(f"batch size must be >= 1, got {batch_size}")
    ing = Ingester(log, rules)
    offset = log.offset(stream) if resume else 0
    sums = {"received": 0, "accepted": 0, "quarantined": 0, "duplicates": 0, "batches": 0}
    while offset < source.height:
        batch = source.slice(offset, batch_size)
        offset += batch.height
        a = ing.ingest(stream, batch, offset)
        for k in ("received", "accepted", "quarantined", "duplicates"):
            sums[k] += getattr(a, k)
        sums["batches"] += 1
        if on_commit is not None:
            on_commit(a, offset)
    return sums


def ingest_stream(log: EventLog, rules: dict[str, ColumnRule], stream: Any, *,
                  batch_size: int = 4096, resume: bool = True,
                  on_commit: Callable[[str, Any, int], None] | None = None
                  ) -> dict[str, dict[str, Any]]:
    """Ingest a replay's events, then its labels (`ingest_source` each), timed: per stream its
    sums, wall and CPU seconds, events per second of each, and the log's totals after it.
    `stream` is an online.stream replay; `on_commit(stream name, appended, offset)`."""
    out: dict[str, dict[str, Any]] = {}
    for name, source in (("events", stream.feature_events()), ("labels", stream.label_events())):
        tell = None if on_commit is None else functools.partial(on_commit, name)
        t0, c0 = time.perf_counter(), time.process_time()
        sums = ingest_source(log, rules, name, source, batch_size=batch_size, resume=resume,
                             on_commit=tell)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        out[name] = {**sums, "wall_s": wall, "cpu_s": cpu,
                     "events_per_s": sums["received"] / wall if wall > 0 else None,
                     "events_per_cpu_s": sums["received"] / cpu if cpu > 0 else None,
                     "totals": log.totals(name)}
    return out
