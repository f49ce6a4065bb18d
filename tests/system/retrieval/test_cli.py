"""`scalelab retrieval ...` end to end through the CLI entry point (JSON on stdout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from figurekit import assert_image, capture, lines
from scalelab.cli import run


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    assert run(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_corpus_index_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(capsys, ["retrieval", "corpus", "--out", str(tmp_path / "c"), "--level", "1,2",
                          "--base-docs", "100", "--questions", "20", "--json"])
    assert [r["docs"] for r in rows] == [100, 200]  # type: ignore[index, union-attr]
    cache = str(tmp_path / "cache.sqlite")
    idx = tmp_path / "idx"
    built = _json(capsys, ["retrieval", "index", "--corpus", str(tmp_path / "c" / "x2"),
                           "--out", str(idx), "--index", "hnswlib:M=8,ef_construction=50",
                           "--embedder", "hashing", "--cache", cache, "--ef", "32",
                           "--lineage", str(tmp_path / "l.db"), "--json"])
    assert built["docs"] == 200 and built["embedded"] == 200  # type: ignore[index]
    assert built["search_params"] == {"ef": 32.0}  # type: ignore[index]
    # The 1x corpus is the 2x corpus's prefix: its documents all come from the cache.
    again = _json(capsys, ["retrieval", "index", "--corpus", str(tmp_path / "c" / "x1"),
                           "--out", str(tmp_path / "idx1"), "--index", "exact",
                           "--embedder", "hashing", "--cache", cache, "--json"])
    assert again["embedded"] == 0  # type: ignore[index]
    # A document's own text finds it first.
    q = _json(capsys, ["retrieval", "query", str(idx), "Carrier code UA is United Air Lines Inc.",
                       "-k", "3", "--cache", cache, "--json"])
    assert len(q["results"]) == 3  # type: ignore[index]
    assert q["results"][0]["key"] == "airline:UA"  # type: ignore[index]
    imp = _json(capsys, ["lineage", "impacted", str(tmp_path / "c" / "x2"), "--lineage",
                         str(tmp_path / "l.db"), "--json"])
    assert imp["changed"] is False  # type: ignore[index]


@pytest.mark.parametrize("argv", [
    ["retrieval", "index", "--corpus", "{tmp}", "--out", "{tmp}/i", "--index", "annoy:5"],
    ["retrieval", "query", "{tmp}", "anything"],
    ["retrieval", "corpus", "--out", "{tmp}/c", "--level", "0"],
    ["retrieval", "bench", "--out", "{tmp}/b", "--indexes", ""],
])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         argv: list[str]) -> None:
    assert run([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err


def test_bench_plot_draws_every_grid_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    saved = capture(monkeypatch)
    out = tmp_path / "frontier.svg"
    r = _json(capsys, ["retrieval", "bench", "--out", str(tmp_path / "b"), "--levels", "1",
                       "--base-docs", "100", "--questions", "10", "--embedder", "hashing",
                       "--indexes", "hnswlib:M=8,ef_construction=50", "--fresh-singles", "2",
                       "--arrival-rate", "2000", "--cache", str(tmp_path / "c.sqlite"),
                       "--plot", str(out), "--json"])
    assert_image(out)
    [(fig, _)] = saved
    drawn = lines(fig.axes[0])
    [level] = r["levels"]  # type: ignore[index]
    want = {f"{ix['spec']} x1": (sorted((p["recall"], p["qps"]) for p in ix["points"]))
            for ix in level["indexes"]}
    assert set(drawn) == set(want) | {"recall target 0.95"}
    assert len(want) == 3  # exact, faiss Flat and the hnswlib grid
    for name, pts in want.items():
        assert drawn[name] == ([p[0] for p in pts], [p[1] for p in pts])
