"""The process torchrun starts for a transformer run:
`python -m scalelab.system.train.parallel.worker RUN_DIR`.

Reads config.json, meta.json and the packed corpus from the run directory, joins the process
group (gloo on CPU, nccl on CUDA), trains, writes rank-<r>.json and, on rank 0, final.safetensors
(the full weights under the full model's names, whatever the strategy). The process's life is
train.rank's, shared with the tabular trainer's worker.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from scalelab.system.train.parallel.config import ParallelConfig
from scalelab.system.train.parallel.loop import train
from scalelab.system.train.rank import die_with_agent, exit_now, join_group, leave_group
from scalelab.system.train.rundir import CONFIG_FILE, FINAL_FILE, META_FILE, rank_file, write_json

DATA_FILE = "corpus.safetensors"


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
        die_with_agent()
    if len(args) != 1:
        print("usage: python -m scalelab.system.train.parallel.worker RUN_DIR "
              "(started by `scalelab train --model transformer`)", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    cfg = ParallelConfig.read(run_dir / CONFIG_FILE)
    meta = json.loads((run_dir / META_FILE).read_text(encoding="utf-8"))
    r = join_group(meta)
    configure(int(meta["threads"]), cfg.deterministic)
    data = load_file(str(run_dir / DATA_FILE))["train"]
    report, state = train(cfg, data, r, run_dir=run_dir)
    report["threads"] = torch.get_num_threads()
    report["backend"] = torch.distributed.get_backend()
    if r.rank == 0 and state is not None:
        save_file({k: v.contiguous() for k, v in state.items()}, str(run_dir / FINAL_FILE))
    write_json(rank_file(run_dir, r.rank), report)
    leave_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
