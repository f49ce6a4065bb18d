"""The standard Triton HTTP client against our server: metadata, readiness, JSON and binary
tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from serve_fixtures import Server, sample_inputs

from requires import requires
from scalelab.layers.nets.registry import load_module

httpclient = requires("tritonclient.http")


def test_tritonclient_round_trip(server: Server, repo: Path) -> None:
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_server_metadata()["name"] == "scalelab"
        assert client.is_model_ready("flights") and client.is_model_ready("flights", "1")
        assert not client.is_model_ready("broken")
        meta = client.get_model_metadata("flights")
        assert [i["name"] for i in meta["inputs"]] == ["categorical", "numeric"]
        cat, num = sample_inputs(5, seed=11)
        net = load_module(repo / "flights" / "1")
        with torch.inference_mode():
            want = torch.softmax(net(torch.from_numpy(cat), torch.from_numpy(num)), 1).numpy()
        for binary in (False, True):
            a = httpclient.InferInput("categorical", [5, 4], "INT64")
            b = httpclient.InferInput("numeric", [5, 14], "FP32")
            a.set_data_from_numpy(cat, binary_data=binary)
            b.set_data_from_numpy(num, binary_data=binary)
            outs = [httpclient.InferRequestedOutput("probabilities", binary_data=binary),
                    httpclient.InferRequestedOutput("label", binary_data=binary)]
            res = client.infer("flights", [a, b], model_version="1", outputs=outs,
                               request_id=f"triton-{binary}")
            probs = res.as_numpy("probabilities")
            assert probs.shape == (5, 4) and probs.dtype == np.float32
            np.testing.assert_allclose(probs, want, rtol=1e-5, atol=1e-6)
            assert res.as_numpy("label").tolist() == want.argmax(1).tolist()
            assert res.get_response()["id"] == f"triton-{binary}"
        # no outputs named: the client asks for binary outputs of everything
        res = client.infer("flights", [a, b])
        assert res.as_numpy("label").shape == (5,)
    finally:
        client.close()
