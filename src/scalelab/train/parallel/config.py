"""One transformer training run: model size, text, batch, strategy, checkpoints, measurement.

The launcher writes it as JSON into the run directory and every torchrun worker reads it back,
so a restarted worker trains exactly the run its predecessor trained.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from scalelab.core.errors import BadUsageError
from scalelab.nets.llama import LlamaConfig
from scalelab.train.text import VOCAB_SIZE

Strategy = Literal["single", "dp", "fsdp", "tp", "pp", "fsdp+tp"]
STRATEGIES: tuple[str, ...] = ("single", "dp", "fsdp", "tp", "pp", "fsdp+tp")
Schedule = Literal["gpipe", "1f1b"]


@dataclass(kw_only=True)
class ParallelConfig:
    """A transformer run. Batches are in sequences of `seq` tokens; steps are optimizer steps."""

    strategy: Strategy = "dp"
    """single: one process, no wrapper (the reference); dp: DDP; fsdp: FSDP2 per block; tp:
    tensor parallel over all ranks; pp: pipeline stages over all ranks; fsdp+tp: a 2-D mesh
    (FSDP across `world / tp` groups, TP of degree `tp` inside each)."""
    tp: int = 2
    """Tensor-parallel degree for fsdp+tp (tp uses every rank)."""
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 4
    ffn: int = 128
    """SwiGLU inner width."""
    seq: int = 64
    """Tokens per sequence."""
    tokens: int = 200_000
    """Corpus tokens read (the stdlib sources, byte-level)."""
    batch: int = 8
    """Global batch in sequences per optimizer step."""
    steps: int = 10
    lr: float = 3e-3
    seed: int = 0
    micro_batches: int = 4
    """Pipeline micro-batches per step."""
    schedule: Schedule = "1f1b"
    recv_ahead: bool = True
    """Pipeline: post a step's receives ahead of need (pipeline.RecvAhead); False keeps torch's
    schedules posting each when they use it."""
    checkpoint_every: int = 0
    """Save a distributed checkpoint every N steps (0: never)."""
    checkpoint_dir: str | None = None
    """Where checkpoints go; None means <run dir>/checkpoints."""
    resume: bool = True
    """Resume from the newest complete checkpoint when one exists."""
    profile_steps: int = 2
    """Steps timed under torch.profiler for the communication split (after one warm-up step)."""
    deterministic: bool = True
    threads: int | None = None
    """Intra-op threads per process; None means cores // processes (at least 1)."""
    fail_at_step: int | None = None
    """Rehearsal: SIGKILL rank `fail_rank` before this step on the first attempt."""
    fail_rank: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise BadUsageError(f"--strategy must be one of {', '.join(STRATEGIES)}; "
                                f"got {self.strategy!r}")
        for name in ("hidden", "layers", "heads", "kv_heads", "ffn", "batch", "steps",
                     "micro_batches", "tp"):
            if getattr(self, name) < 1:
                raise BadUsageError(f"--{name.replace('_', '-')} must be >= 1; "
                                    f"got {getattr(self, name)}")
        if self.schedule not in ("gpipe", "1f1b"):
            raise BadUsageError(f"--schedule must be gpipe or 1f1b; got {self.schedule!r}")
        if not self.lr > 0:
            raise BadUsageError(f"--lr must be > 0; got {self.lr}")
        if self.checkpoint_every < 0 or self.profile_steps < 0:
            raise BadUsageError("--checkpoint-interval and --profile-steps must be >= 0")
        self.model_config()  # validates heads / widths

    def model_config(self) -> LlamaConfig:
        """The Llama shape; the embedding and head are untied so pipeline stages own them."""
        return LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=self.hidden,
                           intermediate_size=self.ffn, num_layers=self.layers,
                           num_heads=self.heads, num_kv_heads=self.kv_heads,
                           max_position_embeddings=self.seq, tie_word_embeddings=False)

    def check_world(self, world: int) -> None:
        """Raise if this strategy cannot run on `world` ranks."""
        s = self.strategy
        if s == "single" and world != 1:
            raise BadUsageError("--strategy single runs one process; use --nproc 1")
        if s in ("dp", "fsdp") and self.batch % world:
            raise BadUsageError(f"--batch {self.batch} does not split over {world} ranks")
        tp = world if s == "tp" else self.tp if s == "fsdp+tp" else 1
        if s == "fsdp+tp" and (world % tp or world // tp < 1):
            raise BadUsageError(f"fsdp+tp: {world} ranks do not split into TP groups of {tp}")
        if s == "fsdp+tp" and self.batch % (world // tp):
            raise BadUsageError(f"--batch {self.batch} does not split over {world // tp} "
                                "data-parallel groups")
        if tp > 1 and (self.heads % tp or self.kv_heads % tp or self.ffn % tp):
            raise BadUsageError(f"tensor parallel of degree {tp} needs --heads, --kv-heads and "
                                f"--ffn divisible by {tp} (got {self.heads}, {self.kv_heads}, "
                                f"{self.ffn})")
        if s == "pp":
            if world > self.layers:
                raise BadUsageError(f"{world} pipeline stages need at least {world} layers; "
                                    f"got --layers {self.layers}")
            if self.batch % self.micro_batches:
                raise BadUsageError(f"--batch {self.batch} does not split into "
                                    f"--micro-batches {self.micro_batches}")

    def run_key(self, world: int) -> str:
        """A digest of what determines the numbers, so a resume never loads another run."""
        keep = ("hidden", "layers", "heads", "kv_heads", "ffn", "seq", "tokens", "batch", "lr",
                "seed")
        blob = json.dumps({k: getattr(self, k) for k in keep}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ParallelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> ParallelConfig:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
