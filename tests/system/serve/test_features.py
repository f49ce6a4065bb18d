"""Encoding the flights contract to tensors and back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from serve_fixtures import PREPROCESS

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.repository import write_json
from scalelab.system.serve.features import decode, encode, load_preprocess


def test_encode_imputes_unknowns_and_nulls(tmp_path: Path) -> None:
    write_json(tmp_path / "preprocess.json", PREPROCESS)
    pre = load_preprocess(tmp_path)
    assert pre is not None
    row = {c: "zzz" for c in pre.categorical} | {c: None for c in pre.numeric}
    row["carrier"] = "B6"
    row["month"] = 14.0  # mean 10, std 2 -> 2.0
    frame = pl.DataFrame([row], schema={**{c: pl.Utf8 for c in pre.categorical},
                                        **{c: pl.Float64 for c in pre.numeric}})
    cat, num = encode(frame, pre)
    assert cat.tolist() == [[2, 0, 0, 0]]
    assert num[0, 0] == 2.0 and (num[0, 1:] == 0).all()
    back = decode(cat, num, pre)[0]
    assert back["carrier"] == "B6" and back["origin"] is None
    assert back["month"] == 14.0 and back["day_of_week"] == 11.0
    with pytest.raises(BadInputError, match="lacks feature columns"):
        encode(frame.drop("carrier"), pre)
    assert load_preprocess(tmp_path / "none") is None
    assert np.isfinite(num).all()
