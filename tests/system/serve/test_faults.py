"""The fault-injection architectures behave as documented."""

from __future__ import annotations

import pytest
import torch
from serve_fixtures import PARAMS

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.registry import build
from scalelab.system.serve import faults


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


def test_delay_sleeps_exactly_batch_ms_plus_row_ms_per_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The overload test's known capacity rests on this delay: 1000 / batch_ms requests/s at
    # batch 1. Checked by what the forward asks the clock for, not by timing it.
    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    net = build("delay_mlp", {**PARAMS, "batch_ms": 20, "row_ms": 5})
    plain = build("tabular_mlp", PARAMS)
    plain.load_state_dict(net.state_dict())
    cat, num = torch.zeros(3, 4, dtype=torch.int64), torch.randn(3, 14)
    with torch.inference_mode():
        out = net(cat, num)
        assert slept == [(20 + 5 * 3) / 1000.0]
        assert torch.equal(out, plain(cat, num))
