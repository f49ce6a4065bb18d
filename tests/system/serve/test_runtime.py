"""config.json's `runtime`: which engine runs a torch version's network (ONNX Runtime or torch)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from serve_fixtures import add_model, sample_inputs
from torch import nn

from requires import requires
from scalelab.layers.nets.model_config import ModelConfig
from scalelab.layers.nets.registry import load_module
from scalelab.system.serve import repository
from scalelab.system.serve.metrics import Metrics
from scalelab.system.serve.repository import ModelRepository
from scalelab.system.serve.runtimes import to_onnx_runtime

requires("onnx")
requires("onnxruntime")


def _loaded(root: Path, check: Any) -> Any:
    """Load every model of `root` in a real repository, run `check(repo)`, close it."""

    async def go() -> Any:
        repo = ModelRepository(root, metrics=Metrics(), sampler=None)
        await repo.load_all()
        try:
            return check(repo)
        finally:
            await repo.close()

    return asyncio.run(go())


def test_auto_runs_a_tabular_version_on_onnx_runtime_with_torchs_answers(tmp_path: Path) -> None:
    add_model(tmp_path, "flights", {1: 3})
    cat, num = sample_inputs(6, seed=2)

    def check(repo: ModelRepository) -> Any:
        worker = repo.models["flights"].versions[1].worker
        assert worker is not None
        assert worker.onnx is not None and worker.module is None  # one copy of the weights
        return worker.forward([cat, num])

    out = _loaded(tmp_path, check)
    net = load_module(tmp_path / "flights" / "1")
    with torch.inference_mode():
        want = torch.softmax(net(torch.from_numpy(cat), torch.from_numpy(num)), 1).numpy()
    np.testing.assert_allclose(out["probabilities"], want, rtol=1e-5, atol=1e-6)
    assert out["label"].tolist() == want.argmax(1).tolist()


def test_runtime_torch_keeps_the_torchscript_trace(tmp_path: Path) -> None:
    add_model(tmp_path, "flights", {1: 3}, runtime="torch")

    def check(repo: ModelRepository) -> None:
        worker = repo.models["flights"].versions[1].worker
        assert worker is not None and worker.onnx is None
        assert isinstance(worker.module, torch.jit.ScriptModule)

    _loaded(tmp_path, check)


def test_auto_leaves_an_architecture_not_known_trace_safe_to_torch(tmp_path: Path) -> None:
    add_model(tmp_path, "poison", {1: 3}, arch="poison_mlp", extra_params={"poison_value": 7.0})

    def check(repo: ModelRepository) -> None:
        worker = repo.models["poison"].versions[1].worker
        assert worker is not None and worker.onnx is None
        assert not isinstance(worker.module, torch.jit.ScriptModule)  # eager: it raises on 7

    _loaded(tmp_path, check)


def test_forced_onnxruntime_that_cannot_export_is_unavailable_with_the_reason(
        tmp_path: Path) -> None:
    # the export runs the net on zeros, which hold its poison value: the export raises
    add_model(tmp_path, "poison", {1: 3}, arch="poison_mlp", extra_params={"poison_value": 0.0},
              runtime="onnxruntime")

    def check(repo: ModelRepository) -> tuple[str, str]:
        s = repo.models["poison"].versions[1]
        return s.state, s.reason

    state, reason = _loaded(tmp_path, check)
    assert state == "UNAVAILABLE"
    assert reason.startswith("runtime onnxruntime: ONNX export failed: ")
    assert "poison value 0.0" in reason
    assert reason.endswith('set "runtime": "torch" in config.json to serve it with torch')


def test_without_onnx_installed_auto_serves_torch_and_forced_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repository, "onnx_available", lambda: False)
    add_model(tmp_path, "auto", {1: 3})
    add_model(tmp_path, "forced", {1: 3}, runtime="onnxruntime")

    def check(repo: ModelRepository) -> tuple[Any, str, str]:
        forced = repo.models["forced"].versions[1]
        return repo.models["auto"].versions[1].worker, forced.state, forced.reason

    auto, state, reason = _loaded(tmp_path, check)
    assert auto is not None and auto.onnx is None
    assert isinstance(auto.module, torch.jit.ScriptModule)
    assert state == "UNAVAILABLE"
    assert "onnx and onnxruntime are not both installed; pip install onnx onnxruntime" in reason


class _ByBatchSize(nn.Module):
    """Different arithmetic for a 2-row batch (what the export runs on) than for others: the
    graph freezes the 2-row branch, so the 1-row check batch must catch it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return y if x.shape[0] == 2 else -y


def test_an_export_that_freezes_a_branch_is_refused() -> None:
    cfg = ModelConfig.model_validate({
        "name": "b", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}]})
    with pytest.raises(ValueError, match="disagrees with torch on a 1-row check batch"):
        to_onnx_runtime(_ByBatchSize(), cfg)
    # without the branch the same net exports and agrees (the check is not refusing everything)
    plain = nn.Linear(3, 2)
    net = to_onnx_runtime(plain, cfg)
    x = torch.randn(4, 3)
    with torch.inference_mode():
        torch.testing.assert_close(net(x), plain(x), rtol=1e-5, atol=1e-6)


class _TwoRowsOnly(nn.Module):
    """Runs on exactly 2 rows (the export's), fails on any other count."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).view(2, 2)


def test_a_check_batch_that_fails_to_run_is_a_refusal_not_a_crash() -> None:
    cfg = ModelConfig.model_validate({
        "name": "b", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}]})
    with pytest.raises(ValueError, match=r"^a 1-row check batch failed: RuntimeError"):
        to_onnx_runtime(_TwoRowsOnly(), cfg)
