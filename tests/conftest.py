"""Fixtures shared across the suite."""

from collections.abc import Iterator

import pytest

from llmkit import generate_server
from recordkit import serve_records as _serve_records
from scalelab.lab.core.records import Record
from scalelab.layers.web.spawn import Spawned


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


@pytest.fixture(scope="session")
def tiny_generate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    """One plain `scalelab generate serve` (tiny model, 2 sequences, 8 MiB of KV cache in
    blocks of 8, no key) for the tests that only need an OpenAI-compatible generator there: a
    start costs 5-10 s of a busy machine, paid once a session (once an xdist worker)."""
    log = tmp_path_factory.mktemp("tiny-generate") / "server.log"
    with generate_server(log, "--max-num-seqs", "2", "--kv-cache-bytes", "8MiB",
                         "--block-size", "8") as s:
        yield s
