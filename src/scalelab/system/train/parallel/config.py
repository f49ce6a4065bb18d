"""One transformer training run, in sections: the model's shape, the text it reads, how it is
parallelised, how it is checkpointed (and a rehearsed failure), what is measured; beside them the
run's few scalars (steps, learning rate, seed, determinism, threads).

The launcher writes it as JSON (one object per section) into the run directory and every
torchrun worker reads it back, so a restarted worker trains exactly the run its predecessor
trained. The CLI's flags are flat (`--hidden`, `--strategy`, `--checkpoint-interval`):
`ParallelConfig.from_flags` and `replace` take those names and put each in its section.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.nets.llama import LlamaConfig
from scalelab.system.train.text import VOCAB_SIZE

Strategy = Literal["single", "dp", "fsdp", "tp", "pp", "fsdp+tp"]
STRATEGIES: tuple[str, ...] = ("single", "dp", "fsdp", "tp", "pp", "fsdp+tp")
Schedule = Literal["gpipe", "1f1b"]


def _at_least_one(section: object, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(section, name) < 1:
            raise BadUsageError(f"--{name.replace('_', '-')} must be >= 1; "
                                f"got {getattr(section, name)}")


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The Llama model's size."""

    hidden: int = 64
    """Residual width."""
    layers: int = 4
    """Transformer blocks."""
    heads: int = 4
    """Attention heads."""
    kv_heads: int = 4
    """Key/value heads (grouped-query attention when fewer than `heads`)."""
    ffn: int = 128
    """SwiGLU inner width."""

    def __post_init__(self) -> None:
        _at_least_one(self, ("hidden", "layers", "heads", "kv_heads", "ffn"))


@dataclass(frozen=True, kw_only=True)
class TextData:
    """What the run reads and how much of it per step."""

    seq: int = 64
    """Tokens per sequence."""
    tokens: int = 200_000
    """Corpus tokens read (the stdlib sources, byte-level)."""
    batch: int = 8
    """Global batch in sequences per optimizer step."""

    def __post_init__(self) -> None:
        _at_least_one(self, ("batch",))


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    """How the ranks split the work (train.parallel.dims turns it into degrees, once)."""

    strategy: Strategy = "dp"
    """single: one process, no wrapper (the reference); dp: DDP; fsdp: FSDP2 per block; tp:
    tensor parallel over all ranks; pp: pipeline stages over all ranks; fsdp+tp: a 2-D mesh
    (FSDP across `world / tp` groups, TP of degree `tp` inside each)."""
    tp: int = 2
    """Tensor-parallel degree for fsdp+tp (tp uses every rank)."""
    micro_batches: int = 4
    """Pipeline micro-batches per step."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule: gpipe or 1f1b."""
    recv_ahead: bool = True
    """Pipeline: post a step's receives ahead of need (pipeline.RecvAhead); False keeps torch's
    schedules posting each when they use it."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise BadUsageError(f"--strategy must be one of {', '.join(STRATEGIES)}; "
                                f"got {self.strategy!r}")
        _at_least_one(self, ("micro_batches", "tp"))
        if self.schedule not in ("gpipe", "1f1b"):
            raise BadUsageError(f"--schedule must be gpipe or 1f1b; got {self.schedule!r}")


@dataclass(frozen=True, kw_only=True)
class Checkpointing:
    """Distributed checkpoints, resuming from them, and the failure a rehearsal injects."""

    every: int = 0
    """Save a distributed checkpoint every N steps (0: never)."""
    dir: str | None = None
    """Where checkpoints go; None means <run dir>/checkpoints."""
    resume: bool = True
    """Resume from the newest complete checkpoint when one exists."""
    fail_at_step: int | None = None
    """Rehearsal: SIGKILL rank `fail_rank` before this step on the first attempt."""
    fail_rank: int = 0
    """The rank a rehearsal kills."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise BadUsageError("--checkpoint-interval and --profile-steps must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What the run measures beyond step times."""

    profile_steps: int = 2
    """Steps timed under torch.profiler for the communication split (after one warm-up step)."""

    def __post_init__(self) -> None:
        if self.profile_steps < 0:
            raise BadUsageError("--checkpoint-interval and --profile-steps must be >= 0")


SECTIONS: dict[str, type] = {"model": ModelShape, "data": TextData, "parallel": Parallelism,
                             "checkpoint": Checkpointing, "measure": Measurement}
FLAT_NAMES: dict[str, tuple[str, str]] = {
    **{n: ("model", n) for n in ("hidden", "layers", "heads", "kv_heads", "ffn")},
    **{n: ("data", n) for n in ("seq", "tokens", "batch")},
    **{n: ("parallel", n) for n in ("strategy", "tp", "micro_batches", "schedule",
                                    "recv_ahead")},
    "checkpoint_every": ("checkpoint", "every"), "checkpoint_dir": ("checkpoint", "dir"),
    "resume": ("checkpoint", "resume"), "fail_at_step": ("checkpoint", "fail_at_step"),
    "fail_rank": ("checkpoint", "fail_rank"), "profile_steps": ("measure", "profile_steps"),
}
"""The CLI's flat names (and the pre-sections config file's keys): section and field of each."""


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """A transformer run. Batches are in sequences of `data.seq` tokens; steps are optimizer
    steps."""

    model: ModelShape = field(default_factory=ModelShape)
    """The model's size."""
    data: TextData = field(default_factory=TextData)
    """The text and the batch."""
    parallel: Parallelism = field(default_factory=Parallelism)
    """The strategy and its settings."""
    checkpoint: Checkpointing = field(default_factory=Checkpointing)
    """Checkpoints, resume, rehearsed failure."""
    measure: Measurement = field(default_factory=Measurement)
    """Profiling."""
    steps: int = 10
    """Optimizer steps."""
    lr: float = 3e-3
    """AdamW learning rate."""
    seed: int = 0
    """Seeds the weights and the data order."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms: needed for bitwise-equal recovery."""
    threads: int | None = None
    """Intra-op threads per process; None means cores // processes (at least 1)."""

    def __post_init__(self) -> None:
        _at_least_one(self, ("steps",))
        if not self.lr > 0:
            raise BadUsageError(f"--lr must be > 0; got {self.lr}")
        self.model_config()  # validates heads / widths

    @classmethod
    def from_flags(cls, **flat: Any) -> ParallelConfig:
        """A config from the CLI's flat names (`hidden=`, `strategy=`, `checkpoint_every=`)."""
        return cls().replace(**flat)

    def replace(self, **flat: Any) -> ParallelConfig:
        """A copy with the named fields changed; flat names go to their sections."""
        top = {f.name for f in fields(self)} - set(SECTIONS)
        changes: dict[str, dict[str, Any]] = {}
        plain: dict[str, Any] = {}
        for name, value in flat.items():
            if name in FLAT_NAMES:
                section, key = FLAT_NAMES[name]
                changes.setdefault(section, {})[key] = value
            elif name in top:
                plain[name] = value
            else:
                raise TypeError(f"ParallelConfig has no field {name!r}")
        for section, kw in changes.items():
            plain[section] = dataclasses.replace(getattr(self, section), **kw)
        return dataclasses.replace(self, **plain)

    def model_config(self) -> LlamaConfig:
        """The Llama shape; the embedding and head are untied so pipeline stages own them."""
        m = self.model
        return LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=m.hidden,
                           intermediate_size=m.ffn, num_layers=m.layers,
                           num_heads=m.heads, num_kv_heads=m.kv_heads,
                           max_position_embeddings=self.data.seq, tie_word_embeddings=False)

    def check_world(self, world: int) -> None:
        """Raise if this strategy cannot run on `world` ranks."""
        s, m, batch = self.parallel.strategy, self.model, self.data.batch
        if s == "single" and world != 1:
            raise BadUsageError("--strategy single runs one process; use --nproc 1")
        if s in ("dp", "fsdp") and batch % world:
            raise BadUsageError(f"--batch {batch} does not split over {world} ranks")
        tp = world if s == "tp" else self.parallel.tp if s == "fsdp+tp" else 1
        if s == "fsdp+tp" and (world % tp or world // tp < 1):
            raise BadUsageError(f"fsdp+tp: {world} ranks do not split into TP groups of {tp}")
        if s == "fsdp+tp" and batch % (world // tp):
            raise BadUsageError(f"--batch {batch} does not split over {world // tp} "
                                "data-parallel groups")
        if tp > 1 and (m.heads % tp or m.kv_heads % tp or m.ffn % tp):
            raise BadUsageError(f"tensor parallel of degree {tp} needs --heads, --kv-heads and "
                                f"--ffn divisible by {tp} (got {m.heads}, {m.kv_heads}, "
                                f"{m.ffn})")
        if s == "pp":
            if world > m.layers:
                raise BadUsageError(f"{world} pipeline stages need at least {world} layers; "
                                    f"got --layers {m.layers}")
            if batch % self.parallel.micro_batches:
                raise BadUsageError(f"--batch {batch} does not split into "
                                    f"--micro-batches {self.parallel.micro_batches}")

    def run_key(self, world: int) -> str:
        """A digest of what determines the numbers, so a resume never loads another run."""
        m, d = self.model, self.data
        blob = json.dumps({"hidden": m.hidden, "layers": m.layers, "heads": m.heads,
                           "kv_heads": m.kv_heads, "ffn": m.ffn, "seq": d.seq,
                           "tokens": d.tokens, "batch": d.batch, "lr": self.lr,
                           "seed": self.seed}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ParallelConfig:
        """The config from its JSON form; the flat form of earlier versions gets an error
        naming the move."""
        flat = sorted(set(d) & set(FLAT_NAMES))
        if flat:
            raise BadUsageError(
                f"this transformer config is in the old flat form (top-level {', '.join(flat)});"
                " it is now in sections model / data / parallel / checkpoint / measure: "
                "re-run the launch that wrote it, or build it with "
                "ParallelConfig.from_flags(**old)")
        known = {f.name for f in fields(cls)}
        sections = {name: kind(**d.get(name, {})) for name, kind in SECTIONS.items()}
        return cls(**{k: v for k, v in d.items() if k in known and k not in SECTIONS},
                   **sections)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> ParallelConfig:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
