from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from scalelab.layers.lineage.store import LineageStore
from scalelab.system.retrieval.corpus import DOCS_FILE, read_corpus
from scalelab.system.retrieval.embed import CachedEmbedder, HashingEmbedder
from scalelab.system.retrieval.retriever import build_index_dir, open_retriever
from scalelab.system.retrieval.store import INDEX_FILE, IndexCorruptError, load_index


@pytest.fixture(scope="module")
def built(small, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One saved index over a private copy of the corpus (tests that damage it copy it)."""
    tmp = tmp_path_factory.mktemp("store")
    corpus = tmp / "corpus"
    shutil.copytree(small.dir, corpus)
    store = LineageStore(tmp / "lineage.db")
    emb = CachedEmbedder(embedder=HashingEmbedder(), path=tmp / "cache.sqlite")
    out = tmp / "idx"
    build_index_dir(corpus, out, spec="hnswlib:M=16,ef_construction=100", embedder=emb,
                    lineage=store, search_params={"ef": 40})
    return corpus, out, store, emb


def test_saved_index_loads_with_the_same_answers(built, small) -> None:  # type: ignore[no-untyped-def]
    _, out, _, _ = built
    idx, info = load_index(out)
    assert info.spec == "hnswlib:M=16,ef_construction=100" and info.ntotal == 1500
    assert info.embedder == "hashing-384" and info.search_params == {"ef": 40.0}
    fresh, _ = load_index(out)
    np.testing.assert_array_equal(idx.search(small.q, 10)[1], fresh.search(small.q, 10)[1])


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_file_is_refused_then_rebuilt(built, small, damage: str,
                                                tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, saved, store, emb = built
    out = tmp_path / "idx"
    shutil.copytree(saved, out)
    want = load_index(out)[0].search(small.q, 10)[1]
    p = out / INDEX_FILE
    data = p.read_bytes()
    if damage == "truncate":
        p.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        p.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        p.unlink()
    with pytest.raises(IndexCorruptError, match="rebuild it: scalelab retrieval index"):
        load_index(out)
    r, opened = open_retriever(out, embedder=emb.embedder, lineage=store)
    assert opened.rebuilt and opened.reason
    np.testing.assert_array_equal(r.index.search(small.q, 10)[1], want)
    assert load_index(out)[1].ntotal == 1500


def test_lineage_names_the_index_when_the_corpus_changes(built, small, tmp_path: Path
                                                        ) -> None:  # type: ignore[no-untyped-def]
    _, _, _, emb = built
    corpus, out = tmp_path / "corpus", tmp_path / "idx"
    shutil.copytree(small.dir, corpus)
    store = LineageStore(tmp_path / "lineage.db")
    build_index_dir(corpus, out, spec="faiss:Flat", embedder=emb, lineage=store)
    assert not store.impacted(corpus).changed
    p = corpus / DOCS_FILE
    p.write_text(p.read_text().replace("Plane", "Plane!", 1))
    imp = store.impacted(corpus)
    assert imp.changed
    assert [n["path"] for n in imp.downstream] == [str(out.resolve())]
    assert imp.downstream[0]["kind"] == "index"


def test_retriever_answers_and_takes_new_documents(built, small) -> None:  # type: ignore[no-untyped-def]
    _, out, _, emb = built
    r, opened = open_retriever(out, embedder=emb.embedder)
    assert not opened.rebuilt
    q = small.corpus.questions[0]
    hits = r.retrieve([q.text], 5)[0]
    assert len(hits) == 5 and hits[0].score >= hits[-1].score
    fresh = small.corpus.fresh_questions[0]
    doc = next(d for d in small.corpus.fresh_docs if d.key == fresh.doc_key)
    assert doc.key not in {h.key for h in r.retrieve([fresh.text], 10)[0]}
    added = r.add([(doc.key, doc.text)], kind=doc.kind)
    assert added[0].id == 1500
    assert doc.key in {h.key for h in r.retrieve([fresh.text], 10)[0]}


def test_embedding_cache_embeds_only_new_texts(small, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    emb = CachedEmbedder(embedder=HashingEmbedder(), path=tmp_path / "c.sqlite")
    texts = [d.text for d in small.corpus.docs[:300]]
    a = emb.embed(texts[:200])
    assert (emb.last.encoded, emb.last.hits) == (200, 0)
    b = emb.embed(texts)
    assert (emb.last.encoded, emb.last.hits) == (100, 200)
    np.testing.assert_array_equal(b[:200], a)
    np.testing.assert_array_equal(b, HashingEmbedder().encode(texts))
    again = CachedEmbedder(embedder=HashingEmbedder(), path=tmp_path / "c.sqlite")
    again.embed(texts)
    assert again.last.encoded == 0


def test_manifest_records_the_corpus(built) -> None:  # type: ignore[no-untyped-def]
    corpus, out, _, _ = built
    m = json.loads((out / "manifest.json").read_text())
    assert m["kind"] == "index"
    assert m["inputs"][0]["path"] == str(corpus.resolve())
    assert m["inputs"][0]["digest"] == json.loads((corpus / "manifest.json").read_text())["digest"]
    assert read_corpus(corpus).docs[0].id == 0
