"""One HTTP capacity search: steps stopped by the rule, confirmations at full length, each judged.

Every run is judged the same way (`capacity.StepRule` on the counts, `steady.judge` on the
step's trace, the generator's validity) and written as one record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scalelab.lab.core.records import Record
from scalelab.lab.load.capacity import (
    CONFIRM_S,
    CONFIRM_VARIABLE,
    CapacityResult,
    Deadline,
    SearchConfig,
    Step,
    StepRule,
    confirmed_search,
    quantile_ci_ms,
    rate_verdicts,
    step_extras,
)
from scalelab.lab.load.cluster import Cluster
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.http.generator import HttpConfig
from scalelab.lab.load.http.result import LoadResult, to_record
from scalelab.lab.load.http.run import LoadPlan, run_load
from scalelab.lab.load.schedule import Arrival
from scalelab.lab.load.steady import HORIZON_S, judge


@dataclass(kw_only=True)
class HttpSearch:
    """The steps of one search against one target (a callable pair for `confirmed_search`)."""

    engine: HttpConfig
    """Target, requests, warm-up (open loop)."""
    rule: StepRule
    arrival: Arrival = "poisson"
    seed: int = 0
    confirm_s: float = CONFIRM_S
    """Length of each confirmation run (0: none)."""
    cluster: Cluster | None = None
    """Steps on a Dask cluster: never stopped early."""
    experiment: str = ""
    url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Put into every record's extras (e.g. the payload kind)."""
    on_step: Callable[[float, bool], None] | None = None
    """Told each (rate, is a confirmation) before it runs."""
    check: Callable[[LoadResult], None] | None = None
    """Told each result (raises when the server never answered)."""
    records: list[Record] = field(default_factory=list)

    def run(self, cfg: SearchConfig, *, max_confirms: int | None = None,
            deadline: Deadline | None = None) -> CapacityResult:
        """The search with its confirmations (none when `confirm_s` is 0; None: as many as
        `confirmed_search` goes on to), within `deadline`."""
        res = confirmed_search(self.step, self.confirm, cfg,
                               max_confirms=max_confirms if self.confirm_s > 0 else 0,
                               deadline=deadline)
        self.records = [r.model_copy(update={"extras": {**r.extras, "rate_verdict": v}})
                        for r, v in zip(self.records, rate_verdicts(res), strict=True)]
        return res

    def step(self, rate: float) -> Step:
        """One search step, stopped by the rule once decided (or at its longest)."""
        return self._measure(rate, self.rule.max_step_s, confirmation=False)

    def confirm(self, rate: float) -> Step:
        """The confirmation run: `confirm_s` at `rate`, never stopped early."""
        return self._measure(rate, self.confirm_s, confirmation=True)

    def _measure(self, rate: float, seconds: float, *, confirmation: bool) -> Step:
        if self.on_step is not None:
            self.on_step(rate, confirmation)
        plan = LoadPlan(engine=self.engine, rate=rate, arrival=self.arrival,
                        duration_s=seconds, seed=self.seed + len(self.records),
                        cold_start=not self.records)
        stop = None if (self.cluster or confirmation) else self.rule.should_stop
        obj = self.rule.slo.latency[0]
        r = run_load(plan, stop_check=stop, slo_threshold_s=obj.threshold_s,
                     cluster=self.cluster)
        if self.check is not None:
            self.check(r)
        step = judged(r, self.rule, rate, confirmation=confirmation,
                      horizon_s=max(self.confirm_s, HORIZON_S))
        self.records.append(step_record(r, step, self))
        return step


def judged(r: LoadResult, rule: StepRule, rate: float, *, confirmation: bool = False,
           horizon_s: float = HORIZON_S) -> Step:
    """A finished run at `rate` as a capacity step (pure)."""
    obj = rule.slo.latency[0]
    steady = None if r.steady is None else judge(r.steady, threshold_s=obj.threshold_s,
                                                 confidence=rule.confidence,
                                                 horizon_s=horizon_s)
    verdict = rule.step_verdict(sent=r.requests, ok=r.successes, within=r.within_slo,
                                errors=r.failures, steady=steady)
    hist = LatencyHistogram.decode(r.hist_blob)
    why = [*(steady.reasons if steady else [])]
    if rule.availability_missed(ok=r.successes, errors=r.failures):
        why.insert(0, f"availability decided missed: {r.failures:,} of "
                      f"{r.successes + r.failures:,} requests failed")
    return Step(rate=rate, verdict=verdict, requests=r.requests,
                throughput_rps=r.throughput_rps, quantile_ms=hist.quantile_ms(obj.quantile),
                quantile_ci_ms=quantile_ci_ms(hist, obj.quantile, rule.confidence),
                error_rate=r.failure_rate, valid=r.valid, wall_s=r.wall_s,
                requests_needed=rule.requests_needed, steady=steady,
                confirmation=confirmation,
                extras={"invalid_reasons": r.invalid_reasons, "lag_p99_ms": r.lag_p99_ms,
                        "why": why, "errors_by_status": r.errors_by_status})


def step_record(r: LoadResult, step: Step, s: HttpSearch) -> Record:
    """The step's record: the level's, plus what the search decided of it (its rate, n,
    failures and outcome stay readable as a decided check)."""
    st = step.steady
    rec = to_record(r, experiment=s.experiment, url=s.url, slo=s.rule.slo.label, extra={
        **s.extra, **step_extras(step, len(s.records), step.verdict),
        "why": step.extras.get("why", []),
        "steady": None if st is None else {
            "offered_rps": st.offered_rps, "served_rps": st.served_rps,
            "served_low_rps": st.served_low_rps, "rate_held": st.rate_held,
            "trending": st.trending,
            "slope_ms_per_s": None if st.trend is None else st.trend.slope_ms_per_s,
            "slope_low_ms_per_s": None if st.trend is None else st.trend.low_ms_per_s}})
    return rec.model_copy(update={"variable": CONFIRM_VARIABLE}) if step.confirmation else rec
