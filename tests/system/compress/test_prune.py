import pytest
import torch
from torch import nn

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.nets.tabular import TabularConfig, TabularNet
from scalelab.system.compress.prune import (
    amount_from_name,
    kept_width,
    n_parameters,
    prune_structured,
    prune_unstructured,
    sparsity,
)


def _net(hidden: list[int]) -> TabularNet:
    torch.manual_seed(0)
    return TabularNet(TabularConfig(cardinalities=[5, 7], n_numeric=3, hidden=hidden)).eval()


def _inputs(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.stack([torch.randint(0, 5, (n,), generator=g),
                         torch.randint(0, 7, (n,), generator=g)], 1),
            torch.randn(n, 3, generator=g))


def test_unstructured_zeroes_share_but_keeps_shapes() -> None:
    net = _net([64, 32])
    p = prune_unstructured(net, 0.9)
    assert sparsity(p) == pytest.approx(0.9, abs=0.002)
    assert sparsity(net) == 0.0  # the original is untouched
    assert n_parameters(p) == n_parameters(net)
    assert [type(m) for m in p.modules()] == [type(m) for m in net.modules()]
    assert not any(name.endswith("_orig") for name, _ in p.named_parameters())


def test_structured_removes_channels_and_matches_masked_model() -> None:
    net = _net([64, 32])
    masked, small = prune_structured(net, 0.5)
    assert small.cfg.hidden == [kept_width(64, 0.5), kept_width(32, 0.5)] == [32, 16]
    assert n_parameters(small) < n_parameters(net)
    lins = [m for m in small.mlp if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in lins] == [(4 + 3 + 3, 32), (32, 16), (16, 4)]
    c, x = _inputs()
    with torch.inference_mode():
        assert torch.allclose(masked(c, x), small(c, x), atol=1e-6)
        # and the masked model really differs from the unpruned one
        assert not torch.allclose(masked(c, x), net(c, x))


def test_structured_keeps_the_largest_l2_neurons() -> None:
    net = _net([8])
    with torch.no_grad():
        first = net.mlp[0]
        first.weight.mul_(0.01)
        first.weight[[1, 4, 6, 7]] *= 1000  # these four neurons have the largest L2 norm
    masked, small = prune_structured(net, 0.5)
    mask = masked.mlp[0].get_buffer("weight_mask")
    assert mask.any(dim=1).nonzero().squeeze(1).tolist() == [1, 4, 6, 7]
    assert torch.equal(small.mlp[0].weight, net.mlp[0].weight[[1, 4, 6, 7]])
    assert torch.equal(small.mlp[2].weight, net.mlp[2].weight[:, [1, 4, 6, 7]])


def test_amount_parsing() -> None:
    assert amount_from_name("prune-structured-50", "prune-structured-") == 0.5
    with pytest.raises(BadUsageError):
        amount_from_name("prune-structured-x", "prune-structured-")
    with pytest.raises(BadUsageError):
        amount_from_name("prune-structured-100", "prune-structured-")
