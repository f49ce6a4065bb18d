"""Qdrant behind the index interface with the real qdrant-client (embedded local mode): the
behaviour every backend shows (add, search, reset, persist and reload, refusal of a damaged
file, the retriever's freshness path), and the server spec's parsing and errors. No Qdrant
server is installable here, so the server path is checked up to the refused connection."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from scalelab.lab.core.errors import BadInputError, BadUsageError, RunFailedError
from scalelab.layers.web.spawn import free_port
from scalelab.system.retrieval.embed import CachedEmbedder, HashingEmbedder
from scalelab.system.retrieval.factory import build_index, make_index, parse_spec
from scalelab.system.retrieval.qdrant import QdrantIndex, parse_server
from scalelab.system.retrieval.quality import recall_at_k, true_scores
from scalelab.system.retrieval.retriever import build_index_dir, open_retriever
from scalelab.system.retrieval.store import INDEX_FILE, IndexCorruptError, load_index


@pytest.fixture(autouse=True)
def one_blas_thread() -> object:
    """Local mode's search is one numpy product per query: a second BLAS thread on a busy
    two-core machine costs more in hand-offs than it saves (as in the bench)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


def test_embedded_answers_exactly_like_exact(small) -> None:  # type: ignore[no-untyped-def]
    idx = build_index("qdrant", small.x)
    assert isinstance(idx, QdrantIndex) and idx.local and idx.ntotal == 1500
    q = small.q[:30]  # all 100 questions: test_index's recall case
    es, _ = build_index("exact", small.x).search(q, 10)
    qs, qi = idx.search(q, 10)
    # numpy brute force's scores at every rank; hashing vectors tie often, and which of the
    # tied documents fills the 10th place is each library's own order (recall counts ties)
    np.testing.assert_allclose(qs, es, rtol=0, atol=1e-5)
    assert recall_at_k(es[:, 9], true_scores(small.x, q, qi), 10) == 1.0
    np.testing.assert_allclose(true_scores(small.x, q, qi), qs, rtol=0, atol=1e-5)
    _, i = idx.search(small.q[:1], 5000)  # k > ntotal: every point once
    assert i.shape == (1, 1500) and sorted(i[0].tolist()) == list(range(1500))
    assert idx.memory_bytes() >= small.x.nbytes  # local mode holds at least the rows


def test_reset_empties_and_ids_restart_at_zero(small) -> None:  # type: ignore[no-untyped-def]
    idx = build_index("qdrant", small.x[:10])
    idx.reset()
    assert idx.ntotal == 0 and idx.search(small.q[:2], 3)[1].shape == (2, 0)
    idx.add(small.x[5:8])
    assert idx.search(small.x[6:7], 1)[1].tolist() == [[1]]


def test_saved_qdrant_index_reloads_and_refuses_damage(small, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    emb = CachedEmbedder(embedder=HashingEmbedder(), path=tmp_path / "cache.sqlite")
    out = tmp_path / "idx"
    build_index_dir(small.dir, out, spec="qdrant", embedder=emb, lineage=None)
    idx, info = load_index(out)
    assert info.spec == "qdrant" and info.ntotal == 1500 and isinstance(idx, QdrantIndex)
    # index.bin is the float32 rows (no pickle): 1500 x 384 x 4 bytes
    assert (out / INDEX_FILE).stat().st_size == 1500 * 384 * 4
    np.testing.assert_array_equal(idx.vectors(), small.x)
    want = idx.search(small.q[:20], 10)[1]
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    p = damaged / INDEX_FILE
    p.write_bytes(p.read_bytes()[:1000])
    with pytest.raises(IndexCorruptError, match="rebuild it: scalelab retrieval index"):
        load_index(damaged)
    r, opened = open_retriever(damaged, embedder=emb.embedder)
    assert opened.rebuilt
    np.testing.assert_array_equal(r.index.search(small.q[:20], 10)[1], want)


def test_retriever_takes_a_new_document_into_qdrant(small, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    emb = CachedEmbedder(embedder=HashingEmbedder())
    out = tmp_path / "idx"
    build_index_dir(small.dir, out, spec="qdrant", embedder=emb, lineage=None)
    r, _ = open_retriever(out, embedder=emb.embedder)
    fq = small.corpus.fresh_questions[0]
    doc = next(d for d in small.corpus.fresh_docs if d.key == fq.doc_key)
    assert doc.key not in {h.key for h in r.retrieve([fq.text], 10)[0]}
    r.add([(doc.key, doc.text)])
    assert r.index.ntotal == 1501
    assert doc.key in {h.key for h in r.retrieve([fq.text], 10)[0]}


def test_embedded_has_no_ef_and_bad_input_is_named() -> None:
    idx = make_index("qdrant", 8)
    with pytest.raises(BadUsageError, match="searches every point exactly"):
        idx.set_params(ef=64)
    with pytest.raises(BadUsageError, match="takes only 'ef'"):
        idx.set_params(nprobe=4)
    with pytest.raises(BadInputError, match=r"expected \[n, 8\]"):
        idx.add(np.zeros((2, 4), np.float32))
    with pytest.raises(BadInputError, match="not whole 8-float rows"):
        QdrantIndex.from_bytes(8, None, b"\0" * 30)


def test_server_spec_parses_and_refuses_what_is_not_a_server() -> None:
    assert parse_server("qdrant+http://10.0.0.5:6333/flights-facts?m=32&ef_construct=200") == (
        "http://10.0.0.5:6333", "flights-facts", {"m": 32, "ef_construct": 200})
    assert parse_server("qdrant+https://q.example:443/c") == ("https://q.example:443", "c", {})
    assert parse_spec("qdrant+http://h:6333/c") == ("qdrant", "qdrant+http://h:6333/c")
    assert parse_spec("qdrant") == ("qdrant", "")
    for bad, says in [("qdrant+http://h:6333/", "not a server URL and a collection"),
                      ("qdrant+http://h:6333/a/b", "not a server URL and a collection"),
                      ("qdrant+ftp://h/c", "unknown index"),
                      ("qdrant+http://h:6333/c?m=0", "use m=N and ef_construct=N"),
                      ("qdrant+http://h:6333/c?hnsw_ef=64", "use m=N and ef_construct=N"),
                      ("qdrant:M=16", "unknown index")]:
        with pytest.raises(BadUsageError, match=says):
            parse_spec(bad)


def test_an_unreachable_server_is_a_clear_error() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(RunFailedError) as e:
        make_index(f"qdrant+http://127.0.0.1:{port}/facts", 8)
    msg = str(e.value)
    assert msg.startswith(f"Qdrant at http://127.0.0.1:{port}: listing collections failed")
    assert "is the server up" in msg and "QDRANT_API_KEY" in msg


def test_the_bench_measures_a_qdrant_row(tmp_path: Path) -> None:
    from scalelab.system.retrieval.bench import (
        RetrievalBenchConfig,
        grid_for,
        run_bench,
        split_indexes,
    )

    assert split_indexes("faiss:HNSW32,qdrant,hnswlib:M=16") == [
        "faiss:HNSW32", "qdrant", "hnswlib:M=16"]
    assert grid_for("qdrant") == (None, [0.0])  # embedded: one exact point, no knob
    assert grid_for("qdrant+http://h:6333/c")[0] == "ef"
    cfg = RetrievalBenchConfig(levels=[1], base_docs=200, questions=30, indexes=["qdrant"],
                               embedder="hashing", out=tmp_path, runs=1, fresh_singles=3,
                               arrival_rate=2000)
    (level,) = run_bench(cfg)["levels"]
    rows = {r["spec"]: r for r in level["indexes"]}
    assert list(rows) == ["exact", "faiss:Flat", "qdrant"]
    q = rows["qdrant"]
    (point,) = q["points"]
    assert point["recall"] == 1.0 and point["qps"] > 0 and q["operating"] == point
    assert point["hit_at_10"] == rows["exact"]["points"][0]["hit_at_10"]
    assert q["memory_bytes"] >= q["raw_bytes"] == 200 * 384 * 4
    assert q["recovery"]["same_results"] == 1.0
    assert q["fresh"]["single_found_first"] == 1.0
