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

Its settings are in `llm_config`, its time rules (the fixed work's estimates, a level's part of
the time left, the curve points it pays) in `llm_sizing`, its advice in `llm_advice`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from dataclasses import replace
from pathlib import Path

from scalelab.lab.core.limits import Evidence
from scalelab.lab.core.objectives import latency_objectives
from scalelab.lab.core.records import Record, append_records, read_records
from scalelab.lab.core.sheet import SheetRow, build_sheet
from scalelab.lab.core.verdict import StageGoal, capacity
from scalelab.lab.diagnose.sizing import (
    LevelClock,
    Outcome,
    curve_point,
    decide_target,
    level_outcome,
    size_level,
)
from scalelab.lab.diagnose.stages.base import Context, Stage
from scalelab.lab.diagnose.stages.endpoint import metrics_note, metrics_url, noted, sized_by
from scalelab.lab.diagnose.stages.llm_advice import advise, engine_evidence
from scalelab.lab.diagnose.stages.llm_commands import LoadLlmCapacity, LoadLlmRun
from scalelab.lab.diagnose.stages.llm_config import LlmSettings, resolve_model
from scalelab.lab.diagnose.stages.llm_servers import (
    SERVER_START_S,
    TOGETHER,
    server_starts,
    start_servers,
)
from scalelab.lab.diagnose.stages.llm_sizing import (
    CAPACITY_SEARCH_S,
    CHUNK_OVERHEAD_S,
    CHUNK_WARMUP_S,
    FIRST_CHUNK_S,
    FIRST_STEP_S,
    FULL_LEVEL_CAP_S,
    LEVEL_S,
    MAX_STEP_S,
    MIN_CHUNK_S,
    TARGET_CHUNK_S,
    chunk_window,
    concurrencies,
    curve_fit,
    curve_step_s,
    first_step_s,
    level_share,
    probe_pays,
)
from scalelab.lab.diagnose.stages.llm_weights import (
    QUALITY_S,
    WeightsQuality,
    measure,
    served_weights,
)
from scalelab.lab.diagnose.stages.serve_curve import CAPACITY, SEARCH_CONFIDENCE, step_seconds
from scalelab.lab.diagnose.stages.serve_search import SEARCH_CONFIRM_S, search_budget
from scalelab.lab.diagnose.steps import Step, StepResult, Tagger, based, restage
from scalelab.lab.load.capacity import step_requests
from scalelab.lab.load.llm import result as llm_result
from scalelab.lab.load.llm.workload import LengthDist
from scalelab.layers.web.spawn import Spawned, stop_group


def _user_endpoint(r: Record, *, note: str | None) -> Record:
    return noted(restage(r, stage="llm"), note=note)


def engine_available() -> bool:
    """Whether this build has the reference engine's server (`scalelab generate serve`)."""
    return importlib.util.find_spec("scalelab.system.generate.app") is not None


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
                             merge=llm_result.merge_records, window=chunk_window,
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
                             merge=llm_result.merge_records, window=chunk_window,
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
