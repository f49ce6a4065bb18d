"""ONNX model versions load through the registry and run like torch ones (needs onnxruntime,
part of the dev extras)."""

import json
from pathlib import Path

import pytest
import torch

from requires import requires
from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets import onnx, registry
from scalelab.layers.nets.tabular import TabularConfig, TabularNet
from scalelab.system.compress import ort

requires("onnxruntime")
requires("onnx")


def _export(tmp_path: Path) -> tuple[TabularNet, onnx.OnnxNet]:
    net = TabularNet(TabularConfig(cardinalities=[5, 7], n_numeric=3)).eval()
    return net, ort.tabular(net, tmp_path / "export", int8=False, n_categorical=2, n_numeric=3)


def test_onnx_version_round_trips(tmp_path: Path) -> None:
    net, exported = _export(tmp_path)
    version = tmp_path / "v1"
    onnx.save(version, exported)
    (version / registry.SPEC_FILE).write_text(json.dumps(
        {"architecture": onnx.ARCH, "params": {"exported_from": "tabular_mlp"}}))
    loaded = registry.load_module(version)
    c, x = torch.tensor([[1, 2], [4, 6]]), torch.randn(2, 3)
    with torch.inference_mode():
        assert torch.allclose(loaded(c, x), net(c, x), atol=1e-5)
    with pytest.raises(BadInputError, match="takes 2 inputs"):
        loaded(c)


def test_broken_onnx_versions_are_refused(tmp_path: Path) -> None:
    version = tmp_path / "v1"
    version.mkdir()
    (version / registry.SPEC_FILE).write_text(json.dumps({"architecture": "onnx", "params": {}}))
    with pytest.raises(BadInputError, match=r"model\.onnx is missing"):
        registry.load_module(version)
    (version / onnx.FILE).write_bytes(b"not a graph")
    with pytest.raises(BadInputError, match="not a loadable ONNX graph"):
        registry.load_module(version)


def test_outputs_appended_to_the_graph_equal_softmax_and_argmax(tmp_path: Path) -> None:
    net, exported = _export(tmp_path)
    fast = onnx.OnnxOutputs(exported)
    c, x = torch.tensor([[1, 2], [4, 6], [0, 0]]), torch.randn(3, 3)
    logits, probs, label = fast.run([c.numpy(), x.numpy()])
    with torch.inference_mode():
        want = net(c, x)
    assert torch.allclose(torch.from_numpy(logits), want, atol=1e-5)
    assert torch.allclose(torch.from_numpy(probs), torch.softmax(want, 1), atol=1e-6)
    assert label.dtype.name == "int64" and label.tolist() == want.argmax(1).tolist()
    with pytest.raises(BadInputError, match="takes 2 inputs"):
        fast.run([c.numpy()])


def test_outputs_are_not_appended_to_a_graph_that_is_not_one_logits_output(
        tmp_path: Path) -> None:
    class Two(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, x + 1

    path = ort.export(Two(), (torch.zeros(2, 3),), tmp_path / "two.onnx", input_names=["x"],
                      output_names=["a", "b"], dynamic_axes={"x": {0: "batch"}})
    with pytest.raises(BadInputError, match="has 2 outputs"):
        onnx.OnnxOutputs(onnx.OnnxNet(path.read_bytes()))
