"""Schema inference and validation on the real flights table, with injected defects."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.table_schema import Schema, logical_type
from scalelab.system.data.schema import Anomaly, infer_schema, validate
from scalelab.system.data.stats import DatasetStats, compute_stats


@pytest.fixture(scope="module")
def flights(flights_typed: pl.DataFrame) -> pl.DataFrame:
    return flights_typed.with_row_index("row").with_columns(
        pl.format("F{}", pl.col("row")).alias("flight_key")).drop("row")


@pytest.fixture(scope="module")
def schema(flights: pl.DataFrame) -> Schema:
    return infer_schema(flights)


@pytest.fixture(scope="module")
def flights_stats(flights: pl.DataFrame) -> DatasetStats:
    return compute_stats(flights)


def serious(anomalies: list[Anomaly]) -> list[Anomaly]:
    return [a for a in anomalies if a.severity != "info"]


def kinds(anomalies: list[Anomaly]) -> list[tuple[str, str | None]]:
    return sorted((a.kind, a.column) for a in anomalies)


def test_inferred_schema_describes_flights(schema: Schema) -> None:
    by = {c.name: c for c in schema.columns}
    assert by["carrier"].type == "string" and by["carrier"].nullable is False
    assert by["carrier"].domain is not None and len(by["carrier"].domain) == 16
    assert by["origin"].domain == ["EWR", "JFK", "LGA"]
    assert by["tailnum"].domain is None  # 4,043 values: more than the domain limit
    assert (by["distance"].type, by["distance"].min, by["distance"].max) == ("integer", 17, 4983)
    assert by["dep_delay"].nullable and by["dep_delay"].max_null_rate == pytest.approx(
        8255 / 336_776 * 1.1 + 0.01, abs=1e-6)
    assert by["month"].max_null_rate == 0.0
    assert by["time_hour"].type == "datetime"
    assert by["flight_key"].unique and not by["flight"].unique
    assert schema.expected_rows is None


def test_the_same_data_validates_clean(flights: pl.DataFrame, flights_stats: DatasetStats,
                                       schema: Schema) -> None:
    assert validate(flights, schema) == []
    # From statistics, uniqueness of a 336,776-value key cannot be checked: said, as info.
    assert kinds(validate(flights_stats, schema)) == [("not_checkable", "flight_key")]


def test_schema_file_round_trips(schema: Schema, tmp_path: Path) -> None:
    p = tmp_path / "schema.json"
    schema.save(p)
    assert Schema.load(p) == schema


def test_injected_defects_give_exactly_those_anomalies(flights: pl.DataFrame,
                                                       schema: Schema) -> None:
    i = pl.int_range(pl.len())
    bad = flights.with_columns(
        pl.when(i < 7).then(99_999).otherwise(pl.col("distance")).alias("distance"),
        pl.when(i % 1000 == 3).then(pl.lit("ZZ")).otherwise(pl.col("carrier")).alias("carrier"),
        pl.when(i % 20_000 == 5).then(None).otherwise(pl.col("sched_dep_time"))
        .alias("sched_dep_time"),
        pl.col("flight").cast(pl.String),
    ).rename({"origin": "airport"})
    bad = pl.concat([bad, bad.head(4)])  # 4 duplicated keys
    got = validate(bad, schema)
    assert kinds(got) == [("duplicate_key", "flight_key"), ("missing_column", "origin"),
                          ("null_rate_above_bound", "sched_dep_time"),
                          ("out_of_range", "distance"), ("type_mismatch", "flight"),
                          ("unexpected_column", "airport"), ("unknown_category", "carrier")]
    by = {a.kind: a for a in got}
    assert (by["out_of_range"].count, by["out_of_range"].examples) == (7 + 4, [99_999])
    assert not by["out_of_range"].approximate
    assert (by["unknown_category"].count, by["unknown_category"].examples) == (337 + 1, ["ZZ"])
    assert by["null_rate_above_bound"].count == 17
    assert by["duplicate_key"].count == 4
    assert by["duplicate_key"].examples == ["F0", "F1", "F2", "F3"]
    assert by["unexpected_column"].severity == "warning"
    assert {a.severity for a in got if a.kind != "unexpected_column"} == {"error"}


def test_validation_from_statistics_alone(flights: pl.DataFrame, schema: Schema) -> None:
    i = pl.int_range(pl.len())
    bad = flights.with_columns(
        pl.when(i < 7).then(99_999).otherwise(pl.col("distance")).alias("distance"),
        pl.when(i % 1000 == 3).then(pl.lit("ZZ")).otherwise(pl.col("carrier")).alias("carrier"))
    got = validate(compute_stats(bad), schema)
    by = {a.kind: a for a in got}
    assert kinds(got) == [("not_checkable", "flight_key"), ("out_of_range", "distance"),
                          ("unknown_category", "carrier")]
    assert by["unknown_category"].count == 337 and not by["unknown_category"].approximate
    assert by["out_of_range"].approximate and by["out_of_range"].count == 7
    assert by["not_checkable"].severity == "info"


def test_row_count_change_against_previous_and_expected(flights_stats: DatasetStats,
                                                        schema: Schema) -> None:
    autumn = compute_stats(pl.DataFrame({"month": [11, 12] * 27_000}))
    got = serious(validate(flights_stats, schema, previous=autumn))
    assert kinds(got) == [("row_count_change", None)]
    assert (got[0].count, got[0].total, got[0].severity) == (336_776, 54_000, "warning")
    fixed = Schema(columns=schema.columns, expected_rows=300_000, row_tolerance=0.2)
    assert serious(validate(flights_stats, fixed)) == []
    fixed.row_tolerance = 0.1
    assert kinds(serious(validate(flights_stats, fixed))) == [("row_count_change", None)]


def test_non_finite_values_and_non_nullable_columns() -> None:
    df = pl.DataFrame({"x": [1.0, 2.0, 3.0]})
    sch = infer_schema(df)
    got = validate(pl.DataFrame({"x": [1.0, float("nan"), None]}), sch)
    assert kinds(got) == [("non_finite", "x"), ("null_rate_above_bound", "x")]


def test_integers_are_accepted_where_floats_are_expected() -> None:
    sch = infer_schema(pl.DataFrame({"x": [1.5, 2.5]}))
    assert validate(pl.DataFrame({"x": [2, 2]}), sch) == []
    sch2 = infer_schema(pl.DataFrame({"x": [1, 2]}))
    assert kinds(validate(pl.DataFrame({"x": [1.5]}), sch2)) == [("type_mismatch", "x")]
    assert logical_type(pl.Datetime("us", "UTC")) == "datetime"


def test_skew_overrides_are_read_from_the_schema(schema: Schema, tmp_path: Path) -> None:
    doc = schema.to_dict()
    doc["columns"][1]["skew"] = {"psi": 0.5, "js": None}
    doc["skew_defaults"]["linf"] = 0.05
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    loaded = Schema.load(p)
    name = doc["columns"][1]["name"]
    t = loaded.skew_for(name)
    assert (t.psi, t.js, t.linf) == (0.5, None, 0.05)
    assert loaded.skew_for("carrier").psi == 0.2


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not valid JSON (line 1"),
    ('{"format": "scalelab.schema/1", "columns": [], "colums": []}', "unknown key(s) 'colums'"),
    ('{"format": "scalelab.schema/1", "columns": [{"name": "a", "type": "int"}]}',
     "type 'int' is not one of"),
    ('{"format": "scalelab.schema/1", "columns": [{"name": "a", "type": "float", "min": "x"}]}',
     "columns[0] (a).min: expected a finite number"),
    ('{"format": "scalelab.schema/1", "columns": [{"name": "a", "type": "float", '
     '"skew": {"psi": -1}}]}', "skew threshold psi must be"),
    ('{"format": "nope", "columns": []}', "format must be"),
    ("[]", "must hold a JSON object, not list"),
])
def test_malformed_schema_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(BadInputError) as e:
        Schema.load(p)
    assert message in str(e.value)
    assert str(p) in str(e.value)  # every message names the file (what, where, how to fix)


def test_missing_schema_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="scalelab data infer"):
        Schema.load(tmp_path / "none.json")
