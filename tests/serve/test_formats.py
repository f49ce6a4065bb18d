"""Compressed variants are served like any version: a folded net and an ONNX Runtime graph."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from serve_fixtures import (
    PARAMS,
    PREPROCESS,
    flights_config,
    infer_body,
    sample_inputs,
    start_server,
)

from scalelab.model import ort
from scalelab.nets import folded, onnx, registry
from scalelab.nets.repository import write_json
from scalelab.nets.tabular import TabularConfig, TabularNet


def test_folded_and_onnx_versions_answer_like_their_source(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
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
    finally:
        srv.stop()
