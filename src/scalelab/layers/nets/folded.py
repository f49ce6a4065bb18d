"""The embedding-folded form of a tabular network: the same function in the fewest ops.

A tabular net's first layer is linear in the concatenation of its embeddings and numeric inputs:
``W [e_1(c_1), ..., e_k(c_k), x] + b = sum_i W_i e_i(c_i) + W_x x + b``. Each product
``W_i e_i(c)`` depends on the category alone, so it can be computed once per vocabulary entry:
table_i = E_i W_i^T (one row per category, one column per first-layer unit). The bias goes into
column 0's rows (every row of the input sums exactly one of them). A forward pass is then one
lookup summing k table rows, one ``addmm`` for the numeric part, and the remaining
layers: 5-7 operator calls instead of 2k + 6 for the net it came from.

On CPU at batch 1 a model this small is dispatch-bound (each operator call costs microseconds of
framework overhead, its arithmetic nanoseconds), so the op count sets the latency; the fold is
exact up to float rounding (~1e-7), and the tables are larger than the embeddings when the first
layer is wider than the embeddings (vocabulary x units instead of vocabulary x width).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.variants import column_offsets

ARCH = "tabular_folded"


@dataclass(kw_only=True)
class FoldedTabularConfig:
    """Shape of a FoldedTabularNet (stored in model.json)."""

    cardinalities: list[int]
    """Vocabulary size per categorical column (index 0 is the unknown value)."""
    n_numeric: int = 0
    """Number of standardised numeric inputs."""
    widths: list[int] = field(default_factory=list)
    """Output width of every linear layer, the folded first one included (the last is the
    number of classes)."""

    def __post_init__(self) -> None:
        if not self.cardinalities or any(c < 1 for c in self.cardinalities):
            raise BadInputError("a folded net needs categorical columns with cardinality >= 1")
        if self.n_numeric < 0 or not self.widths or any(w < 1 for w in self.widths):
            raise BadInputError("n_numeric must be >= 0 and widths a non-empty list of "
                                "positive layer widths")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class FoldedTabularNet(nn.Module):
    """logits = layers(relu(sum_i table[c_i + offset_i] + numeric @ numeric_weight))."""

    offsets: torch.Tensor

    def __init__(self, cfg: FoldedTabularConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("offsets", column_offsets(cfg.cardinalities), persistent=False)
        first = cfg.widths[0]
        self.table = nn.Parameter(torch.zeros(sum(cfg.cardinalities), first))
        self.numeric_weight = nn.Parameter(torch.zeros(cfg.n_numeric, first))
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(cfg.widths))
        self._refresh()
        # load_state_dict(assign=True) would replace the parameters the plan points to
        self.register_load_state_dict_post_hook(lambda module, _keys: module._refresh())

    def _refresh(self) -> None:
        """Keep plain references to the tensors forward uses.

        At batch 1 each nn.Module attribute lookup (a Python __getattr__ walking three dicts)
        costs about a microsecond, as much as an operator: reading six of them per call took
        the folded student from 13 to 19 us. The plan is rebuilt whenever the tensors may have
        been replaced (.to(), .float(), ... and load_state_dict).
        """
        layers = [(m.weight, m.bias) for m in self.layers if isinstance(m, nn.Linear)]
        self.__dict__["_plan"] = (self.offsets, self.table,
                                  self.numeric_weight if self.cfg.n_numeric else None, layers)

    def _apply(self, fn: Any, recurse: bool = True) -> FoldedTabularNet:
        super()._apply(fn, recurse)
        self._refresh()
        return self

    def forward(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        offsets, table, numeric_weight, layers = self.__dict__["_plan"]
        # embedding + sum over columns, not embedding_bag: two plain ops are cheaper than the
        # bag's bookkeeping (offsets, bag sizes) at the batch sizes served here.
        h = F.embedding(categorical + offsets, table).sum(1)
        if numeric_weight is not None:
            h = torch.addmm(h, numeric, numeric_weight)
        # F.linear on the layer's tensors, not layer(h): a module call is Python overhead that
        # costs as much as the op itself here.
        for weight, bias in layers:
            h = F.linear(torch.relu(h), weight, bias)
        return h


def _parts(module: nn.Module) -> tuple[list[torch.Tensor], int, nn.Sequential]:
    """(embedding matrix per column, numeric inputs, MLP) of a TabularNet or FusedTabularNet."""
    from scalelab.layers.nets.tabular import TabularNet
    from scalelab.layers.nets.variants import FusedTabularNet

    if isinstance(module, TabularNet):
        return ([e.weight for e in module.embeddings if isinstance(e, nn.Embedding)],
                module.cfg.n_numeric, module.mlp)
    if isinstance(module, FusedTabularNet):
        bounds = [*module.get_buffer("offsets").tolist(), module.table.num_embeddings]
        tables = [module.table.weight[a:b] for a, b in itertools.pairwise(bounds)]
        return tables, module.cfg.n_numeric, module.mlp
    raise BadInputError(f"only tabular_mlp and tabular_fused models can be folded, "
                        f"not {type(module).__name__}")


@torch.no_grad()
def fold(module: nn.Module) -> FoldedTabularNet:
    """The folded equivalent of a tabular net (see the module docstring); a new module."""
    embeddings, n_numeric, mlp = _parts(module)
    # Dropout is the identity in eval mode; what is left must be Linear, ReLU, ..., Linear.
    kinds = [type(m) for m in mlp if not isinstance(m, nn.Dropout)]
    if kinds[::2] != [nn.Linear] * len(kinds[::2]) or set(kinds[1::2]) - {nn.ReLU} \
            or len(kinds) % 2 == 0:
        raise BadInputError("fold expects an MLP of Linear layers with a ReLU between each "
                            "two of them")
    linears = [m for m in mlp if isinstance(m, nn.Linear)]
    first = linears[0]
    cfg = FoldedTabularConfig(cardinalities=[int(e.shape[0]) for e in embeddings],
                              n_numeric=n_numeric, widths=[lin.out_features for lin in linears])
    net = FoldedTabularNet(cfg)
    w = first.weight.detach().cpu()
    col, tables = 0, []
    for e in embeddings:
        d = int(e.shape[1])
        tables.append(e.detach().cpu() @ w[:, col:col + d].T)
        col += d
    tables[0] = tables[0] + (first.bias.detach().cpu() if first.bias is not None else 0.0)
    net.table.copy_(torch.cat(tables))
    net.numeric_weight.copy_(w[:, col:col + n_numeric].T)
    targets = [m for m in net.layers if isinstance(m, nn.Linear)]
    for dst, src in zip(targets, linears[1:], strict=True):
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias if src.bias is not None else torch.zeros_like(dst.bias))
    net._refresh()
    return net.eval()


def build_folded(params: dict[str, Any]) -> nn.Module:
    """The builder nets.registry lists for ARCH."""
    return FoldedTabularNet(FoldedTabularConfig(**params))
