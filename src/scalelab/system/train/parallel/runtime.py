"""The process baseline: the resident bytes a training worker holds before its first tensor.

A torch process is hundreds of MiB of RSS before the model exists (the interpreter, torch's
shared libraries and their data, the modules the worker imports, the process group's store and
backend, the kernels' first-use allocations). The memory planner's tensors are only the model's
share of a rank's peak; to predict the peak RSS a user sees, the planner adds this baseline,
MEASURED on the machine at hand: a child process does what a worker does up to the model
(imports the worker's modules and the strategy's, applies its torch settings —
worker.configure: threads, deterministic algorithms, ~70 MiB on their own —, joins a one-rank
process group on the same backend, runs two steps of a tiny model of the same architecture and
one collective) and reports its peak RSS (VmHWM). The result is cached per machine, Python,
torch version, backend, thread count, determinism and strategy (`$SCALELAB_CACHE`, else
~/.cache/scalelab): measuring costs a torch import and a few seconds.

What it does not include: anything that grows with the world size (gloo keeps one pair of
buffers per peer: ~1 MiB at 2 ranks here), the data the run loads, and whatever the allocator
keeps after the first steps — the planner adds the first two, the benchmark shows the third.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import RunFailedError

CACHE_FILE = "runtime-baseline.json"

# The child: the worker's imports and process-group setup, nothing else. It prints one JSON line.
_CHILD = r"""
import importlib, json, os, sys, tempfile
from datetime import timedelta
import torch
import torch.distributed as dist
from torch import nn
from scalelab.system.train.parallel.worker import configure  # the worker's whole import graph
from scalelab.layers.nets.llama import LlamaConfig, LlamaForCausalLM, init_weights
backend, threads, modules = sys.argv[1], int(sys.argv[2]), sys.argv[4]
configure(threads, sys.argv[3] == "1")
with tempfile.TemporaryDirectory() as d:
    store = dist.FileStore(os.path.join(d, "store"), 1)
    dist.init_process_group(backend, store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    for name in filter(None, modules.split(",")):
        importlib.import_module(name)
    # Two steps of a tiny model of the same architecture: the kernels', autograd's and the
    # optimizer's first-use allocations (~18 MiB here) belong to the runtime, not the model.
    cfg = LlamaConfig(vocab_size=257, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=2, max_position_embeddings=16,
                      tie_word_embeddings=False)
    m = init_weights(LlamaForCausalLM(cfg), seed=0).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)
    for _ in range(2):
        x = torch.randint(0, 257, (2, 17))
        loss = nn.functional.cross_entropy(m(x[:, :-1]).reshape(-1, 257), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    t = torch.zeros(1)
    dist.all_reduce(t)
    dist.barrier()
    status = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                status[k] = int(v.split()[0]) * 1024
    dist.destroy_process_group()
print(json.dumps({"rss": status.get("VmRSS"), "hwm": status.get("VmHWM"),
                  "torch": torch.__version__}))
"""

# What each strategy imports lazily (train.parallel.apply / pipeline / loop), so its baseline
# holds those modules too.
STRATEGY_MODULES: dict[str, tuple[str, ...]] = {
    "single": (), "dp": ("torch.nn.parallel",),
    "fsdp": ("torch.distributed.fsdp", "torch.distributed.checkpoint.state_dict"),
    "tp": ("torch.distributed.tensor", "torch.distributed.tensor.parallel",
           "torch.distributed.checkpoint.state_dict"),
    "pp": ("torch.distributed.pipelining",),
    "fsdp+tp": ("torch.distributed.fsdp", "torch.distributed.tensor.parallel",
                "torch.distributed.checkpoint.state_dict"),
}

@dataclass(frozen=True, kw_only=True)
class RuntimeBaseline:
    """What one worker process holds before its model, on this machine."""

    peak_rss_bytes: int
    """VmHWM of the child after joining the group (the baseline the planner adds)."""
    rss_bytes: int
    """VmRSS at the same moment."""
    backend: str
    threads: int
    deterministic: bool
    strategy: str
    """Whose lazily imported modules the probe imported (STRATEGY_MODULES)."""
    torch_version: str
    python: str
    host: str
    cached: bool
    """True when read from the cache rather than measured now."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cache_path() -> Path:
    root = os.environ.get("SCALELAB_CACHE") or str(Path.home() / ".cache" / "scalelab")
    return Path(root) / CACHE_FILE


def cache_key(backend: str, threads: int, deterministic: bool, strategy: str,
              torch_version: str) -> str:
    """One entry per machine, interpreter, torch build, backend, thread count, determinism and
    strategy."""
    return "|".join([socket.gethostname(), platform.python_version(), torch_version, backend,
                     str(threads), "deterministic" if deterministic else "default", strategy])


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def measure_baseline(strategy: str = "dp", *, backend: str = "gloo", threads: int = 1,
                     deterministic: bool = True, use_cache: bool = True,
                     timeout_s: float = 120.0) -> RuntimeBaseline:
    """The baseline of a `strategy` worker on `backend` with `threads` intra-op threads: cached,
    else measured in a child process (and cached). Raises RunFailedError if the child fails."""
    if threads < 1:
        raise RunFailedError(f"threads must be >= 1; got {threads}")
    if strategy not in STRATEGY_MODULES:
        raise RunFailedError(f"no baseline probe for strategy {strategy!r}; one of "
                             f"{', '.join(STRATEGY_MODULES)}")
    key = cache_key(backend, threads, deterministic, strategy, _torch_version())
    path = cache_path()
    cache: dict[str, Any] = {}
    if path.is_file():
        try:
            cache = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cache = {}  # a corrupt cache is re-measured, not trusted
    if use_cache and isinstance(cache.get(key), dict):
        try:
            return RuntimeBaseline(**{**cache[key], "cached": True})
        except TypeError:
            pass  # an entry of another version's shape is re-measured, not trusted
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, backend, str(threads),
                              "1" if deterministic else "0", ",".join(STRATEGY_MODULES[strategy])],
                             capture_output=True, text=True, timeout=timeout_s, env=env,
                             check=False)
    except subprocess.TimeoutExpired as e:
        raise RunFailedError(f"measuring the process baseline took over {timeout_s:.0f} s; "
                             "retry on a less loaded machine") from e
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunFailedError(f"measuring the process baseline failed ({backend}): {tail}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    base = RuntimeBaseline(peak_rss_bytes=int(got["hwm"]), rss_bytes=int(got["rss"]),
                           backend=backend, threads=threads, deterministic=deterministic,
                           strategy=strategy,
                           torch_version=str(got["torch"]),
                           python=platform.python_version(), host=socket.gethostname(),
                           cached=False)
    cache[key] = {k: v for k, v in base.to_dict().items() if k != "cached"}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return base
