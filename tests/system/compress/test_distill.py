import math

import pytest
import torch
from torch.nn import functional as F

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.compress.distill import (
    DistillConfig,
    agreement,
    distill,
    distillation_loss,
    new_student,
)
from scalelab.system.compress.features import Features
from scalelab.system.compress.trainer import TrainConfig


def test_loss_reduces_to_cross_entropy_at_alpha_zero() -> None:
    s = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    t = torch.tensor([[0.0, 3.0, 0.0], [1.0, 1.0, 1.0]])
    y = torch.tensor([0, 1])
    assert distillation_loss(s, t, y, temperature=3.0, alpha=0.0) == pytest.approx(
        float(F.cross_entropy(s, y)))


def test_soft_term_is_t_squared_kl_and_zero_when_equal() -> None:
    s = torch.tensor([[1.0, 0.0]])
    t = torch.tensor([[0.0, 1.0]])
    y = torch.tensor([-1])
    T = 2.0
    ps, pt = torch.softmax(s / T, 1), torch.softmax(t / T, 1)
    kl = float((pt * (pt.log() - ps.log())).sum())
    assert distillation_loss(s, t, y, temperature=T, alpha=1.0) == pytest.approx(T * T * kl)
    assert distillation_loss(t, t, y, temperature=T, alpha=1.0) == pytest.approx(0.0, abs=1e-7)


def test_unlabelled_rows_only_feed_the_soft_term() -> None:
    s = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    t = torch.tensor([[0.0, 1.0], [0.5, 0.0]])
    mixed = distillation_loss(s, t, torch.tensor([0, -1]), temperature=1.0, alpha=0.5)
    soft = distillation_loss(s, t, torch.tensor([-1, -1]), temperature=1.0, alpha=1.0)
    ce0 = float(F.cross_entropy(s[:1], torch.tensor([0])))
    assert float(mixed) == pytest.approx(0.5 * float(soft) + 0.5 * ce0)
    all_unlabelled = distillation_loss(s, t, torch.tensor([-1, -1]), temperature=1.0, alpha=0.5)
    assert math.isfinite(float(all_unlabelled))


def test_config_validation() -> None:
    with pytest.raises(BadUsageError):
        DistillConfig(temperature=0)
    with pytest.raises(BadUsageError):
        DistillConfig(alpha=1.5)


def test_distilled_student_learns_the_teacher_from_unlabelled_rows() -> None:
    g = torch.Generator().manual_seed(0)
    n = 2000
    cat = torch.randint(0, 6, (n, 2), generator=g)
    num = torch.randn(n, 3, generator=g)
    torch.manual_seed(0)
    teacher = new_student([6, 6], 3, 3, DistillConfig(hidden=[16]))
    data = Features(categorical=cat, numeric=num, labels=torch.full((n,), -1))
    cfg = DistillConfig(hidden=[16], temperature=2.0, alpha=1.0,
                        train=TrainConfig(epochs=15, batch_size=128, lr=1e-2, seed=1))
    before = agreement(teacher, new_student([6, 6], 3, 3, cfg), data)
    student = distill(teacher, data.take(slice(0, 0)), new_student([6, 6], 3, 3, cfg), cfg,
                      transfer=data)
    after = agreement(teacher, student, data)
    assert before < 0.5 < 0.85 < after
