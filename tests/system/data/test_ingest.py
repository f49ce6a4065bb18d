"""The plain-CSV fast path of ingest gives exactly what the line-by-line reader gives."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from scalelab.system.data import ingest
from scalelab.system.data.flights import FLIGHT_COLUMNS

HEADER = ",".join(FLIGHT_COLUMNS).encode()
ROW = b"2013,1,1,517,515,2,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,2013-01-01T10:00:00Z"
NA_ROW = b"2013,1,1,NA,515,,NA,819,NA,UA,1545,,EWR,IAH,NA,1400,5,15,2013-01-01T10:00:00Z"
SPACED = b"2013, 1 ,1,517,515,2,830,819,11,UA,1545, N1 ,EWR,IAH,227,1400,5,15,2013-01-01 10:00:00"


def _line_reader(monkeypatch: pytest.MonkeyPatch, path: Path) -> ingest.Ingested:
    with monkeypatch.context() as m:
        m.setattr(ingest, "_read_plain_csv", lambda data, rel: None)
        return ingest.ingest_file(path, path.parent)


@pytest.mark.parametrize("body, plain", [
    (HEADER + b"\n" + ROW + b"\n" + NA_ROW + b"\n" + SPACED + b"\n", True),
    (HEADER + b"\n" + ROW + b"\n" + NA_ROW, True),                  # no final newline
    (b"\xef\xbb\xbf" + HEADER + b"\n" + ROW + b"\n", True),         # UTF-8 BOM
    (HEADER + b"\n" + ROW.replace(b"N14228", "N\u00e9".encode()) + b"\n", True),
    (HEADER + b"\n", True),                                         # header only
    (HEADER + b"\n" + ROW + b"\n\n" + ROW + b"\n", False),          # blank line
    (HEADER + b"\n" + ROW + b",x\n" + ROW[:-3] + b"\n", False),     # +1 and -1 field
    (HEADER + b"\n" + ROW + b",x\n" + b"\n" + ROW + b"\n", False),  # +1 field, blank line
    (HEADER + b"\n" + ROW + b"\n" + ROW.replace(b",", b";", 1) + b"\n", False),
    (HEADER + b"\r\n" + ROW + b"\r\n", False),                      # CRLF
    (HEADER + b"\n" + ROW.replace(b"UA", b'"UA"') + b"\n", False),  # quotes
    (HEADER + b"\n" + ROW.replace(b"UA", b"U\xff") + b"\n", False),  # undecodable byte
    (HEADER + b"\n" + ROW.replace(b"UA", "U\ufffd".encode()) + b"\n", False),
])
def test_plain_reader_matches_line_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          body: bytes, plain: bool) -> None:
    path = tmp_path / "f.csv"
    path.write_bytes(body)
    assert (ingest._read_plain_csv(body, "f.csv") is not None) == plain
    fast, slow = ingest.ingest_file(path, tmp_path), _line_reader(monkeypatch, path)
    assert fast.frame.equals(slow.frame)
    assert fast.quarantine.sort("row", "column").equals(slow.quarantine.sort("row", "column"))
    assert (fast.rows_in, fast.anomalies) == (slow.rows_in, slow.anomalies)


def test_plain_reader_keeps_text_rows_and_nulls(tmp_path: Path) -> None:
    path = tmp_path / "f.csv"
    path.write_bytes(HEADER + b"\n" + NA_ROW + b"\n" + SPACED + b"\n")
    frame = ingest.ingest_file(path, tmp_path).frame
    assert frame["_row"].to_list() == [1, 2]
    assert frame["dep_time"].to_list() == [None, "517"]
    assert frame["tailnum"].to_list() == [None, " N1 "]
    assert frame["month"].to_list() == ["1", " 1 "]
    assert all(t == pl.String for c, t in frame.schema.items() if c in FLIGHT_COLUMNS)


def _files(tmp_path: Path, bodies: list[bytes]) -> list[Path]:
    paths = []
    for i, body in enumerate(bodies):
        p = tmp_path / f"f{i}.csv"
        p.write_bytes(body)
        paths.append(p)
    return paths


def test_plain_group_is_the_files_read_one_by_one(tmp_path: Path) -> None:
    paths = _files(tmp_path, [HEADER + b"\n" + ROW + b"\n" + NA_ROW,   # no final newline
                              HEADER + b"\n",                          # header only
                              b"\xef\xbb\xbf" + HEADER + b"\n" + SPACED + b"\n" + ROW + b"\n"])
    names = [p.name for p in paths]
    group = ingest.ingest_plain_group(paths, tmp_path, names)
    assert group is not None and group.rows_in == 4 and group.quarantine.height == 0
    one_by_one = pl.concat([ingest.ingest_file(p, tmp_path, names).frame for p in paths])
    assert group.frame.equals(one_by_one) and group.frame.schema == one_by_one.schema
    assert group.frame["_row"].to_list() == [1, 2, 1, 2]
    assert group.frame["_file"].cast(pl.String).to_list() == ["f0.csv", "f0.csv", "f2.csv",
                                                               "f2.csv"]


@pytest.mark.parametrize("second", [
    HEADER + b"\n" + ROW + b"\n\n" + ROW + b"\n",                       # not plain: blank line
    HEADER.replace(b"dep_delay", b"dep_dly") + b"\n" + ROW + b"\n",     # another header
    b",".join(reversed(HEADER.split(b","))) + b"\n" + ROW + b"\n",      # another column order
    HEADER + b",extra\n" + ROW + b",x\n",                               # an extra column
    b"",                                                                # empty file
])
def test_plain_group_declines_what_it_cannot_read_as_one(tmp_path: Path, second: bytes) -> None:
    paths = _files(tmp_path, [HEADER + b"\n" + ROW + b"\n", second])
    assert ingest.ingest_plain_group(paths, tmp_path, [p.name for p in paths]) is None
