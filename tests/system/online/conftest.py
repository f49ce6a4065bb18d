"""Fixtures for the online tests: a cache of the built flights table and one schema (from
`scalelab data infer`) over the span the tests replay."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the helper module beside this file, importable whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).parent))

from online_fixtures import SCHEMA_END

from scalelab.system.online.schema import write_schema
from scalelab.system.online.stream import CACHE_ENV, ReplayConfig


@pytest.fixture(autouse=True, scope="session")
def _cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The built flights table is cached between processes; never in the user's home here.
    Fine-tunes run on one torch thread, as `scalelab online` runs them."""
    import torch

    mp = pytest.MonkeyPatch()
    mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    mp.undo()


@pytest.fixture(scope="session")
def week_schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The schema of the clean events of 2013-01-01 .. SCHEMA_END (every test's span)."""
    return write_schema(tmp_path_factory.mktemp("schema") / "schema.json",
                        ReplayConfig(end=SCHEMA_END))
