"""The lineage store: exact `impacted` after one changed cell, WAL, no half-written outputs."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.lineage.store import LineageStore, default_lineage_path


def _build(tmp_path: Path) -> tuple[LineageStore, dict[str, Path]]:
    src_a = tmp_path / "a.csv"
    src_a.write_text("x,y\n" + "".join(f"{i},{i * 2}\n" for i in range(100)))
    src_b = tmp_path / "b.parquet"
    pl.DataFrame({"k": list(range(50))}).write_parquet(src_b, row_group_size=10)
    d1, d2, m1 = tmp_path / "d1", tmp_path / "d2", tmp_path / "m1"
    for d in (d1, d2, m1):
        d.mkdir()
        (d / "data.txt").write_text(d.name)
    (m1 / "manifest.json").write_text('{"kind": "model"}')
    store = LineageStore(tmp_path / "lineage.db")
    store.record(output=d1, inputs=[src_a, src_b])
    store.record(output=d2, inputs=[src_b])
    store.record(output=m1, inputs=[d1])
    return store, {"a": src_a, "b": src_b, "d1": d1, "d2": d2, "m1": m1}


def test_impacted_is_exact_and_names_row_groups(tmp_path: Path) -> None:
    store, p = _build(tmp_path)
    assert store.impacted(p["a"]).changed is False
    df = pl.read_parquet(p["b"]).with_columns(
        pl.when(pl.col("k") == 33).then(-1).otherwise(pl.col("k")).alias("k"))
    df.write_parquet(p["b"], row_group_size=10)
    imp = store.impacted(p["b"])
    assert imp.changed and imp.changed_parts == {"": [3]} and imp.part_unit == {"": "row_group"}
    paths = [d["path"] for d in imp.downstream]
    assert sorted(paths) == sorted(str(p[k].resolve()) for k in ("d1", "d2", "m1"))
    kinds = {d["path"]: d["kind"] for d in imp.downstream}
    assert kinds[str(p["m1"].resolve())] == "model"
    # Source a changed: d1 and the model built on it, not d2.
    p["a"].write_text(p["a"].read_text().replace("7,14", "7,15"))
    imp_a = store.impacted(p["a"])
    assert sorted(d["path"] for d in imp_a.downstream) == sorted(
        str(p[k].resolve()) for k in ("d1", "m1"))
    assert imp_a.changed_parts == {"": [0]}


def test_record_refuses_missing_output_and_unknown_source(tmp_path: Path) -> None:
    store, p = _build(tmp_path)
    with pytest.raises(BadInputError, match="does not exist"):
        store.record(output=tmp_path / "not-yet-renamed", inputs=[p["a"]])
    assert len(store.nodes()) == 5
    with pytest.raises(BadInputError, match="not in the lineage store"):
        store.impacted(tmp_path / "zzz.csv")


def test_rerecord_is_idempotent_and_graph_lists_edges(tmp_path: Path) -> None:
    store, p = _build(tmp_path)
    store.record(output=p["d1"], inputs=[p["a"], p["b"]])
    g = store.graph()
    assert len(g["nodes"]) == 5 and len(g["edges"]) == 4
    # Recorded durably: a fresh store on the same file reads back the same graph.
    assert LineageStore(store.path).graph() == g


def test_default_path_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SCALELAB_LINEAGE", str(tmp_path / "l.db"))
    assert default_lineage_path() == tmp_path / "l.db"
