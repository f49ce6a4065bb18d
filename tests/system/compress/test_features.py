from pathlib import Path

import polars as pl
import pytest
import torch

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.repository import write_json
from scalelab.system.compress.features import Preprocess, encode, load_split

PRE = Preprocess(categorical={"carrier": ["<UNK>", "AA", "UA"]},
                 numeric={"distance": {"mean": 100.0, "std": 50.0}},
                 classes=["on_time", "late"])


def test_encode_maps_unknowns_imputes_and_standardises() -> None:
    f = pl.DataFrame({"carrier": ["UA", "ZZ", None], "distance": [200.0, None, 50.0],
                      "delay_class": pl.Series([1, None, 0], dtype=pl.Int8)})
    e = encode(f, PRE)
    assert e.categorical.tolist() == [[2], [0], [0]]
    assert e.numeric.squeeze(1).tolist() == [2.0, 0.0, -1.0]
    assert e.labels.tolist() == [1, -1, 0]
    assert e.unlabelled().labels.tolist() == [-1, -1, -1]
    assert e.categorical.dtype == torch.long and e.numeric.dtype == torch.float32


def test_missing_label_column_is_unlabelled_and_missing_feature_is_an_error() -> None:
    assert encode(pl.DataFrame({"carrier": ["AA"], "distance": [1.0]}), PRE).labels.tolist() == [-1]
    with pytest.raises(BadInputError, match="distance"):
        encode(pl.DataFrame({"carrier": ["AA"]}), PRE)
    with pytest.raises(BadInputError, match="outside"):
        encode(pl.DataFrame({"carrier": ["AA"], "distance": [1.0], "delay_class": [7]}), PRE)


def test_read_preprocess_and_split(tmp_path: Path) -> None:
    write_json(tmp_path / "preprocess.json", PRE.to_dict())
    pre = Preprocess.read(tmp_path)
    assert pre == PRE
    pl.DataFrame({"carrier": ["AA"] * 5, "distance": [100.0] * 5, "x": [1] * 5,
                  "delay_class": [0] * 5}).write_parquet(tmp_path / "test.parquet")
    assert len(load_split(tmp_path, "test", pre, max_rows=3)) == 3
    with pytest.raises(BadInputError, match=r"train\.parquet"):
        load_split(tmp_path, "train", pre)
    write_json(tmp_path / "preprocess.json", {"categorical": {}})
    with pytest.raises(BadInputError, match="numeric"):
        Preprocess.read(tmp_path)
