"""Qdrant behind the index interface: embedded (qdrant-client's local mode) or a server.

Two spec strings:

- ``qdrant``: embedded, in this process, no server (``QdrantClient(":memory:")``). qdrant-client's
  local mode is a numpy brute-force search over the points (it builds no HNSW graph: that is the
  server's), so its recall is exact's and its speed is a full scan plus Python per query; it is
  the development path and the way to try a collection before it moves to a server. Persisted
  like the exact index: ``index.bin`` holds the float32 rows and a load upserts them again, not
  local mode's own ``path=`` storage, which pickles its points into SQLite (a reader that
  unpickles a file runs what the file says).
- ``qdrant+http://HOST:6333/COLLECTION`` (or ``qdrant+https://``; ``?m=32&ef_construct=200``
  sets the collection's HNSW graph when it is created): a Qdrant server, for corpora past one
  machine's memory or with several writers. The API key comes from ``$QDRANT_API_KEY``.
  ``index.bin`` then holds a pointer (URL, collection, dim, point count), and a load checks that
  the server's collection still has that many points. Search knob: ``ef`` (``hnsw_ef``).

Both rank by dot product of unit vectors (= cosine) and use positions as point ids, as every
index here does.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np

from scalelab.lab.core.errors import BadInputError, BadUsageError, RunFailedError, import_optional
from scalelab.system.retrieval.index import VectorIndex, as_rows

INSTALL_HINT = "pip install 'scalelab[retrieval]' (qdrant-client)"
API_KEY_ENV = "QDRANT_API_KEY"
LOCAL_COLLECTION = "scalelab"
UPSERT_BATCH = 512
"""Points per upsert call (one request to a server)."""
HNSW_OPTIONS = ("m", "ef_construct")


def _client_module() -> Any:
    return import_optional("qdrant_client", needed_for="qdrant indexes need qdrant-client",
                           hint=INSTALL_HINT)


def parse_server(url: str) -> tuple[str, str, dict[str, int]]:
    """'qdrant+http://h:6333/facts?m=32' -> ('http://h:6333', 'facts', {'m': 32}) (pure)."""
    u = urlsplit(url.removeprefix("qdrant+"))
    name = u.path.strip("/")
    fix = "use qdrant+http://HOST:6333/COLLECTION[?m=16&ef_construct=100]"
    if u.scheme not in ("http", "https") or not u.hostname or not name or "/" in name:
        raise BadUsageError(f"Qdrant server spec {url!r} is not a server URL and a collection; "
                            f"{fix}")
    opts: dict[str, int] = {}
    for k, v in parse_qsl(u.query, keep_blank_values=True):
        if k not in HNSW_OPTIONS or not v.isdigit() or int(v) < 1:
            raise BadUsageError(f"Qdrant option {k}={v!r}: use m=N and ef_construct=N with "
                                f"N >= 1; {fix}")
        opts[k] = int(v)
    return f"{u.scheme}://{u.netloc}", name, opts


class QdrantIndex(VectorIndex):
    """A Qdrant collection as an index: embedded (`server` None) or on a server. `fresh`: a
    new, empty index (a server's collection is created, and refused if it holds points);
    otherwise an existing collection is attached as it is."""

    def __init__(self, dim: int, server: str | None = None, *, fresh: bool = True) -> None:
        qc = _client_module()
        from qdrant_client import models

        self._models = models
        self.dim = dim
        self._search_params: Any = None
        self._ef: int | None = None
        if server is None:
            self.spec = "qdrant"
            self.url: str | None = None
            self.collection = LOCAL_COLLECTION
            self.hnsw: dict[str, int] = {}
            self._client = qc.QdrantClient(location=":memory:")
            self._create()
            self._n = 0
        else:
            self.spec = server
            self.url, self.collection, self.hnsw = parse_server(server)
            # check_compatibility's version probe runs in a thread of its own and only warns;
            # an unreachable or incompatible server fails the first call here instead, named.
            self._client = qc.QdrantClient(url=self.url, api_key=os.environ.get(API_KEY_ENV),
                                           timeout=30, check_compatibility=False)
            self._n = self._attach()
            if fresh and self._n:
                raise BadUsageError(f"Qdrant collection {self.collection!r} at {self.url} "
                                    f"already holds {self._n} points; a new index needs an "
                                    "empty one: name another collection in the spec or drop "
                                    "this one")

    @property
    def local(self) -> bool:
        return self.url is None

    # -- server calls: every failure names the server and what to do ------------------------
    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except (BadUsageError, BadInputError):
            raise
        except Exception as e:  # qdrant-client raises httpx, grpc and its own errors
            where = "embedded Qdrant" if self.local else f"Qdrant at {self.url}"
            hint = "" if self.local else (
                f"; is the server up, and ${API_KEY_ENV} set if it wants a key?")
            raise RunFailedError(f"{where}: {what} failed ({type(e).__name__}: "
                                 f"{str(e).strip()[:300]}){hint}") from None

    def _create(self) -> None:
        m = self._models
        hnsw = m.HnswConfigDiff(**self.hnsw) if self.hnsw else None
        self._call(f"creating collection {self.collection!r}", self._client.create_collection,
                   self.collection, vectors_config=m.VectorParams(size=self.dim,
                                                                  distance=m.Distance.DOT),
                   hnsw_config=hnsw)

    def _attach(self) -> int:
        """Create the server's collection, or check the one there (dim, dot product)."""
        exists = self._call("listing collections", self._client.collection_exists,
                            self.collection)
        if not exists:
            self._create()
            return 0
        info = self._call(f"reading collection {self.collection!r}",
                          self._client.get_collection, self.collection)
        params = info.config.params.vectors
        size = getattr(params, "size", None)
        dist = getattr(params, "distance", None)
        if size != self.dim or dist != self._models.Distance.DOT:
            raise BadInputError(f"Qdrant collection {self.collection!r} at {self.url} holds "
                                f"{size}-d vectors by {dist}, not {self.dim}-d by dot product; "
                                "choose another collection name in the spec")
        return self._count()

    def _count(self) -> int:
        r = self._call("counting points", self._client.count, self.collection, exact=True)
        return int(r.count)

    # -- the index interface --------------------------------------------------------------
    @property
    def ntotal(self) -> int:
        return self._n

    def add(self, x: np.ndarray) -> None:
        x = as_rows(x, self.dim, "vectors")
        for lo in range(0, x.shape[0], UPSERT_BATCH):
            part = x[lo:lo + UPSERT_BATCH]
            ids: list[Any] = list(range(self._n + lo, self._n + lo + part.shape[0]))
            self._call("adding points", self._client.upsert, self.collection,
                       points=self._models.Batch(ids=ids, vectors=part.tolist()), wait=True)
        self._n += x.shape[0]

    def _search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores = np.full((q.shape[0], k), -np.inf, np.float32)
        ids = np.full((q.shape[0], k), -1, np.int64)
        for i in range(q.shape[0]):
            r = self._call("searching", self._client.query_points, self.collection,
                           query=q[i], limit=k, with_payload=False,
                           search_params=self._search_params)
            for j, p in enumerate(r.points[:k]):
                scores[i, j] = p.score
                ids[i, j] = int(p.id)
        return scores, ids

    def reset(self) -> None:
        self._call(f"dropping collection {self.collection!r}", self._client.delete_collection,
                   self.collection)
        self._create()
        self._n = 0

    def set_params(self, **params: float) -> None:
        for k, v in params.items():
            if k != "ef":
                raise BadUsageError(f"{self.spec} takes only 'ef' (got {k!r})")
            if self.local:
                raise BadUsageError("embedded Qdrant (qdrant-client's local mode) searches "
                                    "every point exactly and has no 'ef'; it applies to a "
                                    "server: qdrant+http://HOST:6333/COLLECTION")
            self._ef = int(v)
            self._search_params = self._models.SearchParams(hnsw_ef=self._ef)

    def to_bytes(self) -> bytes:
        if self.local:
            return self.vectors().tobytes()
        return json.dumps({"url": self.url, "collection": self.collection, "dim": self.dim,
                           "ntotal": self._n}, sort_keys=True).encode()

    def vectors(self) -> np.ndarray:
        """Every point's vector in id order (read back from Qdrant, not a copy kept beside)."""
        out = np.zeros((self._n, self.dim), np.float32)
        offset: Any = None
        while True:
            recs, offset = self._call("reading points", self._client.scroll, self.collection,
                                      limit=1024, offset=offset, with_vectors=True,
                                      with_payload=False)
            for rec in recs:
                out[int(rec.id)] = rec.vector
            if offset is None:
                return out

    def memory_bytes(self) -> int:
        """Embedded: what local mode holds in this process (its vector matrix, grown by
        doubling, plus a Python id map, payload dict and flags per point). Server: the raw
        float32 vectors (the server's own memory is its /metrics' to tell)."""
        if not self.local:
            return self._n * self.dim * 4
        local = self._client._client.collections[self.collection]  # qdrant_client.local
        held = sum(int(a.nbytes) for a in local.vectors.values())
        held += int(local.deleted.nbytes)
        held += sum(int(a.nbytes) for a in local.deleted_per_vector.values())
        held += sys.getsizeof(local.ids) + sys.getsizeof(local.ids_inv)
        held += sys.getsizeof(local.payload) + sum(sys.getsizeof(p) for p in local.payload)
        held += sum(sys.getsizeof(i) for i in local.ids_inv)
        return held

    @classmethod
    def from_bytes(cls, dim: int, server: str | None, data: bytes) -> QdrantIndex:
        if server is None:
            if len(data) % (4 * dim):
                raise BadInputError(f"qdrant index data of {len(data)} bytes is not whole "
                                    f"{dim}-float rows")
            idx = cls(dim)
            idx.add(np.frombuffer(data, dtype=np.float32).reshape(-1, dim))
            return idx
        try:
            ptr = json.loads(data)
            int(ptr["ntotal"])
        except (ValueError, KeyError, TypeError) as e:
            raise BadInputError(f"qdrant server pointer cannot be read ({e})") from None
        idx = cls(dim, server, fresh=False)
        if (ptr.get("url"), ptr.get("collection")) != (idx.url, idx.collection):
            raise BadInputError(f"the saved pointer names {ptr.get('url')}/"
                                f"{ptr.get('collection')}, the spec {idx.url}/{idx.collection}")
        # A point count other than the manifest's is load_index's refusal (another writer,
        # or a dropped collection).
        return idx
