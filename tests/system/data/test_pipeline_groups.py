"""How the local engine groups input files for one validation query each."""

from __future__ import annotations

from pathlib import Path

from scalelab.system.data.local_engine import file_groups


def test_groups_are_consecutive_and_close_at_the_byte_budget(tmp_path: Path) -> None:
    files = []
    for i, size in enumerate([5, 5, 5, 20, 1, 1, 9]):
        f = tmp_path / f"f{i}.csv"
        f.write_bytes(b"x" * size)
        files.append(f)
    groups = file_groups(files, max_bytes=10)
    assert [[f.name for f in g] for g in groups] == [
        ["f0.csv", "f1.csv"], ["f2.csv", "f3.csv"], ["f4.csv", "f5.csv", "f6.csv"]]
    assert file_groups([], max_bytes=10) == []
