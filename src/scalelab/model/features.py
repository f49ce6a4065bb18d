"""Flights rows -> model tensors, by a model version's preprocess.json (the feature contract).

Each categorical value maps to its index in the version's vocabulary (0 = unknown); each numeric
column is imputed with its training mean, then standardised. The label `delay_class` becomes a
LongTensor; a missing label (or a missing column) becomes -1, "unlabelled" (the transfer set of
distillation uses such rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from scalelab.core.errors import BadInputError
from scalelab.nets.repository import read_json

PREPROCESS_FILE = "preprocess.json"
LABEL = "delay_class"
UNLABELLED = -1


@dataclass(frozen=True, kw_only=True)
class Preprocess:
    """A model version's preprocess.json."""

    categorical: dict[str, list[str]]
    """Column -> vocabulary (index 0 is the unknown value)."""
    numeric: dict[str, dict[str, float]]
    """Column -> {"mean", "std"} from the training split."""
    classes: list[str]
    """Class names, in label order."""

    @classmethod
    def read(cls, version_dir: str | Path) -> Preprocess:
        p = Path(version_dir) / PREPROCESS_FILE
        obj = read_json(p)
        try:
            cat, num, classes = obj["categorical"], obj["numeric"], obj["classes"]
        except KeyError as e:
            raise BadInputError(
                f"{p} lacks {e.args[0]!r}; it needs categorical, numeric and classes "
                "(the flights feature contract)") from None
        if not isinstance(cat, dict) or not isinstance(num, dict) or not isinstance(classes, list):
            raise BadInputError(f"{p}: categorical/numeric must be objects, classes a list")
        return cls(categorical={str(k): [str(x) for x in v] for k, v in cat.items()},
                   numeric={str(k): {"mean": float(v["mean"]), "std": float(v["std"])}
                            for k, v in num.items()},
                   classes=[str(c) for c in classes])

    def to_dict(self) -> dict[str, Any]:
        return {"categorical": self.categorical, "numeric": self.numeric, "classes": self.classes}


@dataclass(frozen=True, kw_only=True)
class Features:
    """Encoded rows: the network's two inputs and the labels."""

    categorical: torch.Tensor
    """LongTensor [n, k]."""
    numeric: torch.Tensor
    """FloatTensor [n, m]."""
    labels: torch.Tensor
    """LongTensor [n]; -1 where unlabelled."""

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, index: torch.Tensor | slice) -> Features:
        return Features(categorical=self.categorical[index], numeric=self.numeric[index],
                        labels=self.labels[index])

    def unlabelled(self) -> Features:
        """The same rows with their labels dropped (a transfer set)."""
        return Features(categorical=self.categorical, numeric=self.numeric,
                        labels=torch.full_like(self.labels, UNLABELLED))

    def to(self, device: str) -> Features:
        return Features(categorical=self.categorical.to(device),
                        numeric=self.numeric.to(device), labels=self.labels.to(device))


def encode(frame: pl.DataFrame, pre: Preprocess, *, where: str = "frame") -> Features:
    """Encode a flights frame with the contract's columns (see module docstring)."""
    missing = [c for c in [*pre.categorical, *pre.numeric] if c not in frame.columns]
    if missing:
        raise BadInputError(
            f"{where} lacks column(s) {', '.join(missing)} that the model's preprocess.json "
            "needs; pass a dataset written by `scalelab data run` for this model")
    cats = []
    for col, vocab in pre.categorical.items():
        lookup = {v: i for i, v in enumerate(vocab)}
        s = frame.get_column(col).cast(pl.Utf8)
        cats.append(s.replace_strict(lookup, default=0, return_dtype=pl.Int64).to_numpy())
    nums = []
    for col, st in pre.numeric.items():
        std = st["std"] if st["std"] > 0 else 1.0
        s = frame.get_column(col).cast(pl.Float64).fill_null(st["mean"]).fill_nan(st["mean"])
        nums.append(((s - st["mean"]) / std).to_numpy())
    n = frame.height
    if LABEL in frame.columns:
        y = frame.get_column(LABEL).cast(pl.Int64).fill_null(UNLABELLED).to_numpy()
    else:
        y = np.full(n, UNLABELLED, dtype=np.int64)
    bad = (y >= len(pre.classes)) | (y < UNLABELLED)
    if bad.any():
        raise BadInputError(f"{where}: {LABEL} has values outside 0..{len(pre.classes) - 1}")
    cat_arr = np.stack(cats, axis=1) if cats else np.zeros((n, 0), dtype=np.int64)
    num_arr = np.stack(nums, axis=1) if nums else np.zeros((n, 0))
    # np.array(copy=True): polars hands out read-only views, which torch must not wrap.
    return Features(categorical=torch.from_numpy(np.array(cat_arr, dtype=np.int64, copy=True)),
                    numeric=torch.from_numpy(np.array(num_arr, dtype=np.float32, copy=True)),
                    labels=torch.from_numpy(np.array(y, dtype=np.int64, copy=True)))


def load_split(data_dir: str | Path, split: str, pre: Preprocess, *,
               max_rows: int | None = None) -> Features:
    """Read DATA_DIR/<split>.parquet (a seeded sample of `max_rows` rows, kept in file order)
    and encode it."""
    p = Path(data_dir) / f"{split}.parquet"
    if not p.is_file():
        raise BadInputError(
            f"{p} does not exist; --data must be a dataset directory with train.parquet and "
            "test.parquet (written by `scalelab data run`)")
    cols = [*pre.categorical, *pre.numeric]
    try:
        lf = pl.scan_parquet(p)
        names = lf.collect_schema().names()
        if LABEL in names:
            cols.append(LABEL)
        frame = lf.select([c for c in cols if c in names]).collect()
        if max_rows and frame.height > max_rows:
            # An even sample across the file, in file order: the first N rows of a time-ordered
            # split would be its first months only.
            frame = frame.sample(n=max_rows, seed=0, shuffle=False)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise BadInputError(f"{p} is not a readable Parquet file ({e})") from e
    return encode(frame, pre, where=str(p))
