"""The variant architectures in scalelab.layers.nets.variants, as the server rebuilds them."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets import registry
from scalelab.layers.nets.tabular import TabularConfig, TabularNet
from scalelab.layers.nets.variants import (
    CascadeNet,
    FusedTabularConfig,
    FusedTabularNet,
    Int8Module,
)
from scalelab.system.compress.publish import files_size, write_model_files
from scalelab.system.compress.quantize import int8_variant


def _net() -> TabularNet:
    torch.manual_seed(0)
    return TabularNet(TabularConfig(cardinalities=[5, 7], n_numeric=3, hidden=[64, 64])).eval()


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return (torch.stack([torch.randint(0, 5, (16,), generator=g),
                         torch.randint(0, 7, (16,), generator=g)], 1),
            torch.randn(16, 3, generator=g))


def test_architectures_registered() -> None:
    assert {"tabular_fused", "int8_dynamic", "cascade"} <= set(registry.architectures())


def test_int8_round_trip_is_exact_and_smaller(tmp_path: Path) -> None:
    net = _net()
    q, arch, params = int8_variant(net, "tabular_mlp", net.cfg.to_dict())
    write_model_files(tmp_path / "q", q, arch=arch, params=params)
    registry.save_module(tmp_path / "f", net, arch="tabular_mlp", params=net.cfg.to_dict())
    tensors = load_file(str(tmp_path / "q" / registry.WEIGHTS_FILE))
    assert tensors["mlp.0.weight_int8"].dtype == torch.int8
    loaded = registry.load_module(tmp_path / "q")
    assert isinstance(loaded, Int8Module)
    c, x = _inputs()
    with torch.inference_mode():
        assert torch.equal(loaded(c, x), q(c, x))
        assert torch.allclose(q(c, x), net(c, x), atol=0.05)
    assert files_size(tmp_path / "q") < 0.6 * files_size(tmp_path / "f")


def test_int8_refuses_mismatched_weights(tmp_path: Path) -> None:
    net = _net()
    q, arch, params = int8_variant(net, "tabular_mlp", net.cfg.to_dict())
    write_model_files(tmp_path, q, arch=arch, params={**params, "base_params": {
        **params["base_params"], "hidden": [32, 64]}})
    with pytest.raises(BadInputError):
        registry.load_module(tmp_path)


def test_fused_student_uses_one_table_with_offsets() -> None:
    net = FusedTabularNet(FusedTabularConfig(cardinalities=[3, 4], embedding_dim=2, n_numeric=1,
                                             hidden=[5]))
    assert net.table.num_embeddings == 7
    with torch.no_grad():
        net.table.weight.copy_(torch.arange(14, dtype=torch.float32).reshape(7, 2))
    captured: list[torch.Tensor] = []
    net.mlp[0].register_forward_hook(lambda m, i, o: captured.append(i[0]))
    net(torch.tensor([[2, 1]]), torch.tensor([[9.0]]))
    # column 0 value 2 -> row 2; column 1 value 1 -> row 3 + 1 = 4
    assert captured[0].tolist() == [[4.0, 5.0, 8.0, 9.0, 9.0]]
    with pytest.raises(BadInputError):
        FusedTabularConfig(cardinalities=[], embedding_dim=2)


def test_cascade_round_trip(tmp_path: Path) -> None:
    small = FusedTabularNet(FusedTabularConfig(cardinalities=[5, 7], n_numeric=3, hidden=[8]))
    large = _net()
    net = CascadeNet(small, large, 0.8).eval()
    params = {"small": {"architecture": "tabular_fused", "params": small.cfg.to_dict()},
              "large": {"architecture": "tabular_mlp", "params": large.cfg.to_dict()},
              "tau": 0.8}
    write_model_files(tmp_path, net, arch="cascade", params=params)
    loaded = registry.load_module(tmp_path)
    c, x = _inputs()
    with torch.inference_mode():
        assert torch.equal(loaded(c, x), net(c, x))
    with pytest.raises(BadInputError):
        registry.build("cascade", {"small": params["small"]})
