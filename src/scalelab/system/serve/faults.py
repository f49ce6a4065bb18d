"""Two deliberately misbehaving architectures for tests, benchmarks and `diagnose`.

Both are a TabularNet (same weights, same outputs) with one fault added, registered in
nets.registry when this module is imported (the server imports it):

- "delay_mlp": sleeps `batch_ms` per forward call plus `row_ms` per row, an artificial serial
  section that makes queueing, deadlines and overload reproducible on any machine. `time.sleep`
  releases the GIL, so it costs wall time, not CPU.
- "poison_mlp": raises ValueError when any numeric input equals `poison_value`, so one bad input
  in a batch can be told apart from the rest.

model.json params are the TabularConfig fields plus the fault's own fields.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.registry import register
from scalelab.layers.nets.tabular import TabularConfig, TabularNet


class DelayNet(TabularNet):
    """A TabularNet whose forward takes at least batch_ms + rows * row_ms."""

    def __init__(self, cfg: TabularConfig, *, batch_ms: float, row_ms: float) -> None:
        super().__init__(cfg)
        self.batch_ms = batch_ms
        self.row_ms = row_ms

    def forward(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        time.sleep((self.batch_ms + self.row_ms * categorical.shape[0]) / 1000.0)
        return super().forward(categorical, numeric)


class PoisonNet(TabularNet):
    """A TabularNet that fails on any numeric value equal to `poison_value`."""

    def __init__(self, cfg: TabularConfig, *, poison_value: float) -> None:
        super().__init__(cfg)
        self.poison_value = poison_value

    def forward(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        if bool((numeric == self.poison_value).any()):
            raise ValueError(f"poison value {self.poison_value} in the numeric input")
        return super().forward(categorical, numeric)


def _split(params: dict[str, Any],
           keys: dict[str, float]) -> tuple[TabularConfig, dict[str, float]]:
    rest = dict(params)
    extra = {k: float(rest.pop(k, default)) for k, default in keys.items()}
    if any(v < 0 for k, v in extra.items() if k.endswith("_ms")):
        raise BadInputError(f"delays must be >= 0, got {extra}")
    return TabularConfig(**rest), extra


def _delay(params: dict[str, Any]) -> DelayNet:
    cfg, extra = _split(params, {"batch_ms": 0.0, "row_ms": 0.0})
    return DelayNet(cfg, batch_ms=extra["batch_ms"], row_ms=extra["row_ms"])


def _poison(params: dict[str, Any]) -> PoisonNet:
    cfg, extra = _split(params, {"poison_value": -999.0})
    return PoisonNet(cfg, poison_value=extra["poison_value"])


register("delay_mlp", _delay)
register("poison_mlp", _poison)
