"""What one training run is: data, model, batch policy, sharding, checkpoints, launch.

The launcher writes this config as JSON into the run directory; every torchrun worker reads it
back, so a restarted worker trains exactly the run its predecessor trained.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from scalelab.lab.core.errors import BadUsageError

Mode = Literal["strong", "weak"]
Shard = Literal["none", "zero", "fsdp"]


@dataclass(kw_only=True)
class TabularRunConfig:
    """One data-parallel run of the tabular (flights) net; the transformer's is
    train.parallel.config.ParallelConfig. Batch sizes are in samples; steps are optimizer steps."""

    data: str | None = None
    """Dataset directory holding train.parquet / test.parquet; None reads the raw flights CSVs."""
    limit: float | None = None
    """Training rows: >= 1 is a row count, (0, 1) a fraction; the test split shrinks alike."""
    train_fraction: float = 1.0
    """Fraction of the (limited) training rows to train on; the scaling-law grid varies it."""
    seed: int = 0
    """Seeds weights and data order; data order is a pure function of (seed, epoch, step)."""
    epochs: int = 1
    """Passes over the training rows (ignored when `max_steps` is set)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps; None trains `epochs` full epochs."""
    batch: int = 512
    """Global batch (mode strong) or per-worker batch (mode weak)."""
    mode: Mode = "strong"
    """strong: fixed global batch split over workers; weak: fixed per-worker batch."""
    accumulation: int = 1
    """Micro-steps per optimizer step; each worker's batch is split into this many micro-batches."""
    lr: float = 2e-3
    """Learning rate at `base_batch`; scaled linearly with the global batch."""
    base_batch: int = 512
    """The global batch at which `lr` was tuned (linear scaling reference)."""
    warmup_steps: int | None = None
    """Gradual warmup length; None means 0 at the base batch, else 5% of the steps (>= 1)."""
    weight_decay: float = 0.0
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the TabularNet."""
    class_weights: Literal["none", "balanced"] = "balanced"
    """balanced: weight each class's loss by n / (classes × its count) in the training rows, so
    the rare classes (late > 60 min, cancelled) are learned rather than predicted never."""
    shard: Shard = "none"
    """none: DDP; zero: ZeroRedundancyOptimizer (sharded optimizer state); fsdp: FSDP2."""
    checkpoint_dir: str | None = None
    """Where checkpoints go; None means <run dir>/checkpoints."""
    checkpoint_every: int = 0
    """Save every N optimizer steps; 0 disables checkpoints (unless `checkpoint_auto`)."""
    checkpoint_auto: bool = False
    """Measure the save cost and use Daly's interval for `mtbf_s`."""
    mtbf_s: float = 6 * 3600.0
    """Mean time between failures assumed by the automatic interval."""
    keep: int = 3
    """Checkpoints kept on disk (older ones are deleted after a newer one is complete)."""
    async_checkpoint: bool = False
    """Write checkpoints from a background thread (own gloo group); only the snapshot blocks."""
    resume: bool = True
    """Resume from the newest good checkpoint in `checkpoint_dir` when one exists."""
    rehearse_failure: bool = False
    """SIGKILL one worker at a seeded random step on the first attempt (torchrun restarts it)."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms: needed for bitwise-equal recovery."""
    threads: int | None = None
    """Intra-op threads per process; None means cores // processes (at least 1)."""
    peak_flops: float | None = None
    """The device's peak FLOP/s per process, for MFU; None leaves MFU unknown."""
    price_per_hour: float | None = None
    """Cost of the machine per hour (USD) for samples per dollar; None leaves cost unknown."""
    flop_count: bool = True
    """Count one step's FLOPs with FlopCounterMode (a few ms, once)."""

    def __post_init__(self) -> None:
        if self.limit is not None and not self.limit > 0:
            raise BadUsageError(
                f"--limit must be > 0 (rows, or a fraction below 1); got {self.limit}")
        if self.limit is not None and self.limit >= 1 and self.limit != int(self.limit):
            raise BadUsageError(f"--limit {self.limit}: a row count must be a whole number")
        if not 0 < self.train_fraction <= 1:
            raise BadUsageError(f"train_fraction must be in (0, 1]; got {self.train_fraction}")
        if self.epochs < 1:
            raise BadUsageError(f"--epochs must be >= 1; got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise BadUsageError(f"--steps must be >= 1; got {self.max_steps}")
        if self.batch < 1 or self.base_batch < 1:
            raise BadUsageError(f"--batch and --base-batch must be >= 1; got {self.batch}")
        if self.mode not in ("strong", "weak"):
            raise BadUsageError(f"--mode must be strong or weak; got {self.mode!r}")
        if self.shard not in ("none", "zero", "fsdp"):
            raise BadUsageError(f"--shard must be none, zero or fsdp; got {self.shard!r}")
        if self.accumulation < 1:
            raise BadUsageError(f"--accumulation must be >= 1; got {self.accumulation}")
        if not self.lr > 0:
            raise BadUsageError(f"--lr must be > 0; got {self.lr}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise BadUsageError(f"--warmup must be >= 0 steps; got {self.warmup_steps}")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise BadUsageError(f"--hidden must be positive widths like 64,64; got {self.hidden}")
        if self.checkpoint_every < 0 or self.keep < 1:
            raise BadUsageError("--checkpoint-interval must be >= 0 and --keep >= 1")
        if not self.mtbf_s > 0:
            raise BadUsageError(f"--mtbf must be > 0; got {self.mtbf_s}")
        if self.threads is not None and self.threads < 1:
            raise BadUsageError(f"--threads must be >= 1; got {self.threads}")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise BadUsageError("--peak-flops must be > 0")
        if self.price_per_hour is not None and not self.price_per_hour > 0:
            raise BadUsageError("--price-per-hour must be > 0")

    def global_batch(self, world: int) -> int:
        return self.batch if self.mode == "strong" else self.batch * world

    def local_batch(self, world: int) -> int:
        """Samples one worker processes per optimizer step (all its micro-batches together)."""
        g = self.global_batch(world)
        if g % world:
            raise BadUsageError(
                f"global batch {g} does not split evenly over {world} workers; "
                f"use a multiple of {world} or --mode weak"
            )
        local = g // world
        if local % self.accumulation:
            raise BadUsageError(
                f"per-worker batch {local} does not split into {self.accumulation} micro-batches; "
                "pick --batch divisible by workers x accumulation"
            )
        return local

    def run_key(self, world: int) -> str:
        """A digest of what determines the numbers (not how long, not how saved), so a resume
        never loads a checkpoint of a different run."""
        keep = ("data", "limit", "train_fraction", "seed", "batch", "mode", "accumulation", "lr",
                "base_batch", "warmup_steps", "weight_decay", "hidden", "class_weights", "shard")
        blob = json.dumps({k: getattr(self, k) for k in keep} | {"world": world}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def checkpoints_on(self) -> bool:
        return self.checkpoint_every > 0 or self.checkpoint_auto or self.rehearse_failure

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TabularRunConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> TabularRunConfig:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
