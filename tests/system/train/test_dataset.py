from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
import torch

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.flights import CATEGORICAL, LABEL, NUMERIC, UNK, Preprocess
from scalelab.system.train.dataset import (
    BatchPlan,
    Tensors,
    encode_split,
    epoch_permutation,
    limit_rows,
    load_frames,
)


def _frame(n: int, *, carrier: list[str] | None = None) -> pl.DataFrame:
    cols: dict[str, object] = {
        "flight_key": [f"k{i}" for i in range(n)],
        "time_hour": [datetime(2013, 1, 1, tzinfo=UTC)] * n,
    }
    for c in CATEGORICAL:
        cols[c] = carrier if (c == "carrier" and carrier) else ["X"] * n
    for c in NUMERIC:
        cols[c] = [float(i) for i in range(n)]
    cols[LABEL] = [i % 4 for i in range(n)]
    return pl.DataFrame(cols).with_columns(pl.col(LABEL).cast(pl.Int8))


def test_preprocess_vocab_unknown_and_standardisation() -> None:
    train = _frame(4, carrier=["UA", "AA", "UA", "B6"])
    pre = Preprocess.fit(train)
    assert pre.categorical["carrier"] == [UNK, "AA", "B6", "UA"]
    assert pre.numeric["month"]["mean"] == 1.5
    test = _frame(2, carrier=["ZZ", "AA"]).with_columns(
        pl.Series("month", [None, 1.5], dtype=pl.Float64))
    cat, num, y = encode_split(pre, test)
    assert cat[:, 0].tolist() == [0, 1]  # unseen carrier -> index 0
    month = NUMERIC.index("month")
    assert num[:, month].tolist() == [0.0, 0.0]  # null -> mean -> 0 after standardising
    assert y.tolist() == [0, 1]
    assert Preprocess.from_dict(pre.to_dict()) == pre


def test_constant_column_does_not_divide_by_zero() -> None:
    train = _frame(3).with_columns(pl.lit(5.0).alias("precip"))
    pre = Preprocess.fit(train)
    assert pre.numeric["precip"] == {"mean": 5.0, "std": 1.0}


def test_batches_split_exactly_over_ranks_and_are_a_pure_function() -> None:
    one = BatchPlan(n=100, seed=3, global_batch=20, world=1, rank=0, accumulation=2)
    two = [BatchPlan(n=100, seed=3, global_batch=20, world=2, rank=r, accumulation=1)
           for r in range(2)]
    for step in (0, 4, 5, 11):  # 5 steps per epoch: 5 and 11 start/continue later epochs
        whole = torch.cat([one.indices(step, 0), one.indices(step, 1)])
        assert torch.equal(whole, torch.cat([p.indices(step, 0) for p in two]))
    assert torch.equal(epoch_permutation(100, 3, 1), epoch_permutation(100, 3, 1))
    assert not torch.equal(epoch_permutation(100, 3, 0), epoch_permutation(100, 3, 1))
    # Every row appears once per epoch (the partial last batch is dropped).
    seen = torch.cat([one.indices(s, m) for s in range(5) for m in range(2)])
    assert sorted(seen.tolist()) == list(range(100))


def test_batch_larger_than_data_is_refused() -> None:
    with pytest.raises(BadInputError, match="exceeds"):
        BatchPlan(n=10, seed=0, global_batch=20, world=1, rank=0, accumulation=1)


def test_limit_rows_and_fraction() -> None:
    train, test = _frame(1000), _frame(200)
    a, b = limit_rows(train, test, 100, seed=0)
    assert (a.height, b.height) == (100, 20)
    a2, _ = limit_rows(train, test, 100, seed=0)
    assert a["flight_key"].to_list() == a2["flight_key"].to_list()
    c, d = limit_rows(train, test, 0.5, seed=0)
    assert (c.height, d.height) == (500, 100)


def test_dataset_dir_is_read_and_checked(tmp_path: Path) -> None:
    _frame(8).write_parquet(tmp_path / "train.parquet")
    _frame(4).write_parquet(tmp_path / "test.parquet")
    train, test, sources = load_frames(str(tmp_path))
    assert (train.height, test.height) == (8, 4)
    assert sources[0].role == "dataset" and len(sources[0].digest) == 64
    _frame(4).drop("carrier").write_parquet(tmp_path / "test.parquet")
    with pytest.raises(BadInputError, match="carrier"):
        load_frames(str(tmp_path))
    with pytest.raises(BadInputError, match="does not exist"):
        load_frames(str(tmp_path / "nope"))


def test_tensors_roundtrip_and_subset(tmp_path: Path) -> None:
    pre = Preprocess.fit(_frame(10))
    c, n, y = encode_split(pre, _frame(10))
    t = Tensors(train_cat=c, train_num=n, train_y=y, test_cat=c.clone(), test_num=n.clone(),
                test_y=y.clone())
    t.save(tmp_path / "d.safetensors")
    back = Tensors.load(tmp_path / "d.safetensors")
    assert torch.equal(back.train_num, n)
    assert back.subset_train(0.3, seed=1).n_train == 3
    assert back.subset_train(1.0, seed=1) is back
