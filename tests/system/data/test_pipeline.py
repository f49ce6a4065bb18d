"""The local pipeline on real flights: every injected defect found, nothing lost, contract kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from scalelab.cli import run
from scalelab.layers.lineage.manifest import dir_digest, parquet_digest
from scalelab.system.data.features import FEATURE_COLUMNS, feature_schema
from scalelab.system.data.generate import GenerateConfig, generate, parse_defects
from scalelab.system.data.pipeline import PipelineConfig, run_pipeline
from scalelab.system.data.split import LeakageError, check_leakage

KEY = ["file", "row", "column", "rule"]


@pytest.fixture(scope="module")
def defective_run(defective: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "ds"
    run_pipeline(PipelineConfig(input=defective, out=out, register=False))
    return out


def test_every_injected_defect_is_found_with_its_reason(defective: Path,
                                                        defective_run: Path) -> None:
    truth = pl.read_parquet(defective / "truth.parquet")
    q = pl.read_parquet(defective_run / "quarantine.parquet")
    expected = truth.filter(pl.col("rule") != "duplicate").select(KEY).sort(KEY)
    assert q.select(KEY).sort(KEY).equals(expected)
    # Values are the raw text that failed (nulls for missing ones).
    t_vals = truth.filter(pl.col("rule").is_in(["type", "range"])).select(*KEY, "value")
    assert t_vals.join(q, on=KEY, how="anti").height == 0
    assert q.join(t_vals, on=[*KEY, "value"], how="semi").height == t_vals.height
    m = json.loads((defective_run / "manifest.json").read_text())
    inj = json.loads((defective / "manifest.json").read_text())["validation"]["injected"]
    v = m["validation"]
    assert v["exact_duplicates"] == inj["deduplicated_rows"] and v["key_duplicates"] == 0
    assert v["quarantined_rows"] == inj["quarantined_rows"]
    assert v["quarantine_by_rule"] == {k: n for k, n in inj["by_rule"].items()
                                       if k != "duplicate"}
    kinds = {(a["kind"], tuple(a["columns"])) for a in v["anomalies"]}
    assert kinds == {("missing_column", ("dep_delay",)), ("unexpected_column", ("dep_dly",))}


def test_reconciliation_and_contract(defective_run: Path) -> None:
    m = json.loads((defective_run / "manifest.json").read_text())
    rec = m["validation"]["reconciliation"]
    assert rec["holds"] and rec["rows_in"] == (rec["rows_out"] + rec["quarantined"]
                                               + rec["deduplicated"])
    train = pl.read_parquet(defective_run / "train.parquet")
    test = pl.read_parquet(defective_run / "test.parquet")
    assert tuple(train.columns) == FEATURE_COLUMNS
    assert dict(train.schema) == feature_schema() == dict(test.schema)
    assert train.height + test.height == rec["rows_out"] == m["rows"]
    assert train["flight_key"].n_unique() == train.height
    assert train["month"].max() <= 10 and test["month"].min() >= 11
    assert set(train["delay_class"].unique().to_list()) == {0, 1, 2, 3}
    assert (train["plane_model"] == "UNKNOWN").sum() > 0
    assert train["temp"].null_count() < train.height // 10
    assert m["files"]["train.parquet"]["digest"] == parquet_digest(
        defective_run / "train.parquet").digest
    assert m["validation"]["leakage"] == {"shared_keys": 0, "shared_rows": 0}
    # Digests computed from memory while writing equal what the files hold (lineage re-reads).
    assert m["digest"] == dir_digest(defective_run)[0]


def test_leakage_check_fails_loudly() -> None:
    df = pl.DataFrame({"flight_key": ["a", "b"], "x": [1, 2]})
    with pytest.raises(LeakageError, match="1 flight_key"):
        check_leakage(df, df.head(1))
    with pytest.raises(LeakageError, match="1 duplicate row"):
        check_leakage(df, df.head(1).with_columns(pl.lit("z").alias("flight_key")))


def test_formats_give_the_same_tables(clean: Path, tmp_path: Path) -> None:
    digests = {}
    for fmt in ("csv", "parquet", "jsonl"):
        generate(GenerateConfig(scales=(1,), out=tmp_path / fmt, sample=4000, fmt=fmt,
                                defects=parse_defects("nulls=0.01,unparsable=0.01")))
        r = run_pipeline(PipelineConfig(input=tmp_path / fmt / "x1", out=tmp_path / f"o-{fmt}",
                                        register=False, stats=False))
        assert r.reconciliation["holds"] and r.quarantined_rows > 0
        digests[fmt] = (r.file_digests["train.parquet"], r.file_digests["test.parquet"],
                        r.quarantined_rows)
    assert digests["csv"] == digests["parquet"] == digests["jsonl"]


def test_clean_data_has_no_quarantine(clean: Path, tmp_path: Path) -> None:
    r = run_pipeline(PipelineConfig(input=clean, out=tmp_path / "o", register=False, stats=False))
    assert r.quarantined_rows == 0 and r.exact_duplicates == 0 and r.rows_out == r.rows_in


def _copy_one(clean: Path, tmp_path: Path) -> Path:
    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(clean / "flights" / "part-c000-m01.csv", d / "jan.csv")
    for dim in ("weather", "planes", "airlines"):
        shutil.copy(clean / f"{dim}.csv", d / f"{dim}.csv")
    return d


def test_malformed_rows_are_quarantined_with_reasons(clean: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy_one(clean, tmp_path)
    f = d / "jan.csv"
    lines = f.read_bytes().split(b"\n")
    n = len([x for x in lines[1:] if x])
    lines[3] = lines[3] + b",extra"                      # wrong column count
    lines[5] = lines[5].replace(b",", b",\xff", 1)             # undecodable byte
    lines[7] = lines[7].replace(b",", b";", 2)           # fewer fields
    lines[9] = b'2013,1,1,"5,17",515,2,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,' \
               b"2013-01-01T10:00:00Z"                  # a quoted comma: wrong type
    body = b"\n".join(lines)
    f.write_bytes(body[: body.rstrip(b"\n").rfind(b",") + 3])  # truncated last line
    rc = run(["data", "run", "--input", str(d), "--out", str(tmp_path / "o"), "--no-register",
              "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["reconciliation"]["holds"] and out["rows_in"] == n
    q = pl.read_parquet(tmp_path / "o" / "quarantine.parquet")
    got = {(r, rule) for r, rule in q.select("row", "rule").iter_rows()}
    assert {(3, "column_count"), (5, "encoding"), (7, "column_count"), (9, "type"),
            (n, "type")} == got
    bad_cell = q.filter((pl.col("row") == 9) & (pl.col("rule") == "type"))
    assert bad_cell.select("column", "value").row(0) == ("dep_time", "5,17")


@pytest.mark.parametrize("content, match", [
    (b"", "empty file"),
    (b"\x89PNG\r\n\x1a\n\x00\x00binary", "none of the 19 flights columns"),
    (b"tailnum,year,type\nN1,2004,x\n", "only 2 of the 19 flights columns"),
    (b"year,year,month\n1,2,3\n", "repeats column"),
])
def test_unusable_files_exit_2_with_one_line(clean: Path, tmp_path: Path, content: bytes,
                                             match: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy_one(clean, tmp_path)
    (d / "jan.csv").write_bytes(content)
    rc = run(["data", "run", "--input", str(d), "--out", str(tmp_path / "o"), "--no-register"])
    err = capsys.readouterr().err
    assert rc == 2 and match in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_bad_parquet_and_missing_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not really")
    assert run(["data", "run", "--input", str(tmp_path / "x.parquet"), "--out",
                str(tmp_path / "o")]) == 2
    assert "not a readable Parquet file" in capsys.readouterr().err
    assert run(["data", "run", "--input", str(tmp_path / "nope"), "--out",
                str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_generate_and_run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["data", "generate", "--scale", "1", "--out", str(tmp_path / "g"), "--sample",
              "2000", "--defects", "duplicates=0.01", "--json"])
    gen = json.loads(capsys.readouterr().out)
    assert rc == 0 and gen[0]["rows"] == 2000 + gen[0]["injected"]["duplicate"]
    rc = run(["data", "run", "--input", str(tmp_path / "g" / "x1"), "--out",
              str(tmp_path / "o"), "--lineage", str(tmp_path / "l.db"), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["exact_duplicates"] == gen[0]["injected"]["duplicate"]
    assert [s["name"] for s in res["stages"]] == [
        "ingest", "validate", "dedupe", "features", "split", "stats", "write"]
    assert all(s["peak_memory_bytes"] > 0 for s in res["stages"])
    assert run(["data", "generate", "--scale", "0", "--out", str(tmp_path)]) == 2
    assert run(["data", "run", "--input", str(tmp_path), "--out", str(tmp_path / "o"),
                "--address", "tcp://x:1"]) == 2
