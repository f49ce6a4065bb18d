"""The folded tabular net computes what the net it came from computes, in fewer ops."""

from pathlib import Path

import pytest
import torch
from torch import nn

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets import registry
from scalelab.layers.nets.folded import ARCH, FoldedTabularNet, fold
from scalelab.layers.nets.tabular import TabularConfig, TabularNet
from scalelab.layers.nets.variants import FusedTabularConfig, FusedTabularNet

CARDS = [17, 4, 106, 130]


def _inputs(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    c = torch.stack([torch.randint(0, k, (n,), generator=g) for k in CARDS], 1)
    return c, torch.randn(n, 14, generator=g)


@pytest.mark.parametrize("net", [
    TabularNet(TabularConfig(cardinalities=CARDS, n_numeric=14, hidden=[64, 64])),
    TabularNet(TabularConfig(cardinalities=CARDS, n_numeric=14, hidden=[32], dropout=0.2,
                             embedding_dims=[3, 2, 16, 5])),
    TabularNet(TabularConfig(cardinalities=CARDS, n_numeric=0, hidden=[])),
    FusedTabularNet(FusedTabularConfig(cardinalities=CARDS, embedding_dim=8, n_numeric=14,
                                       hidden=[64])),
], ids=["mlp-64x64", "mlp-dropout-mixed-dims", "linear-no-numeric", "fused-student"])
def test_fold_matches_the_original(net: nn.Module) -> None:
    torch.manual_seed(0)
    for p in net.parameters():  # non-zero everywhere, biases included
        nn.init.normal_(p, std=0.5)
    net.eval()
    folded = fold(net)
    c, x = _inputs()
    with torch.inference_mode():
        want, got = net(c, x), folded(c, x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    hidden = net.cfg.hidden
    assert folded.cfg.widths == [*hidden, 4]
    assert folded.table.shape == (sum(CARDS), ([*hidden, 4])[0])


def test_folded_round_trips_through_the_registry(tmp_path: Path) -> None:
    net = TabularNet(TabularConfig(cardinalities=CARDS, n_numeric=14)).eval()
    folded = fold(net)
    registry.save_module(tmp_path, folded, arch=ARCH, params=folded.cfg.to_dict())
    back = registry.load_module(tmp_path)
    assert isinstance(back, FoldedTabularNet)
    c, x = _inputs(8)
    with torch.inference_mode():
        assert torch.equal(back(c, x), folded(c, x))


def test_fold_refuses_what_it_cannot_rewrite() -> None:
    net = TabularNet(TabularConfig(cardinalities=CARDS, n_numeric=14))
    net.mlp[1] = nn.Tanh()
    with pytest.raises(BadInputError, match="ReLU"):
        fold(net)
    with pytest.raises(BadInputError, match="can be folded"):
        fold(nn.Linear(3, 4))


def test_the_forward_plan_follows_conversions_and_loads() -> None:
    net = TabularNet(TabularConfig(cardinalities=CARDS, n_numeric=14)).eval()
    folded = fold(net).double()  # every tensor replaced: a stale plan would mix dtypes
    c, x = _inputs(4)
    with torch.inference_mode():
        assert folded(c, x.double()).dtype == torch.float64
    other = fold(TabularNet(TabularConfig(cardinalities=CARDS, n_numeric=14)).eval())
    folded = fold(net)
    folded.load_state_dict(other.state_dict(), assign=True)
    with torch.inference_mode():
        assert torch.equal(folded(c, x), other(c, x))
