"""Fixtures shared across the suite."""

import pytest

from recordkit import serve_records as _serve_records
from scalelab.core.records import Record


@pytest.fixture
def serve_records() -> list[Record]:
    return _serve_records()
