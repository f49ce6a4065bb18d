"""`ServerSettings`: what `scalelab serve` configures, checked at construction (the model's own
config.json is `layers.nets.model_config`, tested in tests/layers/nets/test_model_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.serve.settings import ServerSettings


def test_grpc_port_is_checked(tmp_path: Path) -> None:
    s = ServerSettings(model_repo=tmp_path, port=8000, grpc_port=8001)
    assert ServerSettings.from_json(s.to_json()).grpc_port == 8001  # to the workers
    with pytest.raises(BadUsageError, match=r"--grpc-port 8000 must lie in 1\.\.65535 and differ"):
        ServerSettings(model_repo=tmp_path, port=8000, grpc_port=8000)
    with pytest.raises(BadUsageError, match="--governance applies to HTTP only"):
        ServerSettings(model_repo=tmp_path, grpc_port=8001, governance_file="g.yaml")
