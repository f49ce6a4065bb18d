"""The flights delay-class network: embeddings for categoricals, an MLP over everything."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from scalelab.lab.core.errors import BadInputError


@dataclass(kw_only=True)
class TabularConfig:
    """Shape of a TabularNet; stored in each version's model.json so the server can rebuild it."""

    cardinalities: list[int]
    """Vocabulary size per categorical input column (index 0 is reserved for unknown values)."""
    embedding_dims: list[int] = field(default_factory=list)
    """Embedding width per categorical column; empty means min(16, (card + 1) // 2) each."""
    n_numeric: int = 0
    """Number of numeric input features (already standardised by the caller)."""
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Widths of the hidden layers."""
    n_classes: int = 4
    """Output classes (on time / late 15-60 / late > 60 / cancelled)."""
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if not self.embedding_dims:
            self.embedding_dims = [max(1, min(16, (c + 1) // 2)) for c in self.cardinalities]
        if len(self.embedding_dims) != len(self.cardinalities):
            raise BadInputError(
                f"embedding_dims has {len(self.embedding_dims)} entries but cardinalities has "
                f"{len(self.cardinalities)}; give one width per categorical column"
            )
        if any(c < 1 for c in self.cardinalities) or self.n_numeric < 0 or self.n_classes < 2:
            raise BadInputError("cardinalities must be >= 1, n_numeric >= 0 and n_classes >= 2")
        if not self.cardinalities and self.n_numeric == 0:
            raise BadInputError("a TabularNet needs at least one categorical or numeric input")
        if any(h < 1 for h in self.hidden) or not 0 <= self.dropout < 1:
            raise BadInputError("hidden widths must be >= 1 and dropout in [0, 1)")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class TabularNet(nn.Module):
    """logits = MLP([emb_1(cat_1), ..., emb_k(cat_k), numeric])."""

    def __init__(self, cfg: TabularConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = nn.ModuleList(
            nn.Embedding(c, d) for c, d in zip(cfg.cardinalities, cfg.embedding_dims, strict=True)
        )
        width = sum(cfg.embedding_dims) + cfg.n_numeric
        layers: list[nn.Module] = []
        for h in cfg.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if cfg.dropout:
                layers.append(nn.Dropout(cfg.dropout))
            width = h
        layers.append(nn.Linear(width, cfg.n_classes))
        self.mlp = nn.Sequential(*layers)

    def forward(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        parts = [emb(categorical[:, i]) for i, emb in enumerate(self.embeddings)]
        if self.cfg.n_numeric:
            parts.append(numeric)
        return self.mlp(torch.cat(parts, dim=1))
