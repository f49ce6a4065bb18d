"""Deduplication: exact, then by key; the same with delay_class and the key hash given."""

from __future__ import annotations

import polars as pl

from scalelab.system.data.dedupe import KEY_HASH, deduplicate, delay_class, key_hash
from scalelab.system.data.features import INPUT_COLUMNS
from scalelab.system.data.flights import FLIGHT_COLUMNS
from scalelab.system.data.quarantine import validate

ROW = dict(zip(FLIGHT_COLUMNS, [
    "2013", "1", "1", "517", "515", "2", "830", "819", "11", "UA", "1545", "N14228", "EWR",
    "IAH", "227", "1400", "5", "15", "2013-01-01T10:00:00Z"], strict=True))


def _valid(*changes: dict[str, str]) -> pl.DataFrame:
    rows = [{**ROW, **c} for c in changes]
    frame = pl.DataFrame(rows, schema=dict.fromkeys(FLIGHT_COLUMNS, pl.String)).with_columns(
        pl.lit("f.csv").alias("_file"), pl.int_range(1, len(rows) + 1).alias("_row"))
    good, q = validate(frame, carriers=["UA"], origins=["EWR"])
    assert q.height == 0
    return good


def test_exact_key_and_conflicting_duplicates_with_or_without_precomputed_columns() -> None:
    good = _valid({}, {},                                                # exact duplicate
                  {"flight": "7"}, {"flight": "7", "arr_delay": "12"},  # same key and class
                  {"flight": "8"}, {"flight": "8", "dep_delay": "70"},  # label conflict
                  {"flight": "9"})
    plain = deduplicate(good, keep_columns=INPUT_COLUMNS)
    given = deduplicate(good.with_columns(delay_class().alias("delay_class"), key_hash()),
                        keep_columns=INPUT_COLUMNS)
    assert (plain.exact_duplicates, plain.key_duplicates) == (1, 1)
    assert plain.quarantine.select("row", "rule", "value").rows() == [
        (5, "label_conflict", "0"), (6, "label_conflict", "2")]
    assert plain.frame["flight"].to_list() == [1545, 7, 9]
    assert given.frame.equals(plain.frame) and given.quarantine.equals(plain.quarantine)
    assert (given.exact_duplicates, given.key_duplicates) == (1, 1)
    assert KEY_HASH not in deduplicate(good.with_columns(key_hash())).frame.columns


def test_repeated_is_is_duplicated() -> None:
    import numpy as np

    from scalelab.system.data.dedupe import repeated

    rng = np.random.default_rng(7)
    for values in (rng.integers(0, 50, 1000), rng.integers(0, 2**63, 1000), np.arange(10),
                   np.array([], dtype=np.int64), np.array([5, 5])):
        s = pl.Series("h", values, dtype=pl.UInt64)
        assert repeated(s).equals(s.is_duplicated().alias("h"))
