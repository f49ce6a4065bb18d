"""Fixtures for the online tests: a short 2013 span and its schema (from `scalelab data infer`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the helper module beside this file, importable whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).parent))

from online_fixtures import END, START

from scalelab.online.schema import write_schema
from scalelab.online.stream import StreamConfig


@pytest.fixture(scope="session")
def week_schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_schema(tmp_path_factory.mktemp("schema") / "schema.json",
                        StreamConfig(start=START, end=END))
