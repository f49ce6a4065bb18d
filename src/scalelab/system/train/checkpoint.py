"""Checkpoints that are either complete and verified or ignored.

Layout: ROOT/step-00000042/{state.pt, rank-0.pt, rank-1.pt, ..., COMPLETE.json}. Every rank writes
its files into ROOT/.step-00000042.tmp/ (fsync each), then rank 0 hashes them into COMPLETE.json
(fsync), renames the folder into place and fsyncs ROOT: a crash at any point leaves either the
previous checkpoint or a tmp folder that is never read. On load the sha256 of every file is
checked against COMPLETE.json, so a truncated or corrupted checkpoint is skipped in favour of the
previous one. Files are read with torch.load(weights_only=True): no arbitrary unpickling.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

MARKER = "COMPLETE.json"
STATE_FILE = "state.pt"
_PREFIX = "step-"
KILL_AT_ENV = "SCALELAB_TEST_KILL_AT"
KILL_ONCE_ENV = "SCALELAB_TEST_KILL_ONCE"
CRASH_POINTS = ("step", "ckpt-torn", "ckpt-written", "ckpt-marked", "ckpt-renamed")
"""Where the test hook can kill: before a training step; mid-way through a rank's first
checkpoint file (half of it on disk); after a rank wrote all its files; after rank 0 wrote the
marker (before the rename); after the rename (before pruning). `step` counts steps done."""


def crash_point(point: str, step: int, rank: int,
                before: Callable[[], None] | None = None) -> None:
    """Test hook for the crash-consistency tests; does nothing unless both variables are set.

    SCALELAB_TEST_KILL_AT=<point>:<step>[:<rank>] (rank 0 by default) and
    SCALELAB_TEST_KILL_ONCE=<file>: at that point this process creates <file>, runs `before`
    (e.g. leaves a torn file) and SIGKILLs itself. While <file> exists the hook stays quiet, so a
    restarted or re-run job passes the same point. Cost when unset: one environment lookup.
    """
    spec, flag = os.environ.get(KILL_AT_ENV), os.environ.get(KILL_ONCE_ENV)
    if not spec or not flag:
        return
    parts = spec.split(":")
    if (parts[0] != point or len(parts) < 2 or parts[1] != str(step)
            or (parts[2] if len(parts) > 2 else "0") != str(rank)):
        return
    try:
        fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    os.write(fd, json.dumps({"point": point, "step": step, "rank": rank}).encode())
    os.fsync(fd)
    os.close(fd)
    if before is not None:
        before()
    os.kill(os.getpid(), signal.SIGKILL)


def write_torn(obj: Any, path: Path) -> None:
    """Half of `obj`'s serialised bytes at `path`, on disk: what a crash mid-write leaves."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    with path.open("wb") as f:
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` durable (both checkpoint formats commit so)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_file_durably(obj: Any, path: Path) -> None:
    with path.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def rng_state() -> dict[str, Any]:
    """torch, numpy and python RNG states in types weights_only loading accepts."""
    _, key, pos, has_gauss, cached = np.random.get_state()
    py = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"key": torch.from_numpy(np.asarray(key, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(py[0]), "state": [int(x) for x in py[1]],
                   "gauss": py[2]},
    }


def set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    n = s["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    p = s["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


@dataclass(frozen=True, kw_only=True)
class Skipped:
    path: str
    reason: str


class CheckpointStore:
    """The checkpoint folder of one run: write, commit, verify, prune."""

    def __init__(self, root: str | Path, *, keep: int) -> None:
        self.root = Path(root)
        self.keep = keep

    def final_dir(self, step: int) -> Path:
        return self.root / f"{_PREFIX}{step:08d}"

    def tmp_dir(self, step: int) -> Path:
        return self.root / f".{_PREFIX}{step:08d}.tmp"

    def begin(self, step: int) -> Path:
        """The tmp folder every rank writes its files into (each rank may call this)."""
        d = self.tmp_dir(step)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def commit(self, step: int, *, meta: dict[str, Any] | None = None) -> Path:
        """Rank 0, after every rank has written: hash, mark complete, rename, prune."""
        tmp, final = self.tmp_dir(step), self.final_dir(step)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())
                 if p.is_file() and p.name != MARKER}
        marker = tmp / MARKER
        with marker.open("w", encoding="utf-8") as f:
            json.dump({"step": step, "files": files, **(meta or {})}, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        crash_point("ckpt-marked", step, 0)
        if final.exists():  # a re-run of the same step after a restart: replace it whole
            shutil.rmtree(final)
        tmp.rename(final)
        fsync_dir(self.root)
        crash_point("ckpt-renamed", step, 0)
        self.prune()
        return final

    def steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith(_PREFIX) and p.name[len(_PREFIX):].isdigit():
                out.append(int(p.name[len(_PREFIX):]))
        return sorted(out)

    def prune(self, also_keep: int | None = None) -> None:
        """Delete all but the newest `keep` checkpoints (and `also_keep`, the one resumed from,
        which may be older when newer ones failed verification)."""
        for s in self.steps()[: -self.keep]:
            if s != also_keep:
                shutil.rmtree(self.final_dir(s), ignore_errors=True)

    def clean_tmp(self) -> None:
        """Remove half-written folders left by a crash (call before anyone writes)."""
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.is_dir() and p.name.startswith(f".{_PREFIX}") and p.name.endswith(".tmp"):
                    shutil.rmtree(p, ignore_errors=True)

    def verify(self, step: int, run: str | None = None) -> str | None:
        """None when the checkpoint is complete, intact and (given `run`) of this run."""
        d = self.final_dir(step)
        try:
            marker = json.loads((d / MARKER).read_text(encoding="utf-8"))
            files = marker["files"]
        except FileNotFoundError:
            return f"no {MARKER}"
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            return f"{MARKER} unreadable ({e})"
        if run is not None and marker.get("run") != run:
            return "written by a run with other settings (data, batch, model, seed or workers)"
        if STATE_FILE not in files:
            return f"{STATE_FILE} not listed in {MARKER}"
        for name, digest in files.items():
            p = d / name
            if not p.is_file():
                return f"{name} missing"
            if sha256_file(p) != digest:
                return f"{name} checksum mismatch (truncated or corrupted)"
        return None

    def latest_good(self, run: str | None = None) -> tuple[int | None, list[Skipped]]:
        """The newest intact checkpoint's step, and the newer ones skipped with the reason."""
        skipped: list[Skipped] = []
        for s in reversed(self.steps()):
            why = self.verify(s, run)
            if why is None:
                return s, skipped
            skipped.append(Skipped(path=str(self.final_dir(s)), reason=why))
        return None, skipped

    def load(self, step: int, name: str) -> dict[str, Any]:
        obj = torch.load(self.final_dir(step) / name, map_location="cpu", weights_only=True)
        assert isinstance(obj, dict)
        return obj

    def size_bytes(self, step: int) -> int:
        return sum(p.stat().st_size for p in self.final_dir(step).iterdir() if p.is_file())
