"""Shared settings for the trainer tests: small data so real torchrun runs take seconds."""

from __future__ import annotations

import pytest

LIMIT = 4000
"""Training rows for torchrun tests (test split shrinks alike)."""


@pytest.fixture(autouse=True)
def _lineage_in_tmp(tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Model exports register in the lineage store; keep it out of the working tree.
    monkeypatch.setenv("SCALELAB_LINEAGE",
                       str(tmp_path_factory.getbasetemp() / "lineage.db"))
