"""The lineage store: which sources, datasets and models came from which (embedded SQLite, WAL).

Nodes are artifact *versions*: (path, content digest). Edges say "input -> output". Any part
registers what it wrote, after the atomic rename that published it (a half-written output is
never registered: `record` refuses a path that does not exist and digests what is on disk)::

    from scalelab.layers.lineage.store import LineageStore

    store = LineageStore()                       # $SCALELAB_LINEAGE or ./.scalelab/lineage.db
    store.record(output="REPO/flights/3", inputs=["out/flights-x5"], kind="model")
    store.impacted("gen/x5/flights/part-c000-m01.csv")   # -> Impact: what to rebuild

`record(output=PATH, inputs=[PATH, ...], kind=None)` digests each path with
`scalelab.layers.lineage.manifest` (a directory: every file but manifest.json and hidden files; a
file: per row group or line block), stores the directory's manifest.json (if any) with the node, and
adds the edges. `kind` defaults to the manifest's "kind", else "dataset" for a directory and
"source" for a file. Recording the same (path, digest) twice is a no-op that marks it latest.

`impacted(SOURCE)` compares SOURCE's current digest with the latest one recorded for that path;
if it differs, it returns every downstream node (datasets and models, breadth-first, each once)
and which parts (Parquet row groups, or 65,536-line blocks of text files) changed.

Concurrency: SQLite in WAL mode with a 30 s busy timeout; each `record` is one IMMEDIATE
transaction, so several processes may record at once.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.lineage.manifest import MANIFEST_FILE, ContentDigest, dir_digest, file_digest

ENV_VAR = "SCALELAB_LINEAGE"
DEFAULT_PATH = Path(".scalelab") / "lineage.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    path TEXT NOT NULL,
    digest TEXT NOT NULL,
    parts TEXT NOT NULL,
    manifest TEXT,
    created_at TEXT NOT NULL,
    seq INTEGER NOT NULL,
    UNIQUE (path, digest)
);
CREATE TABLE IF NOT EXISTS edges (
    src INTEGER NOT NULL REFERENCES nodes(id),
    dst INTEGER NOT NULL REFERENCES nodes(id),
    created_at TEXT NOT NULL,
    PRIMARY KEY (src, dst)
);
CREATE INDEX IF NOT EXISTS nodes_path ON nodes(path);
CREATE INDEX IF NOT EXISTS edges_src ON edges(src);
"""


def default_lineage_path() -> Path:
    """$SCALELAB_LINEAGE if set, else ./.scalelab/lineage.db."""
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else DEFAULT_PATH


@dataclass(frozen=True, kw_only=True)
class Node:
    """One recorded artifact version."""

    id: int
    kind: str
    path: str
    digest: str
    parts: dict[str, list[str]]
    """Relative file name ('' for a plain file) -> part digests."""
    created_at: str
    manifest: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "path": self.path, "digest": self.digest,
                "created_at": self.created_at}


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What a path holds now: its digest and its parts, per file."""

    kind: str
    digest: str
    parts: dict[str, list[str]]
    units: dict[str, str]
    manifest: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Impact:
    """The answer to 'SOURCE changed: what must be rebuilt?'."""

    source: str
    recorded_digest: str
    current_digest: str | None
    """None when SOURCE no longer exists."""
    changed: bool
    changed_parts: dict[str, list[int]] = field(default_factory=dict)
    """File ('' for a plain file) -> indices of parts that changed."""
    part_unit: dict[str, str] = field(default_factory=dict)
    """File -> what a part is ('row_group', 'lines' = 65,536-line block, 'bytes')."""
    downstream: list[dict[str, Any]] = field(default_factory=list)
    """Every dataset/model built (transitively) from the recorded SOURCE, breadth-first."""


def _canon(path: str | os.PathLike[str]) -> str:
    return str(Path(path).expanduser().resolve())


def snapshot(path: str | os.PathLike[str], kind: str | None = None) -> Snapshot:
    """Digest a path as it is on disk now (see module docstring)."""
    p = Path(path)
    if p.is_dir():
        digest, files = dir_digest(p)
        manifest: dict[str, Any] | None = None
        mp = p / MANIFEST_FILE
        if mp.is_file():
            try:
                manifest = json.loads(mp.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise BadInputError(f"{mp}: not JSON ({e}); fix or remove it") from e
        k = kind or (manifest or {}).get("kind") or "dataset"
        return Snapshot(kind=str(k), digest=digest, parts={n: d.parts for n, d in files.items()},
                        units={n: d.unit for n, d in files.items()}, manifest=manifest)
    if p.is_file():
        d: ContentDigest = file_digest(p)
        return Snapshot(kind=kind or "source", digest=d.digest, parts={"": d.parts},
                        units={"": d.unit})
    raise BadInputError(
        f"{p} does not exist; lineage records only published files or directories")


class LineageStore:
    """The embedded lineage graph (see module docstring for the API and guarantees)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_lineage_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.executescript(_SCHEMA)
        except (OSError, sqlite3.DatabaseError) as e:
            raise BadInputError(
                f"lineage store {self.path} cannot be opened ({e}); pass --lineage PATH to a "
                f"writable SQLite file or set {ENV_VAR}") from e

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            yield db
        finally:
            db.close()

    # -- writing -----------------------------------------------------------------------------

    def _upsert(self, db: sqlite3.Connection, path: str, snap: Snapshot) -> int:
        (seq,) = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM nodes").fetchone()
        row = db.execute("SELECT id FROM nodes WHERE path = ? AND digest = ?",
                         (path, snap.digest)).fetchone()
        if row:
            db.execute("UPDATE nodes SET seq = ? WHERE id = ?", (seq, row[0]))
            return int(row[0])
        cur = db.execute(
            "INSERT INTO nodes (kind, path, digest, parts, manifest, created_at, seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (snap.kind, path, snap.digest, json.dumps(snap.parts),
             json.dumps(snap.manifest) if snap.manifest is not None else None,
             datetime.now(UTC).isoformat(), seq))
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def record(self, *, output: str | os.PathLike[str],
               inputs: Sequence[str | os.PathLike[str]] = (), kind: str | None = None,
               input_kind: str | None = None) -> Node:
        """Register OUTPUT (as it is on disk now) as built from INPUTS; returns OUTPUT's node.

        Call it only after OUTPUT is published (atomically renamed into place)."""
        in_snaps = [(_canon(i), snapshot(i, input_kind)) for i in inputs]
        out_path = _canon(output)
        out_snap = snapshot(output, kind)
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                in_ids = [self._upsert(db, p, s) for p, s in in_snaps]
                out_id = self._upsert(db, out_path, out_snap)
                now = datetime.now(UTC).isoformat()
                for src in in_ids:
                    if src == out_id:
                        raise BadInputError(f"{out_path} cannot be its own input")
                    db.execute("INSERT OR IGNORE INTO edges (src, dst, created_at) "
                               "VALUES (?, ?, ?)", (src, out_id, now))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        node = self.node(out_id)
        assert node is not None
        return node

    # -- reading -----------------------------------------------------------------------------

    @staticmethod
    def _node(row: tuple[Any, ...]) -> Node:
        return Node(id=row[0], kind=row[1], path=row[2], digest=row[3],
                    parts=json.loads(row[4]), manifest=json.loads(row[5]) if row[5] else None,
                    created_at=row[6])

    _COLS = "id, kind, path, digest, parts, manifest, created_at"

    def node(self, node_id: int) -> Node | None:
        with self._connect() as db:
            row = db.execute(f"SELECT {self._COLS} FROM nodes WHERE id = ?",
                             (node_id,)).fetchone()
        return self._node(row) if row else None

    def latest(self, path: str | os.PathLike[str]) -> Node | None:
        """The most recently recorded version of PATH, or None."""
        with self._connect() as db:
            row = db.execute(f"SELECT {self._COLS} FROM nodes WHERE path = ? "
                             "ORDER BY seq DESC LIMIT 1", (_canon(path),)).fetchone()
        return self._node(row) if row else None

    def nodes(self) -> list[Node]:
        with self._connect() as db:
            rows = db.execute(f"SELECT {self._COLS} FROM nodes ORDER BY id").fetchall()
        return [self._node(r) for r in rows]

    def edges(self) -> list[tuple[int, int]]:
        with self._connect() as db:
            return [(int(a), int(b)) for a, b in
                    db.execute("SELECT src, dst FROM edges ORDER BY src, dst").fetchall()]

    def graph(self) -> dict[str, Any]:
        """{'nodes': [...], 'edges': [{'src', 'dst'}]} for printing or JSON."""
        return {"store": str(self.path), "nodes": [n.summary() for n in self.nodes()],
                "edges": [{"src": a, "dst": b} for a, b in self.edges()]}

    def downstream(self, node_id: int) -> list[Node]:
        """Every node reachable from NODE_ID along edges, breadth-first, each once."""
        edges = self.edges()
        children: dict[int, list[int]] = {}
        for a, b in edges:
            children.setdefault(a, []).append(b)
        seen: set[int] = {node_id}
        order: list[int] = []
        frontier = [node_id]
        while frontier:
            nxt: list[int] = []
            for n in frontier:
                for c in children.get(n, []):
                    if c not in seen:
                        seen.add(c)
                        order.append(c)
                        nxt.append(c)
            frontier = nxt
        out = [self.node(i) for i in order]
        return [n for n in out if n is not None]

    def impacted(self, source: str | os.PathLike[str]) -> Impact:
        """What must be rebuilt because SOURCE no longer matches its recorded digest."""
        rec = self.latest(source)
        if rec is None:
            known = sorted({n.path for n in self.nodes() if n.kind == "source"})[:5]
            hint = f" (recorded sources include: {', '.join(known)})" if known else ""
            raise BadInputError(f"{_canon(source)} is not in the lineage store {self.path}{hint}")
        p = Path(rec.path)
        if not p.exists():
            return Impact(source=rec.path, recorded_digest=rec.digest, current_digest=None,
                          changed=True, downstream=[n.summary() for n in self.downstream(rec.id)])
        now = snapshot(p, rec.kind)
        if now.digest == rec.digest:
            return Impact(source=rec.path, recorded_digest=rec.digest, current_digest=now.digest,
                          changed=False)
        changed: dict[str, list[int]] = {}
        for name in sorted(set(now.parts) | set(rec.parts)):
            new, old = now.parts.get(name, []), rec.parts.get(name, [])
            if new != old:
                changed[name] = ContentDigest(digest="", parts=new, unit="").changed_parts(old)
        return Impact(source=rec.path, recorded_digest=rec.digest, current_digest=now.digest,
                      changed=True, changed_parts=changed,
                      part_unit={n: now.units.get(n, "") for n in changed},
                      downstream=[n.summary() for n in self.downstream(rec.id)])
