"""Manifests: what a dataset or model is, by content, written beside it.

A manifest (``manifest.json``) records a **content digest** that changes when any single cell
changes, the row count, the schema, the inputs' digests, the code version, the parameters and a
validation summary. Digests are computed per *part* so they stay cheap and can say *where* a file
changed:

- Parquet files: one part per row group; a part's digest is the SHA-256 of the row group's
  column names, types and canonical value bytes (validity bits + values with nulls zeroed;
  strings as offsets + bytes), so it depends on the values and types only, not on the writer
  (polars or pyarrow), compression, page layout or whether an all-valid bitmap was stored.
- Any other file (CSV, JSONL, zip, weights): one part per block of ``LINES_PER_PART`` lines
  (text) or ``BYTES_PER_PART`` bytes (binary), hashed as bytes.

The whole-file digest is the SHA-256 of the ordered part digests; a directory's digest is the
SHA-256 of its files' (relative name, digest) pairs. Hashing a row group costs one decode of it;
the alternative (hashing file bytes) would change with the compression codec and say nothing
about which rows moved.

Writes are atomic (temp file in the same directory + fsync + rename + directory fsync): a reader
sees the old manifest or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.jsonfile import read_json_object

MANIFEST_FILE = "manifest.json"
LINES_PER_PART = 65_536
"""Lines per digest part of a text file: small enough to localise a change, large enough that
a 3-million-line CSV has ~50 parts."""
BYTES_PER_PART = 8 * 1024 * 1024
"""Bytes per digest part of a binary (non-text, non-Parquet) file."""


@dataclass(frozen=True, kw_only=True)
class ContentDigest:
    """The content digest of one file, and of each of its parts."""

    digest: str
    """sha256 hex of the ordered part digests (prefixed by the part unit)."""
    parts: list[str]
    """One sha256 hex per part (row group, line block or byte block), in file order."""
    unit: str
    """'row_group', 'lines' or 'bytes': what a part is."""
    rows: int | None = None
    """Rows in a Parquet file (None for other files)."""

    def changed_parts(self, old_parts: list[str]) -> list[int]:
        """Indices of parts that differ from `old_parts` (added or removed parts included)."""
        n = max(len(self.parts), len(old_parts))
        return [
            i for i in range(n)
            if i >= len(self.parts) or i >= len(old_parts) or self.parts[i] != old_parts[i]
        ]


def _combine(unit: str, parts: list[str]) -> str:
    h = hashlib.sha256(unit.encode())
    for p in parts:
        h.update(bytes.fromhex(p))
    return h.hexdigest()


def _hash_column(h: Any, arr: Any) -> None:
    """Feed one column's canonical bytes to `h`: validity, then values with nulls zeroed.

    Arrow buffers are not canonical (a writer may or may not store an all-valid bitmap, slices
    keep offsets), so validity is hashed as packed bits (or a marker when there are no nulls)
    and values through zero-copy views; nested types fall back to Arrow IPC bytes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.null_count:
        h.update(np.packbits(pc.is_valid(arr).to_numpy(zero_copy_only=False)).tobytes())
    else:
        h.update(b"all-valid")
    t = arr.type
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_string_view(t)
            or pa.types.is_binary_view(t)):
        b = arr.cast(pa.large_binary())
        if b.null_count:
            b = pc.fill_null(b, b"")
        offs = np.frombuffer(b.buffers()[1], dtype=np.int64)[b.offset:b.offset + len(b) + 1]
        h.update((offs - offs[0]).tobytes() if offs[0] else offs.tobytes())
        data = b.buffers()[2]
        if data is not None:
            h.update(memoryview(data)[int(offs[0]):int(offs[-1])])
        return
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        # Arrow casts these 32-bit temporals to int32 only (int64 raises).
        arr = arr.cast(pa.int32())
    elif pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or \
            pa.types.is_duration(t):
        arr = arr.cast(pa.int64())
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or \
            pa.types.is_boolean(arr.type):
        if arr.null_count:
            arr = pc.fill_null(arr, False if pa.types.is_boolean(arr.type) else 0)
        h.update(np.ascontiguousarray(arr.to_numpy(zero_copy_only=False)))
        return
    sink = pa.BufferOutputStream()
    tbl = pa.table({"c": arr})
    with pa.ipc.new_stream(sink, tbl.schema) as w:
        w.write_table(tbl)
    h.update(sink.getvalue().to_pybytes())


def table_digest(table: Any) -> str:
    """SHA-256 of a table's values and types (column names, type names, canonical values)."""
    h = hashlib.sha256()
    h.update(str(table.num_rows).encode())
    for name, col in zip(table.column_names, table.columns, strict=True):
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        h.update(b"\0" + name.encode() + b"\0" + str(col.type).encode() + b"\0")
        _hash_column(h, arr)
    return h.hexdigest()


def parquet_digest(path: str | os.PathLike[str]) -> ContentDigest:
    """Digest a Parquet file per row group (values and types only)."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError variants
        raise BadInputError(f"{path}: not a readable Parquet file ({e}); re-create it") from e
    parts = [table_digest(pf.read_row_group(i)) for i in range(pf.num_row_groups)]
    if not parts:  # an empty table: polars writes no row group, pyarrow one empty one
        parts = [table_digest(pf.read())]
    return ContentDigest(digest=_combine("row_group", parts), parts=parts, unit="row_group",
                         rows=pf.metadata.num_rows)


def table_row_group_digest(table: Any, row_group_size: int) -> ContentDigest:
    """The digest `parquet_digest` will give for TABLE written with ROW_GROUP_SIZE rows per
    row group (polars' and pyarrow's writers cut row groups at exact multiples), computed from
    memory so a writer need not read its file back; tests check the two agree."""
    n = table.num_rows
    parts = [table_digest(table.slice(i, row_group_size)) for i in range(0, n, row_group_size)]
    if not parts:
        parts = [table_digest(table)]
    return ContentDigest(digest=_combine("row_group", parts), parts=parts, unit="row_group",
                         rows=n)


def _is_text(path: Path) -> bool:
    return path.suffix.lower() in {".csv", ".tsv", ".jsonl", ".ndjson", ".json", ".txt"}


def _line_block_digests(p: Path, chunk_bytes: int = 16 * 1024 * 1024) -> list[str]:
    """sha256 of each block of LINES_PER_PART lines, reading big chunks (numpy finds the
    newlines: a Python loop over lines costs ~1 s per million lines)."""
    import numpy as np

    parts: list[str] = []
    h = hashlib.sha256()
    in_block = 0
    pending = False
    with p.open("rb") as f:
        while chunk := f.read(chunk_bytes):
            nl = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
            start = 0
            while True:
                need = LINES_PER_PART - in_block
                if len(nl) < need:
                    h.update(chunk[start:])
                    in_block += len(nl)
                    pending = pending or start < len(chunk)
                    break
                end = int(nl[need - 1]) + 1
                h.update(chunk[start:end])
                parts.append(h.hexdigest())
                h, in_block, pending = hashlib.sha256(), 0, False
                start = end
                nl = nl[need:]
    if pending or not parts:
        parts.append(h.hexdigest())
    return parts


def file_digest(path: str | os.PathLike[str]) -> ContentDigest:
    """Digest any file: Parquet per row group, text per line block, others per byte block."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(f"{p} is not a file; pass an existing file or dataset directory")
    if p.suffix.lower() == ".parquet":
        return parquet_digest(p)
    parts: list[str] = []
    if _is_text(p):
        parts = _line_block_digests(p)
        return ContentDigest(digest=_combine("lines", parts), parts=parts, unit="lines")
    with p.open("rb") as f:
        while True:
            block = f.read(BYTES_PER_PART)
            if not block and parts:
                break
            parts.append(hashlib.sha256(block).hexdigest())
            if not block:
                break
    return ContentDigest(digest=_combine("bytes", parts), parts=parts, unit="bytes")


def dir_digest(path: str | os.PathLike[str], *, skip: tuple[str, ...] = (MANIFEST_FILE,)
               ) -> tuple[str, dict[str, ContentDigest]]:
    """Digest every file under a directory (names relative, sorted); hidden files and `skip`
    are left out. Returns (directory digest, {relative name: file digest})."""
    root = Path(path)
    if not root.is_dir():
        raise BadInputError(f"{root} is not a directory")
    files: dict[str, ContentDigest] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or p.name in skip or any(s.startswith(".") for s in rel.split("/")):
            continue
        files[rel] = file_digest(p)
    return directory_digest(files), files


def directory_digest(files: dict[str, ContentDigest]) -> str:
    """The digest of a directory from its files' digests ({relative name: digest}, any order)."""
    h = hashlib.sha256(b"dir")
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + bytes.fromhex(files[rel].digest))
    return h.hexdigest()


def combine_digests(named: dict[str, str]) -> str:
    """One digest for several named digests (order-independent: names are sorted)."""
    h = hashlib.sha256(b"set")
    for name in sorted(named):
        h.update(name.encode() + b"\0" + bytes.fromhex(named[name]))
    return h.hexdigest()


def git_commit(start: str | os.PathLike[str] | None = None) -> str | None:
    """The git commit of the checkout holding `start` (default: this package), or None."""
    where = Path(start) if start else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else None


def code_version() -> dict[str, str | None]:
    """{'scalelab': version, 'git_commit': sha or None}."""
    from scalelab import __version__

    return {"scalelab": __version__, "git_commit": git_commit()}


@dataclass(kw_only=True)
class Manifest:
    """What a dataset or model is. Serialised as manifest.json beside it."""

    kind: str
    """'dataset' or 'model' (or another artifact kind)."""
    name: str
    """A human name (e.g. 'flights-x5')."""
    digest: str
    """Content digest of the artifact (combined over `files`)."""
    rows: int | None = None
    """Total rows (datasets), None for models."""
    schema: dict[str, str] = field(default_factory=dict)
    """Column -> type name of the main table(s)."""
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Relative file name -> {'digest', 'parts', 'unit', 'rows'}."""
    inputs: list[dict[str, Any]] = field(default_factory=list)
    """Each input: {'path', 'digest', 'kind', ...} (the lineage edges into this artifact)."""
    code: dict[str, str | None] = field(default_factory=code_version)
    """scalelab version and git commit that produced it."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """Everything that determined the content (seed, scale, defects, split cutoff, ...)."""
    validation: dict[str, Any] = field(default_factory=dict)
    """Validation summary: quarantined rows by rule/column, reconciliation, anomalies."""
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    extras: dict[str, Any] = field(default_factory=dict)
    """Anything else (timings, statistics digests, ...)."""

    def __post_init__(self) -> None:
        if not self.kind or not self.name:
            raise BadInputError("a manifest needs a kind and a name")
        if len(self.digest) != 64:
            raise BadInputError(f"manifest digest {self.digest!r} is not a sha256 hex digest")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def file_entry(d: ContentDigest) -> dict[str, Any]:
    """The manifest `files` entry for one file digest."""
    return {"digest": d.digest, "parts": d.parts, "unit": d.unit, "rows": d.rows}


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically and durably (temp + fsync + rename + dir fsync)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            # mkstemp creates 0600; a manifest is as readable as the data beside it.
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(p.parent)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename in it survives a crash (no-op where unsupported)."""
    try:
        dfd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode("utf-8"))


def write_manifest(directory: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write DIRECTORY/manifest.json atomically; returns its path."""
    p = Path(directory) / MANIFEST_FILE
    atomic_write_json(p, manifest.to_dict())
    return p


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a manifest from a directory (its manifest.json) or a manifest file."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_FILE
    obj = read_json_object(p, fix="is this a scalelab dataset or model? re-create its manifest")
    known = {f for f in Manifest.__dataclass_fields__}
    try:
        return Manifest(**{k: v for k, v in obj.items() if k in known})
    except TypeError as e:
        raise BadInputError(f"{p}: manifest lacks a field ({e})") from e
