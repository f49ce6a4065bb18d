"""A training job end to end: prepare, launch under torchrun, summarise, evaluate, export.

With `rehearse_failure`, the job runs twice with the same seed: once with a worker SIGKILLed
mid-run (torchrun restarts the group, which resumes from the last good checkpoint) and once
uninterrupted; it reports whether the final weights are bitwise equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from scalelab.core.errors import BadUsageError, RunFailedError
from scalelab.nets.tabular import TabularNet
from scalelab.train import export
from scalelab.train.config import TabularRunConfig
from scalelab.train.dataset import TENSORS_FILE, Tensors
from scalelab.train.evaluate import Evaluation, evaluate
from scalelab.train.launch import (
    LaunchConfig,
    final_weights,
    prepare_run,
    read_failure,
    read_rank_reports,
    run_directory,
    run_torchrun,
)
from scalelab.train.loop import model_config
from scalelab.train.summary import RunSummary, summarize


@dataclass(frozen=True, kw_only=True)
class Rehearsal:
    """The failed-and-recovered run against an uninterrupted one with the same seed."""

    bitwise_equal: bool
    max_abs_diff: float
    reference_final_loss: float
    reference_wall_s: float


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    summary: RunSummary
    evaluation: Evaluation
    n_train: int
    n_test: int
    torchrun_wall_s: float
    model_dir: str | None
    warning: str | None
    rehearsal: Rehearsal | None
    config: dict[str, Any]


def _weights_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[bool, float]:
    if a.keys() != b.keys():
        return False, float("inf")
    equal = all(torch.equal(a[k], b[k]) for k in a)
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    return equal, diff


def _one_run(cfg: TabularRunConfig, lc: LaunchConfig, run_dir: Path,
             on_warning: Callable[[str], None] | None,
             on_progress: Callable[[int, int, float], None] | None = None,
             ) -> tuple[Any, RunSummary, float]:
    prep = prepare_run(cfg, lc, run_dir)
    if prep.warning and on_warning is not None:
        on_warning(prep.warning)
    wall = run_torchrun(lc, prep, rehearse=cfg.rehearse_failure, on_progress=on_progress)
    world = lc.nproc * lc.min_nodes()
    summary = summarize(cfg, read_rank_reports(run_dir, world), read_failure(run_dir))
    return prep, summary, wall


def run_training(cfg: TabularRunConfig, lc: LaunchConfig, *, repo: str | None = None,
                 model_name: str = "flights", lineage: str | bool | None = None,
                 on_warning: Callable[[str], None] | None = None,
                 on_progress: Callable[[int, int, float], None] | None = None) -> TrainResult:
    if cfg.rehearse_failure and lc.max_restarts < 1:
        raise BadUsageError("--rehearse-failure needs --max-restarts >= 1 so torchrun can "
                            "restart the killed worker's group")
    if cfg.rehearse_failure and not cfg.deterministic:
        raise BadUsageError("--rehearse-failure compares weights bitwise; drop --nondeterministic")
    with run_directory(lc.run_dir) as run_dir:
        prep, summary, wall = _one_run(cfg, lc, run_dir, on_warning, on_progress)
        if cfg.rehearse_failure and summary.recovery is None:
            raise RunFailedError("the rehearsal killed no worker: the run is too short to fail "
                                 "after its first checkpoint; raise --steps or --epochs")
        state = load_file(str(final_weights(run_dir)))
        net = TabularNet(model_config(cfg, prep.preprocess.cardinalities(),
                                      len(prep.preprocess.numeric)))
        net.load_state_dict(state)
        data = Tensors.load(run_dir / TENSORS_FILE)
        ev = evaluate(net, data.test_cat, data.test_num, data.test_y, prep.preprocess.classes)
        rehearsal = None
        if cfg.rehearse_failure:
            ref_cfg = dataclasses.replace(cfg, rehearse_failure=False, checkpoint_every=0,
                                          checkpoint_auto=False, checkpoint_dir=None)
            ref_lc = dataclasses.replace(lc, max_restarts=0, run_dir=None)
            ref_dir = run_dir / "reference"
            _, ref_summary, ref_wall = _one_run(ref_cfg, ref_lc, ref_dir, None)
            equal, diff = _weights_diff(state, load_file(str(final_weights(ref_dir))))
            rehearsal = Rehearsal(bitwise_equal=equal, max_abs_diff=diff,
                                  reference_final_loss=ref_summary.final_loss,
                                  reference_wall_s=ref_wall)
        model_dir = None
        if repo is not None:
            params = {k: v for k, v in cfg.to_dict().items() if k != "rehearse_failure"}
            model_dir = str(export.save_version(
                repo=repo, name=model_name, net=net, net_config=net.cfg,
                preprocess=prep.preprocess, sources=prep.sources, params=params,
                metrics={**ev.summary(), "final_train_loss": summary.final_loss},
                training={"world": summary.world, "steps": summary.total_steps,
                          "global_batch": summary.global_batch, "n_train": prep.n_train,
                          "n_test": prep.n_test, "samples_per_s": summary.rate.samples_per_s},
                lineage=lineage))
        return TrainResult(summary=summary, evaluation=ev, n_train=prep.n_train,
                           n_test=prep.n_test, torchrun_wall_s=wall, model_dir=model_dir,
                           warning=prep.warning, rehearsal=rehearsal, config=cfg.to_dict())
