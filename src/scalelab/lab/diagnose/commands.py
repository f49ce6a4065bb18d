"""The `scalelab` commands a diagnosis runs, as typed option objects.

Each class is one subcommand; its fields are that command's options, named as the CLI names
them (`sample_rows` → `--sample-rows` unless the field says otherwise) and typed as the CLI
parses them. `to_argv()` is the only place a flag string is written, and
tests/lab/diagnose/test_commands.py checks every field against the click command it targets, so
renaming an option in a part's CLI fails a test instead of a diagnosis.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal


def flag(name: str) -> Any:
    """A field whose CLI option is spelled differently from the field's name."""
    return field(default=None, metadata={"flag": name})


def positional() -> Any:
    """A field that is the command's positional argument (e.g. load's URL)."""
    return field(metadata={"positional": True})


def _text(v: object) -> str:
    if isinstance(v, float):
        # Exact, not %g: 1234567.0 must not reach the CLI as 1.23457e+06.
        return str(int(v)) if v.is_integer() else repr(v)
    return str(v)


@dataclass(frozen=True, kw_only=True)
class Command:
    """Base of every command: the words after `scalelab` and how fields become flags."""

    path: ClassVar[tuple[str, ...]]
    """The subcommand, e.g. ("data", "bench")."""
    emits_json: ClassVar[bool] = True
    """Pass --json: one JSON document on stdout, which the step's log keeps."""

    def to_argv(self) -> list[str]:
        argv: list[str] = [*self.path, *(["--json"] if self.emits_json else [])]
        tail: list[str] = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None or v is False:
                continue
            if f.metadata.get("rest"):
                tail = ["--", *map(str, v)]
                continue
            if f.metadata.get("positional"):
                argv.append(_text(v))
                continue
            name = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
            if f.metadata.get("repeat"):  # given once per item, e.g. --header NAME:VALUE
                for x in v:
                    argv += [name, _text(x)]
            elif v is True:
                argv.append(name)
            elif isinstance(v, list | tuple):
                argv += [name, ",".join(_text(x) for x in v)]
            else:
                argv += [name, _text(v)]
        return argv + tail

    @classmethod
    def flags(cls) -> dict[str, str]:
        """Field name → the CLI option it becomes (positional fields and the tail excluded)."""
        return {
            f.name: f.metadata.get("flag") or "--" + f.name.replace("_", "-")
            for f in dataclasses.fields(cls)
            if not (f.metadata.get("positional") or f.metadata.get("rest"))
        }


@dataclass(frozen=True, kw_only=True)
class DataGenerate(Command):
    path = ("data", "generate")
    scale: list[float]
    sample: int | None = None
    out: Path


@dataclass(frozen=True, kw_only=True)
class DataRun(Command):
    path = ("data", "run")
    input: Path
    out: Path
    lineage: Path | None = None


@dataclass(frozen=True, kw_only=True)
class DataBench(Command):
    path = ("data", "bench")
    scale: list[float]
    sample: int | None = None
    repeats: int = 1
    work: Path | None = None
    price_per_core_hour: float | None = None
    records: Path | None = None


@dataclass(frozen=True, kw_only=True)
class TrainBench(Command):
    path = ("train", "bench")
    nproc: list[int]
    mode: Literal["strong", "weak"] = "strong"
    batch: int
    steps: int
    limit: int | None = None
    data: Path | None = None
    price_per_core_hour: float | None = None
    records: Path | None = None


@dataclass(frozen=True, kw_only=True)
class Train(Command):
    path = ("train",)
    nproc: int = 1
    limit: int | None = None
    epochs: int = 1
    batch: int
    threads: int | None = None
    """Threads per process (the CLI's default: cores // processes)."""
    data: Path | None = None
    repo: Path | None = None
    lineage: Path | None = None
    price_per_hour: float | None = None
    records: Path | None = None


@dataclass(frozen=True, kw_only=True)
class _LoadTarget(Command):
    """What `load run` and `load capacity` send and where."""

    url: str = positional()
    payload: Literal["auto", "get", "json", "file", "oip", "flights"] | None = None
    model: str | None = None
    model_repo: Path | None = None
    data: Path | None = None
    body: Path | None = None
    warmup: str | None = None
    records: Path | None = None
    cluster: str | None = None
    """A Dask scheduler whose workers generate the load (`client.cluster`)."""
    header: list[str] | None = field(default=None, metadata={"flag": "--header", "repeat": True})
    """NAME:VALUE headers sent with every request (the stage's `headers:`)."""
    api_key_env: str | None = None
    """The environment variable holding the endpoint's key (the stage's `api_key_env:`): the
    command line names the variable, never the key."""


@dataclass(frozen=True, kw_only=True)
class LoadRun(_LoadTarget):
    path = ("load", "run")
    rates: list[float]
    duration: str
    arrival: Literal["constant", "poisson"] | None = None
    """`load run`'s default is poisson; the level sweeps ask for constant (evenly spaced),
    kinder to short levels, as their capacity searches' start assumes (endpoint.grid_start)."""
    trace_sample: float | None = None
    trace_at: float | None = None
    server_pid: int | None = None
    metrics_url: str | None = None
    server_signals: bool = False
    prometheus: str | None = None


@dataclass(frozen=True, kw_only=True)
class LoadCapacity(_LoadTarget):
    path = ("load", "capacity")
    slo: str
    error_budget: str | None = None
    start: float | None = None
    max_rate: float | None = None
    fails_at: float | None = None
    precision: str | None = None
    min_step: str | None = None
    max_step: str | None = None
    max_steps: int | None = None
    confirm: str | None = None
    """Length of the confirmation run of the answer (`load capacity --confirm`)."""
    budget: str | None = None
    """Time for the whole search (`load capacity --budget`; `serve_search.search_budget`)."""


@dataclass(frozen=True, kw_only=True)
class Compress(Command):
    path = ("compress",)
    model: Path
    variants: list[str]
    data: Path | None = None
    price_per_core_hour: float | None = None
    price_per_gpu_hour: float | None = None
    records: Path | None = None


@dataclass(frozen=True, kw_only=True)
class Sweep(Command):
    path = ("sweep",)
    var: str
    """NAME=LEVELS, e.g. workers=1,2,4."""
    repeats: int = 1
    metric: str | None = None
    records: Path | None = None
    cluster: str | None = None
    """A Dask scheduler whose workers run the command (`client.cluster`)."""
    command: list[str] = field(default_factory=list, metadata={"rest": True})


@dataclass(frozen=True, kw_only=True)
class ServeRun(Command):
    path = ("serve", "run")
    emits_json = False  # a server prints no result document
    model_repo: Path
    host: str = "127.0.0.1"
    port: int
    workers: int | None = None
    torch_threads: int | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    trace_out: Path | None = None


COMMANDS: tuple[type[Command], ...] = (
    DataGenerate,
    DataRun,
    DataBench,
    TrainBench,
    Train,
    LoadRun,
    LoadCapacity,
    Compress,
    Sweep,
    ServeRun,
)
"""Every command a diagnosis runs (the test checks each against the CLI)."""
