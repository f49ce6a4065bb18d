"""The llm stage's time rules (pure): its fixed work's estimated seconds, the levels a series
runs at, a decided level's part of the stage's time left, whether a bisection's level pays one
chunk, the curve points what the decision left pays, and a chunk's measured window (what
diagnose.sizing reads)."""

from __future__ import annotations

from scalelab.lab.core.decide import quantile_requests_needed
from scalelab.lab.core.objectives import quantile_of
from scalelab.lab.core.records import Record
from scalelab.lab.diagnose.sizing import NEED_MARGIN, target_level
from scalelab.lab.diagnose.stages.llm_config import LlmSettings
from scalelab.lab.diagnose.stages.serve_search import SEARCH_CONFIRM_S

STEP_START_S = 6.0
"""A first `load llm run` step's fixed part: process start and the quality probe's prompts
answered one at a time. With LEVEL_S and SERVER_START_S, the demo's llm stage (SmolLM2, both
series) is ~49 s: an estimate, not measured on a quiet machine. Measured 2026-12-03 on the
shared 2-core VM, before -> after these changes: 377 -> 245 s at load average 14-16 and
126 -> 114 s at 6.5-6.7 (before took 64 s on the quiet machine at 11:38 UTC); scaled by the
second pair (126 s ~ 64 s quiet) the steps take ~16 s (the baseline's four levels) and ~19 s
(the candidate's two, 10 streams on one slot the slow one), the two starts ~13 s together."""
LEVEL_S = 4.0
"""A first step's seconds per concurrency level: its 1 s warm-up and `requests` requests."""
FIRST_STEP_S = 12.0
"""A user endpoint's first step over the default levels."""
CAPACITY_SEARCH_S = 25.0 + SEARCH_CONFIRM_S
"""A user endpoint's `load llm capacity` search (its bounded steps) and the confirmation run of
its answer (`serve_search.SEARCH_CONFIRM_S`, shorter than the command's 30 s under diagnose's
budget: the outcome says so)."""
CHUNK_OVERHEAD_S = 2.5
"""A later chunk's fixed cost beside its window: its process start and CHUNK_WARMUP_S."""
CHUNK_WARMUP_S = 0.5
"""A later chunk's warm-up: the engine is warm by then (the first chunk paid its first-request
costs), so only the closed loop's streams need to reach their steady state."""
MIN_CHUNK_S = 1.0
"""The shortest later chunk worth its start-up (a level stops when under half is left)."""
FIRST_CHUNK_S = 3.0
"""A later chunk's shortest window at a sized llm level (the first counts `requests`, one
round of the streams at least, and shows the engine's rate there, which sizes the next chunk
to the samples still needed)."""
TARGET_CHUNK_S = CHUNK_OVERHEAD_S + 0.5 + FIRST_CHUNK_S + 2.0
"""The target's first chunk's estimated seconds: its start, a 1 s warm-up (0.5 s more than a
later chunk's), its requests (~3 s: 10 streams of SmolLM2 on 2 quiet cores) and the quality
probe's prompts answered one at a time (~2 s)."""
QUIET_TARGET_RPS = 5.35
"""Requests/s the target's first chunk delivers on a quiet 2-core machine: SmolLM2-135M at 10
streams, 32-word prompts and 16 output tokens (the demo's), 2026-12-07 18:46 UTC at load
1.0-1.1. What the target's deciding chunk (`decide_chunk_s`) is estimated at before the
stage has measured its own rate; other settings' rates differ (an estimate, cut by the pace)."""
FULL_LEVEL_CAP_S = 60.0
"""With --full (no budget), the most one llm level runs while still undecided."""
MAX_STEP_S = 20.0
"""Longest llm capacity step (load llm capacity's own default): a slow endpoint's low rates end
undecided, and the search says so, rather than one step running for minutes."""


def concurrencies(s: LlmSettings, series: str | None) -> list[int]:
    """The concurrency levels one series runs at (a candidate's: `candidate_levels`)."""
    levels = s.levels
    if series is not None and series != s.baseline and s.candidate_levels == "ends":
        levels = [min(levels), max(levels)]
    return sorted({max(1, round(s.base_concurrency * m)) for m in levels})


def curve_step_s(levels: int) -> float:
    """The curve step's estimated seconds: STEP_START_S and LEVEL_S a level (none: 0)."""
    return STEP_START_S + LEVEL_S * levels if levels else 0.0


def curve_fit(levels: list[int], left_s: float, pace: float) -> list[int]:
    """The curve points the stage's time left pays after its target is decided (pure): the
    lowest levels (1× first, what the multiples are read against) whose curve step
    (`curve_step_s`) times the pace fits in `left_s`. [1, 2, 5] with 17 s left at pace 1 ->
    [1, 2] (6 + 2 x 4 = 14 s; 18 s for all three); at pace 1.5 -> [1] (15 s for two)."""
    n = len(levels)
    while n and curve_step_s(n) * pace > left_s:
        n -= 1
    return sorted(levels)[:n]


def level_share(left_s: float, *, repeats_left: int, probes_left: int, target: bool) -> float:
    """A decided level's part of the stage's time left (pure): the target, measured first, is
    the decision and gets all of this repeat's part (its chunks take only what the samples
    its share pays need, `sizing.paid_need`); a bisection's level shares it with the levels
    still to come (`probes_left` counts it). 30 s, one repeat: the target 30 s; a bisection
    level with 2 probes left 15 s."""
    per_repeat = left_s / max(1, repeats_left)
    return per_repeat if target else per_repeat / max(1, probes_left)


def probe_pays(share_s: float, pace: float) -> bool:
    """Whether a bisection's level is worth starting in its part of the time left (pure): its
    first chunk (CHUNK_OVERHEAD_S and LEVEL_S for its `requests`) at the run's pace fits. 5 s
    at pace 1.66 does not (10.8 s): a chunk that counts requests runs on to the stage's
    deadline and measures nothing, so the bracket is left open and the time goes on."""
    return share_s >= (CHUNK_OVERHEAD_S + LEVEL_S) * pace


def target_concurrency(s: LlmSettings) -> int:
    """The baseline's concurrency its target multiple decides first (`sizing.target_level`)."""
    levels = concurrencies(s, s.baseline)
    return int(target_level([float(c) for c in levels], min(levels) * s.target_multiple))


def decide_chunk_s(s: LlmSettings) -> float:
    """The target's deciding chunk's estimated seconds: the samples its latency quantiles
    need (59 for a p95) less its first chunk's requests, at QUIET_TARGET_RPS with the sizing's
    NEED_MARGIN, and CHUNK_OVERHEAD_S; 0 when the first chunk has them (or no quantile is an
    objective). The demo's: 10 first requests, 49 more in 10.1 s + 2.5 s = 12.6 s. Counts
    that need more (a 99% availability's 299) are not in it: they decide only where the
    stage's share pays them at the rate it measures (`sizing.paid_need`)."""
    need = max((quantile_requests_needed(q) for o in s.built_objectives()
                if (q := quantile_of(o.metric)) is not None), default=0)
    more = need - max(s.requests, target_concurrency(s))
    return CHUNK_OVERHEAD_S + more / QUIET_TARGET_RPS * NEED_MARGIN if more > 0 else 0.0


def first_step_s(s: LlmSettings, series: str) -> float:
    """A series' fixed work's estimated seconds: the baseline's target decided (its first
    chunk, TARGET_CHUNK_S, and the chunk its latency quantiles need, `decide_chunk_s`) and its
    curve step over the other levels; a candidate's one step over its levels (STEP_START_S +
    LEVEL_S a level)."""
    n = len(concurrencies(s, series))
    if series == s.baseline and not s.url:
        return TARGET_CHUNK_S + decide_chunk_s(s) + curve_step_s(n - 1)
    return STEP_START_S + LEVEL_S * n


def chunk_window(r: Record, asked_s: float) -> float:
    """A chunk's measured seconds: its record's window (a first chunk counts requests)."""
    return r.wall_s if r.wall_s else asked_s
