"""Fixtures of the compare tests."""

from __future__ import annotations

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.clock import realtime


@pytest.fixture(scope="session")
def realtime_ok() -> bool:
    """Whether `load --realtime` (SCHED_FIFO) is allowed here: a compare test's runs must be
    valid to decide anything, and on a busy machine a normal generator falls behind."""
    try:
        with realtime():
            return True
    except BadUsageError:
        return False
