"""Knee detection (Kneedle, Satopää et al. 2011) via the `kneed` library.

For a throughput-vs-resource curve (concave, increasing) the knee is where adding resources stops
paying; for latency-vs-load (convex, increasing) it is where queues start to build.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Literal

import numpy as np

from scalelab.lab.core.errors import BadInputError

Curve = Literal["concave", "convex"]
Direction = Literal["increasing", "decreasing"]


def find_knee(
    x: Sequence[float],
    y: Sequence[float],
    *,
    curve: Curve = "concave",
    direction: Direction = "increasing",
    sensitivity: float = 1.0,
    online: bool = True,
) -> float | None:
    """The x of the knee, or None when the curve has none (e.g. a straight line)."""
    from kneed import KneeLocator

    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise BadInputError("knee detection needs x and y of the same length")
    if len(np.unique(xa)) < 3:
        return None
    order = np.argsort(xa, kind="stable")
    with warnings.catch_warnings():
        # kneed warns "No knee/elbow found" instead of returning a value we can test.
        warnings.simplefilter("ignore")
        kl = KneeLocator(
            xa[order], ya[order], S=sensitivity, curve=curve, direction=direction, online=online
        )
    return None if kl.knee is None else float(kl.knee)
