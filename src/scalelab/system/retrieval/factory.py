"""Indexes by the string a user pastes (after faiss's `index_factory`): `exact`,
`faiss:<factory>`, `hnswlib:M=16,ef_construction=200`, `qdrant` or
`qdrant+http://HOST:6333/COLLECTION` (see retrieval.index for what each is).
"""

from __future__ import annotations

import numpy as np

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.retrieval.index import ExactIndex, FaissIndex, HnswlibIndex, VectorIndex
from scalelab.system.retrieval.qdrant import QdrantIndex, parse_server


def parse_spec(spec: str) -> tuple[str, str]:
    """'faiss:HNSW32' -> ('faiss', 'HNSW32'); 'exact' -> ('exact', ''); 'qdrant' -> ('qdrant',
    ''); 'qdrant+http://h:6333/c' -> ('qdrant', 'qdrant+http://h:6333/c') (the server)."""
    spec = spec.strip()
    if spec in ("exact", "qdrant"):
        return spec, ""
    if spec.startswith(("qdrant+http://", "qdrant+https://")):
        parse_server(spec)
        return "qdrant", spec
    lib, _, rest = spec.partition(":")
    if lib in ("faiss", "hnswlib") and (rest or lib == "hnswlib"):
        return lib, rest
    raise BadUsageError(f"unknown index {spec!r}; use exact, faiss:<factory string> "
                        "(faiss:Flat, faiss:HNSW32, faiss:IVF64,PQ16), "
                        "hnswlib:M=16,ef_construction=200, qdrant (embedded) or "
                        "qdrant+http://HOST:6333/COLLECTION (a Qdrant server)")


def make_index(spec: str, dim: int) -> VectorIndex:
    """An empty index from its spec string."""
    lib, rest = parse_spec(spec)
    if lib == "exact":
        return ExactIndex(dim)
    if lib == "faiss":
        return FaissIndex(dim, rest)
    if lib == "qdrant":
        return QdrantIndex(dim, rest or None)
    return HnswlibIndex(dim, rest)


def index_from_bytes(spec: str, dim: int, data: bytes) -> VectorIndex:
    lib, rest = parse_spec(spec)
    if lib == "exact":
        return ExactIndex.from_bytes(dim, data)
    if lib == "faiss":
        return FaissIndex.from_bytes(dim, rest, data)
    if lib == "qdrant":
        return QdrantIndex.from_bytes(dim, rest or None, data)
    return HnswlibIndex.from_bytes(dim, rest, data)


def build_index(spec: str, vectors: np.ndarray, *, train_sample: int = 50_000,
                seed: int = 0) -> VectorIndex:
    """An index holding `vectors` (trained on a seeded sample first when it needs training)."""
    idx = make_index(spec, vectors.shape[1])
    if idx.needs_training:
        rng = np.random.default_rng(seed)
        n = vectors.shape[0]
        sample = vectors if n <= train_sample else vectors[rng.choice(n, train_sample,
                                                                      replace=False)]
        idx.train(sample)
    idx.add(vectors)
    return idx
