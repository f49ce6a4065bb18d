"""Fixtures shared across the suite."""

from collections.abc import Iterator

import pytest

from recordkit import serve_records as _serve_records
from scalelab.lab.core.records import Record


@pytest.fixture(autouse=True, scope="session")
def _isolated_lineage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Commands default to ./.scalelab/lineage.db; tests must never write into the checkout."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SCALELAB_LINEAGE", str(tmp_path_factory.mktemp("lineage") / "lineage.db"))
    yield
    mp.undo()


@pytest.fixture
def serve_records() -> list[Record]:
    return _serve_records()
