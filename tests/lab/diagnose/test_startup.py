"""What the `scalelab diagnose` process itself loads: it runs no net, so it never imports torch
(its import cost ~1.7 s at the demo's start and its teardown at exit; docs/diagnose-runs.md)."""

import os
import subprocess
import sys
from pathlib import Path


def test_diagnose_process_does_not_import_torch() -> None:
    code = (
        "import sys; import scalelab.cli.diagnose, scalelab.lab.diagnose.stages.serve_config; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=os.environ.copy(), check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def test_registry_still_builds_saves_and_loads_nets(tmp_path: Path) -> None:
    """torch now comes in where a net is built, saved or loaded: the round trip still holds."""
    import torch

    from scalelab.layers.nets.registry import build, load_module, save_module

    params = {"cardinalities": [5], "n_numeric": 2, "hidden": [4], "n_classes": 3}
    net = build("tabular_mlp", params).eval()
    save_module(tmp_path, net, arch="tabular_mlp", params=params)
    back = load_module(tmp_path)
    cat, num = torch.tensor([[1], [4]]), torch.ones(2, 2)
    assert torch.equal(back(cat, num), net(cat, num))
