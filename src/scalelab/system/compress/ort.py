"""ONNX export and ONNX Runtime sessions (optional: `pip install onnx onnxruntime`).

Export uses torch's TorchScript-based exporter (`dynamo=False`): it needs only the `onnx`
package, while the dynamo exporter would also pull onnxscript. int8 here is ONNX Runtime's
dynamic quantization (MatMul weights int8, activations quantized per batch), the counterpart of
torch's quantize_dynamic.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scalelab.lab.core.errors import BadUsageError, import_optional
from scalelab.layers.nets.onnx import OnnxNet, export_graph

INSTALL_HINT = "pip install onnx onnxruntime (or: .venv/bin/pip install onnx onnxruntime)"


def _require() -> Any:
    need = "ONNX Runtime variants need onnx and onnxruntime"
    import_optional("onnx", needed_for=need, hint=INSTALL_HINT)
    return import_optional("onnxruntime", needed_for=need, hint=INSTALL_HINT)


def available() -> bool:
    """Whether onnx and onnxruntime are importable (the optional ONNX variants need both)."""
    try:
        _require()
    except BadUsageError:
        return False
    return True


def export(module: nn.Module, example: tuple[torch.Tensor, ...], path: Path, *,
           input_names: list[str], output_names: list[str],
           dynamic_axes: dict[str, dict[int, str]]) -> Path:
    """Export `module` (on CPU) to ONNX at `path` (`nets.onnx.export_graph`)."""
    _require()
    path.write_bytes(export_graph(module, example, input_names=input_names,
                                  output_names=output_names, dynamic_axes=dynamic_axes))
    return path


def quantize(src: Path, dst: Path) -> Path:
    """ONNX Runtime dynamic int8 quantization of `src` into `dst`."""
    _require()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # It logs a "consider pre-processing" advice on the root logger at every call; silence
    # that (and only up to WARNING) while it runs.
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)
    return dst


def session(path: Path, *, threads: int | None = None) -> Any:
    """A CPU InferenceSession using as many threads as torch does (a fair comparison)."""
    ort = _require()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def tabular(module: nn.Module, workdir: Path, *, int8: bool, n_categorical: int,
            n_numeric: int, threads: int = 1) -> OnnxNet:
    """Export a flights model (fp32, optionally ORT-int8) and open it."""
    workdir.mkdir(parents=True, exist_ok=True)
    example = (torch.zeros((2, n_categorical), dtype=torch.long),
               torch.zeros((2, n_numeric), dtype=torch.float32))
    fp32 = export(module, example, workdir / "model.onnx",
                  input_names=["categorical", "numeric"], output_names=["logits"],
                  dynamic_axes={"categorical": {0: "batch"}, "numeric": {0: "batch"},
                                "logits": {0: "batch"}})
    if not int8:
        return OnnxNet(fp32.read_bytes(), threads=threads)
    return OnnxNet(quantize(fp32, workdir / "model.int8.onnx").read_bytes(), threads=threads)
