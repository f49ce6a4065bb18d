"""The short training loop shared by fine-tuning (after pruning) and distillation.

Deliberately small: Adam, fixed epochs, shuffled mini-batches, a loss function of
(logits, batch index) so callers can look up teacher logits or labels for the same rows.
Full training is the training part's job; this only adapts an existing model for a few epochs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.compress.features import Features

M = TypeVar("M", bound=nn.Module)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(logits of the batch, row indices of the batch) -> scalar loss."""


@dataclass(kw_only=True)
class TrainConfig:
    """How long and how hard to train."""

    epochs: int = 3
    """Passes over the rows."""
    batch_size: int = 512
    """Rows per optimizer step."""
    lr: float = 3e-3
    """Adam learning rate."""
    seed: int = 0
    """Seed for the shuffling and the initial weights (runs are repeatable)."""

    def __post_init__(self) -> None:
        if self.epochs < 0 or self.batch_size < 1 or not self.lr > 0:
            raise BadUsageError("training: epochs >= 0, batch size >= 1 and lr > 0 required")


def train(module: M, data: Features, loss_fn: LossFn, cfg: TrainConfig) -> M:
    """Train `module` in place on `data` (on the device of its parameters); returns it in eval."""
    device = next(module.parameters()).device
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(module.parameters(), lr=cfg.lr)
    n = len(data)
    module.train()
    for _ in range(cfg.epochs):
        order = torch.randperm(n, generator=gen)
        for i in range(0, n, cfg.batch_size):
            idx = order[i:i + cfg.batch_size]
            logits = module(data.categorical[idx].to(device), data.numeric[idx].to(device))
            loss = loss_fn(logits, idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return module.eval()


def cross_entropy(labels: torch.Tensor) -> LossFn:
    """Plain cross-entropy on the labelled rows of each batch (label -1 is ignored)."""
    def loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, labels[idx].to(logits.device),
                                           ignore_index=-1)
    return loss
