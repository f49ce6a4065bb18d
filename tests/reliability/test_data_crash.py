"""Crash consistency of `scalelab data run` (issue 9, item 3).

A real `scalelab data run` subprocess writing a new dataset version over an existing one is
SIGKILLed, then the published directory, its manifest and the lineage store are checked
(the published files byte for byte against the complete versions built apart, hashed by hashlib,
besides the manifest's digests recomputed):

- **at every publish step** (deterministic sweep): a small harness (this file, not the product)
  wraps ``os.replace`` and the pipeline's atomic directory exchange in the child and SIGKILLs
  the child right before or right after the N-th call, for every N — including the stats and
  manifest writes and the swap of the staging directory with the published one. The sweep runs
  both with the atomic exchange (Linux renameat2) and with the two-rename fallback;
- **at seeded random times**: the child is killed after a delay drawn from the measured
  duration of a normal run.

After each kill: the published name holds a complete version (the old one or the new one, never
a mix, never a half-written file) whose recomputed digest equals its manifest's; in fallback
mode a kill between the two renames may leave the name empty with the old version beside it,
and the next run restores it. No output the run did not finish is registered in lineage. Then a
rerun completes and reconciles. SCALELAB_LONG=1 sweeps every step and kills 50 times at random;
the default kills at the first step, one in the middle, around the swap in both modes, and twice
at random.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from scalelab.cli import run
from scalelab.layers.lineage.manifest import dir_digest, read_manifest
from scalelab.system.data.pipeline import recover

pytestmark = pytest.mark.reliability

LONG = bool(os.environ.get("SCALELAB_LONG"))
RANDOM_KILLS = 50 if LONG else 2
SEED = 20261129
SAMPLE = "3000"

# The child: counts publish steps (os.replace and the directory exchange) and SIGKILLs itself
# right before or after step N. argv: N before|after exchange|fallback COUNT_FILE CLI-ARGS...
HARNESS = r"""
import os, signal, sys
n, when, mode, count_file = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
import scalelab.system.data.pipeline as pipeline
count = 0
def step(name, fn):
    def wrapped(*a, **k):
        global count
        count += 1
        with open(count_file, "a") as f:
            f.write(f"{count} {name} {os.path.basename(str(a[-1]))}\n")
        if count == n and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        r = fn(*a, **k)
        if count == n and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return r
    return wrapped
os.replace = step("replace", os.replace)
if mode == "fallback":
    pipeline._exchange = lambda a, b: False
else:
    pipeline._exchange = step("exchange", pipeline._exchange)
from scalelab.cli import run
sys.exit(run(sys.argv[5:]))
"""


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SCALELAB_DEBUG", None)
    env["SCALELAB_LINEAGE"] = str(tmp / "lineage.db")
    return env


class World:
    """Input, output, lineage store and the two complete versions' digests."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.src = tmp / "gen" / "x1"
        self.out = tmp / "ds"
        self.db = tmp / "lineage.db"
        self.digests: dict[int, str] = {}
        self.wall_s = 0.0
        self.steps = {"exchange": 0, "fallback": 0}

    def args(self, test_months: int) -> list[str]:
        return ["data", "run", "--input", str(self.src), "--out", str(self.out),
                "--lineage", str(self.db), "--test-months", str(test_months), "--json"]

    def child(self, n: int, when: str, mode: str, test_months: int,
              counts: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", HARNESS, str(n), when, mode, str(counts),
             *self.args(test_months)],
            env=_env(self.tmp), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def current(self) -> int:
        """Which version (test_months 2 or 3) is published now."""
        d = read_manifest(self.out).digest
        return next(k for k, v in self.digests.items() if v == d)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    w = World(tmp_path_factory.mktemp("crash"))
    assert run(["data", "generate", "--sample", SAMPLE, "--out", str(w.tmp / "gen"),
                "--json"]) == 0
    # The two complete versions, built in-process elsewhere: their digests are what the
    # published name may ever hold (the digest does not depend on the output's name).
    for months in (2, 3):
        ref = w.tmp / f"ref-{months}"
        assert run(["data", "run", "--input", str(w.src), "--out", str(ref), "--no-register",
                    "--test-months", str(months), "--json"]) == 0
        w.digests[months] = read_manifest(ref).digest
    assert w.digests[2] != w.digests[3]
    # A first version in-process, then version A over it by a real subprocess through the
    # harness (no kill): the duration of a normal run and the number of publish steps.
    assert run([*w.args(3)[:-1], "--no-register", "--json"]) == 0
    counts = w.tmp / "count-exchange.txt"
    t0 = time.perf_counter()
    proc = w.child(0, "never", "exchange", 2, counts)
    _, err = proc.communicate(timeout=120)
    w.wall_s = time.perf_counter() - t0
    assert proc.returncode == 0, err.decode()
    w.steps["exchange"] = len(counts.read_text().splitlines())
    # The fallback renames the published version aside first: one step more.
    w.steps["fallback"] = w.steps["exchange"] + 1
    assert w.current() == 2
    _check(w, killed=False)
    return w


def _lineage(w: World) -> list[dict[str, Any]]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run(["lineage", "show", "--lineage", str(w.db), "--json"]) == 0
    return list(json.loads(buf.getvalue())["nodes"])


def _check(w: World, *, killed: bool, fallback: bool = False) -> None:
    """The published name holds one complete version, or (fallback only) nothing with the
    previous version intact beside it; lineage holds only complete versions."""
    out = w.out
    if not out.exists():
        assert fallback, "exchange publish left the dataset name empty"
        olds = list(out.parent.glob(f".{out.name}.old-*"))
        assert len(olds) == 1, olds
        _check_version(w, olds[0])
    else:
        _check_version(w, out)
    for node in _lineage(w):
        if node["kind"] == "dataset":
            assert node["path"] == str(out.resolve())
            assert node["digest"] in w.digests.values(), node


def _check_version(w: World, d: Path) -> None:
    m = read_manifest(d)
    assert m.digest in w.digests.values()
    assert sorted(os.listdir(d)) == sorted([*m.files, "manifest.json"])
    # Independently of the product's digest functions: every file is byte for byte the file
    # of the complete version built apart (sha256 of the bytes, hashlib's own).
    ref = w.tmp / f"ref-{next(k for k, v in w.digests.items() if v == m.digest)}"
    assert sorted(os.listdir(ref)) == sorted(os.listdir(d))
    for name in m.files:
        assert hashlib.sha256((d / name).read_bytes()).digest() == \
            hashlib.sha256((ref / name).read_bytes()).digest(), name
    digest, files = dir_digest(d)
    assert digest == m.digest
    for name, entry in m.files.items():
        assert files[name].digest == entry["digest"]
        if name.endswith(".parquet"):
            assert pq.read_table(d / name).num_rows == entry["rows"]
    recon = m.validation["reconciliation"]
    assert recon["holds"] and recon["rows_in"] == int(SAMPLE)


def _rerun(w: World) -> None:
    """A rerun after the kill completes, reconciles and is registered."""
    months = 3 if w.out.exists() and w.current() == 2 else 2
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run(w.args(months)) == 0
    res = json.loads(buf.getvalue())
    assert res["reconciliation"]["holds"] and res["digest"] == w.digests[months]
    assert w.current() == months
    _check(w, killed=False)
    nodes = [n for n in _lineage(w) if n["kind"] == "dataset"]
    assert w.digests[months] in {n["digest"] for n in nodes}
    leftovers = [p.name for p in w.out.parent.iterdir() if p.name.startswith(f".{w.out.name}.")]
    assert leftovers == [], leftovers


def _sweep_points(w: World) -> list[tuple[str, int, str]]:
    """(mode, step, before|after): every step in the long form; else the swap in both modes."""
    if LONG:
        return [(mode, n, when) for mode in ("exchange", "fallback")
                for n in range(1, w.steps[mode] + 1) for when in ("before", "after")]
    # The last step of a publish is the directory swap (exchange) or the second rename
    # (fallback): kill right before and after it, and in fallback between the two renames.
    # And two steps earlier: the first (nothing of the new version anywhere yet) and one in
    # the middle (the stats and manifest being written into the staging copy).
    ex, fb = w.steps["exchange"], w.steps["fallback"]
    return [("exchange", 1, "before"), ("exchange", max(2, ex // 2), "after"),
            ("exchange", ex, "before"), ("exchange", ex, "after"), ("fallback", fb, "before")]


def test_kill_at_every_publish_step(world: World) -> None:
    w = world
    assert w.steps["exchange"] >= 3
    for mode, n, when in _sweep_points(w):
        before = w.current() if w.out.exists() else None
        target = 3 if before == 2 else 2
        counts = w.tmp / f"steps-{mode}-{n}-{when}.txt"
        proc = w.child(n, when, mode, target, counts)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, (mode, n, when, err.decode()[-2000:])
        _check(w, killed=True, fallback=mode == "fallback")
        if w.out.exists():
            # Killed before its last step, the run published nothing; after it, all of it.
            last = n == w.steps[mode] and when == "after"
            assert w.current() == (target if last else before), (mode, n, when)
        _rerun(w)


def test_kill_at_random_times(world: World) -> None:
    w = world
    rng = random.Random(SEED)
    outcomes = {"killed, old kept": 0, "killed, new published": 0, "finished": 0}
    for _ in range(RANDOM_KILLS):
        before = w.current()
        target = 3 if before == 2 else 2
        # Most of the first ~half of a run is interpreter and import start-up: aim later.
        delay = rng.uniform(0.3, 1.1) * w.wall_s
        proc = w.child(0, "never", "exchange", target, w.tmp / "random-steps.txt")
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        if proc.returncode == 0:
            outcomes["finished"] += 1
            assert w.current() == target
        else:
            assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
            now = w.current()
            assert now in (before, target)
            outcomes["killed, old kept" if now == before else "killed, new published"] += 1
        _check(w, killed=True)
        _rerun(w)
    assert sum(outcomes.values()) == RANDOM_KILLS
    print(f"random kills: {outcomes} (normal run {w.wall_s:.2f} s)")
    if LONG:
        assert outcomes["killed, old kept"] > 0


def test_recover_restores_the_previous_version(world: World, tmp_path: Path) -> None:
    """The fallback's worst case by hand: the dataset moved aside by a dead run."""
    w = world
    ds = tmp_path / "ds"
    assert run(["data", "run", "--input", str(w.src), "--out", str(ds), "--no-register",
                "--json"]) == 0
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    os.replace(ds, tmp_path / f".ds.old-{pid}")
    (tmp_path / f".ds.staging-{pid}").mkdir()
    (tmp_path / f".ds.staging-{pid}" / "train.parquet").write_bytes(b"PAR1 half")
    mine = tmp_path / f".ds.staging-{os.getpid()}"
    mine.mkdir()
    recover(ds)
    assert read_manifest(ds).digest == w.digests[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".ds.staging-{os.getpid()}", "ds"]
