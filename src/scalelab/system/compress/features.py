"""Flights rows -> model tensors, by a model version's preprocess.json (the feature contract).

The encoding is nets.flights' (the one training and serving use); this module adds the tensors
the compression bench trains and measures on. A missing label (or a missing label column)
becomes -1, "unlabelled" (the transfer set of distillation uses such rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import torch

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.flights import LABEL, PREPROCESS_FILE, UNLABELLED, Preprocess

__all__ = ["LABEL", "PREPROCESS_FILE", "UNLABELLED", "Features", "Preprocess", "encode",
           "load_split"]


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
    """Encode a flights frame by the contract's one encoder (see nets.flights)."""
    cat, num = pre.encode(frame, where=where)
    y = pre.labels(frame, where=where)
    return Features(categorical=torch.from_numpy(cat), numeric=torch.from_numpy(num),
                    labels=torch.from_numpy(y))


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
