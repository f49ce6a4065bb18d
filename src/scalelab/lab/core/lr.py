"""Large-batch learning rate: the linear scaling rule and gradual warmup (Goyal et al. 2017).

"When the minibatch size is multiplied by k, multiply the learning rate by k": lr = base_lr ×
batch / base_batch. Early in training that rate is too large, so warm up: start from base_lr
and add a constant amount every iteration so that the scaled rate is reached after
`warmup_epochs` (5 in the paper). The paper showed the recipe to hold on ImageNet/ResNet-50 up
to a batch of 8192 (8k); past that, accuracy fell, so `LrScaling.warnings` says so.

For the trainer::

    sched = LrScaling(base_lr=0.1, base_batch=256, batch=8192, warmup_epochs=5)
    lr = sched.lr_at(step, steps_per_epoch)        # 0-based optimizer step

or, with warmup counted in steps, `lr_at(step, base_lr=0.1, base_batch=256, batch=8192,
warmup=625)`. Both give start_lr at step 0 and the scaled lr from the last warmup step on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalelab.lab.core.errors import BadInputError

LARGEST_SHOWN_BATCH = 8192
"""The largest minibatch for which Goyal et al. matched the small-batch accuracy on ImageNet."""


def _int_at_least(v: int, lo: int, what: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise BadInputError(f"{what} must be an integer >= {lo} (got {v!r})")


def _number_at_least(v: float, lo: float, what: str, strict: bool = False) -> None:
    ok = isinstance(v, int | float) and math.isfinite(v) and (v > lo if strict else v >= lo)
    if not ok:
        raise BadInputError(f"{what} must be a number {'>' if strict else '>='} {lo} (got {v!r})")


def scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """The linear scaling rule: base_lr × batch / base_batch."""
    _number_at_least(base_lr, 0.0, "base learning rate", strict=True)
    _int_at_least(base_batch, 1, "base batch")
    _int_at_least(batch, 1, "batch")
    return base_lr * (batch / base_batch)


def lr_at(step: int, *, base_lr: float, base_batch: int, batch: int, warmup: int,
          start_lr: float | None = None) -> float:
    """The rate for 0-based optimizer `step`, with a linear warmup of `warmup` steps.

    Ramps from `start_lr` (default base_lr, as in the paper) at step 0 to the scaled rate at
    step `warmup`, then holds it.
    """
    _int_at_least(step, 0, "step")
    _int_at_least(warmup, 0, "warmup steps")
    peak = scaled_lr(base_lr, base_batch, batch)
    start = base_lr if start_lr is None else start_lr
    _number_at_least(start, 0.0, "warmup start learning rate")
    if step >= warmup:
        return peak
    return start + (peak - start) * step / warmup


@dataclass(frozen=True, kw_only=True)
class EpochLr:
    epoch: int
    lr: float
    """The rate at the first step of the epoch."""


@dataclass(frozen=True, kw_only=True)
class LrScaling:
    """A linear-scaling-plus-warmup schedule (`scalelab plan lr`)."""

    base_lr: float
    """The rate tuned at `base_batch` (0.1 for ResNet-50 at 256 in the paper)."""
    base_batch: int
    batch: int
    """The global minibatch you will train with (all workers together)."""
    warmup_epochs: float = 5.0
    """Epochs over which to ramp to the scaled rate; 0 disables warmup."""
    start_lr: float | None = None
    """The rate at step 0; None means base_lr (the paper's gradual warmup)."""
    per: str = "step"
    """Warmup granularity: "step" (the paper: every iteration) or "epoch" (one rise per epoch)."""

    def __post_init__(self) -> None:
        _number_at_least(self.base_lr, 0.0, "--base-lr", strict=True)
        _int_at_least(self.base_batch, 1, "--base-batch")
        _int_at_least(self.batch, 1, "--batch")
        _number_at_least(self.warmup_epochs, 0.0, "--warmup-epochs")
        if self.start_lr is not None:
            _number_at_least(self.start_lr, 0.0, "--start-lr")
        if self.per not in ("step", "epoch"):
            raise BadInputError(f"warmup granularity must be 'step' or 'epoch' (got {self.per!r})")

    @property
    def k(self) -> float:
        """The batch multiple: batch / base_batch."""
        return self.batch / self.base_batch

    @property
    def scaled_lr(self) -> float:
        return scaled_lr(self.base_lr, self.base_batch, self.batch)

    @property
    def warmup_start_lr(self) -> float:
        return self.base_lr if self.start_lr is None else self.start_lr

    @property
    def warnings(self) -> list[str]:
        out = []
        if self.batch > LARGEST_SHOWN_BATCH:
            out.append(
                f"batch {self.batch} is past {LARGEST_SHOWN_BATCH}, the largest minibatch at which "
                "Goyal et al. (2017) showed linear scaling + warmup to match small-batch accuracy "
                "(ImageNet, ResNet-50); expect a quality loss, or use a layer-wise rule "
                "(LARS/LAMB) and validate")
        if self.batch > self.base_batch and self.warmup_epochs == 0:
            out.append("no warmup: the paper's scaled rate diverges early without it at large k")
        return out

    def lr_at(self, step: int, steps_per_epoch: int) -> float:
        """The rate for 0-based optimizer `step` with `steps_per_epoch` steps per epoch."""
        _int_at_least(step, 0, "step")
        _int_at_least(steps_per_epoch, 1, "steps per epoch")
        warmup_steps = self.warmup_epochs * steps_per_epoch
        peak, start = self.scaled_lr, self.warmup_start_lr
        if step >= warmup_steps:
            return peak
        progress = (step // steps_per_epoch) * steps_per_epoch if self.per == "epoch" else step
        return start + (peak - start) * progress / warmup_steps

    def epochs(self, through: int | None = None) -> list[EpochLr]:
        """The rate at the start of each epoch, 0 .. `through` (default: the end of warmup)."""
        last = math.ceil(self.warmup_epochs) if through is None else through
        _int_at_least(last, 0, "epochs")
        peak, start = self.scaled_lr, self.warmup_start_lr
        return [EpochLr(epoch=e, lr=peak if e >= self.warmup_epochs
                        else start + (peak - start) * e / self.warmup_epochs)
                for e in range(last + 1)]
