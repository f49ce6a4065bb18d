from __future__ import annotations

import numpy as np
import pytest

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.system.retrieval.factory import build_index, index_from_bytes, make_index
from scalelab.system.retrieval.index import ExactIndex, ivf_lists, limit_threads
from scalelab.system.retrieval.quality import hit_rate, recall_at_k, true_scores

limit_threads(1)


def _recall(small, idx, k: int = 10) -> float:  # type: ignore[no-untyped-def]
    exact = build_index("exact", small.x)
    es, _ = exact.search(small.q, k)
    _, ids = idx.search(small.q, k)
    return recall_at_k(es[:, k - 1], true_scores(small.x, small.q, ids), k)


def test_exact_is_a_full_sort_with_ties_to_the_lower_id() -> None:
    x = np.array([[1, 0], [0, 1], [1, 0], [0.6, 0.8]], np.float32)
    idx = ExactIndex(2)
    idx.add(x)
    s, i = idx.search(np.array([[1, 0]], np.float32), 3)
    assert i.tolist() == [[0, 2, 3]]
    assert s[0].tolist() == pytest.approx([1.0, 1.0, 0.6])
    s, i = idx.search(np.array([[0, 1]], np.float32), 10)  # k > ntotal: all four
    assert i.tolist() == [[1, 3, 0, 2]]


def test_recall_counts_ties_at_the_kth_place() -> None:
    # The k-th exact similarity is 0.5; an index returning another 0.5 loses nothing.
    kth = np.array([0.5])
    assert recall_at_k(kth, np.array([[0.9, 0.5]]), 2) == 1.0
    assert recall_at_k(kth, np.array([[0.9, 0.4]]), 2) == 0.5
    assert recall_at_k(kth, np.array([[0.9, -np.inf]]), 2) == 0.5


@pytest.mark.parametrize(("spec", "params", "floor"), [
    ("faiss:HNSW32", {"ef": 64}, 0.95),
    ("hnswlib:M=16,ef_construction=100", {"ef": 64}, 0.95),
    ("faiss:IVF32,Flat", {"nprobe": 8}, 0.9),
    ("faiss:IVF32,PQ16np,RFlat", {"nprobe": 8, "k_factor": 8}, 0.85),
    ("qdrant", {}, 1.0),  # qdrant-client's local mode scans every point: exact
])
def test_approximate_indexes_against_exact(small, spec: str, params: dict[str, float],
                                           floor: float) -> None:  # type: ignore[no-untyped-def]
    idx = build_index(spec, small.x)
    idx.set_params(**params)
    r = _recall(small, idx)
    assert r >= floor
    # The ground-truth documents are found at least as often as recall allows.
    exact_hits = hit_rate(build_index("exact", small.x).search(small.q, 10)[1], small.truth, 10)
    assert exact_hits > 0.5
    assert hit_rate(idx.search(small.q, 10)[1], small.truth, 10) >= exact_hits - (1 - r) - 0.02


def test_a_tighter_search_recalls_less(small) -> None:  # type: ignore[no-untyped-def]
    idx = build_index("faiss:IVF32,Flat", small.x)
    idx.set_params(nprobe=1)
    low = _recall(small, idx)
    idx.set_params(nprobe=32)  # every list: exact
    assert low < _recall(small, idx) == 1.0


@pytest.mark.parametrize("spec", ["exact", "faiss:Flat", "faiss:IVF32,PQ16np",
                                  "hnswlib:M=16,ef_construction=100", "qdrant"])
def test_incremental_add_equals_a_fresh_build(small, spec: str) -> None:  # type: ignore[no-untyped-def]
    whole = make_index(spec, small.x.shape[1])
    if whole.needs_training:
        whole.train(small.x)
        # The same trained (empty) index twice: a copy through its own bytes (trains once).
        grown = index_from_bytes(spec, small.x.shape[1], whole.to_bytes())
    else:
        # Not a copy: a loaded hnswlib index draws other graph levels than a new one.
        grown = make_index(spec, small.x.shape[1])
    whole.add(small.x)
    grown.add(small.x[:1000])
    grown.add(small.x[1000:])
    assert grown.ntotal == whole.ntotal == len(small.x)
    sw, iw = whole.search(small.q, 10)
    sg, ig = grown.search(small.q, 10)
    np.testing.assert_array_equal(ig, iw)
    # PQ distance tables sum in another order per batch: scores agree to float32 rounding.
    np.testing.assert_allclose(sg, sw, rtol=0, atol=1e-5)


def test_hnsw_added_vectors_are_found(small) -> None:  # type: ignore[no-untyped-def]
    # faiss HNSW inserts a batch by level, so the graph depends on the split; what must hold
    # is that added vectors are searchable at once: each finds itself first.
    idx = build_index("faiss:HNSW32", small.x[:1000])
    idx.add(small.x[1000:])
    idx.set_params(ef=64)
    _, ids = idx.search(small.x[1000:1100], 1)
    assert (ids[:, 0] == np.arange(1000, 1100)).mean() >= 0.95


def test_bad_use() -> None:
    with pytest.raises(BadUsageError, match="unknown index"):
        make_index("annoy:10", 8)
    with pytest.raises(BadUsageError, match="faiss cannot build"):
        make_index("faiss:NotAnIndex", 8)
    with pytest.raises(BadUsageError, match="hnswlib option"):
        make_index("hnswlib:M=0", 8)
    idx = make_index("exact", 8)
    with pytest.raises(BadInputError, match=r"expected \[n, 8\]"):
        idx.add(np.zeros((2, 4), np.float32))
    with pytest.raises(BadUsageError, match="k=0"):
        idx.search(np.zeros((1, 8), np.float32), 0)
    with pytest.raises(BadUsageError, match="no search parameters"):
        idx.set_params(ef=10)
    ivf = make_index("faiss:IVF4,Flat", 8)
    with pytest.raises(BadUsageError, match="trained"):
        ivf.add(np.zeros((2, 8), np.float32))
    with pytest.raises(BadUsageError, match="unknown search parameter"):
        ivf.set_params(depth=3)


def test_ivf_lists() -> None:
    assert ivf_lists(10) == 1
    assert ivf_lists(2000) == 32  # min(4 sqrt(2000) = 178, 2000 // 39 = 51) -> 32
    assert ivf_lists(20_000) == 512  # min(565, 512)
