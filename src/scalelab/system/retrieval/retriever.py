"""Corpus + embedder + index, wired: build an index directory from a corpus, retrieve, add docs.

`build_index_dir` embeds the corpus (through the digest cache), builds the index, saves it with
its manifest and lineage. `Retriever` answers queries with document ids, keys, texts and
scores, and takes new documents without a rebuild (embed them, `add` them: the freshness path).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.layers.lineage.manifest import read_manifest
from scalelab.layers.lineage.store import LineageStore
from scalelab.system.retrieval.corpus import Corpus, Doc, read_corpus
from scalelab.system.retrieval.embed import CachedEmbedder, Embedder, make_embedder
from scalelab.system.retrieval.factory import build_index
from scalelab.system.retrieval.index import VectorIndex
from scalelab.system.retrieval.store import IndexInfo, Opened, open_or_rebuild, save_index


@dataclass(frozen=True, kw_only=True)
class BuildReport:
    spec: str
    docs: int
    embed_s: float
    embedded: int
    """Documents the model embedded (the rest came from the cache)."""
    build_s: float
    memory_bytes: int
    raw_bytes: int
    """n x dim x 4: the float32 vectors alone."""
    path: str | None


def embed_docs(embedder: CachedEmbedder, docs: Sequence[Doc]) -> np.ndarray:
    return embedder.embed([d.text for d in docs])


def build_from_corpus(corpus: Corpus, spec: str, embedder: CachedEmbedder, *,
                      include_fresh: bool = False, seed: int = 0
                      ) -> tuple[VectorIndex, BuildReport]:
    docs = [*corpus.docs, *(corpus.fresh_docs if include_fresh else [])]
    t0 = time.perf_counter()
    x = embed_docs(embedder, docs)
    embed_s = time.perf_counter() - t0
    embedded = embedder.last.encoded
    t1 = time.perf_counter()
    index = build_index(spec, x, seed=seed)
    build_s = time.perf_counter() - t1
    return index, BuildReport(spec=index.spec, docs=len(docs), embed_s=embed_s,
                              embedded=embedded, build_s=build_s,
                              memory_bytes=index.memory_bytes(), raw_bytes=int(x.nbytes),
                              path=None)


def build_index_dir(corpus_dir: str | os.PathLike[str], out: str | os.PathLike[str], *,
                    spec: str, embedder: CachedEmbedder, lineage: LineageStore | None,
                    include_fresh: bool = False,
                    search_params: dict[str, float] | None = None) -> BuildReport:
    """Embed CORPUS_DIR, build SPEC, save into OUT with manifest and corpus -> index lineage."""
    corpus = read_corpus(corpus_dir)
    index, rep = build_from_corpus(corpus, spec, embedder, include_fresh=include_fresh)
    if search_params:
        index.set_params(**search_params)
    save_index(index, out, embedder=embedder.name, corpus_dir=corpus_dir,
               corpus_digest=read_manifest(corpus_dir).digest, build_s=rep.build_s,
               lineage=lineage, search_params=search_params)
    return BuildReport(**{**rep.__dict__, "path": str(out)})


@dataclass(frozen=True, kw_only=True)
class Hit:
    id: int
    key: str
    score: float
    text: str


class Retriever:
    """Queries against one index and the documents its ids point at."""

    def __init__(self, index: VectorIndex, embedder: CachedEmbedder, docs: Sequence[Doc]
                 ) -> None:
        if index.ntotal != len(docs):
            raise BadInputError(f"the index holds {index.ntotal} vectors but {len(docs)} "
                                "documents were given; rebuild the index from this corpus")
        if index.dim != embedder.dim:
            raise BadInputError(f"the index has dim {index.dim}, the embedder {embedder.name} "
                                f"gives {embedder.dim}; rebuild with the same embedder")
        self.index = index
        self.embedder = embedder
        self.docs = list(docs)

    def search_vectors(self, q: np.ndarray, k: int) -> list[list[Hit]]:
        scores, ids = self.index.search(q, k)
        return [[Hit(id=int(i), key=self.docs[i].key, score=float(s), text=self.docs[i].text)
                 for s, i in zip(srow, irow, strict=True) if i >= 0]
                for srow, irow in zip(scores, ids, strict=True)]

    def retrieve(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return self.search_vectors(self.embedder.embed(list(queries)), k)

    def add(self, texts: Sequence[tuple[str, str]], kind: str = "added") -> list[Doc]:
        """Embed and add (key, text) documents now; answerable by the next query."""
        keys = {d.key for d in self.docs}
        new: list[Doc] = []
        for key, text in texts:
            if not key or not text:
                raise BadUsageError("a document needs a non-empty key and text")
            if key in keys:
                raise BadUsageError(f"document key {key!r} is already in the index")
            keys.add(key)
            new.append(Doc(id=len(self.docs) + len(new), key=key, kind=kind, text=text))
        if new:
            self.index.add(self.embedder.embed([d.text for d in new]))
            self.docs.extend(new)
        return new


def open_retriever(index_dir: str | os.PathLike[str], *, embedder: Embedder | None = None,
                   cache: Path | None = None, lineage: LineageStore | None = None
                   ) -> tuple[Retriever, Opened]:
    """Load INDEX_DIR (rebuilding it from its corpus if the file is refused) and its corpus."""
    from scalelab.system.retrieval.store import index_info

    info: IndexInfo = index_info(index_dir)
    corpus_dir = info.corpus.get("path")
    if not corpus_dir or not Path(corpus_dir).is_dir():
        raise BadInputError(f"{index_dir}: its corpus {corpus_dir} is gone (the documents the "
                            "ids point at); re-create the corpus and rebuild the index: "
                            f"scalelab retrieval index --corpus DIR --out {index_dir} "
                            f"--index {info.spec}")
    corpus = read_corpus(corpus_dir)
    emb = embedder if embedder is not None else _embedder_for(info.embedder)
    if emb.name != info.embedder:
        raise BadUsageError(f"{index_dir} was built with {info.embedder}, not {emb.name}")
    cached = CachedEmbedder(embedder=emb, path=cache)
    fresh = info.ntotal == len(corpus.docs) + len(corpus.fresh_docs)

    def rebuild() -> None:
        build_index_dir(corpus_dir, index_dir, spec=info.spec, embedder=cached,
                        lineage=lineage, include_fresh=fresh, search_params=info.search_params)

    opened = open_or_rebuild(index_dir, rebuild)
    docs = [*corpus.docs, *(corpus.fresh_docs if fresh else [])]
    return Retriever(opened.index, cached, docs), opened


def _embedder_for(name: str) -> Embedder:
    if name.startswith("hashing"):
        return make_embedder("hashing")
    if name == "minilm-l6-v2-int8":
        return make_embedder("minilm-int8")
    if name == "minilm-l6-v2":
        return make_embedder("minilm")
    raise BadInputError(f"index embedder {name!r} is unknown to this scalelab")
