"""The flights feature contract, both ways, as the server and its clients call it.

The contract itself (columns, classes, preprocess.json and the one encoder) is
`nets.flights.Preprocess`; these functions keep the serving side's names. Encoding is what a
client does before calling the server (promote uses it on the holdout); decoding turns logged
tensors back into flat feature columns for the data part's train/serve skew check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from scalelab.layers.nets.flights import PREPROCESS_FILE, Preprocess

__all__ = ["PREPROCESS_FILE", "Preprocess", "decode", "encode", "load_preprocess",
           "out_of_vocabulary"]


def load_preprocess(version_dir: Path) -> Preprocess | None:
    """Parse VERSION/preprocess.json, or None when the version has none."""
    return Preprocess.read_optional(version_dir)


def encode(frame: pl.DataFrame, pre: Preprocess) -> tuple[np.ndarray, np.ndarray]:
    """Rows -> (categorical int64 [N, k], numeric float32 [N, m]) per the contract."""
    return pre.encode(frame)


def out_of_vocabulary(cat: np.ndarray, pre: Preprocess) -> str | None:
    """Why `cat` [N, k] holds an index outside its column's vocabulary, or None."""
    return pre.out_of_vocabulary(cat)


def decode(cat: np.ndarray, num: np.ndarray, pre: Preprocess) -> list[dict[str, Any]]:
    """(categorical, numeric) tensors -> one flat dict of raw feature values per row."""
    return pre.decode(cat, num)
