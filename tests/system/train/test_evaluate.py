from __future__ import annotations

import math

import pytest
import torch

from scalelab.system.train.evaluate import evaluate, scores


def test_exact_scores_on_a_small_case() -> None:
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]])
    y = torch.tensor([0, 1, 1, 1])
    ev = scores(probs, y, ["a", "b"], bins=2)
    assert ev.accuracy == 0.75
    a, b = ev.per_class
    assert (a.precision, a.recall, a.support) == (0.5, 1.0, 1)
    assert (b.precision, b.recall, b.support) == (1.0, 2 / 3, 3)
    assert a.f1 == pytest.approx(2 / 3)
    assert b.f1 == pytest.approx(0.8)
    assert ev.macro_f1 == pytest.approx((2 / 3 + 0.8) / 2)
    # Confidences 0.9, 0.6, 0.7, 0.8 all fall in (0.5, 1]: mean 0.75, accuracy 0.75 -> ECE 0.
    assert ev.reliability[1].count == 4 and ev.reliability[0].count == 0
    assert ev.ece == pytest.approx(0.0, abs=1e-12)
    expected_nll = -(math.log(0.9) + math.log(0.4) + math.log(0.7) + math.log(0.8)) / 4
    assert ev.loss == pytest.approx(expected_nll)


def test_overconfidence_shows_in_ece() -> None:
    probs = torch.tensor([[0.95, 0.05]] * 4)
    y = torch.tensor([0, 0, 1, 1])
    ev = scores(probs, y, ["a", "b"], bins=10)
    assert ev.ece == pytest.approx(0.45)
    assert ev.per_class[1].f1 == 0.0  # never predicted: precision and recall 0, no NaN


def test_evaluate_runs_the_model_in_batches() -> None:
    class Fixed(torch.nn.Module):
        def forward(self, cat: torch.Tensor, num: torch.Tensor) -> torch.Tensor:
            return torch.log(torch.tensor([[0.25, 0.75]])).expand(cat.shape[0], 2)

    cat, num = torch.zeros(5, 1, dtype=torch.long), torch.zeros(5, 1)
    ev = evaluate(Fixed(), cat, num, torch.tensor([1, 1, 1, 0, 0]), ["a", "b"], batch=2)
    assert ev.n == 5 and ev.accuracy == pytest.approx(0.6)
