"""A training job end to end: prepare, launch under torchrun, summarise, evaluate, export.

With `rehearse_failure`, the job runs twice with the same seed: once with a worker SIGKILLed
mid-run (torchrun restarts the group, which resumes from the last good checkpoint) and once
uninterrupted; it reports whether the final weights are bitwise equal.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.lab.core.errors import BadUsageError, RunFailedError
from scalelab.layers.nets.flights import Preprocess
from scalelab.layers.nets.tabular import TabularNet
from scalelab.system.train import export
from scalelab.system.train.config import TabularRunConfig
from scalelab.system.train.dataset import TENSORS_FILE, Source, Tensors, prepare
from scalelab.system.train.evaluate import Evaluation, evaluate
from scalelab.system.train.launch import (
    LaunchConfig,
    PreparedRun,
    ready_run_dir,
    run_directory,
    run_torchrun,
)
from scalelab.system.train.loop import model_config
from scalelab.system.train.rundir import (
    CONFIG_FILE,
    META_FILE,
    final_weights,
    read_failure,
    read_rank_reports,
    weights_diff,
)
from scalelab.system.train.summary import RunSummary, summarize


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


@dataclass(frozen=True, kw_only=True)
class Prepared(PreparedRun):
    """The tabular run's directory: the encoded data's preprocessing, sources and row counts."""

    preprocess: Preprocess
    sources: list[Source]
    n_train: int
    n_test: int


def prepare_run(cfg: TabularRunConfig, lc: LaunchConfig, run_dir: Path) -> Prepared:
    """Encode the data and write everything a worker reads into `run_dir`."""
    world = lc.nproc * lc.min_nodes()
    global_batch = cfg.global_batch(world)
    cfg.local_batch(world)
    if cfg.shard == "fsdp" and cfg.async_checkpoint:
        raise BadUsageError("--async-checkpoint is not supported with --shard fsdp "
                            "(its state gather is a collective on the training group)")
    tensors, pre, sources = prepare(cfg.data, cfg.limit, cfg.seed)
    tensors = tensors.subset_train(cfg.train_fraction, cfg.seed)
    if global_batch > tensors.n_train:
        raise BadUsageError(f"global batch {global_batch} exceeds the {tensors.n_train} training "
                            "rows; lower --batch or raise --limit")
    threads, warning = ready_run_dir(lc, run_dir, cfg.threads)
    tensors.save(run_dir / TENSORS_FILE)
    cfg.write(run_dir / CONFIG_FILE)
    pre.write(run_dir)
    (run_dir / META_FILE).write_text(json.dumps({
        "cardinalities": pre.cardinalities(), "threads": threads, "cuda": lc.cuda,
        "collective_timeout_s": min(lc.timeout_s, 300.0)}), encoding="utf-8")
    return Prepared(run_dir=run_dir, preprocess=pre, sources=sources, n_train=tensors.n_train,
                    n_test=int(tensors.test_y.shape[0]), threads=threads, warning=warning)


def _one_run(cfg: TabularRunConfig, lc: LaunchConfig, run_dir: Path,
             on_warning: Callable[[str], None] | None,
             on_progress: Callable[[int, int, float], None] | None = None,
             ) -> tuple[Any, RunSummary, float]:
    prep = prepare_run(cfg, lc, run_dir)
    if prep.warning and on_warning is not None:
        on_warning(prep.warning)
    wall = run_torchrun(lc, run_dir, threads=prep.threads, worker="scalelab.system.train.worker",
                        tag="scalelab", restarts=cfg.rehearse_failure,
                        train_less="--steps, --limit", on_progress=on_progress)
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
        state = final_weights(run_dir)
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
            equal, diff = weights_diff(state, final_weights(ref_dir))
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
