"""Architectures of compressed model variants, so the server can rebuild every published one.

`scalelab compress --publish` writes versions with these architectures; `registry.load_module`
rebuilds them from model.json + model.safetensors like any other (never unpickling):

- ``tabular_fused``: the distilled student. One embedding table for all categorical columns
  (vocabularies laid end to end, shifted by offsets) and one embedding width, so a forward pass is
  one lookup instead of one per column: at batch 1 a tiny MLP is dispatch-bound, and the op
  count, not the FLOPs, sets its latency.
- ``int8_dynamic``: any registered base architecture with its Linear layers quantized to int8
  (dynamic: weights int8, activations quantized per batch). On disk: each quantized Linear as its
  int8 weight plus per-tensor scale and zero point (so the file really is ~4x smaller), every
  other tensor as stored by the base. Rebuilding is exact: the same int8 values come back.
- ``cascade``: a small and a large model; the small one answers rows whose top softmax
  probability is >= tau, the large one the rest. It returns logits, so the server's softmax gives
  each row the probabilities of the model that answered it.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from scalelab.lab.core.errors import BadInputError

INT8_SUFFIXES = (".weight_int8", ".weight_scale", ".weight_zero_point")


# -- the int8 choice, in one place ------------------------------------------------------------

def quantize_int8(module: nn.Module) -> nn.Module:
    """Dynamic int8 quantization of every nn.Linear (CPU only); returns a new module.

    The one place the int8 technique is chosen. torch.ao's quantize_dynamic is deprecated in
    torch 2.13 but is still the fastest eager CPU int8 path (fbgemm kernels); torchao 0.18's
    Int8DynamicActivationInt8WeightConfig without torch.compile measured ~6x slower than fp32
    on this machine's tiny MLPs (see docs/model.md), so it is not used. Swap here only.
    """
    import copy

    with warnings.catch_warnings():
        # The deprecation notices are about the API's future, not this call's result.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(module).cpu().eval(), {nn.Linear}, dtype=torch.qint8)


def _is_qlinear(m: nn.Module) -> bool:
    return isinstance(m, torch.ao.nn.quantized.dynamic.Linear)


class Int8Module(nn.Module):
    """A base module with int8 dynamic Linear layers; state is int8 tensors + scales."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.net = quantize_int8(base)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(*inputs)
        return out

    def int8_state(self) -> dict[str, torch.Tensor]:
        """Tensors to write to safetensors: int8 weights, scales, zero points, everything else."""
        state: dict[str, torch.Tensor] = {}
        qnames = set()
        for name, m in self.net.named_modules():
            if _is_qlinear(m):
                qnames.add(name)
                w, b = m.weight(), m.bias()
                if w.qscheme() != torch.per_tensor_affine:
                    raise BadInputError(f"int8 layer {name}: only per-tensor scales are stored")
                state[f"{name}.weight_int8"] = w.int_repr().contiguous()
                state[f"{name}.weight_scale"] = torch.tensor([w.q_scale()], dtype=torch.float64)
                state[f"{name}.weight_zero_point"] = torch.tensor([w.q_zero_point()])
                if b is not None:
                    state[f"{name}.bias"] = b.detach().contiguous()
        for name, t in self.net.state_dict().items():
            if not any(name.startswith(q + ".") for q in qnames):
                state[name] = t.detach().contiguous()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:
        """Load what `int8_state` wrote; exact (the int8 values are taken as they are)."""
        state = dict(state_dict)
        expected = set(self.int8_state())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if strict and (missing or unexpected):
            raise RuntimeError(f"int8 state: missing keys {missing}, unexpected keys {unexpected}")
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", UserWarning)
            for name, m in self.net.named_modules():
                if not _is_qlinear(m) or f"{name}.weight_int8" not in state:
                    continue
                q = state.pop(f"{name}.weight_int8")
                scale = float(state.pop(f"{name}.weight_scale")[0])
                zp = int(state.pop(f"{name}.weight_zero_point")[0])
                bias = state.pop(f"{name}.bias", None)
                if q.shape != m.weight().shape:
                    raise RuntimeError(f"int8 state: {name} weight has shape {tuple(q.shape)}, "
                                       f"expected {tuple(m.weight().shape)}")
                w = torch._make_per_tensor_quantized_tensor(q.to(torch.int8), scale, zp)
                m.set_weight_bias(w, bias)
            for name, t in state.items():
                if name in expected:
                    owner, _, attr = name.rpartition(".")
                    target = getattr(self.net.get_submodule(owner), attr)
                    if target.shape != t.shape:
                        raise RuntimeError(f"int8 state: {name} has shape {tuple(t.shape)}, "
                                           f"expected {tuple(target.shape)}")
                    target.copy_(t)
        return nn.modules.module._IncompatibleKeys(missing, unexpected)


Build = Callable[[str, dict[str, Any]], nn.Module]
"""nets.registry.build: an architecture by name, as the composite variants build their parts."""


def _build_int8(build: Build, params: dict[str, Any]) -> nn.Module:
    try:
        base, base_params = params["base"], params["base_params"]
    except KeyError as e:
        raise TypeError(f"int8_dynamic needs {e.args[0]!r}") from None
    return Int8Module(build(base, base_params))


# -- the fused-embedding student --------------------------------------------------------------

@dataclass(kw_only=True)
class FusedTabularConfig:
    """Shape of a FusedTabularNet (stored in model.json)."""

    cardinalities: list[int]
    """Vocabulary size per categorical column (index 0 is the unknown value)."""
    embedding_dim: int = 8
    """One embedding width for every categorical column (what lets them share a table)."""
    n_numeric: int = 0
    """Number of standardised numeric inputs."""
    hidden: list[int] = field(default_factory=lambda: [32])
    """Hidden layer widths."""
    n_classes: int = 4
    """Output classes."""

    def __post_init__(self) -> None:
        if not self.cardinalities or any(c < 1 for c in self.cardinalities):
            raise BadInputError("a fused student needs categorical columns with cardinality >= 1")
        if self.embedding_dim < 1 or self.n_numeric < 0 or self.n_classes < 2:
            raise BadInputError("embedding_dim >= 1, n_numeric >= 0 and n_classes >= 2 required")
        if any(h < 1 for h in self.hidden):
            raise BadInputError("hidden widths must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def column_offsets(cardinalities: list[int]) -> torch.Tensor:
    """Where each column's vocabulary starts when all are laid end to end in one table."""
    starts = [0]
    for c in cardinalities[:-1]:
        starts.append(starts[-1] + c)
    return torch.tensor(starts, dtype=torch.long)


class FusedTabularNet(nn.Module):
    """logits = MLP([table(categorical + offsets).flatten(), numeric])."""

    def __init__(self, cfg: FusedTabularConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("offsets", column_offsets(cfg.cardinalities), persistent=False)
        self.table = nn.Embedding(sum(cfg.cardinalities), cfg.embedding_dim)
        width = cfg.embedding_dim * len(cfg.cardinalities) + cfg.n_numeric
        layers: list[nn.Module] = []
        for h in cfg.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, cfg.n_classes))
        self.mlp = nn.Sequential(*layers)

    def forward(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        offsets = self.get_buffer("offsets")
        emb = self.table(categorical + offsets).flatten(1)
        x = torch.cat([emb, numeric], dim=1) if self.cfg.n_numeric else emb
        out: torch.Tensor = self.mlp(x)
        return out


# -- the cascade ------------------------------------------------------------------------------

class CascadeNet(nn.Module):
    """Small model first; rows with top probability < tau go to the large model."""

    def __init__(self, small: nn.Module, large: nn.Module, tau: float) -> None:
        super().__init__()
        if not 0.0 <= tau <= 1.0:
            raise BadInputError(f"cascade tau {tau} must be in [0, 1]")
        self.small = small
        self.large = large
        self.tau = float(tau)

    def forward(self, categorical: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.small(categorical, numeric)
        confident = torch.softmax(logits, dim=1).amax(dim=1) >= self.tau
        # .nonzero() is a device sync point (data-dependent shape); it is what lets the large
        # model run on the unsure rows only, which is the whole point of the cascade.
        unsure = (~confident).nonzero().squeeze(1)
        if unsure.numel() == 0:
            return logits
        out = logits.clone()
        out[unsure] = self.large(categorical[unsure], numeric[unsure]).to(out.dtype)
        return out


def _build_cascade(build: Build, params: dict[str, Any]) -> nn.Module:
    try:
        small, large, tau = params["small"], params["large"], params["tau"]
        return CascadeNet(build(small["architecture"], small["params"]),
                          build(large["architecture"], large["params"]), float(tau))
    except KeyError as e:
        raise TypeError(
            f"cascade needs {e.args[0]!r} (small/large: architecture, params)") from None


def build_fused(params: dict[str, Any]) -> nn.Module:
    return FusedTabularNet(FusedTabularConfig(**params))


def builders(build: Build) -> dict[str, Callable[[dict[str, Any]], nn.Module]]:
    """The compressed variants' builders, listed by nets.registry; the composite ones (int8 of
    a base, a cascade of two nets) build their parts with `build` (the registry's, passed in so
    this module does not import the registry that lists it)."""
    return {"tabular_fused": build_fused,
            "int8_dynamic": functools.partial(_build_int8, build),
            "cascade": functools.partial(_build_cascade, build)}
