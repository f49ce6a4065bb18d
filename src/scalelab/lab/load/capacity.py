"""Capacity: the highest arrival rate that meets an SLO, found by search with a stopping rule.

Each step offers one rate and stops as soon as the data decide pass or fail at the chosen
confidence: for "pq < T", k of n successes finished within T, so P(latency <= T) has a
Clopper-Pearson interval; entirely above q means the q-quantile is under T (pass), entirely
below means over (fail). This is the order-statistic interval of the quantile seen from the
threshold's side. An availability target is judged the same way on the failure count. A step
that reaches its maximum length undecided is judged by the point estimate and marked undecided.

The rule treats requests as independent, which queues are not: near capacity the slow requests
come in bursts (one queue excursion makes many of them), so a step that stops at its first
decision judges a tail from one or two bursts and the search lands wherever the first burst
fell. Each step is therefore sized by the tail it judges: it may not decide before it has
`step_requests(q, confidence)` measured requests, the number at which MLPerf LoadGen's
early-stopping test (loadgen/early_stopping.cc, Server scenario) would pass a server that uses
half of its tail allowance, i.e. whose share over the threshold is (1 - q) / 2. A p99 step
needs 1,164 requests at the default 95% (two-sided; 97.5% one-sided), a p95 step 230, a p50
step 15. `min_step_s` remains a floor in time, since an overloaded queue needs time to show
that it grows.

Availability is judged asymmetrically: a step whose failures decide availability *missed*
(the Clopper-Pearson lower bound over the error budget, `DEFAULT_AVAILABILITY` when none is
given) fails and stops at once, however few requests it has (many failures decide quickly),
even where passing availability is not required per step. A step passes only at steady state
(`load.steady`: served rate equal to the offered one within its interval, no upward latency
trend), and only when the generator offered its rate (`Step.valid`).

Search: from `start`, double while steps pass; then bisect between the highest pass and the
lowest fail until they are within `precision`. A rate already decided to fail elsewhere
(`fails_at`, e.g. a level sweep's) ends the doubling below it: the search bisects towards it.
Where even `start` fails, the search halves down to a passing rate, never below its floor
(`min_rate`; `start` / 64 by default).
A step flagged invalid (the generator did not offer the rate: a stall of the machine, not of
the server) is run again before it counts; one still invalid ends the search at the
generator's ceiling, whatever its verdict (a late generator's lag is charged to latency): the
answer is "at least" the highest pass below it. Only above every rate the generator has
offered: an invalid step at or below one it offered (a step, or a confirmation, of this
search) is a stall of the machine, not a ceiling, and is run again (up to `STALL_RETRIES`
times) while steps last.
The capacity is the highest passing rate and its interval is [highest pass, lowest fail].

Confirmation (`confirmed_search`): the answer is run again for a longer, full-length step; one
that fails sends the search below that rate (twice the precision below it, bisecting down from
there when that fails too), and its answer is confirmed in turn, until a confirmation holds.
It stops with none held only when the next rate would be under the floor ("no rate held down
to N req/s") or the step budget is spent ("the step budget ran out after K confirmations"),
and says which. Advice divides only by a confirmed capacity.
"""

from __future__ import annotations

import abc
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Generic, Literal, TypeVar

# The interval math lives in core.decide (the verdict decides with it too).
from scalelab.lab.core.decide import clopper_pearson, quantile_ranks, step_requests
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.slo import Slo
from scalelab.lab.load.steady import Steadiness

Verdict = Literal["pass", "fail", "undecided-pass", "undecided-fail"]
CONFIRM_S = 30.0
"""Default length of the confirmation run of `load capacity`'s answer."""
CONFIRM_VARIABLE = "rate (confirmation)"
"""The record variable of a confirmation run (apart from the search's steps at the same rate,
which a sheet would otherwise merge with it)."""
DEFAULT_AVAILABILITY = 0.99
"""The availability a step's failures are judged against when the SLO names none: a step
decided to miss it never passes (the asymmetric rule in the module doc)."""
ProgressT = TypeVar("ProgressT")


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What a running step has measured so far (for stopping rules)."""

    sent: int
    """Measured requests dispatched."""
    ok: int
    """Measured successes (2xx)."""
    errors: int
    """Measured failures of any kind."""
    within: int
    """Measured successes with latency <= the SLO threshold."""


def quantile_ci_ms(hist: LatencyHistogram, q: float, confidence: float
                   ) -> tuple[float | None, float | None]:
    n = hist.count
    if n == 0:
        return None, None
    lo, hi = quantile_ranks(n, q, confidence)
    return hist.quantile_ms(lo / n), hist.quantile_ms(hi / n)


@dataclass(frozen=True, kw_only=True)
class StopRule(abc.ABC, Generic[ProgressT]):
    """When a capacity step may stop: its objectives decided at `confidence`, or out of time
    or requests. What is judged, on what a running step measured (a `ProgressT`), is the
    subclass's (`StepRule`: one latency objective on `Progress`; `llm.token_slo.TokenStepRule`:
    token objectives on `Samples`); the interval rule and the stopping rule are this one."""

    confidence: float = 0.95
    """Two-sided confidence of each interval."""
    min_step_s: float = 3.0
    """Never decide before this much measured time (lets an overloaded queue show)."""
    max_step_s: float = 60.0
    """Stop undecided after this much measured time."""
    max_requests: int = 200_000
    """Stop undecided after this many measured requests."""

    def __post_init__(self) -> None:
        if not (0.5 < self.confidence < 1.0):
            raise BadUsageError(f"--confidence must be in (50%, 100%), got {self.confidence}")
        if not (0 < self.min_step_s <= self.max_step_s):
            raise BadUsageError("--min-step must be positive and at most --max-step")

    def out_of_room(self, elapsed_s: float, sent: int) -> bool:
        """The step ran its longest or sent its most: it stops, decided or not."""
        return elapsed_s >= self.max_step_s or sent >= self.max_requests

    def should_stop(self, progress: ProgressT, elapsed_s: float) -> bool:
        """The stopping rule (`driver.StopCheck`): stop when out of room, or, after
        `min_step_s` and `_min_measured` requests, when the objectives are decided."""
        n = self._measured(progress)
        if self.out_of_room(elapsed_s, n) or self._missed_now(progress):
            return True
        if elapsed_s < self.min_step_s or n < self._min_measured:
            return False
        return self._decided(progress)

    @abc.abstractmethod
    def _measured(self, progress: ProgressT) -> int:
        """The requests the step has measured, as `max_requests` counts them."""

    @abc.abstractmethod
    def _decided(self, progress: ProgressT) -> bool:
        """The interval rule has decided every objective."""

    @property
    def _min_measured(self) -> int:
        """Requests a step needs before it may decide."""
        return 0

    def _missed_now(self, progress: ProgressT) -> bool:
        """Decided to miss already, before the step's floors (many failures decide fast)."""
        return False

    def share_verdict(self, k: int, n: int, needed: float) -> Literal["pass", "fail"] | None:
        """k of n events within an objective that needs a share `needed`: "fail" when the
        interval lies wholly below it, "pass" when wholly at or above, None while undecided."""
        lo, hi = clopper_pearson(k, n, self.confidence)
        if n > 0 and hi < needed:
            return "fail"
        return "pass" if n > 0 and lo >= needed else None

    def missed_availability(self, errors: int, n: int, availability: float | None) -> bool:
        """`errors` of n decide availability missed (the asymmetric rule of the module doc):
        against `availability`, or `DEFAULT_AVAILABILITY` where the objectives name none."""
        need = DEFAULT_AVAILABILITY if availability is None else availability
        return self.budget_verdict(errors, n, 1.0 - need) == "fail"

    def budget_verdict(self, errors: int, n: int,
                       budget: float) -> Literal["pass", "fail"] | None:
        """`errors` of n against an error budget: "fail" when the interval lies wholly over
        it, "pass" when wholly within, None while undecided."""
        lo, hi = clopper_pearson(errors, n, self.confidence)
        if lo > budget:
            return "fail"
        return None if hi > budget else "pass"


@dataclass(frozen=True, kw_only=True)
class StepRule(StopRule[Progress]):
    """`StopRule` for one latency objective, optionally an availability target; each step is
    sized by the objective's quantile (see the module doc)."""

    slo: Slo
    """Exactly one latency objective, optionally an availability target."""
    min_requests: int | None = None
    """Never decide before this many measured requests; None: `step_requests` for the
    objective's quantile at `confidence`."""

    def __post_init__(self) -> None:
        if len(self.slo.latency) != 1:
            raise BadUsageError("capacity search takes exactly one latency objective, e.g. "
                                "--slo \"p95<50ms\" (add --error-budget for availability)")
        super().__post_init__()
        if self.min_requests is not None and self.min_requests < 1:
            raise BadUsageError(f"--min-requests must be at least 1, got {self.min_requests}")

    @property
    def requests_needed(self) -> int:
        """Measured requests a step needs before it may decide (see the module doc)."""
        if self.min_requests is not None:
            return self.min_requests
        return step_requests(self.slo.latency[0].quantile, self.confidence)

    def availability_missed(self, *, ok: int, errors: int) -> bool:
        """The failures decide availability missed: against the SLO's budget, or
        `DEFAULT_AVAILABILITY`'s where it names none."""
        return self.missed_availability(errors, ok + errors, self.slo.availability)

    def verdict(self, *, ok: int, within: int, errors: int) -> tuple[str, bool]:
        """('pass'|'fail', decided) from the counts so far."""
        if self.availability_missed(ok=ok, errors=errors):
            return "fail", True
        q = self.slo.latency[0].quantile
        latency = self.share_verdict(within, ok, q)
        if latency == "fail":
            return "fail", True
        decided_pass = latency == "pass"
        budget = self.slo.error_budget
        if budget is not None:
            errs = self.budget_verdict(errors, ok + errors, budget)
            if errs == "fail":
                return "fail", True
            if errs is None:
                decided_pass = False
        if ok == 0:
            return "fail", errors > 0
        # Without an availability objective, failures over the default budget still keep a
        # step from passing: it runs on until they decide a miss (or it ends undecided).
        limit = budget if budget is not None else 1.0 - DEFAULT_AVAILABILITY
        failing = errors / (ok + errors) > limit
        if decided_pass and not failing:
            return "pass", True
        point_ok = within / ok >= q and not failing
        return ("pass" if point_ok else "fail"), False

    def _measured(self, progress: Progress) -> int:
        return progress.sent

    def _decided(self, progress: Progress) -> bool:
        return self.verdict(ok=progress.ok, within=progress.within, errors=progress.errors)[1]

    def _missed_now(self, progress: Progress) -> bool:
        return self.availability_missed(ok=progress.ok, errors=progress.errors)

    @property
    def _min_measured(self) -> int:
        return self._needed

    def step_verdict(self, *, sent: int, ok: int, within: int, errors: int,
                     steady: Steadiness | None = None) -> Verdict:
        """A finished step's verdict: "undecided-" unless the interval decided it with at least
        `requests_needed` requests measured; "fail" when availability was decided missed (at
        any count) or the step was not at steady state (`load.steady`)."""
        if self.availability_missed(ok=ok, errors=errors):
            return "fail"
        if steady is not None and not steady.steady:
            return "fail"
        v, decided = self.verdict(ok=ok, within=within, errors=errors)
        if decided and sent >= self._needed:
            return v  # type: ignore[return-value]
        return f"undecided-{v}"  # type: ignore[return-value]

    @functools.cached_property
    def _needed(self) -> int:
        return self.requests_needed


@dataclass(frozen=True, kw_only=True)
class Step:
    """One offered rate and what it showed."""

    rate: float
    """Offered arrival rate."""
    verdict: Verdict
    """pass/fail, "undecided-" when the step ran out before the rule decided."""
    requests: int
    """Measured requests."""
    throughput_rps: float
    """Achieved successes per second."""
    quantile_ms: float | None
    """The objective's quantile."""
    quantile_ci_ms: tuple[float | None, float | None]
    """Its order-statistic confidence interval."""
    error_rate: float
    """Failures / requests."""
    valid: bool
    """The generator held the rate (see generator lag)."""
    wall_s: float
    """Measured seconds."""
    requests_needed: int = 0
    """Requests the step needed before it could decide (its sizing rule)."""
    steady: Steadiness | None = None
    """The steady-state tests (None where the runner measures none, e.g. token streams)."""
    confirmation: bool = False
    """A confirmation run of the search's answer (full length, never stopped early)."""
    extras: dict[str, object] = field(default_factory=dict)
    """Anything else the runner wants kept (e.g. the full result)."""

    @property
    def server_passed(self) -> bool:
        """What the server did passed, whether or not the generator offered the rate."""
        return self.verdict in ("pass", "undecided-pass")

    @property
    def passed(self) -> bool:
        """Counts as a pass: the server passed at a rate the generator offered."""
        return self.valid and self.server_passed

    @property
    def outcome(self) -> Literal["met", "missed", "undecided"]:
        """The step as a decided check (what diagnose's deciders read from its record)."""
        if not self.verdict.startswith("undecided") and self.valid:
            return "met" if self.verdict == "pass" else "missed"
        return "undecided"


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """How the rate is searched."""

    start: float = 10.0
    """First rate tried (requests/s)."""
    max_rate: float = 100_000.0
    """Never offer more than this."""
    precision: float = 0.05
    """Stop bisecting when (lowest fail - highest pass) / highest pass is at most this."""
    max_steps: int = 20
    """Most steps in all."""
    invalid_retries: int = 1
    """A step the generator could not offer (invalid) says nothing about the server: it is
    run again at the same rate up to this many times before its verdict counts."""
    fails_at: float | None = None
    """A rate already decided to fail outside the search (e.g. a level of `load run` at
    constant arrivals, kinder than the search's Poisson ones): the search never offers it or
    more, and bisects between its highest pass and this rate (None: found by doubling)."""
    min_rate: float | None = None
    """Never offer less than this: where `start` fails the search halves down to it, and
    failed confirmations send the search no lower (None: `start` / 64)."""
    offered_rps: float | None = None
    """A rate the generator already offered (a valid step or confirmation before this search):
    an invalid step at or below it is a stall of the machine, not the generator's ceiling."""

    def __post_init__(self) -> None:
        if not (self.start > 0 and self.max_rate >= self.start):
            raise BadUsageError("--start must be positive and at most --max-rate")
        if self.min_rate is not None and not (0 < self.min_rate <= self.start):
            raise BadUsageError(f"--min-rate {self.min_rate:g} must be positive and at most "
                                f"--start {self.start:g}")
        if self.fails_at is not None and not self.fails_at > self.start:
            raise BadUsageError(
                f"--fails-at {self.fails_at:g} must be above --start {self.start:g}: the search "
                "starts below the rate already known to fail")
        if self.invalid_retries < 0:
            raise BadUsageError(f"--invalid-retries must be >= 0, got {self.invalid_retries}")
        if not (0 < self.precision < 1):
            raise BadUsageError(f"--precision must be in (0, 1), got {self.precision}")
        if self.max_steps < 1:
            raise BadUsageError("--max-steps must be at least 1")

    @property
    def floor(self) -> float:
        """The lowest rate the search offers (`min_rate`, or `start` / 64)."""
        return self.min_rate if self.min_rate is not None else self.start / 64.0


@dataclass(frozen=True, kw_only=True)
class CapacityResult:
    """The search's answer."""

    capacity_rps: float | None
    """Highest offered rate that met the SLO (None when even the lowest tried failed); after
    confirmations, the highest below every failed one."""
    interval_rps: tuple[float | None, float | None]
    """[highest pass, lowest fail]: the capacity lies in it at each step's confidence."""
    steps: list[Step]
    """Every step, in the order run (confirmations included, flagged)."""
    converged: bool
    """The interval is within `precision` (or capped by max_rate)."""
    knee_rps: float | None
    """Knee of the latency-throughput curve (core.knee), when there is one."""
    generator_limit_rps: float | None = None
    """The rate the generator could not offer (its steps invalid while the server passed): the
    capacity is then at least `capacity_rps`, not a capacity (None: no such limit met)."""
    confirmed_rps: float | None = None
    """The rate whose confirmation run passed (None: none did, or none was run)."""
    stopped: str | None = None
    """Why the confirmations stopped with none held (the floor reached, the step budget spent;
    None: one held, or none was run)."""

    @property
    def confirmations(self) -> list[Step]:
        return [s for s in self.steps if s.confirmation]

    @property
    def at_least(self) -> bool:
        """The answer is a lower bound: the search reached the generator's ceiling."""
        return self.generator_limit_rps is not None

    def answer(self) -> str:
        """The answer in one line, its confirmation beside it."""
        if self.capacity_rps is None:
            if self.confirmations:
                c = self.confirmations[-1]
                return "no confirmed capacity: " + (
                    self.stopped or f"{len(self.confirmations)} confirmation run(s) failed, "
                                    f"the last at {c.rate:.4g} req/s")
            if self.at_least:
                return (f"none found: the generator could not offer "
                        f"{self.generator_limit_rps:.4g} req/s, the first rate it tried")
            return "no tried rate met the objective"
        cap = f"{self.capacity_rps:.4g} req/s"
        head = (f"at least {cap}, the generator's limit here (it could not offer "
                f"{self.generator_limit_rps:.4g} req/s)" if self.at_least else f"capacity {cap}")
        confs = self.confirmations
        if not confs:
            return head + f" (not confirmed: {self.stopped or 'no confirmation run'})"
        c = confs[-1]
        if self.confirmed_rps is not None and c.passed:
            return head + (f", confirmed by {c.wall_s:.3g} s at that rate ({c.requests:,} "
                           f"requests, served {c.throughput_rps:.4g} req/s)")
        return head + " (not confirmed: " + (
            self.stopped or f"{len(confs)} confirmation run(s) failed, the last at "
                            f"{c.rate:.4g} req/s") + ")"


class Deadline:
    """A time budget for a whole search (`--budget`, e.g. diagnose's stage share): it starts
    no step and no confirmation that could end past it."""

    def __init__(self, seconds: float, *, step_s: float, confirm_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not seconds > 0:
            raise BadUsageError(f"--budget must be positive, got {seconds:g} s")
        self.seconds = seconds
        self.step_s = step_s
        """The longest a search step takes (its longest measured time and warm-up)."""
        self.confirm_s = confirm_s
        """The longest a confirmation takes."""
        self.clock = clock
        self.end = clock() + seconds

    def allows(self, seconds: float) -> bool:
        """Something that takes up to `seconds` ends within the budget if started now."""
        return self.clock() + seconds <= self.end


STALL_RETRIES = 3
"""Runs again of a step stalled below a rate the search offered before: a machine that stalls
four times running at one rate will not give the search a word on the server there (a busy
run retried one step ten times), so the search stops and says the steps ran out."""


def search(run_step: Callable[[float], Step], cfg: SearchConfig,
           deadline: Deadline | None = None) -> CapacityResult:
    """Exponential then bisection search over the offered rate; `run_step` measures one;
    no step after the first starts that `deadline` does not allow."""
    steps: list[Step] = []
    lo: float | None = None
    hi: float | None = cfg.fails_at
    ceiling: list[float] = []
    offered = [cfg.offered_rps or 0.0]

    def room() -> bool:
        # The first step runs whatever the deadline: a search of no step says nothing.
        return len(steps) < cfg.max_steps and (deadline is None or not steps
                                               or deadline.allows(deadline.step_s))

    def do(rate: float) -> bool | None:
        """The rate passed (True) or failed (False); None: not known, the search stops (the
        generator's ceiling, or a stall that outlasted the steps)."""
        retries = 0
        while True:
            s = run_step(rate)
            steps.append(s)
            if s.valid:
                offered[0] = max(offered[0], rate)
                return s.passed
            # Not offered: what the server did at this rate is unknown (a late generator's
            # lag is charged to latency, so even a "fail" may be its own).
            stall = rate <= offered[0]  # it offered as much before: the machine stalled
            allowed = max(cfg.invalid_retries, STALL_RETRIES) if stall else cfg.invalid_retries
            if not room() or retries >= allowed:
                if not stall:
                    ceiling.append(rate)  # the generator's limit, not the server's
                return None
            retries += 1

    rate = cfg.start
    capped = False
    known = True
    while room():
        ok = do(rate)
        if ok is None:
            known = False
        elif ok:
            lo = rate
            if rate >= cfg.max_rate:
                capped = True
                break
            rate = min(rate * 2.0, cfg.max_rate)
            if hi is None or rate < hi:
                continue  # a known fail above bounds it: bisect below
        else:
            hi = rate
        break
    if lo is None and hi is not None and known:
        # Even the start failed: halve down to a passing rate, never below the floor.
        rate = hi / 2.0
        while room() and rate >= cfg.floor:
            ok = do(rate)
            if ok is None:
                known = False
                break
            if ok:
                lo = rate
                break
            hi = rate
            rate /= 2.0
    while known and lo is not None and hi is not None and (hi - lo) / lo > cfg.precision \
            and room():
        mid = (lo + hi) / 2.0
        ok = do(mid)
        if ok is None:
            known = False
        elif ok:
            lo = mid
        else:
            hi = mid
    converged = capped or (lo is not None and hi is not None and (hi - lo) / lo <= cfg.precision)
    return CapacityResult(capacity_rps=lo, interval_rps=(lo, hi), steps=steps,
                          converged=converged and not ceiling, knee_rps=knee(steps),
                          generator_limit_rps=ceiling[0] if ceiling else None)


def confirmed_search(run_step: Callable[[float], Step], confirm: Callable[[float], Step],
                     cfg: SearchConfig, *, max_confirms: int | None = None,
                     deadline: Deadline | None = None) -> CapacityResult:
    """`search`, then `confirm` (a full-length step, `Step.confirmation`) at its answer. A
    failed confirmation at r bounds the capacity below r, but the short steps that passed near r
    cannot place it better (they passed there already): the search runs again from
    r × (1 - 2 × precision) with that as its ceiling (a failing step there bisects down), and
    its answer is confirmed in turn, until one holds (an invalid confirmation is run again
    `cfg.invalid_retries` times before it counts, as a step is). It stops with none held when
    the next start is under `cfg.floor`, when a search below finds no passing rate, or when
    the steps run out: confirmations do not count against `cfg.max_steps`, but every search
    below a failed one takes its steps from what the searches before left, so K confirmations
    need K - 1 steps left. `max_confirms` (None: no limit; 0: none run) caps them, and
    `deadline` too: no confirmation, and no search below a failed one, starts that it does not
    leave time for (an answer it leaves no time to confirm stays unconfirmed).
    `CapacityResult.stopped` says why none held."""
    res = search(run_step, cfg, deadline)
    steps = list(res.steps)
    searched = len(steps)
    confirmed: float | None = None
    stopped: str | None = None
    confirms = 0
    offered = max((s.rate for s in steps if s.valid), default=0.0)
    while res.capacity_rps is not None and (max_confirms is None or confirms < max_confirms):
        if deadline is not None and not deadline.allows(deadline.confirm_s):
            stopped = _out_of_time(deadline, confirms, steps)
            break
        c = confirm(res.capacity_rps)
        steps.append(c)
        for _ in range(cfg.invalid_retries if not c.valid else 0):
            # The search offered this rate in a step: not offering it now is a stall of the
            # machine, and says nothing about the server; run again before it counts.
            c = confirm(c.rate)
            steps.append(c)
            if c.valid:
                break
        confirms += 1
        if c.passed:
            confirmed = c.rate
            break
        offered = max(offered, c.rate if c.valid else 0.0)
        start = c.rate * (1.0 - 2.0 * cfg.precision)
        left = cfg.max_steps - searched
        stopped = _no_lower(start, left, cfg, confirms, c.rate, max_confirms)
        if stopped is None and deadline is not None and \
                not deadline.allows(deadline.step_s + deadline.confirm_s):
            stopped = _out_of_time(deadline, confirms, steps)
        if stopped is not None:
            res = replace(res, capacity_rps=None, interval_rps=(None, c.rate), converged=False)
            break
        sub = search(run_step, replace(cfg, start=start, fails_at=None, max_rate=start,
                                       min_rate=cfg.floor, max_steps=left,
                                       offered_rps=offered), deadline)
        searched += len(sub.steps)
        steps += sub.steps
        offered = max([offered, *(s.rate for s in sub.steps if s.valid)])
        hi = sub.interval_rps[1] if sub.interval_rps[1] is not None else c.rate
        # A confirmation the generator offered and the server failed puts the capacity below
        # it: a ceiling met above it earlier bounds nothing now ("at least" would be wrong).
        earlier = None if c.valid else res.generator_limit_rps
        res = replace(sub, interval_rps=(sub.capacity_rps, hi),
                      generator_limit_rps=sub.generator_limit_rps or earlier)
        if sub.capacity_rps is None:
            stopped = (_out_of_time(deadline, confirms, steps) if deadline is not None
                       and not deadline.allows(deadline.step_s) else
                       _none_below(sub, cfg, confirms, searched))
    return replace(res, steps=steps, confirmed_rps=confirmed, knee_rps=knee(steps),
                   stopped=None if confirmed is not None else stopped)


def _out_of_time(deadline: Deadline, confirms: int, steps: list[Step]) -> str:
    """The time budget's reason for stopping."""
    head = f"the time budget ({deadline.seconds:.3g} s) ran out"
    if not confirms:
        return head + " before the answer's confirmation"
    last = [s for s in steps if s.confirmation][-1]
    return (f"{head} after {confirms} confirmation(s) (the last at {last.rate:.4g} req/s "
            f"{'held' if last.passed else 'failed'})")


def _no_lower(start: float, left: int, cfg: SearchConfig, confirms: int, failed: float,
              max_confirms: int | None) -> str | None:
    """Why the search cannot go below a failed confirmation (None: it can)."""
    last = f"the last at {failed:.4g} req/s"
    if start < cfg.floor:
        return (f"no rate held down to {cfg.floor:.4g} req/s, the search's floor "
                f"({confirms} confirmation(s) failed, {last})")
    if left < 1:
        return (f"the step budget ran out after {confirms} confirmation(s) ({cfg.max_steps} "
                f"steps in all; {last} failed)")
    if max_confirms is not None and confirms >= max_confirms:
        return f"{confirms} confirmation(s) failed, the most allowed ({last})"
    return None


def _none_below(sub: CapacityResult, cfg: SearchConfig, confirms: int, searched: int) -> str:
    """Why the search below a failed confirmation found no rate to confirm."""
    lowest = min(s.rate for s in sub.steps)
    if searched >= cfg.max_steps:
        return (f"the step budget ran out after {confirms} confirmation(s) ({cfg.max_steps} "
                f"steps in all; none passed down to {lowest:.4g} req/s)")
    if sub.generator_limit_rps is not None:
        return (f"the generator could not offer {sub.generator_limit_rps:.4g} req/s below the "
                f"failed confirmation ({confirms} confirmation(s) failed)")
    return (f"no rate held down to {lowest:.4g} req/s ({confirms} confirmation(s) failed; the "
            f"search's floor is {cfg.floor:.4g} req/s)")


def rate_verdicts(res: CapacityResult) -> list[str]:
    """Each step's verdict as the search counted its rate. A rate is tried again only when its
    step was invalid, and then the last try is the one the search counted: every step of a
    rate carries that verdict, so a reader grouping records by rate (the diagnose sheet) sees
    what the search decided. A confirmation keeps its own."""
    counted = {s.rate: s.verdict for s in res.steps if not s.confirmation}
    return [s.verdict if s.confirmation else counted[s.rate] for s in res.steps]


def step_extras(step: Step, index: int, rate_verdict: str) -> dict[str, object]:
    """What a search decided of one step, as every capacity search's record carries it (its
    rate, n, failures and outcome stay readable as a decided check; `capacity_confirm` tells a
    reader the search confirms, so only a confirmed rate is its capacity)."""
    return {"capacity_step": index, "verdict": step.verdict, "rate_verdict": rate_verdict,
            "requests_needed": step.requests_needed, "outcome": step.outcome,
            "capacity_confirm": step.confirmation, "valid_offer": step.valid}


def knee(steps: list[Step]) -> float | None:
    """Throughput at the knee of latency (the quantile) vs throughput, via core.knee."""
    pts = sorted((s.throughput_rps, s.quantile_ms) for s in steps
                 if s.quantile_ms is not None and math.isfinite(s.throughput_rps))
    if len(pts) < 3:
        return None
    from scalelab.lab.core.knee import find_knee

    return find_knee([p[0] for p in pts], [float(p[1]) for p in pts], curve="convex",
                     direction="increasing")
