"""The serve stage's capacity searches: how long a step must be, and what the searches measured,
said plainly (pure: objectives or sheet rows in, numbers and text out).

- `search_requests` / `step_seconds` size a step by the rule it is judged by, so a step can
  decide at all: the latency quantile's count and, when availability is judged too, the
  failure budget's (3,688 requests for 99.9% at 95%).
- `grid_bounds` reads a server's level sweep for its capacity search: the highest level decided
  to meet the search's latency objective is where it starts, the lowest above it decided to
  miss is a rate it need not measure again (it bisects below it).
- `search_outcome` reads one search from its steps' verdicts: the highest *decided* pass, the
  lowest decided fail above it, and every undecided step with the requests it measured beside
  the requests the step rule needs (`load.capacity.step_requests`: LoadGen's early-stopping
  count, 230 for p95 and 1,164 for p99 at 95%). An undecided step is never read as a miss.
- `replica_advice` turns the searches of the replica sweep (series "replicas=N capacity", one
  torch thread per process, and "threads=T capacity", one process with T threads) into the
  measured replica curve, what its points can and cannot tell (two give one efficiency and an
  exact Karp–Flatt fraction; three or more a linear / Amdahl / USL fit chosen by AIC), the
  replicas a peak needs, and horizontal against vertical on the same cores.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.fits import fit_scaling
from scalelab.lab.core.objectives import Objective, check_rows, latency_objectives
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.load.capacity import CONFIRM_S, CONFIRM_VARIABLE, step_requests

CAPACITY = " capacity"
"""Suffix of the series that holds a capacity search's steps (e.g. 'batching=off capacity')."""
REPLICAS = "replicas="
THREADS = "threads="
MAX_PREDICTED_REPLICAS = 1024
"""Largest replica count a prediction searches before saying no count reaches the peak."""


SEARCH_CONFIDENCE = 0.95
"""`load capacity`'s default confidence, which the stage's searches keep."""


def budget_requests(budget: float, confidence: float = SEARCH_CONFIDENCE) -> int:
    """Fewest requests, all successful, whose Clopper-Pearson interval on the failure share
    lies under `budget` (how `load capacity` decides an availability target passed):
    n >= ln((1 - confidence) / 2) / ln(1 - budget). 3,688 for 99.9% at 95%."""
    if not (0.0 < budget < 1.0 and 0.0 < confidence < 1.0):
        raise BadUsageError(
            f"stages.serve: an availability budget of {budget:.6g} (confidence {confidence:g}) "
            "cannot be shown by a finite capacity step; both must lie in (0, 1): lower the "
            "availability objective's min under 1 or set capacity_availability: false")
    return math.ceil(math.log((1.0 - confidence) / 2.0) / math.log1p(-budget))


def search_requests(objectives: list[Objective], *, availability: bool) -> int:
    """Requests one capacity step needs before it can decide: the latency quantile's rule
    (`load.capacity.step_requests`) and, when the search also judges availability, the
    budget's."""
    lat = latency_objectives(objectives)[0]
    assert lat.quantile is not None
    need = step_requests(lat.quantile, SEARCH_CONFIDENCE)
    avail = next((o.min for o in objectives if o.metric == "availability" and o.min is not None),
                 None)
    if availability and avail is not None:
        need = max(need, budget_requests(round(1.0 - avail, 12)))
    return need


def step_seconds(needed: int, start_rps: float, floor_s: float) -> float:
    """Longest capacity step: long enough for the first (lowest) rate to reach `needed`
    requests with a quarter to spare for Poisson arrivals, never under `floor_s`."""
    return max(floor_s, math.ceil(needed * 1.25 / start_rps * 10) / 10)


@dataclass(frozen=True, kw_only=True)
class Undecided:
    """A search step that stopped before the rule could decide it."""

    rate: float
    requests: int | None
    """Requests it measured."""
    needed: int | None
    """Requests the step rule needs before it may decide (None in records that predate it)."""


@dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    """One capacity search, from decided steps only."""

    setting: str
    capacity_rps: float | None
    """The confirmed capacity: the highest rate whose confirmation run passed (None when no
    confirmation passed: advice never divides by an unconfirmed rate)."""
    searched_rps: float | None = None
    """Highest rate the search's steps decided to pass (confirmed or not)."""
    confirm_s: float | None = None
    """Length of the confirmation run that passed (measured seconds)."""
    confirmations: int = 0
    """Confirmation runs made."""
    confirming: bool = True
    """The search confirms its answer (False: records of a search run without confirmations,
    e.g. `load llm capacity` before it confirmed, whose pass is counted)."""
    fails_at: float | None
    """Lowest rate decided to fail above it (or the lowest decided fail without a pass)."""
    steps: int
    rule: str
    """The quantile the steps were judged on, e.g. 'p95'."""
    undecided: list[Undecided] = field(default_factory=list)

    def text(self) -> str:
        if self.capacity_rps is not None:
            head = (f"{self.setting}: capacity at the objective {self.capacity_rps:.4g} "
                    "requests/s measured" + self._confirmed_text()
                    + (f" (fails at {self.fails_at:.4g})" if self.fails_at is not None else ""))
        elif self.searched_rps is not None:
            head = (f"{self.setting}: the search passed {self.searched_rps:.4g} requests/s but "
                    + (f"none of {self.confirmations} confirmation run(s) held"
                       if self.confirmations else "no confirmation run was made")
                    + ": no confirmed capacity")
        elif self.fails_at is not None:
            head = (f"{self.setting}: every decided step missed the objective (the lowest at "
                    f"{self.fails_at:.4g} requests/s)")
        else:
            head = f"{self.setting}: the search was undecided (no step measured enough to decide)"
        return head + f", {self.steps} search steps" + self._undecided_text()

    def _confirmed_text(self) -> str:
        if not self.confirming:
            return ""
        return (f", confirmed by {self.confirm_s or 0:.3g} s at that rate"
                + (f" (shorter than load capacity's {CONFIRM_S:g} s, under diagnose's time "
                   "budget)" if (self.confirm_s or 0) < CONFIRM_S * 0.9 else ""))

    def _undecided_text(self) -> str:
        if not self.undecided:
            return ""
        shown = [self._one(u) for u in self.undecided[:3]]
        more = len(self.undecided) - len(shown)
        return (f"; {len(self.undecided)} undecided: " + ", ".join(shown)
                + (f" and {more} more" if more > 0 else ""))

    def _one(self, u: Undecided) -> str:
        n = "?" if u.requests is None else f"{u.requests:,}"
        if u.needed is None:
            why = f"{n} requests"
        elif u.requests is not None and u.requests >= u.needed:
            why = f"{n} requests: the interval still straddles the objective"
        else:
            why = f"{n} requests, the {self.rule} rule needs {u.needed:,}"
        return f"{u.rate:.4g} requests/s ({why})"


def sweep_start(passed_rps: list[float], base_rps: float) -> float:
    """First rate of a replica-sweep search: half the highest rate a server of the stage was
    decided to hold (a one-server search of either setting, an earlier shape's, a level sweep's;
    more replicas hold at least about that), never under the stage's base rate; the base rate
    without such a pass."""
    return max(base_rps, max(passed_rps, default=0.0) / 2.0)


@dataclass(frozen=True, kw_only=True)
class GridBounds:
    """Where one server's capacity search starts, from its own level sweep."""

    start: float
    """First rate: the highest level decided to meet the search's latency objective (the
    search measures it again under Poisson arrivals, harsher than the levels' constant ones),
    never under the base rate."""
    fails_at: float | None
    """The lowest level above `start` decided to miss it: Poisson arrivals at that rate miss
    too, so the search bisects below it instead of measuring it again (None: none missed)."""


def grid_bounds(rows: list[SheetRow], objectives: list[Objective], base_rps: float) -> GridBounds:
    """The search's start and known fail from the levels `rows` of the same server (pure):
    only decided checks of the latency objective the search judges (`slo_text`'s) count;
    an undecided or unmeasured level bounds nothing."""
    lat = latency_objectives(objectives)
    if not lat:
        return GridBounds(start=base_rps, fails_at=None)
    checks = check_rows(rows, lat[:1])
    met = [c.level for c in checks if c.outcome == "met"]
    start = max([base_rps, *met])
    missed = [c.level for c in checks if c.outcome == "missed" and c.level > start]
    return GridBounds(start=start, fails_at=min(missed, default=None))


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _verdict(r: SheetRow) -> object:
    # A retried rate (its first step was invalid) has several records; `rate_verdict` is the
    # one the search counted, which the sheet's first-record pick of `verdict` may not be.
    return r.extras.get("rate_verdict", r.extras.get("verdict", ""))


def search_outcome(setting: str, rows: list[SheetRow]) -> SearchOutcome:
    """The answer of one search whose steps are `rows` (a '<setting> capacity' series)."""
    confirms = [(r, str(_verdict(r))) for r in rows if r.variable == CONFIRM_VARIABLE]
    held = [r for r, v in confirms if v in ("pass", "undecided-pass")
            and r.extras.get("valid_offer", True) is not False]
    best = max(held, key=lambda r: r.level, default=None)
    rows = [r for r in rows if r.variable != CONFIRM_VARIABLE]
    verdicts = [(r, str(_verdict(r))) for r in rows]
    passed = [r.level for r, v in verdicts if v == "pass"]
    failed = [r.level for r, v in verdicts if v == "fail"] + [
        r.level for r, v in confirms if r not in held]
    searched = max(passed) if passed else None
    # A search that confirms (`load capacity`: its steps say `capacity_confirm`) counts only a
    # confirmed rate; one that does not (older `load llm capacity` records) keeps its decided
    # pass.
    confirming = any("capacity_confirm" in r.extras for r in rows) or bool(confirms)
    cap = (best.level if best is not None else None) if confirming else searched
    fails = min((f for f in failed if cap is None or f > cap), default=None)
    slo = next((str(r.extras["slo"]) for r in rows if r.extras.get("slo")), "")
    rule = slo.split("<")[0] if "<" in slo else "step"
    undecided = [
        Undecided(rate=r.level, requests=_int(r.input_volume),
                  needed=_int(r.extras.get("requests_needed")))
        for r, v in sorted(verdicts, key=lambda t: t[0].level) if v.startswith("undecided")
    ]
    return SearchOutcome(setting=setting, capacity_rps=cap, fails_at=fails, steps=len(rows),
                         rule=rule, undecided=undecided, searched_rps=searched,
                         confirming=confirming,
                         confirm_s=best.wall_s if best is not None else None,
                         confirmations=len(confirms))


def searches(by_series: dict[str, list[SheetRow]]) -> list[SearchOutcome]:
    """Every capacity search in a stage's series, by name."""
    return [search_outcome(name[: -len(CAPACITY)], rows)
            for name, rows in sorted(by_series.items()) if name.endswith(CAPACITY)]


def sweep_points(by_series: dict[str, list[SheetRow]], prefix: str) -> dict[int, float | None]:
    """Count -> decided capacity of the searches named '<prefix><count> capacity'."""
    out: dict[int, float | None] = {}
    for o in searches(by_series):
        if o.setting.startswith(prefix) and o.setting[len(prefix):].isdigit():
            out[int(o.setting[len(prefix):])] = o.capacity_rps
    return dict(sorted(out.items()))


@dataclass(frozen=True, kw_only=True)
class ReplicaAdvice:
    replicas: int | None
    """Replicas the peak needs (None: no measured or predicted count reaches it)."""
    measured: bool
    """Whether that count's capacity was measured (False: read off a fit, extrapolated)."""
    lines: list[str]


def _curve(points: dict[int, float]) -> tuple[str, Callable[[float], float], float | None]:
    """(what the points tell, X(N) to predict with, the curve's ceiling or None)."""
    ns = sorted(points)
    n1, x1 = ns[0], points[ns[0]]
    if len(ns) == 2:
        n2, x2 = ns[1], points[ns[1]]
        p, s = n2 / n1, x2 / x1
        e = (1 / s - 1 / p) / (1 - 1 / p)
        tell = (f"two replica counts give one efficiency ({s / p:.2f} at {n2}) and one "
                f"Karp–Flatt serial fraction ({e:.3f}, exact through both points): they cannot "
                "tell contention from coherency (the USL needs 3 or more counts) nor show where "
                "adding replicas stops paying; the count below is read off Amdahl through the "
                "two points")
        if e <= 0:
            per = min(x1 / n1, x2 / n2)
            return tell, lambda n: per * n, None
        return tell, lambda n: x1 * (n / n1) / (1 + e * (n / n1 - 1)), x1 / e
    fit = fit_scaling([float(n) for n in ns], [points[n] for n in ns])
    m = fit.model(fit.chosen)
    assert m is not None  # the chosen model is one of the fitted ones
    g, a, b = m.params.get("gamma", 0.0), m.params.get("alpha", 0.0), m.params.get("beta", 0.0)

    def x_of(n: float) -> float:
        return g * n / (1 + a * (n - 1) + b * n * (n - 1))

    if fit.chosen == "usl" and fit.usl is not None and math.isfinite(fit.usl.n_peak) \
            and b > 0:
        tell = (f"the usl fit over {len(ns)} replica counts (chosen by AIC over linear and "
                f"Amdahl) peaks at ≈{fit.usl.n_peak:.3g} replicas with "
                f"{fit.usl.x_peak:.4g} requests/s")
        return tell, x_of, fit.usl.x_peak
    if fit.chosen in ("usl", "amdahl") and a > 0:
        tell = (f"the {fit.chosen} fit over {len(ns)} replica counts (chosen by AIC) has a "
                f"ceiling of {g / a:.4g} requests/s (serial fraction {a:.3f})")
        return tell, x_of, g / a
    tell = (f"the linear fit over {len(ns)} replica counts (chosen by AIC) shows no ceiling "
            f"({g:.4g} requests/s per replica)")
    return tell, x_of, None


def replica_advice(replicas: dict[int, float | None], threads: dict[int, float | None],
                   target_rps: float, *, config: str) -> ReplicaAdvice | None:
    """The measured replica curve and the replicas `target_rps` needs; None without a sweep.

    `replicas`: replica count -> capacity at the objective (None: undecided or no pass);
    `threads`: torch threads of one process -> its capacity; `config` names what was replicated.
    """
    if not replicas:
        return None
    listed = ", ".join(f"{n} → " + ("undecided" if x is None else f"{x:.4g}")
                       for n, x in replicas.items())
    lines = [f"replicas of {config} measured at the objective (1 torch thread each): "
             f"{listed} requests/s"]
    pts = {n: x for n, x in replicas.items() if x is not None and x > 0}
    for t, xt in threads.items():
        xr = replicas.get(t)
        if xt is not None and xr is not None and xt > 0:
            lines.append(f"on {t} cores, {t} replicas × 1 thread hold {xr:.4g} requests/s and 1 "
                         f"replica × {t} threads {xt:.4g} (horizontal is {xr / xt:.2f}× "
                         "vertical, measured)")
        elif t in replicas:
            lines.append(f"on {t} cores, horizontal vs vertical is undecided ({t} replicas: "
                         f"{'undecided' if xr is None else f'{xr:.4g}'}, {t} threads: "
                         f"{'undecided' if xt is None else f'{xt:.4g}'})")
    held = [n for n, x in pts.items() if x >= target_rps]
    if held:
        n = min(held)
        lines.append(f"{n} replica(s) hold the peak of {target_rps:g} requests/s "
                     f"({pts[n]:.4g} measured at {n})")
        return ReplicaAdvice(replicas=n, measured=True, lines=lines)
    if len(pts) < 2:
        lines.append(f"one decided replica count cannot predict the count the peak of "
                     f"{target_rps:g} requests/s needs: measure 2 or more")
        return ReplicaAdvice(replicas=None, measured=False, lines=lines)
    lo, hi = min(pts), max(pts)
    if pts[hi] < pts[lo]:
        lines.append(f"capacity falls from {lo} to {hi} replicas ({pts[lo]:.4g} → "
                     f"{pts[hi]:.4g} requests/s, measured): replicas on the same cores contend "
                     "for them (the load generator runs there too), so no count is read off "
                     "this curve; replicas on cores of their own (separate pods) are unmeasured")
        return ReplicaAdvice(replicas=None, measured=False, lines=lines)
    tell, x_of, ceiling = _curve(pts)
    lines.append(tell)
    top = max(pts)
    need = next((n for n in range(top + 1, MAX_PREDICTED_REPLICAS + 1)
                 if x_of(n) >= target_rps), None)
    if need is None:
        lines.append(f"no replica count reaches the peak of {target_rps:g} requests/s on this "
                     "curve" + (f" (its ceiling is {ceiling:.4g})" if ceiling else "")
                     + ": cut per-request compute or the serial section first")
        return ReplicaAdvice(replicas=None, measured=False, lines=lines)
    lines.append(f"{need} replica(s) hold the peak of {target_rps:g} requests/s "
                 f"({x_of(need):.4g} predicted, extrapolated {need / top:.3g}× beyond the "
                 f"{top} measured)")
    return ReplicaAdvice(replicas=need, measured=False, lines=lines)
