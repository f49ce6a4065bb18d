"""The process torchrun starts: `python -m scalelab.train.worker RUN_DIR`.

Reads the run directory the launcher prepared (config.json, data.safetensors, meta.json), joins
the process group (gloo on CPU, nccl on CUDA), trains, and writes rank-<r>.json plus, on rank 0,
final.safetensors. A barrier precedes destroy_process_group so no rank tears down a group that
another rank is still using for its last collective; then `exit_now` skips interpreter teardown.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from scalelab.train.config import TabularRunConfig
from scalelab.train.dataset import TENSORS_FILE, Tensors
from scalelab.train.loop import Dist, train

CONFIG_FILE = "config.json"
META_FILE = "meta.json"
FINAL_FILE = "final.safetensors"


def rank_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank-{rank}.json"


def _write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj), encoding="utf-8")
    tmp.replace(path)


def _die_with_agent() -> None:
    """SIGKILL this worker when the torchrun agent that started it dies.

    torchrun starts each worker in a session of its own, so a SIGKILLed agent (a killed job, the
    OOM killer, a timeout's SIGKILL) left its workers training on, and writing checkpoints into
    the folder a re-run was already resuming from. Linux only (prctl PR_SET_PDEATHSIG); costs
    nothing while the agent lives.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if os.getppid() != parent:  # the agent died before the prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def exit_now(code: int) -> None:
    """End a worker whose process group is already destroyed without interpreter teardown.

    Why: after destroy_process_group, exit could still abort (SIGABRT, "terminate called
    without an active exception") when a C++ thread of gloo or the autograd engine was
    destroyed while joinable during static destruction — seen once in the sharded-optimizer
    test, after the rank had written its report. Every file this worker writes is closed by
    then, so only the standard streams need flushing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if argv is None:
        _die_with_agent()
    if len(args) != 1:
        print("usage: python -m scalelab.train.worker RUN_DIR (started by `scalelab train`)",
              file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    cfg = TabularRunConfig.read(run_dir / CONFIG_FILE)
    meta = json.loads((run_dir / META_FILE).read_text(encoding="utf-8"))
    torch.set_num_threads(int(meta["threads"]))
    cuda = bool(meta.get("cuda")) and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=timedelta(seconds=float(meta.get("collective_timeout_s", 300))))
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    d = Dist(rank=dist.get_rank(), world=dist.get_world_size(), distributed=True,
             device=f"cuda:{local_rank}" if cuda else "cpu",
             restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    data = Tensors.load(run_dir / TENSORS_FILE)
    report, _net, state = train(cfg, data, list(meta["cardinalities"]), d, run_dir=run_dir)
    report["threads"] = torch.get_num_threads()
    report["backend"] = dist.get_backend()
    if d.rank == 0 and state is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()},
                  str(run_dir / FINAL_FILE))
    _write_json(rank_file(run_dir, d.rank), report)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
