"""The process torchrun starts: `python -m scalelab.system.train.worker RUN_DIR`.

Reads the run directory the launcher prepared (config.json, data.safetensors, meta.json), joins
the process group (gloo on CPU, nccl on CUDA), trains, and writes rank-<r>.json plus, on rank 0,
final.safetensors. The process's life (group, report, teardown) is train.rank's, shared with the
transformer trainer's worker.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.dataset import TENSORS_FILE, Tensors
from scalelab.system.train.loop import train
from scalelab.system.train.rank import die_with_agent, exit_now, join_group, leave_group
from scalelab.system.train.rundir import CONFIG_FILE, FINAL_FILE, META_FILE, rank_file, write_json


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if argv is None:
        die_with_agent()
    if len(args) != 1:
        print("usage: python -m scalelab.system.train.worker RUN_DIR (started by `scalelab train`)",
              file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    cfg = TabularRunConfig.read(run_dir / CONFIG_FILE)
    meta = json.loads((run_dir / META_FILE).read_text(encoding="utf-8"))
    torch.set_num_threads(int(meta["threads"]))
    d = join_group(meta)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    data = Tensors.load(run_dir / TENSORS_FILE)
    report, _net, state = train(cfg, data, list(meta["cardinalities"]), d, run_dir=run_dir)
    report["threads"] = torch.get_num_threads()
    report["backend"] = torch.distributed.get_backend()
    if d.rank == 0 and state is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()},
                  str(run_dir / FINAL_FILE))
    write_json(rank_file(run_dir, d.rank), report)
    leave_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
