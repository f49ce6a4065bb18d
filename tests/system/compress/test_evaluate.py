import numpy as np
import pytest
import torch

from scalelab.system.compress.evaluate import compare, evaluate, predict_proba

CLASSES = ["a", "b", "c"]


def test_per_class_precision_recall_f1_exact() -> None:
    y = np.array([0, 0, 0, 1, 1, 2])
    p = np.array([0, 0, 1, 1, 0, 0])
    q = evaluate(y, p, CLASSES)
    a, b, c = q.classes
    assert (a.precision, a.recall, a.support) == (pytest.approx(2 / 4), pytest.approx(2 / 3), 3)
    assert a.f1 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert (b.precision, b.recall, b.f1) == (0.5, 0.5, 0.5)
    assert (c.precision, c.recall, c.f1, c.support) == (0.0, 0.0, 0.0, 1)
    assert q.accuracy == pytest.approx(3 / 6)
    assert q.macro_f1 == pytest.approx((a.f1 + 0.5 + 0.0) / 3)
    assert q.weighted_f1 == pytest.approx((3 * a.f1 + 2 * 0.5) / 6)
    assert q.as_dict()["f1.b"] == 0.5


def test_unlabelled_rows_are_ignored() -> None:
    q = evaluate(torch.tensor([0, -1, 1]), torch.tensor([0, 2, 1]), CLASSES)
    assert q.n == 2 and q.accuracy == 1.0


def test_compare_flags_classes_beyond_tolerance() -> None:
    base = evaluate(np.array([0, 1, 2, 2]), np.array([0, 1, 2, 2]), CLASSES)
    worse = evaluate(np.array([0, 1, 2, 2]), np.array([0, 1, 2, 0]), CLASSES)
    d = compare(base, worse, tolerance_points=10.0)
    assert d.per_class_f1_points["b"] == 0.0
    assert d.per_class_f1_points["a"] == pytest.approx(100 * (2 / 3 - 1))
    assert d.per_class_f1_points["c"] == pytest.approx(100 * (2 / 3 - 1))
    assert set(d.flagged) == {"a", "c"}
    assert d.worst_class in ("a", "c")
    assert compare(base, worse, tolerance_points=50.0).flagged == []


def test_predict_proba_batches_and_sums_to_one() -> None:
    lin = torch.nn.Linear(3, 4)

    def model(c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return lin(x)

    p = predict_proba(model, torch.zeros((10, 1), dtype=torch.long), torch.randn(10, 3),
                      batch_size=3)
    assert p.shape == (10, 4)
    assert torch.allclose(p.sum(1), torch.ones(10))
