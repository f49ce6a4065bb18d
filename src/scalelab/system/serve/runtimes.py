"""How a loaded version becomes what its worker runs: the network with its outputs as one module
(`WithOutputs`), TorchScript-traced (`to_torchscript`) or exported to ONNX and opened in ONNX
Runtime (`to_onnx_runtime`, then `onnx_outputs` with softmax and argmax appended to the graph),
each checked against eager torch before it serves. The repository converts at load time (on a
thread); the worker (`serve.worker`) only runs the result.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import torch
from torch import nn

from scalelab.layers.nets.model_config import ModelConfig
from scalelab.layers.nets.onnx import OnnxNet, OnnxOutputs, export_graph
from scalelab.system.serve.tensors import FEED_DTYPES

log = logging.getLogger("scalelab.system.serve")

Outputs = dict[str, np.ndarray]
OUTPUT_KINDS = ("probabilities", "label", "logits")
COMPUTED = ("logits", "probabilities", "label")
"""The order of WithOutputs' results."""


# architectures without data-dependent control flow or Python side effects (the fault ones in
# faults.py have both, so they always run eagerly)
TRACE_SAFE = frozenset({"tabular_mlp"})


class WithOutputs(nn.Module):
    """The network and the outputs this server computes from its logits, as one module.
    Why: traced together, the forward pass, softmax and argmax are one graph the inference
    thread enters once — each torch call made from Python instead takes the GIL back, and
    beside a busy event loop each take can wait out a switch interval."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.net(*inputs).float()
        probs = torch.softmax(logits, dim=1)
        return logits, probs, probs.argmax(dim=1)


def to_torchscript(module: nn.Module, cfg: ModelConfig) -> nn.Module:
    """TorchScript-trace `WithOutputs(module)` on zero inputs shaped by the config; the eager
    wrapper if the trace fails or disagrees with it. Why: eager torch releases and re-takes
    the GIL at every op, and each re-take waits out the switch interval while the event loop
    runs Python."""
    wrapped = module if isinstance(module, WithOutputs) else WithOutputs(module)
    example = _example(cfg)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.freeze(torch.jit.trace(wrapped, example, check_trace=False).eval())
            want = wrapped(*example)
            for _ in range(3):  # the profiling executor optimises after a few runs
                got = traced(*example)
        if not all(torch.allclose(w.float(), g.float(), atol=1e-5)
                   for w, g in zip(want, got, strict=True)):
            log.warning("trace of %s disagrees with eager; serving eagerly", cfg.name)
            return wrapped
        return traced
    except Exception as e:  # a model that cannot be traced is still served, eagerly
        log.warning("model %s cannot be traced (%s); serving eagerly", cfg.name, e)
        return wrapped


def _example(cfg: ModelConfig) -> tuple[torch.Tensor, ...]:
    """Zero network inputs shaped by the config (2 rows where the batch dimension is free)."""
    return tuple(torch.zeros([2 if d == -1 else d for d in t.shape],
                             dtype=getattr(torch, FEED_DTYPES[t.datatype].name))
                 for t in cfg.network_inputs())


def _check_batches(cfg: ModelConfig) -> list[tuple[torch.Tensor, ...]]:
    """Inputs the exported graph must agree with torch on: zeros of 2 rows (what it was
    exported on), then 1 and 7 rows (the batch dimension really is free) with seeded normal
    floats — integer inputs stay 0, the one index every embedding table has."""
    g = torch.Generator().manual_seed(0)
    out = [_example(cfg)]
    for rows in (1, 7):
        batch = []
        for t in cfg.network_inputs():
            shape = [rows if i == 0 else (3 if d == -1 else d) for i, d in enumerate(t.shape)]
            dtype = getattr(torch, FEED_DTYPES[t.datatype].name)
            batch.append(torch.randn(shape, generator=g).to(dtype) if dtype.is_floating_point
                         else torch.zeros(shape, dtype=dtype))
        out.append(tuple(batch))
    return out


def to_onnx_runtime(module: nn.Module, cfg: ModelConfig) -> OnnxNet:
    """`module` exported to ONNX and opened in ONNX Runtime (threads as torch's), after its
    logits agree with the module's own on `_check_batches` (rtol 1e-4, atol 1e-5). Raises
    ValueError saying why not (an op the exporter lacks, disagreement, onnx missing).
    Measured on the benchmark MLP: a 12-row batch 29 us against 59 for the traced torch net
    alone, and the server's CPU per 1-row request 104 us against 129 (closed loop, median of
    ten alternating runs)."""
    example = _example(cfg)
    names = [t.name for t in cfg.network_inputs()]
    axes = {t.name: {i: f"{t.name}_{i}" for i, d in enumerate(t.shape) if d == -1}
            for t in cfg.network_inputs()}
    axes["logits"] = {0: "batch"}
    module = module.eval()
    try:
        graph = export_graph(module, example, input_names=names, output_names=["logits"],
                             dynamic_axes=axes)
        net = OnnxNet(graph)
    except Exception as e:  # the exporter and onnxruntime raise their own types
        raise ValueError(f"ONNX export failed: {type(e).__name__}: {e}") from None
    with torch.inference_mode():
        for batch in _check_batches(cfg):
            try:
                want = module(*batch).float()
                got = net(*batch).float()
            except Exception as e:  # a graph that cannot run a free batch size, say
                raise ValueError(f"a {len(batch[0])}-row check batch failed: "
                                 f"{type(e).__name__}: {e}") from None
            if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                worst = (got - want).abs().max().item() if got.shape == want.shape else None
                raise ValueError(f"the exported graph disagrees with torch on a {len(batch[0])}"
                                 f"-row check batch (largest logit difference {worst})")
    return net


def onnx_outputs(net: OnnxNet, cfg: ModelConfig) -> OnnxOutputs | None:
    """The ONNX version's graph with its softmax and argmax appended (OnnxOutputs), checked
    against the eager path on zero inputs; None (serve it eagerly) when it cannot be built or
    disagrees. Measured on the benchmark MLP, one row after the request handling that
    precedes a forward in the server: 92 us a batch against 168 for the traced torch net."""
    example = _example(cfg)
    try:
        fast = OnnxOutputs(net)
        got = fast.run([t.numpy() for t in example])
        with torch.inference_mode():
            want = WithOutputs(net)(*example)
        if all(np.allclose(g, w.numpy(), atol=1e-5) for g, w in zip(got, want, strict=True)):
            return fast
        log.warning("ONNX graph of %s with outputs disagrees with eager; serving eagerly",
                    cfg.name)
    except Exception as e:  # the eager path still serves it
        log.warning("ONNX graph of %s: outputs not appended (%s); serving eagerly", cfg.name, e)
    return None


def check_outputs(cfg: ModelConfig) -> None:
    bad = [t.name for t in cfg.outputs if t.name not in OUTPUT_KINDS]
    if bad:
        raise ValueError(f"outputs {bad} are not computable; this server returns "
                         f"{list(OUTPUT_KINDS)} from the network's logits")
