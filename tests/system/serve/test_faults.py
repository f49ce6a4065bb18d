"""The fault-injection architectures behave as documented."""

from __future__ import annotations

import pytest
import torch
from serve_fixtures import PARAMS

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.registry import build
from scalelab.system.serve import faults  # noqa: F401


def test_poison_raises_only_on_the_value() -> None:
    net = build("poison_mlp", {**PARAMS, "poison_value": 7.0})
    cat = torch.zeros(2, 4, dtype=torch.int64)
    assert net(cat, torch.zeros(2, 14)).shape == (2, 4)
    bad = torch.zeros(2, 14)
    bad[1, 3] = 7.0
    with pytest.raises(ValueError, match="poison value"):
        net(cat, bad)


def test_delay_shares_weights_with_tabular_and_checks_params() -> None:
    net = build("delay_mlp", {**PARAMS, "batch_ms": 0, "row_ms": 0})
    plain = build("tabular_mlp", PARAMS)
    assert net.state_dict().keys() == plain.state_dict().keys()
    with pytest.raises(BadInputError):
        build("delay_mlp", {**PARAMS, "batch_ms": -1})
