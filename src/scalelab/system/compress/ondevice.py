"""Compressed variants on a target device: each variant written as a model version, then loaded
and timed at batch 1 by a `scalelab model time` child held to a device profile
(core/device.py: pinned CPUs, threads, memory limit), so "does int8 fit in 256 MiB on one core,
and how fast is it there" is measured, not guessed.

The child loads the version from its files the way a server would (safetensors, or the ONNX
graph), so its peak RSS counts the interpreter, torch and the model: what the device must hold.
Variants that are not a standalone model (the cache, masked controls) are listed as not measured.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from scalelab.lab.core.device import DeviceProfile, run_limited
from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets import registry
from scalelab.system.compress.measure import time_calls
from scalelab.system.compress.publish import write_model_files

ROWS_FILE = "rows.safetensors"


def write_rows(path: Path, categorical: torch.Tensor, numeric: torch.Tensor) -> Path:
    """The rows a device run times on, as safetensors (categorical, numeric)."""
    save_file({"categorical": categorical.contiguous().cpu(),
               "numeric": numeric.contiguous().cpu()}, str(path))
    return path


def time_version(model_dir: Path, rows: Path, *, calls: int, warmup: int) -> dict[str, Any]:
    """Load a model version and time it at batch 1 on `rows`, in this process (the child)."""
    try:
        t = load_file(str(rows))
        c, x = t["categorical"], t["numeric"]
    except Exception as e:  # safetensors raises its own error types
        raise BadInputError(f"{rows}: not a rows file with categorical and numeric "
                            f"tensors ({e})") from e
    model = registry.load_module(model_dir)
    with torch.inference_mode():
        ms = time_calls(model, c, x, batch_size=1, calls=calls, warmup=warmup, device="cpu")
    ms.sort()
    return {"model": str(model_dir), "calls": calls, "p50_ms": statistics.median(ms),
            "p95_ms": ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))],
            "torch_threads": torch.get_num_threads()}


def measure_on_device(variants: list[Any], profile: DeviceProfile, workdir: Path, *,
                      categorical: torch.Tensor, numeric: torch.Tensor, calls: int,
                      warmup: int = 20, timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """One row per variant: fit, reason, p50/p95 at batch 1, peak RSS, CPUs, mechanism."""
    workdir.mkdir(parents=True, exist_ok=True)
    rows = write_rows(workdir / ROWS_FILE, categorical[:512], numeric[:512])
    out = []
    for v in variants:
        row: dict[str, Any] = {"variant": v.name}
        if v.arch is None or not isinstance(v.model, nn.Module):
            out.append({**row, "fit": None, "measured": False,
                        "reason": "not a standalone model (nothing to load)"})
            continue
        d = workdir / v.name
        write_model_files(d, v.model, arch=v.arch, params=v.arch_params)
        run = run_limited(["scalelab", "model", "time", "--model", str(d), "--rows", str(rows),
                           "--calls", str(calls), "--warmup", str(warmup), "--json"],
                          profile, timeout_s=timeout_s)
        row.update(run.as_dict())
        row["measured"] = True
        if run.fit:
            try:
                row.update({k: json.loads(run.stdout)[k] for k in ("p50_ms", "p95_ms")})
            except (ValueError, KeyError):
                row.update(fit=None, reason=f"unreadable child output: {run.stdout[:200]!r}")
        out.append(row)
    return out
