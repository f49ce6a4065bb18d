"""`scalelab data infer | validate | skew | stats`: schema, anomalies, skew/drift, statistics.

DATA is a Parquet, CSV (also a .zip holding one CSV) or JSONL file, a directory of them (read
recursively and stacked; all files must share one schema), or a statistics document written by
`scalelab data stats DATA --json` (then only statistics-based checks run).

Exit codes: 0 clean; 1 `validate` found anomalies of severity error, or `skew` flagged a feature;
2 bad usage or unreadable input (one line naming the file and the fix).
"""

from __future__ import annotations

import dataclasses
import io
import zipfile
from pathlib import Path
from typing import Any

import click
import polars as pl
from rich.console import Console
from rich.table import Table

from scalelab.cli._output import emit, json_option, parse_list
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.jsonfile import read_json_object
from scalelab.layers.nets.table_schema import Schema
from scalelab.system.data.schema import Anomaly, infer_schema
from scalelab.system.data.schema import validate as validate_data
from scalelab.system.data.skew import BINS, SkewReport, compare, drift_anomalies
from scalelab.system.data.stats import FORMAT as STATS_FORMAT
from scalelab.system.data.stats import DatasetStats, compute_stats

ANOMALIES_EXIT = 1
"""Exit status when validation finds error anomalies or skew flags a feature."""
SUFFIXES = (".parquet", ".pq", ".csv", ".jsonl", ".ndjson", ".zip")

null_values_option = click.option(
    "--null-values", default="NA", show_default=True,
    help="Comma-separated CSV tokens read as null (empty fields are always null).")


def _read_file(path: Path, nulls: list[str]) -> pl.DataFrame:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return pl.read_parquet(path)
    if suffix in (".jsonl", ".ndjson"):
        return pl.read_ndjson(path, infer_schema_length=None)
    source: Any = path
    if suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            csvs = [n for n in z.namelist() if n.lower().endswith(".csv")]
            if len(csvs) != 1:
                raise BadInputError(f"{path}: a .zip must hold exactly one .csv file "
                                    f"(found {len(csvs)})")
            source = io.BytesIO(z.read(csvs[0]))
    try:
        return pl.read_csv(source, null_values=nulls, infer_schema_length=10_000,
                           try_parse_dates=True)
    except pl.exceptions.ComputeError:
        # A type that changes after row 10,000: infer from every row. Costs ~10x, and date
        # parsing is left off (with full inference it costs ~15x more again).
        if isinstance(source, io.BytesIO):
            source.seek(0)
        return pl.read_csv(source, null_values=nulls, infer_schema_length=None)


def read_table(path: str | Path, *, null_values: str = "NA") -> pl.DataFrame | DatasetStats:
    """A DataFrame from a file or directory, or DatasetStats from a statistics document."""
    p = Path(path)
    nulls = [t for t in null_values.split(",") if t]
    if not p.exists():
        raise BadInputError(f"{p} does not exist; give a Parquet, CSV or JSONL file or a "
                            "directory of them")
    if p.is_file() and p.suffix.lower() == ".json":
        doc = read_json_object(p, fix="give `scalelab data stats DATA --json > stats.json`")
        if doc.get("format") != STATS_FORMAT:
            raise BadInputError(f"{p}: a .json DATA must be a statistics document "
                                "(`scalelab data stats DATA --json > stats.json`)")
        return DatasetStats.from_dict(doc)
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SUFFIXES) \
        if p.is_dir() else [p]
    if not files:
        raise BadInputError(f"{p}: no {', '.join(SUFFIXES)} files in this directory")
    frames = []
    for f in files:
        if f.suffix.lower() not in SUFFIXES:
            raise BadInputError(f"{f}: unsupported file type {f.suffix!r}; use "
                                f"{', '.join(SUFFIXES)} (or a directory of them)")
        try:
            frames.append(_read_file(f, nulls))
        except BadInputError:
            raise
        except (pl.exceptions.PolarsError, OSError, zipfile.BadZipFile, UnicodeDecodeError,
                ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BadInputError(f"{f}: cannot read as {f.suffix.lstrip('.')} ({first}); check "
                                "the file is complete and in that format") from None
    if len(frames) == 1:
        return frames[0]
    try:
        return pl.concat(frames, how="vertical_relaxed")
    except pl.exceptions.PolarsError as e:
        raise BadInputError(f"{p}: its files do not share one schema ({str(e).splitlines()[0]}); "
                            "point DATA at one file or a directory of like files") from None


def _stats(data: pl.DataFrame | DatasetStats) -> DatasetStats:
    return data if isinstance(data, DatasetStats) else compute_stats(data)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


@click.command("infer")
@click.argument("data", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the schema here (JSON). Review it: ranges are the observed ones.")
@null_values_option
@json_option
def infer(data: Path, out: Path | None, null_values: str, as_json: bool) -> None:
    """Propose a schema (types, nullability, ranges, domains, uniqueness) from DATA."""
    schema = infer_schema(read_table(data, null_values=null_values))
    if out is not None:
        schema.save(out)

    def render(con: Console) -> None:
        t = Table(title=f"schema inferred from {data}")
        for h in ("column", "type", "nullable", "max null rate", "min", "max", "domain",
                  "unique"):
            t.add_column(h)
        for c in schema.columns:
            dom = "-" if c.domain is None else (
                f"{len(c.domain)}: " + ", ".join(c.domain[:4]) + (" ..." if len(c.domain) > 4
                                                                  else ""))
            t.add_row(c.name, c.type, "yes" if c.nullable else "no", _fmt(c.max_null_rate),
                      _fmt(c.min), _fmt(c.max), dom, "yes" if c.unique else "no")
        con.print(t)
        con.print(f"written to {out}" if out else "not saved (use --out schema.json)")

    emit(schema.to_dict(), as_json, render)


def _anomaly_table(con: Console, anomalies: list[Anomaly], title: str) -> None:
    if not anomalies:
        con.print(f"{title}: no anomalies")
        return
    t = Table(title=title)
    for h in ("severity", "kind", "column", "count", "description", "examples"):
        t.add_column(h)
    for a in anomalies:
        t.add_row(a.severity, a.kind, a.column or "(dataset)",
                  "-" if a.count is None else f"{'~' if a.approximate else ''}{a.count}",
                  a.description, ", ".join(map(str, a.examples[:5])))
    con.print(t)


@click.command("validate")
@click.argument("data", type=click.Path(path_type=Path))
@click.option("--schema", "schema_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help="Schema JSON (from infer).")
@click.option("--previous", type=click.Path(path_type=Path),
              help="The previous version of the data: checks row-count change and drift.")
@null_values_option
@json_option
def validate(data: Path, schema_path: Path, previous: Path | None, null_values: str,
             as_json: bool) -> int:
    """Check DATA against a schema; list anomalies by kind. Exit 1 if any is an error."""
    schema = Schema.load(schema_path)
    table = read_table(data, null_values=null_values)
    prev_stats = None if previous is None else _stats(read_table(previous,
                                                                 null_values=null_values))
    anomalies = validate_data(table, schema, previous=prev_stats)
    if prev_stats is not None:
        anomalies += drift_anomalies(compare(prev_stats, _stats(table), schema=schema))
    errors = sum(a.severity == "error" for a in anomalies)
    warnings = sum(a.severity == "warning" for a in anomalies)
    doc = {"data": str(data), "schema": str(schema_path), "ok": errors == 0,
           "rows": table.height if isinstance(table, pl.DataFrame) else table.rows,
           "errors": errors, "warnings": warnings,
           "anomalies": [dataclasses.asdict(a) for a in anomalies]}

    def render(con: Console) -> None:
        _anomaly_table(con, anomalies, f"{data} vs {schema_path}")
        con.print(f"{errors} error(s), {warnings} warning(s)")

    emit(doc, as_json, render)
    return ANOMALIES_EXIT if errors else 0


def _skew_doc(r: SkewReport) -> dict[str, Any]:
    return {"reference_rows": r.reference_rows, "current_rows": r.current_rows,
            "flagged": [f.name for f in r.flagged],
            "only_in_reference": r.only_in_reference, "only_in_current": r.only_in_current,
            "features": [dataclasses.asdict(f) for f in r.features]}


@click.command("skew")
@click.option("--reference", required=True, type=click.Path(path_type=Path),
              help="Reference data (e.g. train, yesterday).")
@click.option("--current", required=True, type=click.Path(path_type=Path),
              help="Current data (e.g. test, today, a sample of served requests).")
@click.option("--schema", "schema_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Schema whose skew thresholds override the defaults.")
@click.option("--bins", default=BINS, show_default=True, type=click.IntRange(2, 1000),
              help="Shared equal-mass bins for JS and PSI.")
@null_values_option
@json_option
def skew(reference: Path, current: Path, schema_path: Path | None, bins: int,
         null_values: str, as_json: bool) -> int:
    """Per-feature skew/drift of CURRENT vs REFERENCE. Exit 1 if any feature is flagged."""
    schema = None if schema_path is None else Schema.load(schema_path)
    r = compare(read_table(reference, null_values=null_values),
                read_table(current, null_values=null_values), schema=schema, bins=bins)

    def render(con: Console) -> None:
        t = Table(title=f"skew: {current} vs {reference}")
        for h in ("feature", "kind", "L-inf", "JS", "PSI", "KS D", "KS p", "flag"):
            t.add_column(h)
        for f in r.features:
            t.add_row(f.name, f.kind, _fmt(f.linf), _fmt(f.js), _fmt(f.psi),
                      _fmt(f.ks_statistic), _fmt(f.ks_pvalue),
                      "; ".join(f.reasons) if f.flagged else (f.note or ""))
        con.print(t)
        for side, cols in (("reference", r.only_in_reference), ("current", r.only_in_current)):
            if cols:
                con.print(f"only in {side}: {', '.join(cols)}")
        con.print(f"{len(r.flagged)} feature(s) flagged")

    emit(_skew_doc(r), as_json, render)
    return ANOMALIES_EXIT if r.flagged else 0


@click.command("stats")
@click.argument("data", type=click.Path(path_type=Path))
@click.option("--columns", help="Comma-separated columns (default: all).")
@null_values_option
@json_option
def stats(data: Path, columns: str | None, null_values: str, as_json: bool) -> None:
    """Per-column statistics of DATA (mergeable: the JSON can be merged and validated)."""
    table = read_table(data, null_values=null_values)
    cols = None if columns is None else parse_list(columns, what="--columns", kind=str)
    st = table if isinstance(table, DatasetStats) else compute_stats(table, columns=cols)
    doc = st.to_dict()

    def render(con: Console) -> None:
        t = Table(title=f"{data}: {st.rows} rows")
        for h in ("column", "dtype", "nulls", "min", "mean", "std", "p50", "max",
                  "distinct / top"):
            t.add_column(h)
        for c in doc["columns"]:
            s = c["summary"]
            q = s.get("quantiles", {})
            top = ""
            if "distinct" in s:
                top = f"{_fmt(s['distinct'])}: " + ", ".join(f"{v} ({k})" for v, k in
                                                             s["top_k"][:3])
            t.add_row(c["name"], c["dtype"], str(c["nulls"]), _fmt(s.get("min")),
                      _fmt(s.get("mean")), _fmt(s.get("std")), _fmt(q.get("p50")),
                      _fmt(s.get("max")), top)
        con.print(t)

    emit(doc, as_json, render)
