"""The retrieval part's failure matrix (issue 35), each case ending with the index whole again
(its file matching its manifest, every vector's document there, the same answers as before):

1. A corrupted index file: truncated, a byte flipped, a wrong magic; and a wrong magic whose
   manifest was rewritten to match (bytes that were never this index). With the corpus in place
   the file is refused and rebuilt, the answer the same as the undamaged index's; with the
   corpus gone the CLI exits 2 with one line naming the directory and the fix, and
   `retrieval serve` refuses to start with that line. Never a traceback, never a crash (hnswlib
   used to die with SIGSEGV on a wrong header), never a silently wrong answer.
2. Concurrent add + query against a real `scalelab retrieval serve` (hnswlib, which grows its
   graph and capacity on add): no error, every added document answerable by its own text, the
   server's counts reconcile with what was added.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from requires import requires
from scalelab.cli import run
from scalelab.layers.lineage.manifest import MANIFEST_FILE
from scalelab.layers.web.spawn import Spawned, start_server
from scalelab.system.retrieval.corpus import CorpusSpec, build_corpus, write_corpus
from scalelab.system.retrieval.embed import CachedEmbedder, HashingEmbedder
from scalelab.system.retrieval.retriever import build_index_dir
from scalelab.system.retrieval.store import INDEX_FILE, load_index

pytestmark = pytest.mark.reliability
requires("faiss")
requires("hnswlib")

SPECS = ("exact", "faiss:Flat", "hnswlib:M=8,ef_construction=50")
QUERY = "Carrier code UA is United Air Lines Inc."
TOKEN = "retrieval-admin-token"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("ret-faults")
    corpus = write_corpus(build_corpus(CorpusSpec(level=1, base_docs=300, questions=10)),
                          tmp / "corpus")
    emb = CachedEmbedder(embedder=HashingEmbedder())
    out = {"corpus": corpus}
    for spec in SPECS:
        out[spec] = tmp / spec.replace(":", "_").replace(",", "_").replace("=", "_")
        build_index_dir(corpus, out[spec], spec=spec, embedder=emb, lineage=None)
    return out


def _query(d: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    code = run(["retrieval", "query", str(d), QUERY, "-k", "5", "--no-cache", "--json"])
    cap = capsys.readouterr()
    return code, json.loads(cap.out) if code == 0 else {}, cap.err


def _damage(d: Path, how: str) -> None:
    p = d / INDEX_FILE
    b = p.read_bytes()
    if how == "truncate":
        p.write_bytes(b[: len(b) // 2])
    elif how == "flip":
        p.write_bytes(b[:100] + bytes([b[100] ^ 0xFF]) + b[101:])
    else:  # wrong magic: the first four bytes overwritten
        p.write_bytes(b"XXXX" + b[4:])
    if how == "magic+manifest":  # and the manifest rewritten to vouch for the bad bytes
        m = json.loads((d / MANIFEST_FILE).read_text())
        data = p.read_bytes()
        m["extras"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        (d / MANIFEST_FILE).write_text(json.dumps(m))


@pytest.mark.parametrize("spec", SPECS)
def test_a_corrupted_index_is_refused_and_rebuilt_or_named_never_served(
        built: dict[str, Path], spec: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, good, _ = _query(built[spec], capsys)
    assert code == 0 and not good["rebuilt"] and len(good["results"]) == 5
    for how in ("truncate", "flip", "magic", "magic+manifest"):
        d = tmp_path / how
        shutil.copytree(built[spec], d)
        _damage(d, how)
        code, got, err = _query(d, capsys)
        assert code == 0, (how, err)
        assert got["rebuilt"] and got["results"] == good["results"], how
        index, info = load_index(d)  # whole again: the rebuilt file matches its manifest
        assert index.ntotal == info.ntotal == 300


def test_a_corrupted_index_without_its_corpus_is_one_line_and_exit_2(
        built: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to rebuild from, nothing to answer with: the CLI and the server say so."""
    d = tmp_path / "orphan"
    shutil.copytree(built["hnswlib:M=8,ef_construction=50"], d)
    _damage(d, "magic")
    moved = tmp_path / "corpus-elsewhere"
    shutil.move(built["corpus"], moved)
    try:
        code, _, err = _query(d, capsys)
        serve = subprocess.run([sys.executable, "-m", "scalelab", "retrieval", "serve", str(d),
                                "--port", "1"], capture_output=True, text=True, timeout=120,
                               check=False)
    finally:
        shutil.move(moved, built["corpus"])
    for rc, text in ((code, err), (serve.returncode, serve.stderr)):
        assert rc == 2 and "Traceback" not in text
        lines = text.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {d}: its corpus "), text
        assert f"scalelab retrieval index --corpus DIR --out {d} --index" in lines[0]


@pytest.fixture(scope="module")
def server(built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Spawned]:
    tmp = tmp_path_factory.mktemp("ret-srv")
    idx = tmp / "idx"
    shutil.copytree(built["hnswlib:M=8,ef_construction=50"], idx)
    env = {**os.environ, "SCALELAB_ADMIN_TOKEN": TOKEN}

    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "scalelab", "retrieval", "serve", str(idx), "--port",
                str(port), "--no-cache", "--max-inflight", "64"]

    with start_server(cmd, ready_path="/health/ready", env=env, log=tmp / "server.log") as s:
        yield s


def test_concurrent_add_and_query_lose_nothing(server: Spawned) -> None:
    base = httpx.get(server.url + "/health/ready", timeout=10).json()["ntotal"]
    assert base == 300
    adders, batches, per = 4, 10, 3  # 120 documents, added 3 at a time by 4 clients
    admin = {"authorization": f"Bearer {TOKEN}"}

    def text(a: int, b: int, j: int) -> str:
        w = f"a{a}b{b}d{j}"
        return f"fresh note {w}: zebra{w} quokka{w} narwhal{w}"

    def add(a: int) -> list[int]:
        sizes = []
        with httpx.Client(timeout=60) as c:
            for b in range(batches):
                r = c.post(server.url + "/v1/documents", headers=admin, json={"documents": [
                    {"key": f"new:{a}:{b}:{j}", "text": text(a, b, j)} for j in range(per)]})
                assert r.status_code == 200, r.text
                assert r.json()["added"] == per
                sizes.append(r.json()["ntotal"])
        return sizes

    def query(i: int) -> int:
        with httpx.Client(timeout=60) as c:
            n = 0
            for _ in range(25):
                r = c.post(server.url + "/v1/retrieve", json={"query": f"{QUERY} {i}", "k": 5})
                assert r.status_code == 200, r.text
                hits = r.json()["results"][0]
                assert len(hits) == 5 and hits[0]["key"] == "airline:UA"
                n += 1
            return n

    with cf.ThreadPoolExecutor(8) as ex:
        adds = [ex.submit(add, a) for a in range(adders)]
        queries = [ex.submit(query, i) for i in range(4)]
        sizes = sorted(s for f in adds for s in f.result())
        assert sum(f.result() for f in queries) == 100
    total = adders * batches * per
    # every add saw a distinct index size: the adds were serialised, none lost or doubled
    assert sizes == list(range(base + per, base + total + 1, per))
    ready = httpx.get(server.url + "/health/ready", timeout=10).json()
    assert ready["ntotal"] == base + total
    assert f"scalelab_retrieval_index_vectors {float(base + total)}" in \
        httpx.get(server.url + "/metrics", timeout=10).text
    # every added document is answerable by its own text, under an id of its own
    ids = set()
    for a in range(adders):
        for b in range(batches):
            r = httpx.post(server.url + "/v1/retrieve", timeout=30, json={
                "queries": [text(a, b, j) for j in range(per)], "k": 1})
            for j, hits in enumerate(r.json()["results"]):
                assert hits[0]["key"] == f"new:{a}:{b}:{j}"
                ids.add(hits[0]["id"])
    assert ids == set(range(base, base + total))
