import pytest
import torch

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.layers.nets.variants import CascadeNet
from scalelab.system.compress.cascade import choose_tau, combine, route, sweep


def test_route_by_threshold_exact_counts() -> None:
    small = torch.tensor([[0.95, 0.05], [0.6, 0.4], [0.5, 0.5], [0.2, 0.8], [0.7, 0.3]])
    assert route(small, 0.7).tolist() == [False, True, True, False, False]
    assert int(route(small, 0.0).sum()) == 0
    assert int(route(small, 1.0).sum()) == 5
    pts = sweep(small, torch.tensor([[0.0, 1.0]] * 5), [0.5, 0.7, 0.9])
    assert [p.share_to_large for p in pts] == [0.0, pytest.approx(0.4), pytest.approx(0.8)]
    assert pts[1].predictions.tolist() == [0, 1, 1, 1, 0]


def test_combine_takes_large_where_routed() -> None:
    small = torch.tensor([[0.9, 0.1], [0.55, 0.45]])
    large = torch.tensor([[0.1, 0.9], [0.2, 0.8]])
    assert torch.equal(combine(small, large, 0.8), torch.stack([small[0], large[1]]))


def test_bad_threshold() -> None:
    with pytest.raises(BadUsageError):
        route(torch.ones((1, 2)), 1.5)
    with pytest.raises(BadInputError):
        CascadeNet(torch.nn.Identity(), torch.nn.Identity(), -0.1)


def test_choose_tau_cheapest_within_loss() -> None:
    f1 = {0.5: 0.70, 0.7: 0.797, 0.9: 0.80}
    share = {0.5: 0.0, 0.7: 0.2, 0.9: 0.5}
    assert choose_tau(f1, share, baseline_f1=0.80, max_loss_points=0.5) == 0.7
    assert choose_tau(f1, share, baseline_f1=0.80, max_loss_points=20) == 0.5
    assert choose_tau(f1, share, baseline_f1=0.99, max_loss_points=0.1) == 0.9


class _Const(torch.nn.Module):
    """Logits from the first numeric column (small) or a fixed answer (large), counting rows."""

    def __init__(self, fixed: list[float] | None) -> None:
        super().__init__()
        self.fixed = fixed
        self.rows = 0

    def forward(self, c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        self.rows += int(x.shape[0])
        if self.fixed is not None:
            return torch.tensor([self.fixed] * x.shape[0])
        return torch.stack([x[:, 0], torch.zeros_like(x[:, 0])], dim=1)


def test_cascade_net_sends_only_unsure_rows_to_large() -> None:
    small, large = _Const(None), _Const([-5.0, 5.0])
    net = CascadeNet(small, large, tau=0.9)
    # small's top prob = sigmoid(|x0|): x0 = 4 -> 0.982 (sure), 0.5 -> 0.62 (unsure)
    x = torch.tensor([[4.0], [0.5], [-4.0], [0.1]])
    out = net(torch.zeros((4, 1), dtype=torch.long), x)
    assert small.rows == 4 and large.rows == 2
    assert out.argmax(1).tolist() == [0, 1, 1, 1]
    assert torch.equal(out[1], torch.tensor([-5.0, 5.0]))
