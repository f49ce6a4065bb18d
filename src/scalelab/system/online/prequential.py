"""Prequential evaluation with a label delay: predict each window with the live model, score
every prediction against its label once that label arrives, and let the updater learn only from
what had arrived by each window's close (the shape of river's progressive_val_score with
`delay`, run a window at a time: the model only changes at window closes, so predicting a
window in one batch gives exactly the per-event answers).

The log is read whole first and time is replayed from it: an event is visible from its event
time, a label from its arrival time. Ingestion does not depend on the updater, so this is what
interleaving the two would give.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from scalelab.lab.core.gate import evaluation
from scalelab.layers.nets.flights import CLASSES
from scalelab.system.online.ingest import ColumnRule
from scalelab.system.online.policy import Policy
from scalelab.system.online.updater import (
    Publisher,
    StreamData,
    UpdateDecision,
    Updater,
    UpdaterConfig,
    from_us,
)
from scalelab.system.online.window import HOUR_US


@dataclass(kw_only=True)
class PrequentialResult:
    policy: str
    served: int
    """Predictions the live model made (one per accepted event after the bootstrap)."""
    scored: int
    """Predictions scored against a late label."""
    macro_f1: float
    accuracy: float
    per_class_f1: dict[str, float | None]
    monthly: list[dict[str, Any]]
    """Quality over time: macro F1 per calendar month of the prediction."""
    promoted: int
    refused: int
    rolled_back: int
    quarantined_windows: int
    samples_trained: int
    """Compute: rows x epochs of every fit, the bootstrap included."""
    train_cpu_s: float
    predict_cpu_s: float
    predictions: int
    staleness_h: float
    """Mean hours between a prediction and the end of its model's newest training data."""
    update_s: list[float]
    """Wall seconds of each update (fine-tune + gate + publish)."""
    rollback_s: list[float]
    wall_s: float
    feature_version: str
    decisions: list[UpdateDecision] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("decisions")
        return d


def run(data: StreamData, rules: dict[str, ColumnRule], policy: Policy, cfg: UpdaterConfig,
        *, publish: Publisher | None = None, rolled_back: Any = None,
        on_bootstrap: Any = None,
        on_window: Callable[[int, int], None] | None = None) -> PrequentialResult:
    """Replay `data` under `policy`; `publish`/`rolled_back`/`on_bootstrap` connect the updater
    to a serving repository (online/publish.py); `on_window(done, total)` after each window."""
    t0 = time.perf_counter()
    upd = Updater(data, rules, policy, cfg, publish=publish, rolled_back=rolled_back)
    tick = int(cfg.tick_hours * HOUR_US)
    first = int(data.t_event.min())
    origin = first - first % (24 * HOUR_US)  # midnight UTC of the first day
    start = upd.bootstrap(origin)
    if on_bootstrap is not None:
        on_bootstrap(upd.live)
    n = len(data.ids)
    pred = np.full(n, -1, dtype=np.int64)
    version = np.zeros(n, dtype=np.int64)
    age = np.zeros(n, dtype=np.float64)
    order = np.argsort(data.t_label, kind="stable")
    t_label_sorted = data.t_label[order]
    last = int(data.t_event.max())
    k = 0
    windows = (last - start) // tick + 1 if start <= last else 0
    while start <= last:
        end = start + tick
        i0, i1 = np.searchsorted(data.t_event, [start, end], side="left")
        idx = np.arange(i0, i1)
        if idx.size:
            pred[idx], v = upd.predict(idx)
            version[idx] = v
            age[idx] = (data.t_event[idx] - upd.live.trained_until) / HOUR_US
        j0, j1 = np.searchsorted(t_label_sorted, [start, end], side="left")
        arrived = order[j0:j1]
        arrived = arrived[(pred[arrived] >= 0) & (data.label[arrived] >= 0)]
        errors = (pred[arrived] != data.label[arrived]).astype(np.float64)
        upd.close(k, start, end, arrived, errors, pred, version)
        start, k = end, k + 1
        if on_window is not None:
            on_window(k, windows)
    scored = (pred >= 0) & (data.label >= 0)
    y, p = data.label[scored], pred[scored]
    ev = evaluation(0, y, p, CLASSES)
    months = np.array([from_us(int(t)).month for t in data.t_event[scored]]) if scored.any() \
        else np.zeros(0, dtype=np.int64)
    monthly = []
    for m in np.unique(months):
        sel = months == m
        e = evaluation(0, y[sel], p[sel], CLASSES)
        monthly.append({"month": int(m), "rows": int(sel.sum()), "macro_f1": e.macro_f1,
                        "accuracy": e.accuracy})
    acts = [d.action for d in upd.decisions]
    return PrequentialResult(
        policy=policy.name, served=int((pred >= 0).sum()), scored=int(scored.sum()),
        macro_f1=ev.macro_f1, accuracy=ev.accuracy,
        per_class_f1=ev.per_class_f1, monthly=monthly, promoted=acts.count("promoted"),
        refused=acts.count("refused"), rolled_back=acts.count("rolled_back"),
        quarantined_windows=acts.count("quarantined"), samples_trained=upd.cost.samples,
        train_cpu_s=upd.cost.train_cpu_s, predict_cpu_s=upd.cost.predict_cpu_s,
        predictions=upd.cost.predictions,
        staleness_h=float(age[pred >= 0].mean()) if (pred >= 0).any() else 0.0,
        update_s=upd.update_wall_s, rollback_s=upd.rollback_s,
        wall_s=time.perf_counter() - t0, feature_version=upd.live.spec.version,
        decisions=upd.decisions)
