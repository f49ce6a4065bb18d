"""Knowledge distillation into a small fused-embedding student.

loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE(student, y)

The KL term is averaged over every row of a batch, labelled or not; the CE term over the
labelled rows only. So a transfer set of unlabelled rows (label -1) teaches through the
teacher's soft targets alone: that is where distillation pays, when labels are scarce and
unlabelled rows are plenty. T^2 keeps the soft term's gradient scale independent of T.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from scalelab.lab.core.errors import BadUsageError
from scalelab.layers.nets.variants import FusedTabularConfig, FusedTabularNet
from scalelab.system.compress.evaluate import predict_proba
from scalelab.system.compress.features import Features
from scalelab.system.compress.trainer import M, TrainConfig, cross_entropy, train


@dataclass(kw_only=True)
class DistillConfig:
    """The student's shape and the distillation loss."""

    temperature: float = 4.0
    """T: softens both distributions; higher shows more of the teacher's 'dark knowledge'."""
    alpha: float = 0.7
    """Weight of the soft (teacher) term; 1 - alpha weighs the hard-label cross-entropy."""
    hidden: list[int] = field(default_factory=lambda: [64])
    """Student hidden widths."""
    embedding_dim: int = 8
    """Student embedding width (one for all categorical columns)."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=6, batch_size=256))
    """Epochs, batch size, learning rate, seed."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise BadUsageError(f"distillation temperature {self.temperature} must be > 0")
        if not 0.0 <= self.alpha <= 1.0:
            raise BadUsageError(f"distillation alpha {self.alpha} must be in [0, 1]")


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                      labels: torch.Tensor, *, temperature: float, alpha: float) -> torch.Tensor:
    """The loss in the module docstring; rows labelled -1 contribute the soft term only."""
    t = temperature
    soft = F.kl_div(F.log_softmax(student_logits / t, dim=1),
                    F.log_softmax(teacher_logits / t, dim=1),
                    reduction="batchmean", log_target=True) * (t * t)
    labelled = labels >= 0
    if alpha >= 1.0 or not bool(labelled.any()):
        return alpha * soft
    hard = F.cross_entropy(student_logits[labelled], labels[labelled])
    return alpha * soft + (1.0 - alpha) * hard


def new_student(cardinalities: list[int], n_numeric: int, n_classes: int,
                cfg: DistillConfig) -> FusedTabularNet:
    torch.manual_seed(cfg.train.seed)
    return FusedTabularNet(FusedTabularConfig(
        cardinalities=list(cardinalities), embedding_dim=cfg.embedding_dim, n_numeric=n_numeric,
        hidden=list(cfg.hidden), n_classes=n_classes))


def _cat(a: Features, b: Features | None) -> Features:
    if b is None or len(b) == 0:
        return a
    return Features(categorical=torch.cat([a.categorical, b.categorical]),
                    numeric=torch.cat([a.numeric, b.numeric]),
                    labels=torch.cat([a.labels, b.labels]))


@torch.inference_mode()
def teacher_logits(teacher: nn.Module, data: Features, batch_size: int = 8192) -> torch.Tensor:
    """The teacher's logits for every row, computed once (the teacher is frozen)."""
    device = next(teacher.parameters()).device
    out = [teacher(data.categorical[i:i + batch_size].to(device),
                   data.numeric[i:i + batch_size].to(device)).float().cpu()
           for i in range(0, len(data), batch_size)]
    return torch.cat(out)


def distill(teacher: nn.Module, labelled: Features, student: M, cfg: DistillConfig, *,
            transfer: Features | None = None) -> M:
    """Train `student` on the teacher's soft targets over labelled + transfer rows."""
    data = _cat(labelled, transfer)
    soft = teacher_logits(teacher.eval(), data)
    labels = data.labels

    def loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return distillation_loss(logits, soft[idx].to(logits.device), labels[idx].to(logits.device),
                                 temperature=cfg.temperature, alpha=cfg.alpha)

    return train(student, data, loss, cfg.train)


def train_on_labels(labelled: Features, student: M, cfg: DistillConfig) -> M:
    """The control: the same student trained on the labelled rows alone (no teacher)."""
    return train(student, labelled, cross_entropy(labelled.labels), cfg.train)


def agreement(a: nn.Module, b: nn.Module, data: Features) -> float:
    """Share of rows on which two models predict the same class."""
    pa = predict_proba(a, data.categorical, data.numeric).argmax(1)
    pb = predict_proba(b, data.categorical, data.numeric).argmax(1)
    return float((pa == pb).float().mean()) if len(data) else 0.0
