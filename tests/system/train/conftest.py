"""Shared settings for the trainer tests: small data so real torchrun runs take seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

LIMIT = 4000
"""Training rows for torchrun tests (test split shrinks alike)."""


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    # In-process training here runs a 16-wide MLP on batches of 64-256: each op is
    # microseconds, so a second intra-op thread only hands work off (the scaling-law grid took
    # 15.8 s of CPU with 2 threads, 10.0 s with 1, on the shared 2-core machine). torchrun's
    # workers set their own thread count from the launcher's plan.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _lineage_in_tmp(tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Model exports register in the lineage store; keep it out of the working tree.
    monkeypatch.setenv("SCALELAB_LINEAGE",
                       str(tmp_path_factory.getbasetemp() / "lineage.db"))
