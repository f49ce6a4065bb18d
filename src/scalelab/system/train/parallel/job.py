"""A transformer run end to end: corpus into the run directory, torchrun, every rank's report
read back into one summary beside the memory planner's prediction.

The launch and the run directory are the ones both trainers share (train.launch: free port,
timeout, process-group kill, threads policy; train.rundir: the files and reading them back),
pointed at this package's worker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.torch import load_file, save_file

from scalelab.lab.core.errors import RunFailedError
from scalelab.layers.plan.memory import MemoryQuery, plan_memory, plan_peak_rss
from scalelab.system.train.launch import LaunchConfig, PreparedRun, ready_run_dir, run_torchrun
from scalelab.system.train.parallel.config import ParallelConfig
from scalelab.system.train.parallel.runtime import RuntimeBaseline, measure_baseline
from scalelab.system.train.parallel.worker import DATA_FILE
from scalelab.system.train.rundir import (
    CONFIG_FILE,
    FINAL_FILE,
    META_FILE,
    final_weights,
    read_failure,
    read_rank_reports,
    weights_diff,
)
from scalelab.system.train.text import VOCAB_SIZE, Corpus, load_corpus

WORKER = "scalelab.system.train.parallel.worker"


@dataclass(frozen=True, kw_only=True)
class Prepared(PreparedRun):
    """The transformer run's directory and the corpus written there."""

    corpus: Corpus


def prepare(cfg: ParallelConfig, lc: LaunchConfig, run_dir: Path) -> Prepared:
    world = lc.nproc * lc.min_nodes()
    cfg.check_world(world)
    corpus = load_corpus(seq=cfg.data.seq, max_tokens=cfg.data.tokens, seed=cfg.seed)
    if cfg.data.batch > corpus.train.shape[0]:
        raise RunFailedError(f"--batch {cfg.data.batch} exceeds the {corpus.train.shape[0]} "
                             "training sequences; raise --tokens or lower --batch")
    threads, warning = ready_run_dir(lc, run_dir, cfg.threads)
    # Every file lands by rename: on a cluster, each node prepares the same shared run
    # directory (identical bytes), and a worker must never read another node's half-written one.
    tag = f".{os.getpid()}.tmp"
    save_file({"train": corpus.train, "val": corpus.val}, str(run_dir / (DATA_FILE + tag)))
    os.replace(run_dir / (DATA_FILE + tag), run_dir / DATA_FILE)
    cfg.write(run_dir / (CONFIG_FILE + tag))
    os.replace(run_dir / (CONFIG_FILE + tag), run_dir / CONFIG_FILE)
    (run_dir / (META_FILE + tag)).write_text(json.dumps({
        "threads": threads, "cuda": lc.cuda, "collective_timeout_s": min(lc.timeout_s, 300.0),
        "corpus": {"tokens": corpus.tokens, "files": corpus.files, "digest": corpus.digest,
                   "train_sequences": int(corpus.train.shape[0]),
                   "val_sequences": int(corpus.val.shape[0])}}), encoding="utf-8")
    os.replace(run_dir / (META_FILE + tag), run_dir / META_FILE)
    return Prepared(run_dir=run_dir, corpus=corpus, threads=threads, warning=warning)


def planned(cfg: ParallelConfig, world: int, n_params: int, *,
            baseline: RuntimeBaseline | None = None, data_bytes: int = 0) -> dict[str, Any]:
    """The memory planner's prediction for this run; with a measured process `baseline`, also
    the peak RSS (`peak_rss`)."""
    m, par = cfg.model, cfg.parallel
    strategy = "dp" if par.strategy == "single" else par.strategy
    q = MemoryQuery(params=n_params, layers=m.layers, hidden=m.hidden, seq=cfg.data.seq,
                    batch=cfg.data.batch, strategy=strategy,
                    world=world, heads=m.heads, kv_heads=m.kv_heads, ffn=m.ffn,
                    vocab=VOCAB_SIZE, micro_batches=par.micro_batches if strategy == "pp" else 1,
                    schedule=par.schedule, tp=par.tp if strategy == "fsdp+tp" else 2)
    out = plan_memory(q).to_dict()
    if baseline is not None:
        out["peak_rss"] = {**plan_peak_rss(q, runtime_bytes=baseline.peak_rss_bytes,
                                           data_bytes=data_bytes).to_dict(),
                           "baseline": baseline.to_dict()}
    return out


@dataclass(frozen=True, kw_only=True)
class ParallelResult:
    """One transformer run: the loss curve, throughput, and per-rank memory and communication."""

    strategy: str
    world: int
    threads: int
    steps: int
    batch: int
    seq: int
    n_params: int
    losses: list[float]
    """The global batch's mean token cross-entropy per step (steps of the last attempt)."""
    median_step_s: float
    tokens_per_s: float
    ranks: list[dict[str, Any]]
    """Per rank: memory bytes (params, grads, optimizer, activations, peak RSS), compute and
    communication per step by kind, bytes and bandwidth, pipeline bubble."""
    plan: dict[str, Any] | None
    corpus: dict[str, Any]
    wall_s: float
    failure: dict[str, Any] | None
    resumed_from: dict[str, Any] | None
    warning: str | None
    run_dir: str


def corpus_bytes(run_dir: Path) -> int:
    """Bytes of the corpus tensors a worker loads (train and held-out, both kept)."""
    return sum(int(v.numel() * v.element_size())
               for v in load_file(str(run_dir / DATA_FILE)).values())


def summarize(cfg: ParallelConfig, reports: list[dict[str, Any]], run_dir: Path,
              wall: float, warning: str | None, threads: int,
              baseline: RuntimeBaseline | None = None) -> ParallelResult:
    r0 = reports[0]
    world = len(reports)
    # Every rank runs every step in lockstep; the slowest rank's median is the step time.
    med = max(float(np.median(r["step_s"][1:] or r["step_s"])) for r in reports)
    full_params = sum(int(v.numel()) for v in load_file(str(run_dir / FINAL_FILE)).values())
    meta = json.loads((run_dir / META_FILE).read_text(encoding="utf-8"))
    keys = ("rank", "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes",
            "peak_rss_bytes", "peak_rss_profiled_bytes", "rss_before_model_bytes",
            "n_params_local", "compute_ms_per_step", "comm_ms_per_step", "profiled_step_ms",
            "comm", "pipeline", "rss_timeline")
    return ParallelResult(
        strategy=cfg.parallel.strategy, world=world, threads=int(r0.get("threads", threads)),
        steps=cfg.steps, batch=cfg.data.batch, seq=cfg.data.seq, n_params=full_params,
        losses=[float(v) for _, v in r0["losses"]], median_step_s=med,
        tokens_per_s=cfg.data.batch * cfg.data.seq / med if med > 0 else 0.0,
        ranks=[{k: r.get(k) for k in keys} for r in reports],
        plan=planned(cfg, world, full_params, baseline=baseline,
                     data_bytes=corpus_bytes(run_dir) if baseline is not None else 0),
        corpus=meta["corpus"], wall_s=wall,
        failure=read_failure(run_dir),
        resumed_from=r0.get("resumed_from"), warning=warning, run_dir=str(run_dir))


def run_parallel(cfg: ParallelConfig, lc: LaunchConfig, run_dir: Path,
                 *, restarts: bool = False, plan_rss: bool = False,
                 on_progress: Callable[[int, int, float], None] | None = None) -> ParallelResult:
    """Train `cfg` under torchrun in `run_dir` and summarise it. With `plan_rss` (CPU runs),
    the plan also predicts the peak RSS from the process baseline measured on this machine
    (runtime.measure_baseline: a child process the first time, ~10 s; cached after)."""
    prep = prepare(cfg, lc, run_dir)
    wall = run_torchrun(lc, run_dir, threads=prep.threads, worker=WORKER, tag="scalelab-tf",
                        restarts=restarts, train_less="--steps", on_progress=on_progress)
    reports = read_rank_reports(run_dir, lc.nproc * lc.min_nodes())
    baseline = (measure_baseline(cfg.parallel.strategy, threads=prep.threads,
                                 deterministic=cfg.deterministic)
                if plan_rss and not lc.cuda else None)
    return summarize(cfg, reports, run_dir, wall, prep.warning, prep.threads, baseline)


@dataclass(frozen=True, kw_only=True)
class Rehearsal:
    """A run with one rank SIGKILLed mid-way (torchrun restarts the group, which resumes from
    the newest complete checkpoint) against the same run uninterrupted."""

    killed_rank: int
    killed_at_step: int
    resumed_from_step: int | None
    recovery_s: float | None
    """From the kill to the restarted group's first finished step."""
    bitwise_equal: bool
    max_abs_diff: float
    losses_equal: bool
    """The steps both runs trained after the resume have bitwise-equal losses."""
    result: ParallelResult
    reference: ParallelResult


def failure_point(cfg: ParallelConfig, world: int) -> tuple[int, int]:
    """(step, rank) a rehearsal kills: after the first checkpoint, before the last step; seeded."""
    import random

    every = cfg.checkpoint.every
    if every < 1 or cfg.steps - 1 < every + 1:
        raise RunFailedError(f"a rehearsal needs a checkpoint before the kill: --steps "
                             f"{cfg.steps} is too short for --checkpoint-interval {every} "
                             f"(need steps >= interval + 2)")
    rng = random.Random(cfg.seed * 7919 + 17)
    return rng.randint(every + 1, cfg.steps - 1), rng.randrange(world)


def rehearse(cfg: ParallelConfig, lc: LaunchConfig, run_dir: Path) -> Rehearsal:
    """Kill one rank at a seeded step, recover, compare with an uninterrupted run."""
    import dataclasses
    import shutil

    world = lc.nproc * lc.min_nodes()
    step, rank = failure_point(cfg, world)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    crashing = cfg.replace(fail_at_step=step, fail_rank=rank, checkpoint_dir=None)
    result = run_parallel(crashing, dataclasses.replace(lc, max_restarts=max(1, lc.max_restarts)),
                          run_dir, restarts=True)
    ref_cfg = cfg.replace(checkpoint_every=0, fail_at_step=None, checkpoint_dir=None)
    reference = run_parallel(ref_cfg, dataclasses.replace(lc, max_restarts=0),
                             run_dir / "reference")
    equal, diff = weights_diff(final_weights(run_dir), final_weights(run_dir / "reference"))
    start = (result.resumed_from or {}).get("step")
    tail = reference.losses[start:] if start is not None else reference.losses
    first = read_rank_reports(run_dir, world)[0].get("first_step_unix")
    recovery = (first - result.failure["time"]) if result.failure and first else None
    return Rehearsal(killed_rank=rank, killed_at_step=step, resumed_from_step=start,
                     recovery_s=recovery, bitwise_equal=equal, max_abs_diff=diff,
                     losses_equal=tail == result.losses, result=result, reference=reference)
