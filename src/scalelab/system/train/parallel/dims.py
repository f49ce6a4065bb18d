"""Which parallelisms are on, and the device mesh they run over.

One object answers "how are the W ranks split": data-parallel replicas (DDP), data-parallel
shards (FSDP2), tensor-parallel degree and pipeline stages, whose product is W. It builds the
mesh once; `apply.parallelize` reads the degrees (never the strategy's name) and hands each
parallelism the sub-mesh it needs by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalelab.lab.core.errors import BadUsageError


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Degrees of each parallelism; their product is the world size."""

    dp_replicate: int = 1
    """DDP replicas (each holds the whole model)."""
    dp_shard: int = 1
    """FSDP2 shards (parameters, gradients and optimizer state split this many ways)."""
    tp: int = 1
    """Tensor-parallel degree (each weight matrix split this many ways)."""
    pp: int = 1
    """Pipeline stages."""

    def __post_init__(self) -> None:
        if min(self.dp_replicate, self.dp_shard, self.tp, self.pp) < 1:
            raise BadUsageError(f"parallel degrees must be >= 1; got {self}")
        if self.dp_replicate > 1 and self.dp_shard > 1:
            raise BadUsageError("DDP replicas and FSDP shards together (HSDP) are not offered")
        if self.pp > 1 and self.world != self.pp:
            raise BadUsageError("pipeline parallel is offered on its own (world = stages)")

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp

    def enabled(self, axis: str) -> bool:
        """Whether parallelism `axis` (dp_replicate, dp_shard, tp, pp) is on: degree > 1."""
        return int(getattr(self, axis)) > 1

    @property
    def sharded(self) -> bool:
        """Some parameters are split across ranks (FSDP or TP): the full weights need a gather."""
        return self.enabled("dp_shard") or self.enabled("tp")

    @property
    def dp(self) -> int:
        """Ways the batch is split (each data-parallel group sees batch / dp sequences)."""
        return self.dp_replicate * self.dp_shard

    @classmethod
    def for_strategy(cls, strategy: str, world: int, tp: int = 2) -> ParallelDims:
        """The one place a strategy name becomes degrees; everything after reads the degrees
        (a degree of 1 is off, as in torchtitan: a 1-rank run of any strategy trains the
        plain model)."""
        if strategy == "single":
            return cls()
        if strategy == "dp":
            return cls(dp_replicate=world)
        if strategy == "fsdp":
            return cls(dp_shard=world)
        if strategy == "tp":
            return cls(tp=world)
        if strategy == "pp":
            return cls(pp=world)
        if strategy == "fsdp+tp":
            if world % tp:
                raise BadUsageError(f"{world} ranks do not split into TP groups of {tp}")
            return cls(dp_shard=world // tp, tp=tp)
        raise BadUsageError(f"unknown strategy {strategy!r}")

    def sub_mesh(self, mesh: Any, name: str) -> Any:
        """The axis `name` of `mesh` (the mesh itself when it has only that axis)."""
        return mesh if mesh.ndim == 1 else mesh[name]

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Mesh dimensions (outermost first) and their names; degree-1 axes are left out."""
        dims = [("pp", self.pp), ("dp_replicate", self.dp_replicate),
                ("dp_shard", self.dp_shard), ("tp", self.tp)]
        on = [(n, d) for n, d in dims if d > 1] or [("dp_replicate", 1)]
        return tuple(d for _, d in on), tuple(n for n, _ in on)

    def build_mesh(self, device_type: str = "cpu") -> Any:
        """The DeviceMesh over all ranks (needs an initialised process group)."""
        from torch.distributed.device_mesh import init_device_mesh

        shape, names = self.mesh_shape()
        return init_device_mesh(device_type, shape, mesh_dim_names=names)

    def dp_rank(self, rank: int) -> int:
        """Which slice of the batch `rank` trains on (TP peers share one)."""
        return (rank // self.tp) % self.dp
