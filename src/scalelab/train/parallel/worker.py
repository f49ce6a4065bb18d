"""The process torchrun starts for a transformer run: `python -m scalelab.train.parallel.worker
RUN_DIR`.

Reads config.json, meta.json and the packed corpus from the run directory, joins the process
group (gloo on CPU, nccl on CUDA), trains, writes rank-<r>.json and, on rank 0, final.safetensors
(the full weights under the full model's names, whatever the strategy). A barrier precedes
destroy_process_group so no rank tears down a group another still uses.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from scalelab.train.parallel.config import ParallelConfig
from scalelab.train.parallel.loop import Rank, train
from scalelab.train.worker import _die_with_agent, exit_now

CONFIG_FILE = "config.json"
META_FILE = "meta.json"
DATA_FILE = "corpus.safetensors"
FINAL_FILE = "final.safetensors"


def rank_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank-{rank}.json"


def configure(threads: int, deterministic: bool) -> None:
    """The process-wide torch settings of a worker; runtime.measure_baseline's probe applies the
    same, so the baseline it measures is this process's (deterministic algorithms alone cost
    ~70 MiB of RSS on torch 2.13 CPU)."""
    torch.set_num_threads(threads)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if argv is None:
        _die_with_agent()
    if len(args) != 1:
        print("usage: python -m scalelab.train.parallel.worker RUN_DIR "
              "(started by `scalelab train --model transformer`)", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    cfg = ParallelConfig.read(run_dir / CONFIG_FILE)
    meta = json.loads((run_dir / META_FILE).read_text(encoding="utf-8"))
    cuda = bool(meta.get("cuda")) and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=timedelta(seconds=float(meta.get("collective_timeout_s", 300))))
    configure(int(meta["threads"]), cfg.deterministic)
    r = Rank(rank=dist.get_rank(), world=dist.get_world_size(),
             device=f"cuda:{local_rank}" if cuda else "cpu",
             restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    data = load_file(str(run_dir / DATA_FILE))["train"]
    report, state = train(cfg, data, r, run_dir=run_dir)
    report["threads"] = torch.get_num_threads()
    report["backend"] = dist.get_backend()
    if r.rank == 0 and state is not None:
        save_file({k: v.contiguous() for k, v in state.items()}, str(run_dir / FINAL_FILE))
    tmp = rank_file(run_dir, r.rank).with_suffix(".tmp")
    tmp.write_text(json.dumps(report), encoding="utf-8")
    tmp.replace(rank_file(run_dir, r.rank))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
