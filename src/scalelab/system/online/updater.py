"""Continuous update, under review: at each window close the updater reconciles the window,
watches the promoted model on late labels (and rolls it back when it is worse than the version it
replaced), asks its policy whether to update, and if so fine-tunes a candidate on the labelled
lookback, checks the lookback for skew, and gates the candidate against the live model on the
held-out part of the latest labelled window before promoting it. Every step is a UpdateDecision.

What it never does: train on a quarantined window, promote a candidate the gate refused, promote
on features that skewed from the feature version's reference, or keep a promoted model that live
labels show worse than its predecessor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.gate import HoldoutQuality, compare, evaluation
from scalelab.layers.nets.flights import CLASSES, LABEL
from scalelab.system.online.features import FeatureSpec, skew
from scalelab.system.online.ingest import REJECT_SCHEMA, ColumnRule, reconcile
from scalelab.system.online.learner import Learner, TrainConfig, TrainingCost
from scalelab.system.online.policy import Policy
from scalelab.system.online.stream import EVENT_ID, EVENT_TIME, LABEL_TIME
from scalelab.system.online.window import HOUR_US, WindowSpec, sliding_mask

NO_LABEL = np.iinfo(np.int64).max
EPOCH = datetime(1970, 1, 1)


def to_us(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=int(us))


@dataclass(kw_only=True)
class UpdaterConfig:
    """The updater's windows, gate and rollback."""

    tick_hours: float = 24.0
    """Tumbling decision window: the updater acts at each close."""
    bootstrap_hours: float = 28 * 24.0
    """The first model is fitted on the labels that arrived in this span; scoring starts after."""
    lookback: WindowSpec = field(default_factory=WindowSpec)
    """What an update trains on: the last 7 days (default) or the last N labelled events."""
    holdout_fraction: float = 0.2
    """Share of the lookback (by a hash of the event id) held out for the gate."""
    min_holdout: int = 100
    """Fewer held-out labelled events than this: refuse, too little evidence."""
    tolerance: float = 0.05
    """Gate: refuse a candidate worse than live by more than this (accuracy, macro F1, any
    class's F1). `serve promote` defaults to 0.01 on a full holdout; a week's held-out ~1,200
    flights hold ~25 cancellations, whose F1 moves by ~0.05 between two equally good models,
    so 0.01 refused 20 of 21 weekly candidates (January-June), 17 of them with a higher macro
    F1 than the live model (by up to 0.15)."""
    max_quarantine_rate: float = 0.01
    """A window with more quarantined events than this is quarantined whole."""
    rollback_tolerance: float = 0.02
    """Roll back when the promoted model's live macro F1 is below its predecessor's by more."""
    rollback_min_labels: int = 1000
    """Late labels needed before the rollback check judges."""
    monitor_hours: float = 72.0
    """How long after a promotion its live labels are watched."""
    skew_min_rows: int = 200
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.tick_hours <= 0 or self.bootstrap_hours <= 0 or self.monitor_hours <= 0:
            raise BadInputError("tick_hours, bootstrap_hours and monitor_hours must be > 0")
        if not 0 < self.holdout_fraction < 1:
            raise BadInputError(f"holdout_fraction must lie in (0, 1), got "
                                f"{self.holdout_fraction}")
        if not 0 <= self.tolerance < 1 or not 0 <= self.rollback_tolerance < 1:
            raise BadInputError("tolerances must lie in [0, 1)")

    def lookback_windows(self) -> int:
        """The lookback's span in ticks (at least 1): the drift policy's longest back-off. A
        count lookback's span is not known ahead: the default 7-day lookback's 7 daily ticks."""
        if self.lookback.kind == "time":
            return max(1, math.ceil(self.lookback.size / self.tick_hours))
        return 7

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class UpdateDecision:
    """One record of what the updater did at a window close, and why."""

    window: int
    start: str
    end: str
    action: str
    """bootstrap, quarantined, no_update, refused, promoted, rolled_back, confirmed."""
    policy: str
    feature_version: str
    live_version: int
    candidate_version: int | None = None
    reasons: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    trained_windows: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def holdout_mask(ids: np.ndarray, fraction: float) -> np.ndarray:
    """A fixed pseudo-random share of event ids (Knuth's multiplicative hash), so an event is
    held out or not whatever window it is seen in."""
    h = (ids.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(2**32)
    return h.astype(np.float64) / 2**32 < fraction


def _eval_dict(e: HoldoutQuality) -> dict[str, Any]:
    return asdict(e)


@dataclass(kw_only=True)
class StreamData:
    """The log's contents as arrays aligned to accepted events in time order."""

    events: pl.DataFrame
    ids: np.ndarray
    t_event: np.ndarray
    label: np.ndarray
    """The label that arrived (-1: none)."""
    t_label: np.ndarray
    """When it arrived (NO_LABEL: never, or past the label horizon)."""
    rejects: pl.DataFrame
    labels_stored: int = 0
    """Labels in the log (each event id once): joined + past_horizon + unjoined."""
    labels_joined: int = 0
    """Labels of stored events that arrived within the horizon: what scoring and updates use."""
    past_horizon: int = 0
    """Labels of stored events that arrived later than `horizon_h` after their event: counted
    here and otherwise treated as never arrived."""
    unjoined: int = 0
    """Labels of events the log does not hold (quarantined ones): nothing to join them to."""

    @classmethod
    def from_frames(cls, events: pl.DataFrame, labels: pl.DataFrame,
                    rejects: pl.DataFrame | None = None, *,
                    horizon_h: float | None = None) -> StreamData:
        """`horizon_h`: labels arriving more than this many hours after their event are
        counted in `past_horizon` and not used (None: every label is used, however late)."""
        if horizon_h is not None and horizon_h <= 0:
            raise BadInputError(f"the label horizon must be > 0 hours, got {horizon_h}")
        ev = events.sort([EVENT_TIME, EVENT_ID])
        stored = unjoined = past = 0
        if labels.height:
            # A label may arrive for a quarantined event (nothing to join to) or twice (the
            # log refused the second): keep the first arrival per event.
            lab = labels.sort(LABEL_TIME).unique(EVENT_ID, keep="first")
            stored = lab.height
            ev = ev.join(lab.select(EVENT_ID, pl.col(LABEL).alias("_label"),
                                    pl.col(LABEL_TIME).alias("_t_label")),
                         on=EVENT_ID, how="left", maintain_order="left")
            unjoined = stored - int(ev.get_column("_t_label").is_not_null().sum())
            if horizon_h is not None:
                late = (pl.col("_t_label") - pl.col(EVENT_TIME)) > pl.duration(
                    microseconds=int(horizon_h * HOUR_US))
                past = int(ev.select(late.fill_null(False).sum()).item())
                ev = ev.with_columns(
                    pl.when(late).then(None).otherwise(pl.col("_label")).alias("_label"),
                    pl.when(late).then(None).otherwise(pl.col("_t_label")).alias("_t_label"))
        else:
            ev = ev.with_columns(pl.lit(None, pl.Int8).alias("_label"),
                                 pl.lit(None, pl.Datetime("us")).alias("_t_label"))
        t_label = ev.get_column("_t_label").cast(pl.Int64).fill_null(NO_LABEL).to_numpy()
        return cls(events=ev.drop("_label", "_t_label"),
                   ids=ev.get_column(EVENT_ID).to_numpy(),
                   t_event=ev.get_column(EVENT_TIME).cast(pl.Int64).to_numpy(),
                   label=ev.get_column("_label").cast(pl.Int64).fill_null(-1).to_numpy(),
                   t_label=t_label,
                   rejects=rejects if rejects is not None and rejects.height
                   else pl.DataFrame(schema=REJECT_SCHEMA),
                   labels_stored=stored, labels_joined=stored - unjoined - past,
                   past_horizon=past, unjoined=unjoined)


Publisher = Callable[[Learner, pl.DataFrame], tuple[bool, list[str]]]
"""Called after the in-process gate accepts a candidate: publish it (e.g. through the serving
repository's gate) and say whether that accepted it too, with its reasons."""


class Updater:
    """The model under review. `prequential.run` drives it: predict a window, then close it."""

    def __init__(self, data: StreamData, rules: dict[str, ColumnRule], policy: Policy,
                 cfg: UpdaterConfig, *, publish: Publisher | None = None,
                 rolled_back: Callable[[Learner, Learner], None] | None = None) -> None:
        self.data, self.rules, self.policy, self.cfg = data, rules, policy, cfg
        self.publish, self.on_rollback = publish, rolled_back
        self.decisions: list[UpdateDecision] = []
        self.cost = TrainingCost()
        self.quarantined: set[int] = set()
        self.window_of = np.zeros(0, dtype=np.int64)
        self.is_holdout = holdout_mask(data.ids, cfg.holdout_fraction)
        self.last_update: int | None = None  # window of the last update attempt
        self.next_version = 2
        self.previous: Learner | None = None
        self.promoted_at: int | None = None
        self.shadow = np.full(len(data.ids), -1, dtype=np.int64)
        self.thresholds = {c: (r.psi, r.linf) for c, r in rules.items()}
        self.update_wall_s: list[float] = []
        self.rollback_s: list[float] = []

    # -- bootstrap -----------------------------------------------------------------------------

    def bootstrap(self, origin_us: int) -> int:
        """Fit the feature spec and the first model on what was labelled by the bootstrap's
        end; returns that instant (scoring starts there)."""
        d, cfg = self.data, self.cfg
        end = origin_us + int(cfg.bootstrap_hours * HOUR_US)
        known = (d.t_event < end) & (d.t_label < end)
        if known.sum() < 100:
            raise BadInputError(f"only {int(known.sum())} labelled events in the first "
                                f"{cfg.bootstrap_hours:g} h; lengthen the bootstrap or the "
                                "replay")
        frame = d.events.filter(pl.Series(known))
        spec = FeatureSpec.fit(frame)
        self.cat, self.num = spec.encode(d.events)
        self.live = Learner(spec, cfg.train, version=1)
        self.window_of = (d.t_event - end) // int(cfg.tick_hours * HOUR_US)
        idx = np.flatnonzero(known)
        self.live.trained_until = end
        self.cost.add(self.live.fit(self.cat[idx], self.num[idx], d.label[idx],
                                    epochs=cfg.train.bootstrap_epochs, lr=cfg.train.lr,
                                    seed=cfg.train.seed))
        self.decisions.append(UpdateDecision(
            window=-1, start=from_us(origin_us).isoformat(), end=from_us(end).isoformat(),
            action="bootstrap", policy=self.policy.name, feature_version=spec.version,
            live_version=1, metrics={"rows": int(known.sum())},
            cost={"samples": self.cost.samples, "train_cpu_s": self.cost.train_cpu_s}))
        return end

    # -- per window ----------------------------------------------------------------------------

    def predict(self, idx: np.ndarray) -> tuple[np.ndarray, int]:
        pred, c = self.live.predict(self.cat[idx], self.num[idx])
        self.cost.add(c)
        if self.previous is not None:  # shadow-score the predecessor for the rollback check
            self.shadow[idx], c2 = self.previous.predict(self.cat[idx], self.num[idx])
            self.cost.add(c2)
        return pred, self.live.version

    def close(self, k: int, start_us: int, end_us: int, arrived: np.ndarray,
              errors: np.ndarray, pred: np.ndarray, version: np.ndarray) -> list[UpdateDecision]:
        """Window k = [start, end) has closed; `arrived`: events whose label came in it,
        `errors`: the live model's 0/1 errors on them in arrival order."""
        out: list[UpdateDecision] = []
        base = {"window": k, "start": from_us(start_us).isoformat(),
                "end": from_us(end_us).isoformat(), "policy": self.policy.name}
        self.policy.observe(errors)
        out += self._reconcile(k, start_us, end_us, base)
        rb = self._watch(end_us, pred, version, base)
        if rb is not None:
            out.append(rb)
        do, why = self.policy.decide(k, self.last_update)
        if not do:
            out.append(self._decision(base, "no_update", [why]))
        else:
            dec = self._update(k, end_us, why, base)
            out.append(dec)
            # An attempt answers the signal, promoted or not; a refusal also tells the policy the
            # stale model stays live (the drift policy backs off instead of paying every window
            # for candidates the gate refuses for the same reason).
            if dec.action == "promoted":
                self.policy.updated()
            else:
                self.policy.refused()
            self.last_update = k
        self.decisions += out
        return out

    def _decision(self, base: dict[str, Any], action: str, reasons: list[str],
                  **kw: Any) -> UpdateDecision:
        return UpdateDecision(**base, action=action, reasons=reasons,
                              feature_version=self.live.spec.version,
                              live_version=self.live.version, **kw)

    def _reconcile(self, k: int, start_us: int, end_us: int,
                   base: dict[str, Any]) -> list[UpdateDecision]:
        d = self.data
        inside = (d.t_event >= start_us) & (d.t_event < end_us)
        t0, t1 = from_us(start_us), from_us(end_us)
        rej = d.rejects.filter((pl.col(EVENT_TIME) >= t0) & (pl.col(EVENT_TIME) < t1))
        check = reconcile(d.events.filter(pl.Series(inside)), rej, self.rules, start=t0,
                          end=t1, max_quarantine_rate=self.cfg.max_quarantine_rate)
        if check.status != "ok":
            self.quarantined.add(k)
            return [self._decision(base, "quarantined", check.reasons,
                                   metrics={"reconcile": check.to_dict()})]
        return []

    def _watch(self, now_us: int, pred: np.ndarray, version: np.ndarray,
               base: dict[str, Any]) -> UpdateDecision | None:
        """Roll the promoted model back if late labels show it worse than its predecessor."""
        if self.previous is None or self.promoted_at is None:
            return None
        d, cfg = self.data, self.cfg
        seen = (version == self.live.version) & (d.t_label < now_us) & (self.shadow >= 0) \
            & (d.label >= 0)
        n = int(seen.sum())
        ended = now_us - self.promoted_at >= int(cfg.monitor_hours * HOUR_US)
        if n >= cfg.rollback_min_labels:
            y = d.label[seen]
            live = evaluation(self.live.version, y, pred[seen], CLASSES)
            prev = evaluation(self.previous.version, y, self.shadow[seen], CLASSES)
            metrics = {"live": _eval_dict(live), "previous": _eval_dict(prev), "labels": n}
            if live.macro_f1 < prev.macro_f1 - cfg.rollback_tolerance:
                t0 = time.perf_counter()
                hours_live = (now_us - self.promoted_at) / HOUR_US
                bad, self.live = self.live, self.previous
                if self.on_rollback is not None:
                    self.on_rollback(bad, self.live)
                self.rollback_s.append(time.perf_counter() - t0)
                self.previous, self.promoted_at = None, None
                self.policy.updated()
                return UpdateDecision(**base, action="rolled_back", reasons=[
                    f"live macro F1 {live.macro_f1:.4f} < previous {prev.macro_f1:.4f} - "
                    f"tolerance {cfg.rollback_tolerance} on {n} late labels"],
                    feature_version=self.live.spec.version, live_version=self.live.version,
                    candidate_version=bad.version,
                    metrics={**metrics, "hours_live": hours_live,
                             "rollback_s": self.rollback_s[-1]})
            if ended:
                self.previous, self.promoted_at = None, None
                return self._decision(base, "confirmed", [
                    f"live macro F1 {live.macro_f1:.4f} vs previous {prev.macro_f1:.4f} on "
                    f"{n} late labels"], metrics=metrics)
        elif ended:
            self.previous, self.promoted_at = None, None
            return self._decision(base, "confirmed", [
                f"only {n} late labels in {cfg.monitor_hours:g} h; kept"])
        return None

    def _skew(self, rows: np.ndarray) -> dict[str, dict[str, float]]:
        """Skew of the lookback, judged window by window against the feature version's
        reference: a rescale in one day of a week dilutes to a PSI under threshold over the
        whole week (0.15 for distance x 1.609 in one of three days), not over its own day."""
        for w in np.unique(self.window_of[rows]):
            sel = rows & (self.window_of == w)
            flagged = skew(self.live.spec, self.data.events.filter(pl.Series(sel)),
                           self.thresholds, self.cfg.skew_min_rows)
            if flagged:
                return {c: {**v, "window": int(w)} for c, v in flagged.items()}
        return {}

    def _update(self, k: int, end_us: int, why: str, base: dict[str, Any]) -> UpdateDecision:
        d, cfg = self.data, self.cfg
        t_wall = time.perf_counter()
        clean = ~np.isin(self.window_of, np.fromiter(self.quarantined, dtype=np.int64))
        labelled = (d.t_label < end_us) & (d.label >= 0) & clean
        window = sliding_mask(d.t_event, labelled, end_us, cfg.lookback)
        train = window & ~self.is_holdout
        hold = window & self.is_holdout
        used = sorted({int(w) for w in np.unique(self.window_of[train])})
        reasons = [why]
        # Features need no label: judge every event of the lookback's span. The labelled ones
        # alone lack each day's last hours (their labels are still in flight), which skews
        # sched_arr_hour by itself (PSI ~1.6 on every 2013 day).
        first = d.t_event[window].min() if window.any() else end_us
        flagged = self._skew(clean & (d.t_event >= first) & (d.t_event < end_us))
        if flagged:
            return self._decision(base, "refused", reasons + [
                f"skew: {c} {next(iter(v))} {next(iter(v.values())):.3f} > {v['threshold']} in "
                f"window {int(v['window'])}" for c, v in flagged.items()],
                metrics={"skew": flagged}, trained_windows=used)
        if hold.sum() < cfg.min_holdout:
            n_hold = int(hold.sum())
            return self._decision(base, "refused", [*reasons, f"too little evidence: {n_hold} "
                                  f"held-out labels < {cfg.min_holdout}"], trained_windows=used)
        cand = self.live.clone(self.next_version)
        self.next_version += 1
        ti = np.flatnonzero(train)
        c = cand.fit(self.cat[ti], self.num[ti], d.label[ti], epochs=cfg.train.epochs,
                     lr=cfg.train.finetune_lr, seed=cfg.train.seed + k + 1)
        cand.trained_until = end_us
        hi = np.flatnonzero(hold)
        p_live, c1 = self.live.predict(self.cat[hi], self.num[hi])
        p_cand, c2 = cand.predict(self.cat[hi], self.num[hi])
        for x in (c, c1, c2):
            self.cost.add(x)
        y = d.label[hi]
        e_live = evaluation(self.live.version, y, p_live, CLASSES)
        e_cand = evaluation(cand.version, y, p_cand, CLASSES)
        refusals = compare(e_live, e_cand, cfg.tolerance)
        cost = {"samples": c.samples, "train_cpu_s": c.train_cpu_s,
                "eval_cpu_s": c1.predict_cpu_s + c2.predict_cpu_s}
        metrics = {"live": _eval_dict(e_live), "candidate": _eval_dict(e_cand),
                   "train_rows": len(ti), "holdout_rows": len(hi)}
        if not refusals and self.publish is not None:
            ok, extra = self.publish(cand, d.events.filter(pl.Series(hold)).with_columns(
                pl.Series(LABEL, y, dtype=pl.Int8)))
            if not ok:
                refusals = [f"serving gate: {r}" for r in extra] or ["serving gate refused"]
        self.update_wall_s.append(time.perf_counter() - t_wall)
        if refusals:
            return self._decision(base, "refused", reasons + refusals, metrics=metrics,
                                  cost=cost, candidate_version=cand.version,
                                  trained_windows=used)
        self.previous, self.live = self.live, cand
        self.promoted_at = end_us
        return self._decision(base, "promoted", reasons, metrics=metrics, cost=cost,
                              candidate_version=cand.version, trained_windows=used)
