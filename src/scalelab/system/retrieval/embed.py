"""Embeddings: the bundled MiniLM (fp32 or int8) or a hashing baseline, cached by content digest.

Every embedder returns unit-length float32 rows, so inner product is cosine similarity and every
index searches by inner product. The cache is one SQLite file keyed by (embedder, sha256 of the
text): a grown corpus embeds only its new documents, and a re-run embeds nothing. Embedding is
the costly step on CPU (a few hundred documents/s on two cores), which is why it is cached and
why cost per 1,000 documents is reported.

- ``minilm`` all-MiniLM-L6-v2 in torch (the semantic reference);
- ``minilm-int8`` the same encoder with dynamic int8 Linear layers (`nets.variants`);
- ``hashing`` words and character trigrams hashed into 384 signed buckets: a lexical baseline
  that needs no model, retrieves exact identifiers (tail numbers, dates) well and paraphrases
  badly.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from scalelab.lab.core.errors import BadInputError, BadUsageError

EMBEDDERS = ("minilm", "minilm-int8", "hashing")
HASH_DIM = 384
_WORD = re.compile(r"[a-z0-9]+(?:[-.][a-z0-9]+)*")


class Embedder(Protocol):
    name: str
    """Identifies the vectors: part of every cache key and index manifest."""
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), dim] float32 rows of unit length."""
        ...


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(n, 1e-12)).astype(np.float32)


class HashingEmbedder:
    """Signed feature hashing of words and character trigrams (crc32: stable across runs)."""

    def __init__(self, dim: int = HASH_DIM) -> None:
        if dim < 8:
            raise BadUsageError(f"hashing dim {dim} must be >= 8")
        self.dim = dim
        self.name = f"hashing-{dim}"

    def features(self, text: str) -> list[str]:
        words = _WORD.findall(text.lower())
        grams = [f"#{w[i:i + 3]}" for w in words for i in range(max(1, len(w) - 2))]
        return words + grams

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for r, t in enumerate(texts):
            for f in self.features(t):
                h = zlib.crc32(f.encode())
                out[r, h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
        return _unit(out)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers (mean pooling, normalised), fp32 or int8."""

    def __init__(self, *, int8: bool = False, batch_size: int = 64, threads: int | None = None
                 ) -> None:
        from scalelab.layers.nets.minilm import DIM, load_sentence_model

        self.dim = DIM
        self.name = "minilm-l6-v2-int8" if int8 else "minilm-l6-v2"
        self.batch_size = batch_size
        self.threads = threads
        self._model = load_sentence_model()
        if int8:
            from torch import nn

            from scalelab.layers.nets.variants import quantize_int8

            # sentence-transformers' `auto_model` is a read-only property over `model`:
            # assigning to it registers an unused submodule and leaves fp32 running.
            first = self._model[0]
            attr = "model" if isinstance(getattr(first, "model", None), nn.Module) \
                else "auto_model"
            setattr(first, attr, quantize_int8(getattr(first, attr)))
            if first.auto_model is not getattr(first, attr):
                raise AssertionError("the int8 encoder is not the one sentence-transformers runs")

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            out = self._model.encode(list(texts), batch_size=self.batch_size,
                                     normalize_embeddings=True, convert_to_numpy=True,
                                     show_progress_bar=False)
        finally:
            torch.set_num_threads(before)
        return np.asarray(out, dtype=np.float32).reshape(len(texts), self.dim)


def make_embedder(name: str, *, threads: int | None = None) -> Embedder:
    """An embedder by name (see EMBEDDERS)."""
    if name == "hashing":
        return HashingEmbedder()
    if name in ("minilm", "minilm-int8"):
        return MiniLMEmbedder(int8=name.endswith("int8"), threads=threads)
    raise BadUsageError(f"unknown embedder {name!r}; choose from {', '.join(EMBEDDERS)}")


def text_digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


@dataclass(kw_only=True)
class EmbedStats:
    """What one `CachedEmbedder.embed` call cost."""

    texts: int = 0
    hits: int = 0
    encoded: int = 0
    encode_s: float = 0.0
    """Seconds spent in the model (not in the cache)."""
    wall_s: float = 0.0

    def per_1000_s(self) -> float | None:
        """Model seconds per 1,000 encoded texts (None when nothing was encoded)."""
        return self.encode_s / self.encoded * 1000 if self.encoded else None


@dataclass(kw_only=True)
class CachedEmbedder:
    """An embedder behind the content-digest cache (SQLite, WAL; safe across processes)."""

    embedder: Embedder
    path: Path | None = None
    """Cache file; None keeps no cache."""
    chunk: int = 512
    """Texts encoded per model call before their rows are stored (bounds lost work)."""
    last: EmbedStats = field(default_factory=EmbedStats)
    on_progress: Callable[[int, int], None] | None = None

    def __post_init__(self) -> None:
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self._db() as db:
                    db.execute("CREATE TABLE IF NOT EXISTS vecs (model TEXT NOT NULL, "
                               "digest BLOB NOT NULL, vec BLOB NOT NULL, "
                               "PRIMARY KEY (model, digest))")
            except (OSError, sqlite3.DatabaseError) as e:
                raise BadInputError(f"embedding cache {self.path} cannot be opened ({e}); "
                                    "pass --cache to a writable file") from e

    @property
    def name(self) -> str:
        return self.embedder.name

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def _db(self) -> sqlite3.Connection:
        assert self.path is not None
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def _lookup(self, digests: list[bytes]) -> dict[bytes, np.ndarray]:
        if self.path is None or not digests:
            return {}
        found: dict[bytes, np.ndarray] = {}
        db = self._db()
        try:
            for i in range(0, len(digests), 500):
                part = digests[i:i + 500]
                q = ",".join("?" * len(part))
                for d, v in db.execute(f"SELECT digest, vec FROM vecs WHERE model = ? AND "
                                       f"digest IN ({q})", [self.name, *part]):
                    row = np.frombuffer(v, dtype=np.float32)
                    if row.shape == (self.dim,):
                        found[bytes(d)] = row
        finally:
            db.close()
        return found

    def _store(self, digests: list[bytes], rows: np.ndarray) -> None:
        if self.path is None:
            return
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT OR REPLACE INTO vecs (model, digest, vec) VALUES (?, ?, ?)",
                           [(self.name, d, r.astype(np.float32).tobytes())
                            for d, r in zip(digests, rows, strict=True)])
            db.execute("COMMIT")
        finally:
            db.close()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[n, dim] unit rows for `texts`; only texts not in the cache reach the model."""
        t0 = time.perf_counter()
        digests = [text_digest(t) for t in texts]
        have = self._lookup(list(dict.fromkeys(digests)))
        missing: dict[bytes, str] = {}
        for d, t in zip(digests, texts, strict=True):
            if d not in have:
                missing.setdefault(d, t)
        stats = EmbedStats(texts=len(texts), hits=len(texts) - sum(
            1 for d in digests if d not in have))
        todo = list(missing.items())
        for i in range(0, len(todo), self.chunk):
            part = todo[i:i + self.chunk]
            e0 = time.perf_counter()
            rows = self.embedder.encode([t for _, t in part])
            stats.encode_s += time.perf_counter() - e0
            stats.encoded += len(part)
            self._store([d for d, _ in part], rows)
            have.update({d: r for (d, _), r in zip(part, rows, strict=True)})
            if self.on_progress:
                self.on_progress(min(i + self.chunk, len(todo)), len(todo))
        out = (np.stack([have[d] for d in digests]) if digests
               else np.zeros((0, self.dim), np.float32))
        stats.wall_s = time.perf_counter() - t0
        self.last = stats
        return out.astype(np.float32, copy=False)


def default_cache_path() -> Path:
    """$SCALELAB_EMBED_CACHE, else ./.scalelab/embeddings.sqlite."""
    env = os.environ.get("SCALELAB_EMBED_CACHE")
    return Path(env) if env else Path(".scalelab") / "embeddings.sqlite"


def embedding_cost_per_1000(seconds_per_1000: float, *, threads: int,
                            price_per_core_hour: float) -> float:
    """USD for 1,000 embeddings: model seconds x cores x price per core-hour."""
    return seconds_per_1000 / 3600.0 * threads * price_per_core_hour


def fill_threads() -> int:
    """Threads to fill the embedding cache with: every core while the 1-minute load average
    (which counts this run's own work, one or two busy threads) is at most the cores, else
    one. On a busy host torch's OpenMP threads spin-wait for each other when descheduled: at
    load 14 on 2 cores two threads took 2.9x the CPU seconds per document of one (23 ms
    against 8) and twice the wall time."""
    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:
        return 1
    return cores if busy <= cores else 1


@contextmanager
def torch_threads(embedder: object, n: int) -> Iterator[None]:
    """The embedder's torch threads set to `n` inside (an embedder without threads, like
    hashing, is left as it is)."""
    if not hasattr(embedder, "threads"):
        yield
        return
    before = embedder.threads
    embedder.threads = n
    try:
        yield
    finally:
        embedder.threads = before


@dataclass(kw_only=True)
class EncodeTimings:
    """The model's uncached rates (documents, then the questions' embeddings and rate), timed
    once per distinct input: every level has the same questions and the same first documents
    (corpus.build_corpus), so timing them again at each level repeated the same encodes."""

    _seen: dict[tuple[str, ...], tuple[float, np.ndarray, float]] = field(default_factory=dict)

    def measure(self, emb: CachedEmbedder, docs: list[str], questions: list[str]
                ) -> tuple[float, np.ndarray, float]:
        """(document s per 1,000, question embeddings, question s per 1,000)."""
        key = (*docs, "\x00", *questions)
        if key not in self._seen:
            # A fresh rate even when the cache answered everything: straight through the model.
            p0 = time.perf_counter()
            emb.embedder.encode(docs)
            doc_per_1000_s = (time.perf_counter() - p0) / max(1, len(docs)) * 1000
            q0 = time.perf_counter()
            q = emb.embedder.encode(questions)
            q_per_1000_s = (time.perf_counter() - q0) / len(questions) * 1000
            self._seen[key] = (doc_per_1000_s, q, q_per_1000_s)
        return self._seen[key]
