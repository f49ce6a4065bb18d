"""The retrieval stage: the index as the corpus grows 1x, 2x, 5x, 10x, exact vs approximate.

One `scalelab retrieval bench` step per repeat measures, per level and index: build time,
memory against the raw vectors, QPS one query at a time over each index's parameter grid with
recall@10 against exact search, latency at a fixed arrival rate, the fresh month added without
a rebuild, a single new document's seconds to answerable, and a reload from disk. Each index is
a series; exact brute force is the baseline (today's system: no index to tune). The advisor
reads the curves: which index and parameter to serve, when exact search runs out of QPS, when
to compress the embeddings (PQ), when to shard, and whether caching query embeddings pays.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from scalelab.lab.core.decide import quantile_requests_needed
from scalelab.lab.core.objectives import Objective, latency_objectives, metric_value
from scalelab.lab.core.records import Record
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import SAMPLES_RATE_KEY, Advice, AdviceInput, StageGoal, num_text
from scalelab.lab.diagnose.budget import SIZING_KEY
from scalelab.lab.diagnose.commands import Command
from scalelab.lab.diagnose.schema import Levels, StageSettings
from scalelab.lab.diagnose.sizing import curve_point, target_level
from scalelab.lab.diagnose.stages.base import MINIMUM_S, Context, Stage
from scalelab.lab.diagnose.steps import Step, based, restage

BASELINE = "exact"
RELATIVE = frozenset({"quality:recall_at_10", "extras:memory_vs_raw"})
"""Metrics measured against exact search or the raw vectors: 1.0 on the baseline by
construction, so the verdict judges them on the indexes only."""


@dataclass(frozen=True, kw_only=True)
class RetrievalBench(Command):
    """`scalelab retrieval bench` (kept beside its only user, the retrieval stage)."""

    path = ("retrieval", "bench")
    out: Path
    levels: list[float]
    base_docs: int
    questions: int
    indexes: list[str]
    embedder: str
    cache: Path | None = None
    recall_target: float | None = None
    arrival_rate: float | None = None
    fresh_singles: int | None = None
    latency_queries: int | None = None
    latency_slo: list[str] | None = None
    latency_budget: float | None = None
    no_flat: bool = False
    price_per_core_hour: float | None = None
    records: Path | None = None


class RetrievalSettings(StageSettings):
    """`stages.retrieval`: the corpus multiples and the indexes measured at each."""

    levels: Levels = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """Corpus multiples (the questions stay the same; the haystack grows)."""
    base_docs: int = Field(default=500, ge=20)
    """Documents at 1x (embedding runs at a few hundred documents/s on two cores)."""
    questions: int = Field(default=100, ge=1)
    """Queries per measurement, one at a time."""
    indexes: list[str] = Field(default_factory=lambda: ["faiss:HNSW32", "ivfpq"])
    """Approximate indexes beside exact numpy ('ivfpq' is sized to the corpus)."""
    flat: bool = False
    """Also faiss Flat: exact search through BLAS. Off by default: its recall against exact
    numpy is 1.0 by construction (an objective it cannot fail) and it took 4 of the 16 runs."""
    embedder: Literal["minilm", "minilm-int8", "hashing"] = "minilm"
    """minilm: the bundled all-MiniLM-L6-v2; hashing: a lexical baseline without a model."""
    recall_target: float = Field(default=0.95, gt=0, le=1)
    """Recall@10 an operating point must reach."""
    arrival_rate: float = Field(default=100.0, gt=0)
    """Queries/s of the fixed-rate latency run."""
    fresh_singles: int = Field(default=10, ge=1)
    """Single new documents timed from text to answerable."""
    shard_bytes: int = Field(default=8 * 2**30, gt=0)
    """Index memory one machine may hold; above it the advice is to shard."""


def _best(inp: AdviceInput) -> tuple[str, list[SheetRow]] | None:
    """The non-baseline series that meets every objective at its top level with the most QPS."""
    goal = inp.goal
    best: tuple[float, str, list[SheetRow]] | None = None
    for s, rows in inp.by_series.items():
        if s == goal.baseline_series or not rows:
            continue
        top = max(rows, key=lambda r: r.level)
        meets = all(o.passes(metric_value(top, o.metric, rows)) is not False
                    for o in goal.objectives)
        if meets and top.rate is not None and (best is None or top.rate > best[0]):
            best = (top.rate, s, rows)
    return (best[1], best[2]) if best else None


def exact_saturation(rows: list[SheetRow]) -> float | None:
    """The corpus multiple at which exact search's one-thread QPS falls to the arrival rate,
    assuming QPS ~ 1/documents (brute force reads every vector); None when not measurable."""
    pts = [(r.multiple, float(r.rate), float(a)) for r in rows
           if r.rate and isinstance(a := r.extras.get("arrival_rate_qps"), int | float) and a > 0]
    if not pts:
        return None
    m, qps, rate = max(pts, key=lambda p: p[0])
    return m * qps / rate


def advise(inp: AdviceInput, *, shard_bytes: int = 8 * 2**30) -> Advice:
    """Index type and parameters, shard, compress embeddings, cache queries (pure)."""
    goal = inp.goal
    parts: list[str] = []
    predicted: list[str] = []
    base = inp.by_series.get(goal.baseline_series, [])
    sat = exact_saturation(base)
    best = _best(inp)
    if best is not None:
        s, rows = best
        top = max(rows, key=lambda r: r.level)
        param = top.extras.get("param")
        value = top.extras.get("value")
        knob = f" at {param}={value:g}" if param and isinstance(value, int | float) else ""
        parts.append(f"index: serve {s}{knob}")
        speed = top.extras.get("speedup_vs_exact")
        predicted.append(
            f"{s}: {num_text(top.rate)} queries/s one at a time at {top.multiple:g}x "
            f"({num_text(speed)}x exact) with recall@10 {num_text(top.quality.get('recall_at_10'))}"
            f", memory {num_text(top.extras.get('memory_vs_raw'))}x the raw vectors")
    elif base:
        parts.append("no approximate index met every objective: widen the search (raise ef or "
                     "nprobe) or add a refine stage (',RFlat')")
    if sat is not None:
        predicted.append(f"exact search falls to the arrival rate near {sat:.3g}x this corpus "
                         "(QPS ~ 1/documents)")
    rows_all = [r for rs in inp.by_series.values() for r in rs]
    if rows_all:
        chosen = best[1] if best is not None else base
        top = max(chosen or rows_all, key=lambda r: r.level)
        shards = shard_count(chosen, goal.target_multiple, shard_bytes)
        if shards is not None and shards[0] > 1:
            parts.append(f"shard the index {shards[0]} ways")
        if shards is not None:
            predicted.append(shards[1])
        pq = [(s, max(rs, key=lambda r: r.level)) for s, rs in inp.by_series.items()
              if "PQ" in s.upper()]
        smaller: list[tuple[float, str]] = []
        for s, r in pq:
            mv, rc = r.extras.get("memory_vs_raw"), r.quality.get("recall_at_10")
            if isinstance(mv, int | float) and mv < 1:
                smaller.append((float(rc) if isinstance(rc, int | float) else -1.0, s))
                predicted.append(f"{s}: {mv:.2f}x the raw vectors at recall@10 "
                                 f"{num_text(rc)} (measured)")
        if smaller:  # one action: the compressed index that kept the most recall
            parts.append(f"compress embeddings when memory binds: {max(smaller)[1]}")
        q_ms = top.extras.get("query_embed_ms")
        s_ms = top.extras.get("search_ms")
        if isinstance(q_ms, int | float) and isinstance(s_ms, int | float) and q_ms > s_ms:
            parts.append("cache query embeddings (repeated questions skip the model)")
            predicted.append(f"embedding a query costs {q_ms:.3g} ms against {s_ms:.3g} ms of "
                             "search: the model, not the index, bounds QPS")
    return Advice(intervention="; ".join(parts), predicted="; ".join(predicted))


def shard_count(rows: list[SheetRow], target_multiple: float, shard_bytes: int
                ) -> tuple[int, str] | None:
    """(shards, why) for the index at the target multiple, from its measured bytes per
    document at the largest level (index memory grows linearly in documents)."""
    if not rows:
        return None
    top = max(rows, key=lambda r: r.level)
    docs = top.input_volume or 0.0
    index = top.extras.get("index_bytes")
    if not docs or not isinstance(index, int | float) or not index:
        return None
    per_doc = index / docs
    need = per_doc * docs * target_multiple / max(top.multiple, 1e-9)
    shards = max(1, math.ceil(need / shard_bytes))
    return shards, (f"{per_doc:.0f} bytes/document: {need / 2**20:.3g} MiB at "
                    f"{target_multiple:g}x, {shards} shard(s) of {shard_bytes / 2**30:g} GiB")


FULL_RUN_CAP_S = 30.0
"""--full: the most a fixed-rate run may add beyond its first pass while still undecided."""


def tag_record(r: Record, *, stage: str, repeat: int, objectives: list[Objective],
               curve: bool = False) -> Record:
    """A bench record under the diagnosis's stage and repeat (a curve point when `curve`),
    each latency objective in its sizing's undecided lines named as the config names it (the
    bench knows only the limit: 'p99_ms ≤ 20' becomes 'p99 ≤ 20 ms at the arrival rate'), and
    the paced run's query rate where a Need reads it (`SAMPLES_RATE_KEY`): its latencies over
    its seconds when it was sized, else the arrival rate it was paced at; not the record's
    rate (one-at-a-time QPS) nor its wall_s (the index build)."""
    r = restage(r, stage=stage, repeat=repeat)
    if curve:
        r = curve_point(r)
    z = r.extras.get(SIZING_KEY)
    pace = r.extras.get("arrival_rate_qps")
    per_s = float(pace) if isinstance(pace, int | float) and pace > 0 else None
    if isinstance(z, dict) and isinstance(z.get("samples"), int) and \
            isinstance(z.get("spent_s"), int | float) and z["spent_s"] > 0:
        per_s = z["samples"] / z["spent_s"]
        z = {**z, "samples_per_s": round(per_s, 3)}
    extras = {**r.extras, **({SAMPLES_RATE_KEY: round(per_s, 3)} if per_s else {})}
    names = {Objective(metric=o.metric, max=o.max).label + ":": o.label + ":"
             for o in latency_objectives(objectives)}
    if isinstance(z, dict) and names:
        lines = [next((names[k] + u[len(k):] for k in names if u.startswith(k)), u)
                 for u in z.get("undecided", [])]
        z = {**z, "undecided": lines}
    if isinstance(z, dict):
        extras[SIZING_KEY] = z
    return r.model_copy(update={"extras": extras})


RUN_SLACK_S = 0.3
"""A fixed-rate run's seconds beyond its schedule (the chunk's start, the last query's search,
the decision between chunks): without it a run paid exactly its schedule stopped at 297 of
its 299 latencies (the demo of 2026-12-07 17:35 UTC, load 12-15)."""


def decision_s(s: RetrievalSettings) -> float:
    """Seconds the target level's fixed-rate runs need beyond their first passes to reach
    the samples their latency objectives need (pure): a p99 needs 299 latencies, the
    questions give one pass, the rest is sent at the arrival rate, one run per index."""
    lat = latency_objectives(s.built_objectives())
    need = max((quantile_requests_needed(o.quantile) for o in lat if o.quantile), default=0)
    if need <= s.questions:
        return 0.0
    runs = 1 + s.flat + len(s.indexes)
    return runs * ((need - s.questions) / s.arrival_rate + RUN_SLACK_S)


class RetrievalStage(Stage[RetrievalSettings]):
    name = "retrieval"
    settings = RetrievalSettings
    sized = True

    def count(self, s: RetrievalSettings, repeats: int) -> int:
        return repeats * (1 + (len(s.levels) > 1))

    def minimum_s(self, s: RetrievalSettings, repeats: int) -> float:
        """Its fixed work per repeat (one step each) and the samples its target's latency
        objectives need (`decision_s`), times the repeats."""
        return (MINIMUM_S[self.name] + decision_s(s)) * repeats

    def latency_budget(self, s: RetrievalSettings, ctx: Context) -> float | None:
        """Seconds one bench process's fixed-rate runs at the target may add beyond their
        first passes (retrieval.open_loop: each grows until its latency objectives are
        decided): what deciding them needs (`decision_s`) and the stage's share beyond its
        minimum over the repeats; --full without a budget, FULL_RUN_CAP_S a run; None: not
        sized (no budget, or no latency objective)."""
        if not latency_objectives(s.built_objectives()):
            return None
        share = ctx.shares.get(self.name)
        if share is None:
            return (FULL_RUN_CAP_S * (1 + s.flat + len(s.indexes)) if ctx.full else None)
        spare = max(0.0, share - self.minimum_s(s, ctx.repeats)) / ctx.repeats
        return decision_s(s) + spare

    def run(self, s: RetrievalSettings, ctx: Context) -> None:
        """Per repeat, the target level decided first in a bench of its own, its fixed-rate
        runs sized to their latency objectives' samples (`latency_budget`); then the other
        levels, one pass each, in one bench: curve points (`Record.purpose`), cut to the
        lowest level when the stage's share was under its minimum."""
        work = ctx.work / "retrieval"
        target = target_level(s.levels, s.target_multiple)
        others = [x for x in s.levels if x != target]
        if self.name in ctx.short and others:
            ctx.note(f"retrieval: its {ctx.shares.get(self.name, 0.0):.0f} s share was under "
                     "its minimum at this run's pace: cut to the target and the lowest level "
                     "(what its multiple is read against); a larger --budget runs the rest")
            others = [min(s.levels)] if min(s.levels) != target else []
        if ctx.unpaid_start(self.name, "building its corpora and indexes",
                            MINIMUM_S[self.name]):
            return
        for rep in range(ctx.repeats):
            budget = self.latency_budget(s, ctx)
            self._bench(s, ctx, work, rep, [target], curve=False,
                        slo=[o.to_slo() for o in latency_objectives(s.built_objectives())]
                        if budget is not None else None,
                        budget=budget)
            if others:
                self._bench(s, ctx, work, rep, others, curve=True, slo=None, budget=None)

    def _bench(self, s: RetrievalSettings, ctx: Context, work: Path, rep: int,
               levels: list[float], *, curve: bool, slo: list[str] | None,
               budget: float | None) -> None:
        name = "curve" if curve else "target"
        rec = ctx.records(f"retrieval-{rep}-{name}")
        cmd = RetrievalBench(out=work, levels=levels, base_docs=s.base_docs,
                             questions=s.questions, indexes=s.indexes, embedder=s.embedder,
                             cache=work / "embeddings.sqlite", recall_target=s.recall_target,
                             arrival_rate=s.arrival_rate, fresh_singles=s.fresh_singles,
                             latency_slo=slo, latency_budget=budget, no_flat=not s.flat,
                             price_per_core_hour=ctx.prices.core_hour_usd, records=rec)
        where = ", ".join(f"{x:g}×" for x in levels)
        ctx.run(Step(stage=self.name, label=f"retrieval bench {where} #{rep + 1}", command=cmd,
                     records=rec, tag=based(functools.partial(
                         tag_record, stage=self.name, repeat=rep,
                         objectives=s.built_objectives(), curve=curve), min(s.levels)),
                     timeout_s=1800))

    def goals(self, s: RetrievalSettings) -> list[StageGoal]:
        return [StageGoal(stage=self.name, objectives=s.built_objectives(),
                          baseline_series=BASELINE, target_multiple=s.target_multiple,
                          advisor=functools.partial(advise, shard_bytes=s.shard_bytes),
                          candidate_metrics=RELATIVE)]


STAGE = RetrievalStage()
