"""Index persistence: one directory per index, a manifest with its lineage, refusal of bad files.

    INDEX_DIR/index.bin       the index's own bytes (numpy rows, faiss serialize_index, hnswlib)
    INDEX_DIR/manifest.json   spec, dim, embedder, vector count, the corpus (path + digest) it was
                              built from, the file's size and sha256

The file is written first and the manifest last (each atomically), so a crash between them
leaves a manifest that does not match and the index is refused, not half-read. Loading checks
size and sha256 *before* the bytes reach faiss or hnswlib (their readers trust their input: a
truncated file can crash the process or read garbage). `open_or_rebuild` turns a refusal into a
rebuild from the corpus, so a corrupted index is never served.

Saving registers corpus -> index in the lineage store, so `scalelab lineage impacted CORPUS`
names every index to rebuild when the corpus changes.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.lineage.manifest import (
    MANIFEST_FILE,
    Manifest,
    atomic_write_bytes,
    file_digest,
    file_entry,
    read_manifest,
    write_manifest,
)
from scalelab.layers.lineage.store import LineageStore
from scalelab.system.retrieval.factory import index_from_bytes
from scalelab.system.retrieval.index import VectorIndex

INDEX_FILE = "index.bin"


class IndexCorruptError(BadInputError):
    """An index file that does not match its manifest (truncated, corrupted or replaced)."""


@dataclass(frozen=True, kw_only=True)
class IndexInfo:
    """What the manifest says about an index on disk."""

    path: Path
    spec: str
    dim: int
    embedder: str
    ntotal: int
    corpus: dict[str, Any]
    """{'path', 'digest', 'docs'} of the corpus the vectors came from."""
    search_params: dict[str, float]
    build_s: float | None


def save_index(index: VectorIndex, directory: str | os.PathLike[str], *, embedder: str,
               corpus_dir: str | os.PathLike[str] | None, corpus_digest: str | None,
               build_s: float | None = None, lineage: LineageStore | None = None,
               search_params: dict[str, float] | None = None) -> Path:
    """Write the index and its manifest; register corpus -> index in `lineage` if given."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    data = index.to_bytes()
    atomic_write_bytes(d / INDEX_FILE, data)
    entry = file_entry(file_digest(d / INDEX_FILE))
    m = Manifest(
        kind="index", name=f"{index.spec} over {embedder}", digest=entry["digest"],
        rows=index.ntotal, files={INDEX_FILE: entry},
        inputs=[{"path": str(Path(corpus_dir).resolve()), "digest": corpus_digest,
                 "kind": "corpus"}] if corpus_dir else [],
        parameters={"spec": index.spec, "dim": index.dim, "embedder": embedder,
                    "search_params": dict(search_params or {})},
        extras={"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                "build_s": build_s})
    write_manifest(d, m)
    if lineage is not None and corpus_dir is not None:
        lineage.record(output=d, inputs=[corpus_dir], kind="index")
    return d


def index_info(directory: str | os.PathLike[str]) -> IndexInfo:
    d = Path(directory)
    if not (d / MANIFEST_FILE).is_file():
        raise BadInputError(f"{d} holds no index (no {MANIFEST_FILE}); build one with "
                            "'scalelab retrieval index --corpus DIR --out DIR'")
    m = read_manifest(d)
    if m.kind != "index":
        raise BadInputError(f"{d} holds a {m.kind!r}, not an index")
    p = m.parameters
    inp = m.inputs[0] if m.inputs else {}
    return IndexInfo(path=d, spec=str(p["spec"]), dim=int(p["dim"]),
                     embedder=str(p["embedder"]), ntotal=int(m.rows or 0),
                     corpus={"path": inp.get("path"), "digest": inp.get("digest")},
                     search_params={k: float(v) for k, v in
                                    dict(p.get("search_params") or {}).items()},
                     build_s=m.extras.get("build_s"))


def load_index(directory: str | os.PathLike[str]) -> tuple[VectorIndex, IndexInfo]:
    """The index in DIRECTORY, after checking its file against the manifest.

    Raises IndexCorruptError for a missing, truncated or altered file (never hands such bytes
    to the library)."""
    info = index_info(directory)
    m = read_manifest(directory)
    p = Path(directory) / INDEX_FILE
    fix = (f"rebuild it: scalelab retrieval index --corpus {info.corpus.get('path') or 'DIR'} "
           f"--out {directory} --index {info.spec}")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise IndexCorruptError(f"{p} is missing; {fix}") from None
    want = int(m.extras.get("bytes", -1))
    if len(data) != want:
        raise IndexCorruptError(f"{p} has {len(data)} bytes, its manifest says {want} "
                                f"(truncated or replaced); {fix}")
    if hashlib.sha256(data).hexdigest() != m.extras.get("sha256"):
        raise IndexCorruptError(f"{p} does not match its manifest's sha256 (corrupted); {fix}")
    try:
        index = index_from_bytes(info.spec, info.dim, data)
    except IndexCorruptError:
        raise
    except BadInputError as e:  # bytes that match the manifest yet are not this index
        raise IndexCorruptError(f"{p} matches its manifest but is not a {info.spec} index "
                                f"({e}); {fix}") from None
    if index.ntotal != info.ntotal:
        raise IndexCorruptError(f"{p} holds {index.ntotal} vectors, its manifest says "
                                f"{info.ntotal}; {fix}")
    if info.search_params:
        index.set_params(**info.search_params)
    return index, info


@dataclass(frozen=True, kw_only=True)
class Opened:
    index: VectorIndex
    info: IndexInfo
    rebuilt: bool
    reason: str | None
    """Why it was rebuilt (the refusal's message), None when loaded as saved."""
    load_s: float


def open_or_rebuild(directory: str | os.PathLike[str], rebuild: Any) -> Opened:
    """Load the index; if it is refused as corrupt, call `rebuild()` (which must save a fresh
    one into `directory`) and load that. A corrupt file is never returned."""
    t0 = time.perf_counter()
    try:
        index, info = load_index(directory)
        return Opened(index=index, info=info, rebuilt=False, reason=None,
                      load_s=time.perf_counter() - t0)
    except IndexCorruptError as e:
        reason = str(e)
    rebuild()
    index, info = load_index(directory)
    return Opened(index=index, info=info, rebuilt=True, reason=reason,
                  load_s=time.perf_counter() - t0)
