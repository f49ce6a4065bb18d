"""`retrieval bench` end to end on the hashing embedder and a small corpus: the records it
appends (the retrieval row and the retrieval stage's records) checked against what this test
computes itself: brute-force numpy search, the approximate indexes rebuilt and searched here,
the corpus sizes, the raw vector bytes, the fresh month's hits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scalelab.lab.core.records import read_records
from scalelab.system.retrieval.bench import RetrievalBenchConfig, run_bench
from scalelab.system.retrieval.corpus import CorpusSpec, build_corpus
from scalelab.system.retrieval.embed import HashingEmbedder
from scalelab.system.retrieval.factory import build_index
from scalelab.system.retrieval.index import ivf_lists

K = 10
BASE, QUESTIONS, SEED = 200, 30, 13


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("bench")
    cfg = RetrievalBenchConfig(levels=(1, 2), base_docs=BASE, questions=QUESTIONS,
                               indexes=("faiss:HNSW32", "ivfflat"), embedder="hashing",
                               cache=out / "cache.sqlite", out=out, recall_target=0.9,
                               arrival_rate=2000.0, runs=1, fresh_singles=5, seed=SEED)
    return run_bench(cfg), out


def _exact(x: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Brute force: (scores [m, n], top-k ids [m, k]) by inner product."""
    s = q @ x.T
    return s, np.argsort(-s, axis=1, kind="stable")[:, :K]


def _recall(scores: np.ndarray, top: np.ndarray, found: np.ndarray) -> float:
    """Share of returned ids scoring at least the k-th best exact score (ties count)."""
    kth = np.take_along_axis(scores, top, axis=1)[:, K - 1]
    got = np.take_along_axis(scores, np.where(found < 0, 0, found), axis=1)
    got = np.where(found < 0, -np.inf, got)
    return float(np.mean((got >= kth[:, None] - 1e-5).sum(axis=1) / K))


def test_records_hold_every_index_at_every_level(bench: tuple[dict[str, Any], Path]) -> None:
    result, out = bench
    records = read_records(out / "records.jsonl")  # schema-checked as it reads
    assert result["records"] == str(out / "records.jsonl")
    specs = ["exact", "faiss:Flat", "faiss:HNSW32"]
    for level in (1, 2):
        corpus = build_corpus(CorpusSpec(level=level, base_docs=BASE, questions=QUESTIONS,
                                         seed=SEED))
        n = len(corpus.docs)
        here = [r for r in records if r.level == level]
        assert [r.extras["index"] for r in here] == [*specs, f"faiss:IVF{ivf_lists(n)},Flat"]
        for r in here:
            assert (r.stage, r.variable, r.input_unit) == ("retrieval", "corpus_multiple",
                                                           "documents")
            assert r.input_volume == n
            # 384-dim float32 vectors (the hashing embedder): the raw bytes are exact; every
            # index holds at least them
            assert r.extras["raw_bytes"] == n * 384 * 4
            assert r.extras["index_bytes"] >= r.extras["raw_bytes"]
            assert r.extras["memory_vs_raw"] == r.extras["index_bytes"] / r.extras["raw_bytes"]
            # The process's peak while this index was measured holds at least the index.
            assert r.peak_memory_bytes is not None
            assert r.peak_memory_bytes >= r.extras["index_bytes"]
            assert r.extras["arrival_rate_qps"] == 2000.0
            assert r.extras["samples"] == r.extras["open_loop"]["queries"] > 0
            lat = r.latency
            assert lat is not None and 0 < lat.p50_ms <= lat.p95_ms <= lat.p99_ms <= lat.max_ms
            assert r.extras["recovery"]["same_results"] == 1.0
            assert r.extras["recovery"]["load_s"] > 0
        # exact search keeps the vectors and nothing else
        assert here[0].extras["index_bytes"] == n * 384 * 4
        assert here[0].extras["speedup_vs_exact"] == 1.0
    assert len(records) == 8
    assert len({r.experiment for r in records}) == 1
    doc = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    assert doc["stage"] == "retrieval"


def test_recall_and_hits_match_a_brute_force_search(
        bench: tuple[dict[str, Any], Path]) -> None:
    result, out = bench
    corpus = build_corpus(CorpusSpec(level=1, base_docs=BASE, questions=QUESTIONS, seed=SEED))
    e = HashingEmbedder()
    x = e.encode([d.text for d in corpus.docs])
    q = e.encode([qq.text for qq in corpus.questions])
    k2i = corpus.key_to_id()
    truth = np.array([k2i[qq.doc_key] for qq in corpus.questions])
    scores, top = _exact(x, q)
    hit = float(np.mean((top == truth[:, None]).any(axis=1)))
    assert 0 < hit < 1  # a real comparison: some questions find their document, some don't
    level = result["levels"][0]
    by_spec = {r["spec"]: r for r in level["indexes"]}
    for spec in ("exact", "faiss:Flat"):
        (p,) = by_spec[spec]["points"]
        assert p["recall"] == 1.0 and p["hit_at_10"] == pytest.approx(hit, abs=1e-12)
    # the approximate indexes, rebuilt with the bench's seed and searched here at each grid
    # point: the recall the bench reports is the one a brute-force comparison gives
    below_one = 0
    for spec, param in (("faiss:HNSW32", "ef"), (f"faiss:IVF{ivf_lists(len(x))},Flat",
                                                   "nprobe")):
        r = by_spec[spec]
        index = build_index(spec, x, seed=SEED)
        for p in r["points"]:
            index.set_params(**{param: p["value"]})
            found = np.vstack([index.search(q[i:i + 1], K)[1] for i in range(len(q))])
            assert p["recall"] == pytest.approx(_recall(scores, top, found), abs=1e-9), \
                (spec, p["value"])
            assert p["hit_at_10"] == pytest.approx(
                float(np.mean((found == truth[:, None]).any(axis=1))), abs=1e-12)
            below_one += p["recall"] < 1.0
        # the operating point: the fastest point at or above the target, or none
        ok = [p for p in r["points"] if p["recall"] >= 0.9]
        if ok:
            assert r["operating"] == max(ok, key=lambda p: p["qps"])
        else:
            assert r["operating"] is None
        # the frontier: grid points that no other point beats on both recall and QPS
        rec = next(x for x in read_records(out / "records.jsonl")
                   if x.level == 1 and x.extras["index"] == spec)
        front = rec.extras["frontier"]
        assert front and all(f in r["points"] for f in front)
        for f in front:
            assert not any(p["recall"] >= f["recall"] and p["qps"] > f["qps"]
                           for p in r["points"])
    # IVF at nprobe=1 of 4 lists misses neighbours: the check above compared real recalls
    assert below_one > 0


def test_a_new_document_is_answerable_and_the_fresh_month_is_found(
        bench: tuple[dict[str, Any], Path]) -> None:
    result, _ = bench
    corpus = build_corpus(CorpusSpec(level=1, base_docs=BASE, questions=QUESTIONS, seed=SEED))
    e = HashingEmbedder()
    x = e.encode([d.text for d in corpus.docs])
    fresh = e.encode([d.text for d in corpus.fresh_docs])
    fq = e.encode([qq.text for qq in corpus.fresh_questions])
    fk = {d.key: i for i, d in enumerate(corpus.fresh_docs)}
    truth = np.array([len(x) + fk[qq.doc_key] for qq in corpus.fresh_questions])
    _, top = _exact(np.vstack([x, fresh]), fq)
    hit = float(np.mean((top == truth[:, None]).any(axis=1)))
    assert hit > 0
    for r in result["levels"][0]["indexes"]:
        f = r["fresh"]
        assert (f["docs"], f["singles"]) == (len(corpus.fresh_docs), 5)
        assert f["single_found_first"] == 1.0, r["spec"]  # each new document finds itself
        assert 0 < f["single_to_answerable_p50_s"] <= f["single_to_answerable_max_s"]
        if r["spec"] in ("exact", "faiss:Flat"):
            assert f["fresh_hit_at_10"] == pytest.approx(hit, abs=1e-12)


def test_ivfpq_codes_are_sized_to_the_training_vectors() -> None:
    """2**bits centroids per sub-quantizer with >= 39 vectors each (faiss's k-means minimum),
    8 bits from 256 x 39 = 9,984 vectors on; the IVF lists as before."""
    from scalelab.system.retrieval.bench import pq_bits, resolve_spec

    assert [pq_bits(n) for n in (50, 500, 1000, 2500, 5000, 9983, 9984, 100_000)] == [
        1, 3, 4, 6, 7, 7, 8, 8]
    assert resolve_spec("ivfpq", 5000, 384) == f"faiss:IVF{ivf_lists(5000)},PQ48x7np"
    assert resolve_spec("ivfpq", 20_000, 384) == f"faiss:IVF{ivf_lists(20_000)},PQ48np"
    assert resolve_spec("ivfflat", 500, 384) == f"faiss:IVF{ivf_lists(500)},Flat"


def test_the_cache_fills_on_every_core_only_while_they_are_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from scalelab.system.retrieval import embed

    monkeypatch.setattr(embed.os, "cpu_count", lambda: 2)
    for load, threads in ((0.3, 2), (2.0, 2), (2.01, 1), (14.2, 1)):
        monkeypatch.setattr(embed.os, "getloadavg", lambda load=load: (load, load, load))
        assert embed.fill_threads() == threads
