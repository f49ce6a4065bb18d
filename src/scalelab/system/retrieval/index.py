"""One small index interface over exact numpy, faiss, hnswlib and Qdrant (after faiss's `Index`).

Every index stores unit vectors and ranks by inner product (= cosine). Ids are positions: the
n-th vector added has id n-1, so a corpus that grows by appending keeps its ids and an index
grows by `add` without a rebuild. Indexes are named by a string the user can paste:

- ``exact`` numpy brute force (the recall reference; one matrix product per query batch);
- ``faiss:<factory>`` any faiss `index_factory` string with inner product: ``faiss:Flat``,
  ``faiss:HNSW32``, ``faiss:IVF64,PQ16``, ``faiss:IVF64,PQ32,RFlat`` ...;
- ``hnswlib:M=16,ef_construction=200``;
- ``qdrant`` (embedded, qdrant-client's local mode) or ``qdrant+http://HOST:6333/COLLECTION``
  (a Qdrant server), in `retrieval.qdrant`.

retrieval.factory turns a spec string into an index (this module is the interface and the
in-process libraries' indexes; the factory knows every kind, Qdrant's included).

Search-time knobs go through `set_params`: ``ef`` (HNSW's candidate list; faiss efSearch,
hnswlib ef), ``nprobe`` (IVF lists visited), ``k_factor`` (re-ranked candidates of a refine
stage). Incremental add: exact, Flat and IVF append (IVF assigns the new vectors to its trained
lists; no retraining); HNSW inserts into the graph.
"""

from __future__ import annotations

import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.lab.core.errors import BadInputError, BadUsageError, import_optional
from scalelab.system.retrieval.hnsw_file import check_hnswlib_bytes

INSTALL_HINT = "pip install 'scalelab[retrieval]' (faiss-cpu, hnswlib and qdrant-client)"
SEARCH_PARAMS = ("ef", "nprobe", "k_factor")


def _faiss() -> Any:
    return import_optional("faiss", needed_for="faiss indexes need faiss-cpu", hint=INSTALL_HINT)


def _hnswlib() -> Any:
    return import_optional("hnswlib", needed_for="hnswlib indexes need hnswlib",
                           hint=INSTALL_HINT)


def as_rows(x: np.ndarray, dim: int, what: str) -> np.ndarray:
    """`x` as C-contiguous float32 rows of `dim`, or BadInputError naming `what`."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    if a.ndim != 2 or a.shape[1] != dim:
        raise BadInputError(f"{what}: expected [n, {dim}] vectors, got shape {a.shape}")
    return a


class VectorIndex(ABC):
    """add / search / train / reset, ids by position, bytes for persistence."""

    spec: str
    dim: int

    @property
    @abstractmethod
    def ntotal(self) -> int: ...

    @property
    def needs_training(self) -> bool:
        return False

    def train(self, x: np.ndarray) -> None:
        """Learn what the index needs from sample vectors (a no-op for graph and flat ones)."""
        return None

    @abstractmethod
    def add(self, x: np.ndarray) -> None:
        """Append vectors; their ids continue from `ntotal`."""

    @abstractmethod
    def _search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores [m, k'], ids [m, k']) best first, k' = min(k, ntotal); cosine scores."""
        if k < 1:
            raise BadUsageError(f"k={k} must be >= 1")
        q = as_rows(q, self.dim, "queries")
        kk = min(k, self.ntotal)
        if kk == 0 or q.shape[0] == 0:
            return np.zeros((q.shape[0], 0), np.float32), np.zeros((q.shape[0], 0), np.int64)
        return self._search(q, kk)

    @abstractmethod
    def reset(self) -> None:
        """Drop every vector (a trained IVF keeps what it learned)."""

    def set_params(self, **params: float) -> None:
        """Search-time knobs (see the module docstring); unknown ones raise BadUsageError."""
        if params:
            raise BadUsageError(f"{self.spec} takes no search parameters "
                                f"(got {', '.join(params)})")

    @abstractmethod
    def to_bytes(self) -> bytes: ...

    def memory_bytes(self) -> int:
        """Bytes the index holds (its serialized size: vectors, codes, graph links)."""
        return len(self.to_bytes())


class ExactIndex(VectorIndex):
    """Brute force over a growing float32 matrix (amortised doubling, so add is O(new))."""

    def __init__(self, dim: int) -> None:
        self.spec = "exact"
        self.dim = dim
        self._x = np.zeros((0, dim), np.float32)
        self._n = 0

    @property
    def ntotal(self) -> int:
        return self._n

    def add(self, x: np.ndarray) -> None:
        x = as_rows(x, self.dim, "vectors")
        need = self._n + x.shape[0]
        if need > self._x.shape[0]:
            grown = np.zeros((max(need, 2 * self._x.shape[0], 1024), self.dim), np.float32)
            grown[:self._n] = self._x[:self._n]
            self._x = grown
        self._x[self._n:need] = x
        self._n = need

    def vectors(self) -> np.ndarray:
        return self._x[:self._n]

    def _search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        sims = q @ self.vectors().T
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k] if k < sims.shape[1] else \
            np.tile(np.arange(sims.shape[1]), (sims.shape[0], 1))
        ps = np.take_along_axis(sims, part, axis=1)
        # Ties broken by the lower id, so exact results are one well-defined list.
        order = np.lexsort((part, -ps), axis=1)
        ids = np.take_along_axis(part, order, axis=1).astype(np.int64)
        return np.take_along_axis(ps, order, axis=1).astype(np.float32), ids

    def reset(self) -> None:
        self._x = np.zeros((0, self.dim), np.float32)
        self._n = 0

    def to_bytes(self) -> bytes:
        return self.vectors().tobytes()

    def memory_bytes(self) -> int:
        return self._n * self.dim * 4

    @classmethod
    def from_bytes(cls, dim: int, data: bytes) -> ExactIndex:
        if len(data) % (4 * dim):
            raise BadInputError(f"exact index data of {len(data)} bytes is not whole "
                                f"{dim}-float rows")
        x = np.frombuffer(data, dtype=np.float32).reshape(-1, dim)
        # the rows are unit vectors (or zero, for a text with no features): anything else is
        # bytes that were never this index, even when a manifest vouches for them
        finite = bool(np.isfinite(x).all())
        norms = np.linalg.norm(x, axis=1) if finite else np.zeros(0, np.float32)
        if not finite or not ((np.abs(norms - 1.0) < 1e-3) | (norms == 0.0)).all():
            raise BadInputError(f"exact index data holds rows that are not unit vectors "
                                f"({dim} float32 each)")
        idx = cls(dim)
        idx.add(x)
        return idx


class FaissIndex(VectorIndex):
    """A faiss index from an index_factory string, inner-product metric."""

    def __init__(self, dim: int, factory: str, *, index: Any = None) -> None:
        faiss = _faiss()
        self.spec = f"faiss:{factory}"
        self.dim = dim
        self.factory = factory
        if index is None:
            try:
                index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
            except RuntimeError as e:
                raise BadUsageError(f"faiss cannot build {factory!r}: "
                                    f"{str(e).strip().splitlines()[-1]}; see faiss's "
                                    "index_factory strings (Flat, HNSW32, IVF64,PQ16)") from None
        self._index = index
        self._params: dict[str, float] = {}

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    @property
    def needs_training(self) -> bool:
        return not bool(self._index.is_trained)

    def train(self, x: np.ndarray) -> None:
        if self.needs_training:
            x = as_rows(x, self.dim, "training vectors")
            try:
                self._index.train(x)
            except RuntimeError as e:
                raise BadInputError(f"{self.spec} cannot train on {x.shape[0]} vectors: "
                                    f"{str(e).strip().splitlines()[-1]}") from None

    def add(self, x: np.ndarray) -> None:
        if self.needs_training:
            raise BadUsageError(f"{self.spec} must be trained before vectors are added")
        self._index.add(as_rows(x, self.dim, "vectors"))

    def _search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        d, i = self._index.search(q, k)
        return d.astype(np.float32), i.astype(np.int64)

    def reset(self) -> None:
        self._index.reset()

    def set_params(self, **params: float) -> None:
        faiss = _faiss()
        # faiss names a refine stage's factor k_factor_rf and IVFPQR's k_factor.
        names = {"ef": ("efSearch",), "nprobe": ("nprobe",),
                 "k_factor": ("k_factor_rf", "k_factor")}
        ps = faiss.ParameterSpace()
        for k, v in params.items():
            if k not in names:
                raise BadUsageError(f"unknown search parameter {k!r}; use "
                                    f"{', '.join(SEARCH_PARAMS)}")
            for name in names[k]:
                try:
                    ps.set_index_parameter(self._index, name, float(v))
                    break
                except RuntimeError:
                    continue
            else:
                raise BadUsageError(f"{self.spec} has no {k!r} parameter")
            self._params[k] = float(v)

    def to_bytes(self) -> bytes:
        return bytes(_faiss().serialize_index(self._index))

    @classmethod
    def from_bytes(cls, dim: int, factory: str, data: bytes) -> FaissIndex:
        faiss = _faiss()
        try:
            index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        except RuntimeError as e:
            raise BadInputError(f"faiss index data cannot be read ({e})") from None
        if index.d != dim:
            raise BadInputError(f"faiss index has dim {index.d}, expected {dim}")
        return cls(dim, factory, index=index)


def _parse_kv(text: str, allowed: dict[str, int]) -> dict[str, int]:
    out = dict(allowed)
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, sep, v = part.partition("=")
        if not sep or k not in allowed or not v.isdigit() or int(v) < 1:
            raise BadUsageError(f"hnswlib option {part!r}: use "
                                f"{', '.join(f'{a}=N' for a in allowed)} with N >= 1")
        out[k] = int(v)
    return out


class HnswlibIndex(VectorIndex):
    """hnswlib's HNSW, inner-product space; grows its capacity by doubling."""

    def __init__(self, dim: int, options: str = "", *, index: Any = None) -> None:
        self.opts = _parse_kv(options, {"M": 16, "ef_construction": 200})
        self.spec = "hnswlib:" + ",".join(f"{k}={v}" for k, v in self.opts.items())
        self.dim = dim
        self._ef = 50
        if index is None:
            index = _hnswlib().Index(space="ip", dim=dim)
            index.init_index(max_elements=1024, M=self.opts["M"],
                             ef_construction=self.opts["ef_construction"], random_seed=100)
        self._index = index
        self._index.set_ef(self._ef)

    @property
    def ntotal(self) -> int:
        return int(self._index.get_current_count())

    def add(self, x: np.ndarray) -> None:
        x = as_rows(x, self.dim, "vectors")
        need = self.ntotal + x.shape[0]
        cap = int(self._index.get_max_elements())
        if need > cap:
            self._index.resize_index(max(need, 2 * cap))
        # One thread: insertion order is then the id order, so adding in two steps builds the
        # same graph as adding everything at once.
        self._index.add_items(x, np.arange(self.ntotal, need), num_threads=1)

    def _search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self._ef < k:
            self._index.set_ef(k)
        try:
            labels, dist = self._index.knn_query(q, k=k, num_threads=1)
        finally:
            self._index.set_ef(self._ef)
        return (1.0 - dist).astype(np.float32), labels.astype(np.int64)

    def reset(self) -> None:
        fresh = _hnswlib().Index(space="ip", dim=self.dim)
        fresh.init_index(max_elements=1024, M=self.opts["M"],
                         ef_construction=self.opts["ef_construction"], random_seed=100)
        self._index = fresh
        self._index.set_ef(self._ef)

    def set_params(self, **params: float) -> None:
        for k, v in params.items():
            if k != "ef":
                raise BadUsageError(f"{self.spec} takes only 'ef' (got {k!r})")
            self._ef = int(v)
            self._index.set_ef(self._ef)

    def to_bytes(self) -> bytes:
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "index.bin"
            self._index.save_index(str(p))
            return p.read_bytes()

    @classmethod
    def from_bytes(cls, dim: int, options: str, data: bytes) -> HnswlibIndex:
        hl = _hnswlib()
        check_hnswlib_bytes(data, dim, _parse_kv(options, {"M": 16, "ef_construction": 200})["M"])
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "index.bin"
            p.write_bytes(data)
            index = hl.Index(space="ip", dim=dim)
            try:
                index.load_index(str(p))
            except (RuntimeError, ValueError, MemoryError) as e:
                raise BadInputError(f"hnswlib index data cannot be read ({e})") from None
        return cls(dim, options, index=index)


def ivf_lists(n: int) -> int:
    """IVF list count for n vectors: ~4 sqrt(n), a power of two, with >= 39 points per list
    (faiss's k-means warns below that)."""
    target = max(1, min(int(4 * np.sqrt(n)), n // 39))
    return 1 << max(0, int(np.floor(np.log2(target))))


def limit_threads(n: int | None) -> None:
    """Pin faiss's OpenMP pool (one thread for ann-benchmarks-style timing)."""
    if n is None:
        return
    try:
        import faiss
    except ImportError:
        return
    faiss.omp_set_num_threads(n)
