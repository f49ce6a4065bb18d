"""A model version stored as ONNX and run by ONNX Runtime, callable like any torch model.

Architecture ``onnx``: model.json + model.onnx (no safetensors). ONNX is a protobuf graph with
its weights inside; loading it runs no Python code from the file, so it keeps the repository's
"nothing is unpickled" rule. `OnnxNet` is an nn.Module only so the server, promotion gate and
bench can hold it like the others: forward hands the tensors to an InferenceSession (CPU,
threads as many as torch uses) and wraps the result back into a tensor.

Needs the optional packages onnx + onnxruntime (`pip install 'scalelab[serve]'`).
"""

from __future__ import annotations

import importlib.util
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from scalelab.lab.core.errors import BadInputError, BadUsageError, import_optional

ARCH = "onnx"
FILE = "model.onnx"
INSTALL_HINT = "pip install onnx onnxruntime (or: pip install 'scalelab[serve]')"


def runtime() -> Any:
    """The onnxruntime module, or a BadUsageError saying how to install it."""
    return import_optional("onnxruntime", needed_for="ONNX models need onnxruntime",
                           hint=INSTALL_HINT)


def available() -> bool:
    """Whether onnx and onnxruntime are both installed (exporting and appending outputs need
    onnx; running needs onnxruntime). Looks them up without importing either."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


def export_graph(module: nn.Module, example: tuple[torch.Tensor, ...], *,
                 input_names: list[str], output_names: list[str],
                 dynamic_axes: dict[str, dict[int, str]]) -> bytes:
    """`module` (on CPU, in eval mode) as ONNX graph bytes, opset 17. torch's TorchScript-based
    exporter (`dynamo=False`) needs only the `onnx` package, where the dynamo one would also
    pull onnxscript; like a trace it records the ops `example` runs through."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        # the TorchScript exporter writes to a file object too (typed for paths only)
        torch.onnx.export(module.cpu().eval(), example, buf, dynamo=False,  # type: ignore[arg-type]
                          input_names=input_names, output_names=output_names,
                          dynamic_axes=dynamic_axes, opset_version=17)
    return buf.getvalue()


class OnnxNet(nn.Module):
    """An ONNX graph (inputs in order, first output = logits) behind a torch-style forward."""

    def __init__(self, graph: bytes, *, threads: int | None = None) -> None:
        super().__init__()
        ort = runtime()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        # idle pool threads sleep rather than spin: beside an event loop on few cores a spinning
        # worker takes the core the loop needs (no effect with one thread: no pool)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(graph, sess_options=opts,
                                                providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for bad graphs
            raise BadInputError(f"not a loadable ONNX graph ({e}); re-export the model") from e
        self.graph = graph
        self.input_names = [i.name for i in self.session.get_inputs()]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != len(self.input_names):
            raise BadInputError(f"the ONNX graph takes {len(self.input_names)} inputs "
                                f"({', '.join(self.input_names)}), got {len(inputs)}")
        feed = {n: t.detach().cpu().numpy() for n, t in zip(self.input_names, inputs, strict=True)}
        return torch.from_numpy(np.asarray(self.session.run(None, feed)[0]))

    def nbytes(self) -> int:
        return len(self.graph)


class OnnxOutputs:
    """A classifier graph (one output: logits, shape [batch, classes]) with its softmax and
    argmax appended, in one session: `run` returns (logits, probabilities, label) as numpy
    arrays. The server's path for ONNX versions: no torch tensors on either side and one
    native call a batch (OnnxNet's forward goes numpy -> session -> torch, then softmax and
    argmax as separate torch calls). Needs the `onnx` package besides onnxruntime."""

    def __init__(self, net: OnnxNet) -> None:
        try:
            import onnx
            from onnx import TensorProto, helper
        except ImportError as e:
            raise BadUsageError(f"appending outputs to an ONNX graph needs onnx ({e}); "
                                f"{INSTALL_HINT}") from None
        model = onnx.load_from_string(net.graph)
        g = model.graph
        if len(g.output) != 1:
            raise BadInputError(f"the graph has {len(g.output)} outputs; expected one (logits)")
        out = g.output[0]
        if out.type.tensor_type.elem_type != TensorProto.FLOAT or \
                len(out.type.tensor_type.shape.dim) != 2:
            raise BadInputError("the graph's output is not float32 logits of shape "
                                "[batch, classes]")
        probs, label = "scalelab_probabilities", "scalelab_label"
        g.node.extend([helper.make_node("Softmax", [out.name], [probs], axis=1),
                       helper.make_node("ArgMax", [probs], [label], axis=1, keepdims=0)])
        g.output.extend([helper.make_tensor_value_info(probs, TensorProto.FLOAT, None),
                         helper.make_tensor_value_info(label, TensorProto.INT64, None)])
        ort = runtime()
        opts = net.session.get_session_options()
        self.session = ort.InferenceSession(model.SerializeToString(), sess_options=opts,
                                            providers=["CPUExecutionProvider"])
        self.input_names = net.input_names

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if len(arrays) != len(self.input_names):
            raise BadInputError(f"the ONNX graph takes {len(self.input_names)} inputs "
                                f"({', '.join(self.input_names)}), got {len(arrays)}")
        got: list[np.ndarray] = self.session.run(
            None, dict(zip(self.input_names, arrays, strict=True)))
        return got


def load(directory: Path, params: dict[str, Any]) -> OnnxNet:
    """Open DIR/model.onnx (params are informational: what was exported, how)."""
    path = directory / FILE
    if not path.is_file():
        raise BadInputError(f"{path} is missing; an '{ARCH}' model version needs {FILE}")
    return OnnxNet(path.read_bytes())


def save(directory: Path, net: OnnxNet) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / FILE).write_bytes(net.graph)
