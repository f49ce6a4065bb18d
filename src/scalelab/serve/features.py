"""The flights feature contract, both ways: table rows <-> the model's input tensors.

preprocess.json (written by training) holds, per categorical column, its vocabulary (index 0 is
unknown) and, per numeric column, the mean and std used to impute nulls and standardise. Encoding
is what a client does before calling the server (promote uses it on the holdout); decoding turns
logged tensors back into flat feature columns for the data part's train/serve skew check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from scalelab.core.errors import BadInputError
from scalelab.nets.repository import read_json

PREPROCESS_FILE = "preprocess.json"


@dataclass(kw_only=True, frozen=True)
class Preprocess:
    """A version's preprocess.json, parsed."""

    categorical: dict[str, list[str]]
    """Column -> vocabulary; index 0 stands for unknown values."""
    numeric: dict[str, tuple[float, float]]
    """Column -> (mean, std) used to impute nulls and standardise."""
    classes: list[str]
    """Class names in output order."""

    def __post_init__(self) -> None:
        if not self.classes:
            raise BadInputError("preprocess.json: 'classes' must name at least one class")


def load_preprocess(version_dir: Path) -> Preprocess | None:
    """Parse VERSION/preprocess.json, or None when the version has none."""
    path = version_dir / PREPROCESS_FILE
    if not path.is_file():
        return None
    raw = read_json(path)
    try:
        cat = {str(k): [str(x) for x in v] for k, v in raw.get("categorical", {}).items()}
        num = {str(k): (float(v["mean"]), float(v["std"]))
               for k, v in raw.get("numeric", {}).items()}
        classes = [str(c) for c in raw.get("classes", [])]
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise BadInputError(f"{path}: not in the preprocess format ({e})") from e
    return Preprocess(categorical=cat, numeric=num, classes=classes)


def encode(frame: pl.DataFrame, pre: Preprocess) -> tuple[np.ndarray, np.ndarray]:
    """Rows -> (categorical int64 [N, k], numeric float32 [N, m]) per the contract."""
    missing = [c for c in [*pre.categorical, *pre.numeric] if c not in frame.columns]
    if missing:
        raise BadInputError(f"the table lacks feature columns {missing}; it must follow the "
                            "flights feature contract")
    n = frame.height
    cat = np.zeros((n, len(pre.categorical)), dtype=np.int64)
    for j, (col, vocab) in enumerate(pre.categorical.items()):
        index = {v: i for i, v in enumerate(vocab)}
        values = frame.get_column(col).cast(pl.Utf8).to_list()
        cat[:, j] = [index.get(v, 0) if v is not None else 0 for v in values]
    num = np.zeros((n, len(pre.numeric)), dtype=np.float32)
    for j, (col, (mean, std)) in enumerate(pre.numeric.items()):
        x = frame.get_column(col).cast(pl.Float64).fill_null(mean).fill_nan(mean).to_numpy()
        num[:, j] = (x - mean) / (std if std > 0 else 1.0)
    return cat, num


def out_of_vocabulary(cat: np.ndarray, pre: Preprocess) -> str | None:
    """Why the categorical tensor `cat` [N, k] holds an index outside its column's vocabulary,
    or None when every index is valid. Checked before compute: an embedding lookup out of
    range raises inside the network, which would answer 500 for what is a bad request."""
    sizes = [len(v) for v in pre.categorical.values()]
    if cat.ndim != 2 or cat.shape[1] != len(sizes):
        return None  # not this contract's layout; the config's shape check already ran
    for j, (col, n) in enumerate(zip(pre.categorical, sizes, strict=True)):
        bad = (cat[:, j] < 0) | (cat[:, j] >= n)
        if bad.any():
            return (f"column {j} ({col}) holds index {int(cat[:, j][bad][0])}, outside its "
                    f"vocabulary [0, {n - 1}] (0 = unknown)")
    return None


def decode(cat: np.ndarray, num: np.ndarray, pre: Preprocess) -> list[dict[str, Any]]:
    """(categorical, numeric) tensors -> one flat dict of raw feature values per row."""
    if cat.ndim != 2 or cat.shape[1] != len(pre.categorical) or num.ndim != 2 \
            or num.shape[1] != len(pre.numeric):
        raise BadInputError("tensors do not match preprocess.json's columns")
    rows: list[dict[str, Any]] = [{} for _ in range(cat.shape[0])]
    for j, (col, vocab) in enumerate(pre.categorical.items()):
        for i, code in enumerate(cat[:, j].tolist()):
            rows[i][col] = vocab[code] if 0 < code < len(vocab) else None
    for j, (col, (mean, std)) in enumerate(pre.numeric.items()):
        raw = num[:, j].astype(np.float64) * (std if std > 0 else 1.0) + mean
        for i, v in enumerate(raw.tolist()):
            rows[i][col] = v
    return rows
