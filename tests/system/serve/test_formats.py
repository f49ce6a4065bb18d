"""Compressed variants are served like any version: a folded net and an ONNX Runtime graph."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import torch
from serve_fixtures import (
    PARAMS,
    PREPROCESS,
    flights_config,
    infer_body,
    sample_inputs,
    start_server,
)

from requires import requires
from scalelab.layers.nets import folded, onnx, registry
from scalelab.layers.nets.model_config import ModelConfig
from scalelab.layers.nets.repository import write_json
from scalelab.layers.nets.tabular import TabularConfig, TabularNet
from scalelab.system.compress import ort
from scalelab.system.serve.metrics import Metrics
from scalelab.system.serve.worker import VersionWorker


def test_folded_and_onnx_versions_answer_like_their_source(tmp_path: Path) -> None:
    requires("onnxruntime")
    torch.manual_seed(3)
    net = TabularNet(TabularConfig(**PARAMS)).eval()
    repo = tmp_path / "repo"
    write_json(repo / "flights" / "config.json", flights_config("flights"))  # latest 2: both
    v1, v2 = repo / "flights" / "1", repo / "flights" / "2"
    f = folded.fold(net)
    registry.save_module(v1, f, arch=folded.ARCH, params=f.cfg.to_dict())
    g = ort.tabular(net, tmp_path / "export", int8=False, n_categorical=4, n_numeric=14)
    onnx.save(v2, g)
    write_json(v2 / registry.SPEC_FILE, {"architecture": onnx.ARCH, "params": {}})
    for v in (v1, v2):
        write_json(v / "preprocess.json", PREPROCESS)
    cat, num = sample_inputs(5, seed=7)
    with torch.inference_mode():
        want = torch.softmax(net(torch.from_numpy(cat), torch.from_numpy(num)), 1).numpy()
    srv = start_server(repo, tmp_path / "server.log")
    try:
        for version in (1, 2):
            r = httpx.post(f"{srv.url}/v2/models/flights/versions/{version}/infer",
                           json=infer_body(5, seed=7), timeout=30)
            assert r.status_code == 200, r.text
            probs = np.array(r.json()["outputs"][0]["data"], dtype=np.float32).reshape(5, 4)
            np.testing.assert_allclose(probs, want, rtol=1e-4, atol=1e-5)
            assert r.json()["outputs"][1]["data"] == want.argmax(1).tolist()
    finally:
        srv.stop()


def test_an_onnx_version_runs_its_graph_with_outputs_appended(tmp_path: Path) -> None:
    requires("onnx")
    requires("onnxruntime")
    torch.manual_seed(0)
    net = TabularNet(TabularConfig(cardinalities=[5, 7], n_numeric=3)).eval()
    graph = ort.tabular(net, tmp_path / "export", int8=False, n_categorical=2, n_numeric=3)
    cfg = ModelConfig.model_validate({
        "name": "tab", "inputs": [{"name": "categorical", "datatype": "INT64", "shape": [-1, 2]},
                                  {"name": "numeric", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]},
                    {"name": "label", "datatype": "INT64", "shape": [-1]}],
        "max_batch_size": 8})
    worker = VersionWorker(model="tab", version=1, module=graph, cfg=cfg, pre=None,
                           metrics=Metrics(), sampler=None)
    assert worker.onnx is not None  # the fast path, not the eager wrapper
    c = np.array([[1, 2], [4, 6], [0, 3]], np.int64)
    x = np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)
    out = worker.forward([c, x])
    with torch.inference_mode():
        want = torch.softmax(net(torch.from_numpy(c), torch.from_numpy(x)), 1).numpy()
    np.testing.assert_allclose(out["probabilities"], want, atol=1e-6)
    assert out["label"].tolist() == want.argmax(1).tolist()
    assert set(out) == {"probabilities", "label"}
    assert worker.module is None  # the eager net and its session are not kept beside it
