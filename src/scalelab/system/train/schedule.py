"""Large-batch learning rate: linear scaling with the global batch plus gradual warmup.

Goyal et al. (2017): lr = base_lr * global_batch / base_batch, reached by a linear ramp from
base_lr over the first `warmup` steps so early, large updates do not diverge. The formula is the
foundation's (core.lr, also behind `scalelab plan lr`), so plan and trainer agree.
"""

from __future__ import annotations

from scalelab.lab.core.lr import lr_at

__all__ = ["default_warmup", "lr_at"]


def default_warmup(configured: int | None, *, batch: int, base_batch: int, total_steps: int) -> int:
    """None -> no warmup at or below the base batch, else 5% of the run (at least one step)."""
    if configured is not None:
        return configured
    return 0 if batch <= base_batch else max(1, total_steps // 20)
