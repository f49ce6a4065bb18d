"""The one flights feature contract: training and serving encode the same rows identically."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.flights import (
    CATEGORICAL,
    LABEL,
    NUMERIC,
    UNK,
    UNLABELLED,
    Preprocess,
    serving_config,
)
from scalelab.system.compress.features import encode as model_encode
from scalelab.system.serve.features import decode, encode, load_preprocess
from scalelab.system.train.dataset import encode_split


def _train() -> pl.DataFrame:
    cols: dict[str, object] = {c: ["A", "B", "A", "C"] for c in CATEGORICAL}
    for c in NUMERIC:
        cols[c] = [1.0, 2.0, 3.0, 6.0]
    # Missing values in the training split are not measurements: they leave mean/std alone.
    cols["temp"] = [1.0, None, float("nan"), 3.0]
    cols[LABEL] = [0, 1, 2, 3]
    return pl.DataFrame(cols)


def _hard_rows() -> pl.DataFrame:
    """Null, NaN, ±inf, unseen categories and values far outside the training range."""
    cols: dict[str, object] = {c: ["B", None, "never-seen", "A", ""] for c in CATEGORICAL}
    for c in NUMERIC:
        cols[c] = [3.0, None, float("nan"), 1e6, -50.0]
    cols["temp"] = [float("inf"), float("-inf"), None, 2.0, float("nan")]
    cols[LABEL] = [1, 0, 3, 2, 1]
    return pl.DataFrame(cols)


def test_fit_ignores_missing_values() -> None:
    pre = Preprocess.fit(_train())
    assert pre.categorical["carrier"] == [UNK, "A", "B", "C"]
    assert pre.numeric["month"] == {"mean": 3.0, "std": pytest.approx(2.1602468994692865)}
    # temp: only 1.0 and 3.0 are known -> mean 2, sample std sqrt(2).
    assert pre.numeric["temp"] == {"mean": 2.0, "std": pytest.approx(2**0.5)}


def test_training_and_serving_encode_identical_tensors(tmp_path: Path) -> None:
    pre = Preprocess.fit(_train())
    pre.write(tmp_path)
    served = load_preprocess(tmp_path)  # what the server and its clients read
    assert served == pre
    rows = _hard_rows()
    t_cat, t_num, t_y = encode_split(pre, rows)          # training
    s_cat, s_num = encode(rows, served)                  # serving clients, promote
    m = model_encode(rows, Preprocess.read(tmp_path))    # the compression bench
    assert torch.equal(t_cat, torch.from_numpy(s_cat)) and torch.equal(t_cat, m.categorical)
    assert torch.equal(t_num, torch.from_numpy(s_num)) and torch.equal(t_num, m.numeric)
    assert torch.equal(t_y, m.labels)
    # Exact values: "B" is 2; null, unseen and "" are 0 (unknown).
    assert t_cat[:, 0].tolist() == [2, 0, 0, 1, 0]
    month, temp = NUMERIC.index("month"), NUMERIC.index("temp")
    std = pre.numeric["month"]["std"]
    assert t_num[:, month].tolist() == pytest.approx(
        [0.0, 0.0, 0.0, (1e6 - 3.0) / std, (-50.0 - 3.0) / std], rel=1e-6)
    # Null, NaN and ±inf all become the mean: 0 after standardising; 2.0 is the mean itself.
    assert t_num[:, temp].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert t_num.dtype == torch.float32 and t_cat.dtype == torch.int64
    assert np.isfinite(s_num).all()


def test_decode_inverts_encode_on_known_values() -> None:
    pre = Preprocess.fit(_train())
    rows = _train().drop("temp").with_columns(pl.lit(2.0).alias("temp"))
    cat, num = encode(rows, pre)
    back = decode(cat, num, pre)
    assert [r["carrier"] for r in back] == ["A", "B", "A", "C"]
    assert [r["month"] for r in back] == pytest.approx([1.0, 2.0, 3.0, 6.0])
    assert pre.out_of_vocabulary(cat) is None
    cat[0, 1] = 4
    assert pre.out_of_vocabulary(cat) == (
        "column 1 (origin) holds index 4, outside its vocabulary [0, 3] (0 = unknown)")


def test_labels_and_bad_input() -> None:
    pre = Preprocess.fit(_train())
    rows = _hard_rows().with_columns(pl.Series(LABEL, [None, 0, 1, 2, 3]))
    assert pre.labels(rows).tolist() == [UNLABELLED, 0, 1, 2, 3]
    with pytest.raises(BadInputError, match=r"outside 0\.\.3"):
        pre.labels(rows, allow_unlabelled=False)
    with pytest.raises(BadInputError, match="lacks feature columns"):
        pre.encode(rows.drop("carrier"))
    with pytest.raises(BadInputError, match="not in the preprocess format"):
        Preprocess.from_dict({"categorical": {}, "numeric": []})
    with pytest.raises(BadInputError, match="std > 0"):
        Preprocess.from_dict({"categorical": {}, "numeric": {"x": {"mean": 0, "std": 0}},
                              "classes": ["a"]})


def test_the_serving_config_is_one_the_server_reads(tmp_path: Path) -> None:
    from scalelab.layers.nets.model_config import load_model_config
    from scalelab.layers.nets.repository import CONFIG_FILE, write_json

    write_json(tmp_path / "flights" / CONFIG_FILE, serving_config("flights"))
    cfg = load_model_config(tmp_path / "flights")
    assert cfg.name == "flights" and cfg.max_batch_size == 64
    assert [(t.name, t.shape) for t in cfg.inputs] == [("categorical", [-1, 4]),
                                                       ("numeric", [-1, 14])]
    assert [(t.name, t.shape) for t in cfg.outputs] == [("probabilities", [-1, 4]),
                                                        ("label", [-1])]
