"""The diagnose retrieval stage's advisor: pure functions over sheet rows, exact numbers."""

from __future__ import annotations

from typing import Any

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.sheet import SheetRow
from scalelab.lab.core.verdict import AdviceInput, StageGoal
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.stages.retrieval import (
    STAGE,
    RetrievalBench,
    advise,
    exact_saturation,
    shard_count,
)

OBJ = [Objective(metric="quality:recall_at_10", min=0.95),
       Objective(metric="extras:memory_vs_raw", max=1.5)]


def row(series: str, level: float, *, rate: float, recall: float, mem: int, docs: float,
        **extras: Any) -> SheetRow:
    return SheetRow(stage="retrieval", series=series, variable="corpus_multiple", level=level,
                    multiple=level, repeats=1, failures=0, input_volume=docs,
                    input_unit="documents", rate=rate, rate_min=rate, rate_max=rate,
                    rate_unit="queries/s", wall_s=1.0, p50_ms=1.0, p95_ms=2.0, p99_ms=3.0,
                    peak_memory_bytes=mem, failure_rate=0.0,
                    quality={"recall_at_10": recall}, cost_per_unit_usd=None, cost_unit=None,
                    recovery=None, limiting_resource="cpu",
                    extras={"index_bytes": mem, **extras})


def _input(by: dict[str, list[SheetRow]], target: float = 10) -> AdviceInput:
    goal = StageGoal(stage="retrieval", objectives=OBJ, baseline_series="exact",
                     target_multiple=target)
    return AdviceInput(goal=goal, base=by["exact"], by_series=by, limits=[], miss=None)


def test_exact_saturation_is_qps_over_rate_times_the_multiple() -> None:
    rows = [row("exact", 1, rate=2000, recall=1, mem=1, docs=1000, arrival_rate_qps=100),
            row("exact", 10, rate=400, recall=1, mem=1, docs=10000, arrival_rate_qps=100)]
    assert exact_saturation(rows) == 40.0  # 10x * 400 / 100
    assert exact_saturation([]) is None


def test_shard_count_from_bytes_per_document() -> None:
    rows = [row("x", 2, rate=1, recall=1, mem=2 * 2**30, docs=1000)]
    n, why = shard_count(rows, 10, 4 * 2**30)  # type: ignore[misc]
    # 2 GiB / 1,000 docs at 2x -> 10 GiB at 10x -> 3 shards of 4 GiB.
    assert n == 3
    assert "3 shard(s) of 4 GiB" in why


def test_advice_names_the_index_its_knob_and_the_alternatives() -> None:
    by = {
        "exact": [row("exact", 1, rate=1000, recall=1.0, mem=1536000, docs=1000,
                      arrival_rate_qps=100, raw_bytes=1536000)],
        "faiss:HNSW32": [row("faiss:HNSW32", 1, rate=9000, recall=0.97, mem=1800000,
                             docs=1000, param="ef", value=48.0, speedup_vs_exact=9.0,
                             memory_vs_raw=1.17, query_embed_ms=5.0, search_ms=0.1)],
        "faiss:IVF32,PQ48np": [row("faiss:IVF32,PQ48np", 1, rate=20000, recall=0.7,
                                   mem=100000, docs=1000, memory_vs_raw=0.07)],
    }
    a = advise(_input(by), shard_bytes=8 * 2**30)
    assert a.intervention.startswith("index: serve faiss:HNSW32 at ef=48")
    assert "compress embeddings when memory binds: faiss:IVF32,PQ48np" in a.intervention
    assert "cache query embeddings" in a.intervention
    assert "shard" not in a.intervention  # 18 MB at 10x fits one machine
    assert "exact search falls to the arrival rate near 10x" in a.predicted
    assert "0.07x the raw vectors at recall@10 0.7" in a.predicted


def test_advice_when_no_index_meets_the_objectives() -> None:
    by = {"exact": [row("exact", 1, rate=1000, recall=1.0, mem=10, docs=10)],
          "faiss:HNSW32": [row("faiss:HNSW32", 1, rate=9000, recall=0.5, mem=12, docs=10)]}
    assert "raise ef or nprobe" in advise(_input(by)).intervention


def test_quick_mode_is_small_and_modelless() -> None:
    q = STAGE.of(load_config(None, "quick"))
    d = STAGE.of(load_config(None, "default"))
    assert q.embedder == "hashing" and q.levels == [1, 2] and q.base_docs == 200
    assert d.levels == [1, 2, 5, 10] and d.embedder == "minilm"
    assert q.objectives == d.objectives


def test_the_bench_command_round_trips_its_index_specs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scalelab.system.retrieval.bench import split_indexes

    cmd = RetrievalBench(out=tmp_path, levels=[1, 2], base_docs=200, questions=30,
                         indexes=["faiss:HNSW32", "hnswlib:M=16,ef_construction=200", "ivfpq"],
                         embedder="hashing")
    argv = cmd.to_argv()
    assert argv[:3] == ["retrieval", "bench", "--json"]
    joined = argv[argv.index("--indexes") + 1]
    assert split_indexes(joined) == ["faiss:HNSW32", "hnswlib:M=16,ef_construction=200",
                                     "ivfpq"]


def test_the_target_level_is_decided_in_a_bench_of_its_own(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two levels, target 2×: 2× first in its own bench with its fixed-rate runs sized (the
    decision), then 1× in a curve bench (one pass, curve points)."""
    from scalelab.lab.core.records import read_records
    from scalelab.lab.diagnose.run import Runner
    from stagekit import stages_yaml

    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text(stages_yaml({"retrieval": "{levels: [1, 2], base_docs: 40, questions: 10, "
                                "embedder: hashing, indexes: ['faiss:HNSW32'], "
                                "fresh_singles: 2, target_multiple: 2}"}))
    runner = Runner(load_config(cfg, "quick"), tmp_path / "out", "quick", budget_s=None)
    runner.ctx.full = True  # no budget: the target's runs sized up to their --full cap
    d = runner.run()
    assert [r.step.label for r in d.steps] == ["retrieval bench 2× #1", "retrieval bench 1× #1"]
    recs = read_records(tmp_path / "out" / "records.jsonl")
    assert sorted((r.series, r.level, r.purpose) for r in recs) == [
        ("exact", 1.0, "curve"), ("exact", 2.0, "decision"),
        ("faiss:HNSW32", 1.0, "curve"), ("faiss:HNSW32", 2.0, "decision")]
    assert all("sizing" in r.extras for r in recs if r.level == 2.0)
    assert not any("sizing" in r.extras for r in recs if r.level == 1.0)
