"""Deciding an objective: met, missed or undecided from what was measured, at a confidence.

Three kinds of evidence, three rules (each side one-sided at `CONFIDENCE`, so "met" means the
upper bound is under the limit with 95% confidence, "missed" that the lower bound is over it):

* Latency quantiles (p50/p95/p99 ≤ X) by the binomial order-statistic rule: with n latencies,
  the q-quantile lies below the u-th smallest with probability P(Binomial(n, q) ≤ u − 1), and
  above the l-th smallest with P(Binomial(n, q) ≥ l). A sheet keeps only the recorded quantiles
  (p50, p90, p95, p99, p99.9, max), not the latencies, so the bound's order statistic is
  bracketed by the recorded quantile ranks, conservatively: the upper bound is read at the
  lowest recorded quantile whose rank is at least u (a value at least x_(u)), the lower bound at
  the highest recorded quantile whose rank is at most l (a value at most x_(l)). The recorded
  quantiles come from histograms with their own bucket precision (HdrHistogram: 3 significant
  digits), which this rule does not widen further.
* Failure rates and availability by the exact binomial (Clopper–Pearson) bounds on k failures
  of n trials.
* Rates and efficiencies over repeats by their spread: met when every repeat meets, missed when
  every repeat misses, undecided when they straddle; one repeat is a point decision and says so.
  Quality, memory, wall time, cost and extras are measured points.

The load tester's capacity search sizes and stops its steps with the same intervals
(`clopper_pearson`, `min_passing`, `step_requests`, `quantile_ranks` live here; load imports
them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.units import sig

try:
    # scipy.stats' binom and beta are these boost ufuncs behind argument checks. Importing
    # scipy.stats costs ~1.4 s of CPU (~0.5 s for scipy.special), paid by every `scalelab load`
    # process and diagnose step that reaches this module: two thirds of a short step's CPU.
    from scipy.special._ufuncs import _beta_ppf, _binom_cdf, _binom_ppf
except ImportError:  # a scipy that keeps them elsewhere: the public functions, same numbers
    from scipy.stats import beta as _beta
    from scipy.stats import binom as _binom

    _beta_ppf, _binom_ppf = _beta.ppf, _binom.ppf

    def _binom_cdf(k: np.ndarray, n: np.ndarray, p: float) -> np.ndarray:
        return np.asarray(_binom.cdf(k, n, p))


def _bin_cdf(k: float | np.ndarray, n: float | np.ndarray, p: float) -> np.ndarray:
    """P(Binomial(n, p) <= k), as scipy.stats.binom.cdf (k below 0 gives 0, from n on 1)."""
    k, n = np.floor(np.asarray(k, dtype=float)), np.asarray(n, dtype=float)
    inside = np.clip(_binom_cdf(np.clip(k, 0, n), n, p), 0.0, 1.0)
    return np.where(k < 0, 0.0, np.where(k >= n, 1.0, inside))


def _bin_ppf(q: float, n: int, p: float) -> int:
    """The smallest k with P(Binomial(n, p) <= k) >= q (0 < q < 1), as scipy.stats.binom.ppf."""
    return int(_binom_ppf(q, n, p))


def _beta_quantile(q: float, a: float, b: float) -> float:
    """The Beta(a, b) q-quantile (0 < q < 1), as scipy.stats.beta.ppf."""
    return float(_beta_ppf(q, a, b))

CONFIDENCE = 0.95
"""One-sided confidence of every statistical decision in a verdict."""

Outcome = Literal["met", "missed", "undecided", "not measured"]

RECORDED_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999, 1.0)
"""The latency quantiles a record keeps (p50, p90, p95, p99, p99.9, max)."""

TAIL_USE = 0.5
"""Step sizing: a step must be long enough to pass a server whose share of requests over the
threshold is this fraction of the allowance (1 - q)."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One objective at one level: the outcome and what it rests on."""

    outcome: Outcome
    value: float | None
    """The measured value (median over repeats); None when not measured."""
    n: int | None
    """The sample size the decision rests on: requests or trials for statistical rules,
    repeats for spread and point rules; None when the records did not say it."""
    basis: str
    """The rule: 'order statistic', 'clopper-pearson', 'repeats', 'point' or
    'point (1 repeat)'; 'not measured' when there is no value."""
    lower: float | None = None
    """Lower bound of the metric (one-sided at `confidence`; the lowest repeat for spreads)."""
    upper: float | None = None
    """Upper bound of the metric (one-sided at `confidence`; the highest repeat for spreads)."""
    confidence: float | None = None
    """One-sided confidence of each bound; None for point and spread decisions."""
    need: str = ""
    """For an undecided decision: what was measured and what deciding it needs."""

    @property
    def statistical(self) -> bool:
        return self.confidence is not None


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Exact two-sided binomial interval for k successes in n trials."""
    if n <= 0:
        return 0.0, 1.0
    a = 1.0 - confidence
    lo = 0.0 if k <= 0 else _beta_quantile(a / 2, k, n - k + 1)
    hi = 1.0 if k >= n else _beta_quantile(1 - a / 2, k + 1, n - k)
    return lo, hi


def one_sided(confidence: float) -> float:
    """The one-sided level of each side of a two-sided `confidence` interval (0.95 -> 0.975)."""
    return 1.0 - (1.0 - confidence) / 2.0


def binomial_bounds(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds (each at `confidence`) on the probability behind k
    events in n trials: P(p < lower) ≤ 1 − confidence and P(p > upper) ≤ 1 − confidence."""
    return clopper_pearson(k, n, 1.0 - 2.0 * (1.0 - confidence))


def trials_needed(k: int, limit: float, confidence: float = CONFIDENCE) -> int:
    """The fewest trials with k events whose upper bound is under `limit` (0 < limit < 1).
    With k = 0 it is the closed form ⌈ln(1 − confidence) / ln(1 − limit)⌉ (rounded up past
    equality): 2,995 for a 0.1% failure budget at 95%."""
    if not 0.0 < limit < 1.0:
        raise BadUsageError(f"a rate limit must be in (0, 1), got {limit}")

    def under(n: int) -> bool:
        return binomial_bounds(k, n, confidence)[1] < limit

    hi = max(k + 1, 1)
    while not under(hi):
        hi *= 2
    lo = max(k + 1, hi // 2)
    while lo < hi:
        mid = (lo + hi) // 2
        if under(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def min_passing(overs: int, q: float, confidence: float) -> int:
    """LoadGen's early-stopping count: the fewest requests within the threshold that, beside
    `overs` requests over it, show at one-sided `confidence` that the q-quantile is under the
    threshold, i.e. the smallest h with P(Binomial(h + overs, 1 - q) <= overs) <= 1 - confidence.

    With no request over, h = ceil(ln(1 - c) / ln(q)): 459 for p99 at 99%, LoadGen's minimum.
    """
    if not (0.0 < q < 1.0 and 0.0 < confidence < 1.0) or overs < 0:
        raise BadUsageError(f"min_passing needs 0 < q, confidence < 1 and overs >= 0; got "
                            f"q={q}, confidence={confidence}, overs={overs}")
    alpha = 1.0 - confidence

    def fails(h: int) -> bool:
        return float(_bin_cdf(overs, h + overs, 1.0 - q)) > alpha

    hi = 1
    while fails(hi):
        hi *= 2
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:  # smallest h in [lo, hi] that does not fail
        mid = (lo + hi) // 2
        if fails(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def step_requests(q: float, confidence: float, tail_use: float = TAIL_USE) -> int:
    """Measured requests one step needs before it may decide a q-quantile objective at two-sided
    `confidence`: the smallest n with n >= min_passing(t) + t for t = floor(tail_use (1-q) n),
    at the one-sided level the Clopper-Pearson pass test uses (so this is also the fewest
    requests at which that test can pass such a server)."""
    if not (0.0 < tail_use < 1.0):
        raise BadUsageError(f"tail use must be in (0, 1), got {tail_use}")
    alpha = 1.0 - one_sided(confidence)
    p_over = 1.0 - q
    start = 1
    chunk = 65536
    while start < 100_000_000:
        n = np.arange(start, start + chunk)
        t = np.floor(tail_use * p_over * n)
        ok = _bin_cdf(t, n, p_over) <= alpha
        if ok.any():
            return int(n[int(np.argmax(ok))])
        start += chunk
        chunk *= 2
    raise BadUsageError(f"p{q * 100:g} at {confidence:.0%} needs more than 100,000,000 requests "
                        "per step; lower --confidence")


def quantile_ranks(n: int, q: float, confidence: float) -> tuple[int, int]:
    """1-based ranks (l, u) so that [x_(l), x_(u)] covers the q-quantile with ≥ confidence."""
    a = 1.0 - confidence
    lo = _bin_ppf(a / 2, n, q)
    hi = _bin_ppf(1 - a / 2, n, q) + 1
    return max(1, lo), min(n, hi)


def order_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int | None, int | None]:
    """One-sided ranks: l with P(x_(l) ≤ ξ_q) ≥ confidence and u with P(x_(u) ≥ ξ_q) ≥ confidence
    (1-based, among n); None where no order statistic of n reaches that confidence."""
    u = _bin_ppf(confidence, n, q) + 1  # P(Bin(n, q) ≤ u − 1) ≥ confidence
    low = _bin_ppf(1.0 - confidence, n, q)  # P(Bin(n, q) ≤ low − 1) < 1 − confidence
    return (low if low >= 1 else None), (u if u <= n else None)


def quantile_requests_needed(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest latencies at which any order statistic (the maximum) bounds the q-quantile
    from above: ⌈ln(1 − confidence) / ln q⌉ (59 for p95 at 95%)."""
    return min_passing(0, q, confidence)


def quantile_bounds(
    recorded: dict[float, float], n: int, q: float, confidence: float = CONFIDENCE
) -> tuple[float | None, float | None]:
    """(lower, upper) confidence bounds on the q-quantile of n latencies from the recorded
    quantiles only (see the module doc): a recorded quantile r stands for an order statistic
    of rank between ⌊r·n⌋ and ⌈r·n⌉, so it is an upper bound when ⌊r·n⌋ ≥ u and a lower
    bound when ⌈r·n⌉ ≤ l. None where no recorded quantile qualifies."""
    low_rank, up_rank = order_ranks(n, q, confidence)
    upper = lower = None
    if up_rank is not None:
        ups = [r for r in sorted(recorded) if math.floor(r * n + 1e-9) >= up_rank]
        upper = recorded[ups[0]] if ups else None
    if low_rank is not None:
        lows = [r for r in sorted(recorded) if math.ceil(r * n - 1e-9) <= low_rank]
        lower = recorded[lows[-1]] if lows else None
    return lower, upper


def _against(lower: float | None, upper: float | None, *, minimum: float | None,
             maximum: float | None) -> Outcome:
    """Met when the whole interval satisfies the bound, missed when none of it does."""
    if maximum is not None:
        if upper is not None and upper <= maximum:
            return "met"
        if lower is not None and lower > maximum:
            return "missed"
        return "undecided"
    assert minimum is not None
    if lower is not None and lower >= minimum:
        return "met"
    if upper is not None and upper < minimum:
        return "missed"
    return "undecided"


def decide_point(value: float | None, *, minimum: float | None, maximum: float | None,
                 repeats: int = 1) -> Decision:
    """A measured point (quality, memory, wall time, cost): the value against the bound."""
    if value is None:
        return Decision(outcome="not measured", value=None, n=None, basis="not measured")
    return Decision(outcome=_against(value, value, minimum=minimum, maximum=maximum),
                    value=value, n=repeats, basis="point", lower=value, upper=value)


def decide_spread(value: float | None, lo: float | None, hi: float | None, *, repeats: int,
                  minimum: float | None, maximum: float | None) -> Decision:
    """A value measured once per repeat (rate, efficiency): met when every repeat meets, missed
    when every repeat misses, undecided when [lowest, highest] straddles the bound."""
    if value is None:
        return Decision(outcome="not measured", value=None, n=None, basis="not measured")
    lo = value if lo is None else lo
    hi = value if hi is None else hi
    if repeats <= 1:
        return Decision(outcome=_against(value, value, minimum=minimum, maximum=maximum),
                        value=value, n=1, basis="point (1 repeat)", lower=value, upper=value)
    out = _against(lo, hi, minimum=minimum, maximum=maximum)
    need = (f"{repeats} repeats span {sig(lo)}–{sig(hi)} across the limit: more repeats or longer "
            "levels decide it" if out == "undecided" else "")
    return Decision(outcome=out, value=value, n=repeats, basis="repeats", lower=lo, upper=hi,
                    need=need)


def decide_rate(k: int | None, n: int | None, *, value: float | None, minimum: float | None,
                maximum: float | None, complement: bool = False, unit: str = "requests",
                confidence: float = CONFIDENCE) -> Decision:
    """A failure rate (k failures of n) or, with `complement`, availability 1 − k/n, against its
    bound by the one-sided Clopper–Pearson bounds."""
    if value is None:
        return Decision(outcome="not measured", value=None, n=None, basis="not measured")
    if k is None or n is None or n <= 0:
        return Decision(outcome="undecided", value=value, n=None, basis="clopper-pearson",
                        confidence=confidence,
                        need=f"sample size not recorded ({sig(value)} measured)")
    f_lo, f_hi = binomial_bounds(k, n, confidence)
    lo, hi = (1.0 - f_hi, 1.0 - f_lo) if complement else (f_lo, f_hi)
    out = _against(lo, hi, minimum=minimum, maximum=maximum)
    # On the failure scale (what the sample must show), strict: a bound equal to the budget
    # has not shown it is under.
    budget = (1.0 - minimum if minimum is not None else None) if complement else maximum
    if out == "met" and budget is not None and not f_hi < budget:
        out = "undecided"
    need = ""
    if out == "undecided":
        failed = "without a failure" if k == 0 else f"at {k:,} failures"
        need = f"{n:,} {unit}"
        if budget is not None and 0.0 < budget < 1.0 and k / n < budget:
            what = (f"{(1.0 - budget) * 100:.4g}%" if complement
                    else f"a failure rate ≤ {budget * 100:.4g}%")
            need += f"; {what} needs ≥ {trials_needed(k, budget, confidence):,} {failed}"
        else:
            need += f", {k:,} failed: more {unit} decide it"
    return Decision(outcome=out, value=value, n=n, basis="clopper-pearson", lower=lo, upper=hi,
                    confidence=confidence, need=need)


def decide_quantile(q: float, recorded: dict[float, float], n: int | None, *,
                    value: float | None, minimum: float | None, maximum: float | None,
                    unit: str = "requests", confidence: float = CONFIDENCE) -> Decision:
    """A latency q-quantile against its bound by the order-statistic rule on n latencies."""
    if value is None:
        return Decision(outcome="not measured", value=None, n=None, basis="not measured")
    if n is None or n <= 0:
        return Decision(outcome="undecided", value=value, n=None, basis="order statistic",
                        confidence=confidence,
                        need=f"sample size not recorded ({sig(value)} measured)")
    lo, hi = quantile_bounds(recorded, n, q, confidence)
    out = _against(lo, hi, minimum=minimum, maximum=maximum)
    if out == "met" and maximum is not None and hi is not None and not hi < maximum:
        out = "undecided"  # met only when the upper bound is under the limit
    need = ""
    if out == "undecided":
        least = quantile_requests_needed(q, confidence)
        need = f"{n:,} {unit}"
        if n < least:
            need += f"; p{q * 100:g} needs ≥ {least:,} to bound it at {confidence:.0%}"
        else:
            shown = "—" if hi is None else sig(hi)
            need += f": upper bound {shown} straddles the limit; more {unit} decide it"
    return Decision(outcome=out, value=value, n=n, basis="order statistic", lower=lo, upper=hi,
                    confidence=confidence, need=need)
