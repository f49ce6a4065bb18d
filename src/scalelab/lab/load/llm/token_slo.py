"""Token-level objectives: "ttft_p95<500ms,tpot_p95<60ms,itl_p99<100ms,avail>=99.9%".

Each latency objective names a metric (ttft, itl, tpot, e2e), a quantile and a threshold; the
level meets it when at least that share of the measurements are at or under the threshold
(equivalently the quantile is). TTFT, TPOT and e2e are one value per successful request; ITL is
one value per inter-token gap. Availability is successes / requests.

Goodput (DistServe's definition) is per request: the requests per second that succeeded AND
met every per-request objective's threshold (TTFT, TPOT, e2e; an ITL objective is judged over
all gaps, not per request), and the output tokens per second those requests carried. A one-token
answer has no TPOT and counts as meeting TPOT objectives.

The capacity step rule is `capacity.StepRule`'s, for several objectives at once: each objective
has a Clopper-Pearson interval on its within-threshold share; any interval entirely below its
quantile decides fail, all entirely above decide pass. ITL's gaps within one stream are not
independent, so its interval is taken over the request count, not the gap count. Availability
is judged as `StepRule` judges it, asymmetrically, against `capacity.DEFAULT_AVAILABILITY`
(99%) where the SLO names none: failures that decide it missed fail a step at once, and a step
whose failure share is over that never passes on its latencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from scalelab.lab.core.objectives import TIMINGS, parse_terms, read_term
from scalelab.lab.load.capacity import DEFAULT_AVAILABILITY, StopRule
from scalelab.lab.load.slo import LatencyObjective, ObjectiveSet

Metric = Literal["ttft", "itl", "tpot", "e2e"]
METRICS: tuple[Metric, ...] = TIMINGS  # type: ignore[assignment]


@dataclass(frozen=True, kw_only=True)
class TokenObjective(LatencyObjective):
    """The `quantile` of `metric` must stay at or under `threshold_s`."""

    metric: Metric
    """ttft, itl, tpot or e2e."""

    @property
    def label(self) -> str:
        return f"{self.metric}_{super().label}"


@dataclass(frozen=True, kw_only=True)
class TokenSlo(ObjectiveSet[TokenObjective]):
    """Token latency objectives and an optional availability target."""

    objectives: tuple[TokenObjective, ...]
    """Latency objectives (may be empty with availability alone)."""

    needs: ClassVar[str] = "a token SLO needs an objective, e.g. " \
        "\"ttft_p95<500ms,tpot_p95<60ms,avail>=99.9%\""

    @property
    def terms(self) -> tuple[TokenObjective, ...]:
        return self.objectives


def parse_token_slo(text: str) -> TokenSlo:
    """Parse comma-separated terms: METRIC_pQ<THRESHOLD (ms by default) and avail>=P% (the
    grammar is core/objectives.py's)."""
    objs, avail = parse_terms(str(text), _read_term,
                              "\"ttft_p95<500ms\", \"tpot_p99<60ms\", \"itl_p99<100ms\", "
                              "\"e2e_p95<5s\" or \"avail>=99.9%\"")
    return TokenSlo(objectives=tuple(objs), availability=avail)


def _read_term(term: str) -> TokenObjective | float | None:
    t = read_term(term)
    if t is None or (t.quantile is not None and t.of is None):
        return None
    if t.quantile is None or t.threshold_s is None:
        return t.availability
    return TokenObjective(metric=t.of,  # type: ignore[arg-type]
                          quantile=t.quantile, threshold_s=t.threshold_s)


@dataclass(frozen=True, kw_only=True)
class Samples:
    """What a level measured, as the objectives need it (µs; one entry per success)."""

    ttft_us: np.ndarray
    tpot_us: np.ndarray
    """-1 where a one-token answer has no TPOT."""
    e2e_us: np.ndarray
    output_tokens: np.ndarray
    requests: int
    """Measured requests (successes and failures)."""
    itl_within: dict[float, tuple[int, int]]
    """threshold_s -> (gaps at or under it, all gaps), from the ITL histogram."""


@dataclass(frozen=True, kw_only=True)
class ObjectiveLine:
    """One objective at one level."""

    objective: str
    """Its label."""
    events: int
    """Measurements it is judged over."""
    within: int
    """Those at or under the threshold (for availability: successes)."""
    share: float
    """within / events."""
    needed: float
    """The share it needs (the quantile or the availability)."""
    met: bool
    """share >= needed."""


def _per_request(s: Samples, o: TokenObjective) -> tuple[int, int]:
    thr = int(o.threshold_s * 1e6)
    if o.metric == "ttft":
        return int(np.count_nonzero(s.ttft_us <= thr)), len(s.ttft_us)
    if o.metric == "e2e":
        return int(np.count_nonzero(s.e2e_us <= thr)), len(s.e2e_us)
    has = s.tpot_us >= 0
    return int(np.count_nonzero(has & (s.tpot_us <= thr))), int(np.count_nonzero(has))


def evaluate(slo: TokenSlo, s: Samples) -> list[ObjectiveLine]:
    """Each objective's share within its threshold, and whether the level met it."""
    out: list[ObjectiveLine] = []
    for o in slo.objectives:
        if o.metric == "itl":
            k, n = s.itl_within.get(o.threshold_s, (0, 0))
        else:
            k, n = _per_request(s, o)
        share = k / n if n else 0.0
        out.append(ObjectiveLine(objective=o.label, events=n, within=k, share=share,
                                 needed=o.quantile, met=n > 0 and share >= o.quantile - 1e-12))
    if slo.availability is not None:
        ok = len(s.ttft_us)
        share = ok / s.requests if s.requests else 0.0
        out.append(ObjectiveLine(objective=f"avail>={slo.availability * 100:g}%",
                                 events=s.requests, within=ok, share=share,
                                 needed=slo.availability,
                                 met=s.requests > 0 and share >= slo.availability - 1e-12))
    return out


def good_mask(slo: TokenSlo, s: Samples) -> np.ndarray:
    """Per success: met every per-request threshold (TTFT, TPOT, e2e)."""
    good = np.ones(len(s.ttft_us), dtype=bool)
    for o in slo.objectives:
        thr = int(o.threshold_s * 1e6)
        if o.metric == "ttft":
            good &= s.ttft_us <= thr
        elif o.metric == "e2e":
            good &= s.e2e_us <= thr
        elif o.metric == "tpot":
            good &= (s.tpot_us < 0) | (s.tpot_us <= thr)
    return good


@dataclass(frozen=True, kw_only=True)
class Goodput:
    """Requests and output tokens per second that met every per-request objective."""

    good_requests: int
    """Successes within every per-request threshold."""
    goodput_rps: float
    """good_requests / wall_s."""
    good_output_tokens: int
    """Output tokens of those requests."""
    goodput_tps: float
    """good_output_tokens / wall_s."""


def goodput(slo: TokenSlo, s: Samples, wall_s: float) -> Goodput:
    mask = good_mask(slo, s)
    n = int(np.count_nonzero(mask))
    toks = int(s.output_tokens[mask].sum()) if n else 0
    w = max(wall_s, 1e-9)
    return Goodput(good_requests=n, goodput_rps=n / w, good_output_tokens=toks,
                   goodput_tps=toks / w)


@dataclass(frozen=True, kw_only=True)
class TokenStepRule(StopRule[Samples]):
    """`StopRule` for several token objectives at once: every objective decided, or out of
    time/requests."""

    slo: TokenSlo
    """The objectives every step is judged on."""
    max_step_s: float = 30.0
    """Stop undecided after this much measured time."""
    max_requests: int = 100_000
    """Stop undecided after this many measured requests."""

    def verdict(self, s: Samples) -> tuple[str, bool]:
        """('pass'|'fail', decided) from the measurements so far."""
        lines = evaluate(self.slo, s)
        if not lines or s.requests == 0:
            return "fail", False
        decided_pass = True
        nreq = max(1, len(s.ttft_us))
        for line, o in zip(lines, [*self.slo.objectives, None], strict=False):
            k, n = line.within, line.events
            if o is not None and o.metric == "itl" and n > 0:
                # Gaps of one stream are correlated: judge on the request count.
                k, n = round(line.share * nreq), nreq
            if o is None:
                # Availability: the failure share against the error budget.
                verdict = self.budget_verdict(n - k, n, 1.0 - line.needed)
            else:
                verdict = self.share_verdict(k, n, line.needed)
            if verdict == "fail":
                return "fail", True
            if verdict is None:
                decided_pass = False
        if len(s.ttft_us) == 0:
            return "fail", True
        failing = False
        if self.slo.availability is None:
            # No availability objective: the default's misses still count (asymmetric).
            errors = s.requests - len(s.ttft_us)
            if self._missed_now(s):
                return "fail", True
            failing = errors / s.requests > 1.0 - DEFAULT_AVAILABILITY
        if decided_pass and not failing:
            return "pass", True
        return ("pass" if all(x.met for x in lines) and not failing else "fail"), False

    def _missed_now(self, progress: Samples) -> bool:
        return self.missed_availability(progress.requests - len(progress.ttft_us),
                                        progress.requests, self.slo.availability)

    def _measured(self, progress: Samples) -> int:
        return progress.requests

    def _decided(self, progress: Samples) -> bool:
        return self.verdict(progress)[1]


def cost_per_1k(price_per_hour_usd: float, tokens_per_s: float) -> float | None:
    """USD per 1,000 tokens at `tokens_per_s` sustained on hardware costing the given hourly
    price (None when nothing was produced: the cost per token is unbounded)."""
    if not (tokens_per_s > 0) or not math.isfinite(tokens_per_s):
        return None
    return price_per_hour_usd / 3600.0 / tokens_per_s * 1000.0
