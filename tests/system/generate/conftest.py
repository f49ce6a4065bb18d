"""The generation tests' helper modules beside this file, importable whatever the import mode."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> object:
    """The tiny model's ops are microseconds long: with two threads on a busy two-core machine
    the OpenMP hand-offs cost ~10x the work itself. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
