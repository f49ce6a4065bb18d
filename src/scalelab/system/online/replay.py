"""One replay end to end, as `scalelab online replay` runs it: ingest the 2013 stream into the
log when the log is empty, read it back as aligned arrays, then update under review
(prequential), publishing through a serving repository when one is given.

Its record is one level of the online stage's curve, as `online bench` writes them: the
variable is update attempts (promoted + refused) per 30 days of replayed windows, so a replay's
record and a bench's sit on the same axis.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.lab.core.records import Record, make_record, new_experiment_id
from scalelab.system.online.bench import STAGE, VARIABLE, per_30d, series_of
from scalelab.system.online.ingest import ColumnRule, ingest_stream
from scalelab.system.online.log import EventLog
from scalelab.system.online.policy import Policy
from scalelab.system.online.prequential import PrequentialResult, run
from scalelab.system.online.publish import RepositoryPublisher
from scalelab.system.online.stream import ReplayConfig, build_stream
from scalelab.system.online.updater import StreamData, UpdaterConfig


@dataclass(kw_only=True)
class Replay:
    """What one replay measured and where its inputs stood."""

    policy: str
    result: PrequentialResult
    data: StreamData
    ingested: dict[str, Any] | None
    """Per stream (events, labels), what this replay ingested; None when the log had data."""
    totals: dict[str, int]
    """The log's event totals (received, accepted, quarantined, batches)."""
    label_totals: dict[str, int]
    label_horizon_h: float | None
    published: dict[int, int] | None
    """Learner version -> repository version, when published."""

    def record(self, tick_hours: float) -> Record:
        """The replay as one record of the online stage (see the module docstring)."""
        r, t = self.result, self.totals
        return make_record(
            experiment=new_experiment_id("online"), stage=STAGE, variable=VARIABLE,
            level=per_30d(r, tick_hours), wall_s=r.wall_s,
            input_volume=float(t["received"]), input_unit="events",
            failures=t["quarantined"] + r.refused,
            failure_rate=t["quarantined"] / t["received"] if t["received"] else None,
            quality={"macro_f1": r.macro_f1, "accuracy": r.accuracy},
            recovery="rollback to the previous version on late labels",
            series=series_of(self.policy),
            extras={"policy": self.policy,
                    "promoted": r.promoted, "refused": r.refused,
                    "rolled_back": r.rolled_back, "samples_trained": r.samples_trained,
                    "staleness_h": r.staleness_h, "monthly": r.monthly})

    def labels(self) -> dict[str, Any]:
        """How the labels were used: stored, joined, past the horizon, for unknown events."""
        d = self.data
        return {"log_accepted": self.label_totals["accepted"], "stored": d.labels_stored,
                "joined": d.labels_joined, "past_horizon": d.past_horizon,
                "unjoined": d.unjoined, "horizon_h": self.label_horizon_h}

    def summary(self, log_path: Path) -> dict[str, Any]:
        """The JSON `online replay --json` prints."""
        return {"log": str(log_path), "ingested": self.ingested, "log_totals": self.totals,
                "labels": self.labels(), **self.result.summary(),
                "published": self.published}


def replay(log_path: Path, rules: dict[str, ColumnRule], policy_name: str, policy: Policy,
           updater: UpdaterConfig, stream: ReplayConfig, *, label_horizon_h: float | None = None,
           publisher: RepositoryPublisher | None = None,
           on_window: Callable[[int, int], None] | None = None) -> Replay:
    """Ingest (into an empty log), then replay under `policy` (see the module docstring)."""
    with EventLog(log_path) as log:
        ingested = None
        if log.totals("events")["batches"] == 0:
            ingested = ingest_stream(log, rules, build_stream(stream))
        data = StreamData.from_frames(log.read("events"), log.labels(), log.quarantine(),
                                      horizon_h=label_horizon_h)
        totals, label_totals = log.totals("events"), log.totals("labels")
    pub = publisher
    result = run(data, rules, policy, updater, publish=pub,
                 rolled_back=pub.rolled_back if pub is not None else None,
                 on_bootstrap=(lambda lr: pub.bootstrap(lr, {"source": "scalelab online"}))
                 if pub is not None else None, on_window=on_window)
    return Replay(policy=policy_name, result=result, data=data, ingested=ingested,
                  totals=totals, label_totals=label_totals, label_horizon_h=label_horizon_h,
                  published=pub.versions if pub is not None else None)


def write_decisions(path: Path, result: PrequentialResult) -> None:
    """Every decision as one JSON line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for d in result.decisions:
            f.write(json.dumps(d.to_dict()) + "\n")
