"""Pruning: unstructured (zeros inside dense matrices) and structured (neurons removed).

Unstructured L1 pruning zeroes the smallest weights but keeps every matrix its full dense size:
dense kernels multiply the zeros all the same, so it saves nothing at inference (and while the
masks are attached, each forward also recomputes weight * mask, so it is slower). Made permanent
here so the variant is a plain TabularNet again.

Structured pruning ranks the neurons of each hidden Linear layer by the L2 norm of their incoming
weights, keeps the top (1 - amount), and physically removes the others: the layer's output rows,
their bias entries and the next layer's matching input columns. The result is a smaller dense
TabularNet whose outputs equal the masked model's exactly (a removed neuron contributed
ReLU(0) = 0), before the short fine-tune that recovers quality.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn.utils import prune

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.layers.nets.tabular import TabularConfig, TabularNet


def _check_amount(amount: float) -> None:
    if not 0.0 <= amount < 1.0:
        raise BadUsageError(f"pruning amount {amount} must be in [0, 1)")


def linear_layers(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def prune_unstructured(module: nn.Module, amount: float = 0.9) -> nn.Module:
    """A copy with the smallest `amount` of each Linear weight (by |w|) set to zero, permanently."""
    _check_amount(amount)
    out = copy.deepcopy(module)
    for lin in linear_layers(out):
        prune.l1_unstructured(lin, name="weight", amount=amount)
        prune.remove(lin, "weight")
    return out.eval()


def sparsity(module: nn.Module) -> float:
    """Share of Linear weights that are exactly zero."""
    ws = [lin.weight for lin in linear_layers(module)]
    total = sum(w.numel() for w in ws)
    return sum(int((w == 0).sum()) for w in ws) / total if total else 0.0


def n_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _hidden_linears(net: TabularNet) -> list[nn.Linear]:
    lins = [m for m in net.mlp if isinstance(m, nn.Linear)]
    return lins[:-1]  # the output layer keeps one neuron per class


def masked_structured(net: TabularNet, amount: float = 0.5) -> TabularNet:
    """A copy whose pruned hidden neurons are masked to zero (weights and bias), still full size.

    The neuron ranking is torch's `ln_structured` (L2 norm over each output row); the same mask
    is applied to the bias, so a pruned neuron outputs exactly ReLU(0) = 0.
    """
    _check_amount(amount)
    if not isinstance(net, TabularNet):
        raise BadInputError("structured pruning needs a TabularNet (architecture tabular_mlp)")
    out = copy.deepcopy(net)
    for lin in _hidden_linears(out):
        h = lin.out_features
        n_prune = min(h - 1, round(amount * h))  # always keep at least one neuron
        prune.ln_structured(lin, name="weight", amount=n_prune, n=2, dim=0)
        row_mask = lin.get_buffer("weight_mask")[:, 0].clone()
        if lin.bias is not None:
            prune.custom_from_mask(lin, name="bias", mask=row_mask)
    return out.eval()


def kept_neurons(masked: TabularNet) -> list[torch.Tensor]:
    """Indices of the neurons each hidden layer keeps (from the masks of `masked_structured`)."""
    return [lin.get_buffer("weight_mask").any(dim=1).nonzero().squeeze(1)
            for lin in _hidden_linears(masked)]


def remove_channels(masked: TabularNet) -> TabularNet:
    """Physically remove the masked neurons: a smaller TabularNet with the same function."""
    keep = kept_neurons(masked)
    cfg = masked.cfg
    small = TabularNet(TabularConfig(
        cardinalities=list(cfg.cardinalities), embedding_dims=list(cfg.embedding_dims),
        n_numeric=cfg.n_numeric, hidden=[int(k.numel()) for k in keep],
        n_classes=cfg.n_classes, dropout=cfg.dropout))
    with torch.no_grad():
        small.embeddings.load_state_dict(masked.embeddings.state_dict())
        src_lins = [m for m in masked.mlp if isinstance(m, nn.Linear)]
        dst_lins = [m for m in small.mlp if isinstance(m, nn.Linear)]
        prev: torch.Tensor | None = None
        for i, (s, d) in enumerate(zip(src_lins, dst_lins, strict=True)):
            w, b = s.weight, s.bias  # masked values (weight_orig * mask) where pruned
            rows = keep[i] if i < len(keep) else torch.arange(w.shape[0])
            w = w[rows]
            if prev is not None:
                w = w[:, prev]
            d.weight.copy_(w)
            if b is not None and d.bias is not None:
                d.bias.copy_(b[rows])
            prev = rows
    return small.eval()


def prune_structured(net: TabularNet, amount: float = 0.5) -> tuple[TabularNet, TabularNet]:
    """(masked full-size model, physically smaller model); equal outputs, before fine-tuning."""
    masked = masked_structured(net, amount)
    return masked, remove_channels(masked)


def kept_width(width: int, amount: float) -> int:
    """Neurons a layer of `width` keeps at `amount` (matches `masked_structured`)."""
    return width - min(width - 1, round(amount * width))


def amount_from_name(name: str, prefix: str) -> float:
    """'prune-structured-50' -> 0.5; a clear error for anything else."""
    tail = name[len(prefix):]
    try:
        pct = float(tail)
    except ValueError:
        raise BadUsageError(
            f"variant {name!r}: expected {prefix}<percent>, e.g. {prefix}50") from None
    if not 0 <= pct < 100 or math.isnan(pct):
        raise BadUsageError(f"variant {name!r}: percent must be in [0, 100)")
    return pct / 100.0
