"""The retrieval bench's fixed-rate latency run grown chunk by chunk until its latency
objectives are decided (retrieval.open_loop), and the diagnose stage handing it the time its
share pays beyond the stage's minimum (exact numbers)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from scalelab.lab.core.errors import BadUsageError, ScalelabError
from scalelab.lab.core.objectives import Objective, latency_objectives
from scalelab.lab.core.records import make_record, read_records
from scalelab.lab.diagnose.budget import time_lines
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.schema import Prices
from scalelab.lab.diagnose.sizing import UNPAID as SIZING_UNPAID
from scalelab.lab.diagnose.stages.base import MINIMUM_S, Context
from scalelab.lab.diagnose.stages.retrieval import RUN_SLACK_S, STAGE, decision_s, tag_record
from scalelab.lab.diagnose.steps import StepResult
from scalelab.system.retrieval.bench import RetrievalBenchConfig, open_loop, run_bench
from scalelab.system.retrieval.factory import build_index
from scalelab.system.retrieval.open_loop import (
    UNPAID,
    LatencyAllowance,
    next_chunk,
    paid_count,
    parse_slo,
    send,
    sized_open_loop,
    undecided,
)

RATE = 1000.0
"""Queries/s: an exact search of 200 vectors takes ~30 µs, so every latency is far under 1 s
and a chunk falls behind its schedule (and stops early) only if the process sleeps ~0.25 s."""


@pytest.fixture(scope="module")
def index_and_questions() -> tuple[object, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 16)).astype(np.float32)
    q = rng.standard_normal((30, 16)).astype(np.float32)
    return build_index("exact", x), q


def test_the_latency_run_sends_the_questions_again_until_it_has_enough(
        index_and_questions: tuple[object, np.ndarray]) -> None:
    index, q = index_and_questions
    assert open_loop(index, q, 10, RATE)["queries"] == 30  # type: ignore[arg-type]
    assert open_loop(index, q, 10, RATE, 75)["queries"] == 75  # type: ignore[arg-type]
    assert open_loop(index, q, 10, RATE, 10)["queries"] == 30  # type: ignore[arg-type]
    assert send(index, q, 10, RATE, 45, offset=20).size == 45  # type: ignore[arg-type]
    with pytest.raises(BadUsageError, match="--latency-queries"):
        RetrievalBenchConfig(latency_queries=-1)
    with pytest.raises(BadUsageError, match="--latency-budget sizes the runs"):
        RetrievalBenchConfig(latency_budget_s=10.0)
    with pytest.raises(BadUsageError, match="--latency-budget must be >= 0"):
        RetrievalBenchConfig(latency_budget_s=-1.0, latency_objectives=parse_slo(["p99<2ms"]))


def test_the_next_chunk_reaches_a_decidable_count_then_doubles() -> None:
    # p99 needs 299 latencies: after a 30-query pass, 269 more (not 30)
    assert next_chunk(30, 299, 10.0, 100.0, 30) == 269
    # past 299 and still undecided (the bound straddles the limit): as many as measured
    assert next_chunk(299, 299, 10.0, 100.0, 30) == 299
    # cut to what the share pays: 1.5 s at 100 queries/s
    assert next_chunk(30, 299, 1.5, 100.0, 30) == 150
    # under half the first pass: stop (0.14 s pays 14 < 15)
    assert next_chunk(30, 299, 0.14, 100.0, 30) == 0
    assert next_chunk(30, 299, 0.15, 100.0, 30) == 15
    assert next_chunk(30, 299, -1.0, 100.0, 30) == 0


def test_the_allowance_gives_later_runs_what_earlier_ones_left() -> None:
    a = LatencyAllowance(total_s=12.0, runs=4)
    assert a.next_share() == 3.0  # 12 s over 4 runs
    a.spent_s += 1.0  # the first run was decided after 1 s of chunks
    assert a.next_share() == pytest.approx(11.0 / 3)
    a.spent_s += 11.0  # the second spent everything
    assert a.next_share() == 0.0
    assert a.next_share() == 0.0


def test_slo_parsing_names_the_fix() -> None:
    assert parse_slo(["p99<20ms", " p95<5.5ms"]) == [Objective(metric="p99_ms", max=20.0),
                                                       Objective(metric="p95_ms", max=5.5)]
    for bad, fix in (("p99_ms=20", "e.g. p99<20ms"), ("p99", "e.g. p99<20ms"),
                     ("p99<fast", "not a duration"), ("p99<0ms", "must be positive"),
                     ("p90<3ms", "p50, p95 or p99"), ("avail>=99%", "e.g. p99<20ms")):
        with pytest.raises(ScalelabError, match=fix):
            parse_slo([bad])


def test_a_run_grows_until_its_p99_is_decided(
        index_and_questions: tuple[object, np.ndarray]) -> None:
    index, q = index_and_questions
    slo = [Objective(metric="p99_ms", max=1000.0)]
    # 30 latencies bound no p99 (the rule needs 299): one more chunk of 269 decides it met
    assert undecided(send(index, q, 10, RATE, 30), slo) == [  # type: ignore[arg-type]
        "p99_ms ≤ 1000: 30 queries; p99 needs ≥ 299 to bound it at 95%"]
    summary, sizing = sized_open_loop(index, q, 10, RATE, objectives=slo,  # type: ignore[arg-type]
                                      share_s=5.0)
    assert summary["queries"] == 299.0
    assert {k: sizing[k] for k in ("chunks", "samples", "stopped", "undecided")} == {
        "chunks": 2, "samples": 299, "stopped": "decided", "undecided": []}
    assert sizing["spent_s"] <= sizing["share_s"]


def test_a_run_without_time_says_what_deciding_needs(
        index_and_questions: tuple[object, np.ndarray]) -> None:
    index, q = index_and_questions
    summary, sizing = sized_open_loop(
        index, q, 10, RATE, objectives=[Objective(metric="p99_ms", max=1000.0)],  # type: ignore[arg-type]
        share_s=0.0)
    assert summary["queries"] == 30.0
    assert {k: sizing[k] for k in ("chunks", "samples", "stopped", "undecided")} == {
        "chunks": 1, "samples": 30, "stopped": UNPAID,
        "undecided": ["p99_ms ≤ 1000: 30 queries; p99 needs ≥ 299 to bound it at 95%"]}


def test_a_share_that_pays_the_p95_but_not_the_p99_stops_unpaid(
        index_and_questions: tuple[object, np.ndarray]) -> None:
    """A clock that reads 10 ms more each time it is read: after the 30-query pass 90 ms are
    left, which pay the p95's 29 more latencies at 1000/s, not the p99's 269; the chunk sends
    30 (doubling reaches 59), deciding the p95 met on 60, and with 80 ms left the p99's 239
    more are not paid: the run stops there, the rest of its share left to the runs after it
    (sending what the share pays, it would have run on to 300 and decided the p99 too)."""
    index, q = index_and_questions
    ticks = itertools.count()
    slo = [Objective(metric="p95_ms", max=1000.0), Objective(metric="p99_ms", max=1000.0)]
    summary, sizing = sized_open_loop(index, q, 10, RATE, objectives=slo,  # type: ignore[arg-type]
                                      share_s=0.1, clock=lambda: next(ticks) * 0.01)
    assert summary["queries"] == 60.0
    assert {k: sizing[k] for k in ("chunks", "samples", "stopped", "undecided")} == {
        "chunks": 2, "samples": 60, "stopped": UNPAID,
        "undecided": ["p99_ms ≤ 1000: 60 queries; p99 needs ≥ 299 to bound it at 95%"]}
    assert UNPAID == SIZING_UNPAID  # the words the Time section reads for every stage


def test_the_largest_count_the_time_left_pays() -> None:
    """30 measured at 100 queries/s: 0.29 s pay the p95's 29 more, 2.69 s the p99's 269."""
    assert paid_count([59, 299], have=30, left_s=0.289, rate=100.0) is None
    assert paid_count([59, 299], have=30, left_s=0.291, rate=100.0) == 59
    assert paid_count([59, 299], have=30, left_s=2.689, rate=100.0) == 59
    assert paid_count([59, 299], have=30, left_s=2.691, rate=100.0) == 299
    assert paid_count([59, 299], have=300, left_s=0.0, rate=100.0) == 299


def test_a_missed_p99_stops_at_the_first_pass(
        index_and_questions: tuple[object, np.ndarray]) -> None:
    """Every latency is over 1 ns: on 30 the lower bound of the p99 (the p95, rank 29 of 30 at
    95%) is over the limit already, so it is decided missed and no chunk follows."""
    index, q = index_and_questions
    _, sizing = sized_open_loop(index, q, 10, RATE,  # type: ignore[arg-type]
                                objectives=[Objective(metric="p99_ms", max=1e-6)], share_s=5.0)
    assert (sizing["chunks"], sizing["samples"], sizing["stopped"]) == (1, 30, "decided")


def test_the_bench_records_each_run_s_sizing_for_the_time_section(tmp_path: Path) -> None:
    cfg = RetrievalBenchConfig(levels=(1,), base_docs=100, questions=20, indexes=(),
                               embedder="hashing", cache=None, out=tmp_path, runs=1,
                               arrival_rate=RATE, fresh_singles=2,
                               latency_objectives=parse_slo(["p99<1000ms"]),
                               latency_budget_s=4.0)
    run_bench(cfg)
    records = read_records(tmp_path / "records.jsonl")
    assert [r.series for r in records] == ["exact", "faiss:Flat"]
    for r in records:  # 20 questions, then 279 more: 299 latencies decide the p99
        assert r.extras["samples"] == 299 and r.extras["open_loop"]["queries"] == 299
        assert r.extras["sizing"]["chunks"] == 2
        assert r.extras["sizing"]["stopped"] == "decided"
    assert [line.split(" in ")[0] for line in time_lines(None, records)] == [
        "retrieval exact at 1: 2 chunk(s), 299 samples",
        "retrieval faiss:Flat at 1: 2 chunk(s), 299 samples"]


def _ctx(tmp_path: Path, shares: dict[str, float], full: bool = False,
         repeats: int = 1) -> Context:
    def never(*_: object) -> StepResult:
        raise AssertionError("no step runs here")

    return Context(work=tmp_path, logs=tmp_path, repeats=repeats, prices=Prices(),
                   settings={}, run=never, fail=never, shares=shares, full=full)


def test_the_stage_hands_the_bench_its_share_beyond_the_minimum(tmp_path: Path) -> None:
    """Defaults: p99 ≤ 20 ms sized at the target, 10×: 3 fixed-rate runs (exact numpy, HNSW,
    IVF-PQ; faiss Flat off) each need 299 latencies, one pass of 100 questions given, 199 more
    at 100 queries/s and RUN_SLACK_S: 6.87 s, part of the stage's minimum and always handed
    to the bench; none when one pass decides."""
    s = load_config(None, "default").stages.retrieval
    need = decision_s(s)
    assert need == pytest.approx(3 * (199 / 100.0 + RUN_SLACK_S))
    assert decision_s(s.model_copy(update={"questions": 300})) == 0.0
    least = STAGE.minimum_s(s, 1)
    assert least == pytest.approx(MINIMUM_S["retrieval"] + need)
    assert [o.to_slo() for o in latency_objectives(s.built_objectives())] == ["p99<20ms"]
    assert STAGE.latency_budget(s, _ctx(tmp_path, {})) is None  # no budget: one pass
    assert STAGE.latency_budget(s, _ctx(tmp_path, {}, full=True)) == 3 * 30.0
    assert STAGE.latency_budget(s, _ctx(tmp_path, {"retrieval": least})) == need
    assert STAGE.latency_budget(s, _ctx(tmp_path, {"retrieval": least - 5})) == need
    assert STAGE.latency_budget(s, _ctx(tmp_path, {"retrieval": least + 16})) == \
        pytest.approx(need + 16.0)
    # two repeats: twice the minimum, the spare split over the two bench processes
    assert STAGE.minimum_s(s, 2) == 2 * least
    assert STAGE.latency_budget(s, _ctx(tmp_path, {"retrieval": 2 * least + 16},
                                        repeats=2)) == pytest.approx(need + 8.0)
    # Two benches: the target alone first, its runs sized; then the curve levels, one pass
    argv, curve = _argv(s, tmp_path, {"retrieval": least + 16})
    assert curve[curve.index("--levels") + 1] == "1,2,5" and "--latency-slo" not in curve
    assert argv[argv.index("--levels") + 1] == "10"
    assert argv[argv.index("--latency-slo") + 1] == "p99<20ms"
    assert float(argv[argv.index("--latency-budget") + 1]) == pytest.approx(need + 16, abs=0.01)
    assert "--no-flat" in argv and argv[argv.index("--indexes") + 1] == "faiss:HNSW32,ivfpq"
    assert "--latency-slo" not in _argv(s, tmp_path, {})[0]  # no budget: not sized


def _argv(s: object, tmp_path: Path, shares: dict[str, float]) -> tuple[list[str], list[str]]:
    """The argvs of the two bench steps the stage runs with these shares (target, curve)."""
    seen: list[list[str]] = []

    def keep(step: object) -> StepResult:
        seen.append(step.command.to_argv())  # type: ignore[attr-defined]
        return None  # type: ignore[return-value]

    ctx = _ctx(tmp_path, shares)
    ctx.run = keep  # type: ignore[assignment]
    STAGE.run(s, ctx)  # type: ignore[arg-type]
    assert len(seen) == 2
    return seen[0], seen[1]


def test_the_stage_names_undecided_objectives_as_its_config_does() -> None:
    s = load_config(None, "default").stages.retrieval
    rec = make_record(experiment="e", stage="retrieval", variable="corpus_multiple", level=2.0,
                      extras={"series": "exact", "sizing": {
                          "chunks": 1, "samples": 100, "spent_s": 1.0, "share_s": 1.0,
                          "stopped": "time share spent",
                          "undecided": ["p99_ms ≤ 20: 100 queries; p99 needs ≥ 299 to bound "
                                        "it at 95%", "other: as it was"]}})
    got = tag_record(rec, stage="retrieval", repeat=1, objectives=s.built_objectives())
    assert got.repeat == 1 and got.series == "exact"
    assert got.extras["sizing"]["undecided"] == [
        "p99 ≤ 20 ms at the arrival rate: 100 queries; p99 needs ≥ 299 to bound it at 95%",
        "other: as it was"]
    # a Need's time reads the paced run's queries over its seconds, not the bench's QPS
    assert got.extras["samples_per_s"] == 100.0
    assert got.extras["sizing"]["samples_per_s"] == 100.0
    paced = make_record(experiment="e", stage="retrieval", variable="corpus_multiple",
                        level=1.0, extras={"arrival_rate_qps": 80.0})
    assert tag_record(paced, stage="retrieval", repeat=0, objectives=s.built_objectives(),
                      curve=True).extras["samples_per_s"] == 80.0
    plain = make_record(experiment="e", stage="x", variable="v", level=1.0)
    assert tag_record(plain, stage="retrieval", repeat=0,
                      objectives=s.built_objectives()).stage == "retrieval"
