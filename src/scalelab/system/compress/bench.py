"""The compression bench: build each requested variant of a flights model, measure it the same
way on the same test rows and device, and write records (and, on request, publish the variants).

Variants (names accepted by `scalelab compress --variants`):

- ``int8``: dynamic int8 on the faster int8 path measured at batch 1 (torch.ao or ONNX Runtime;
  see model/quantize.py). CPU only; on a CUDA run it is measured on the CPU and says so.
- ``fold``: the model with its embeddings folded into the first layer (exact; nets/folded.py).
- ``prune-unstructured-<p>``: <p>% of each Linear's weights zeroed (L1), permanent, no speed-up.
- ``prune-structured-<p>``: <p>% of hidden neurons removed (L2), then a short fine-tune; the
  masked full-size model is measured beside it (row ``<name>-masked``) to show masks alone don't
  speed anything up.
- ``distill``: a fused-embedding student distilled from the model on the labelled rows plus a
  transfer set of unlabelled rows; a control student of the same shape trained on the labelled
  rows alone is measured beside it (row ``student-labels``). Both are served folded; the
  unfolded distilled student is measured too (row ``distill-unfolded``).
- ``cascade``: distilled (folded) student first, the model for unsure rows; swept over tau, the
  chosen tau published.
- ``cache``: a TTL + LRU prediction cache in front of the model, under a Zipf request stream.
- ``onnx`` / ``onnx-int8``: the model in ONNX Runtime, fp32 / dynamic int8 (CPU).

The baseline row ``fp32`` is always measured first; every delta and ratio is against it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.machine import current_machine
from scalelab.lab.core.peak_memory import PeakMemory
from scalelab.lab.core.records import Cost, Latency, Record, make_record, new_experiment_id
from scalelab.layers.nets import onnx, registry
from scalelab.layers.nets.folded import ARCH as FOLDED
from scalelab.layers.nets.folded import fold
from scalelab.layers.nets.tabular import TabularNet
from scalelab.layers.nets.variants import CascadeNet, FusedTabularNet
from scalelab.system.compress import cascade as cascade_mod
from scalelab.system.compress import ort
from scalelab.system.compress.cache import measure_cache
from scalelab.system.compress.distill import (
    DistillConfig,
    agreement,
    distill,
    new_student,
    train_on_labels,
)
from scalelab.system.compress.evaluate import Delta, Quality, compare, evaluate, predict_proba
from scalelab.system.compress.features import Features, Preprocess, load_split
from scalelab.system.compress.measure import (
    BatchTiming,
    MeasureConfig,
    Measurement,
    device_label,
    measure,
    median_of,
)
from scalelab.system.compress.prune import (
    amount_from_name,
    n_parameters,
    prune_structured,
    prune_unstructured,
    sparsity,
)
from scalelab.system.compress.publish import files_size, write_model_files
from scalelab.system.compress.quantize import choose_int8
from scalelab.system.compress.trainer import TrainConfig, cross_entropy, train

STAGE = "model"
FIXED = ("int8", "fold", "distill", "cascade", "cache", "onnx", "onnx-int8")
PREFIXES = ("prune-structured-", "prune-unstructured-")


def check_variants(names: list[str]) -> list[str]:
    """Validate variant names (see module docstring); returns them de-duplicated, in order."""
    out: list[str] = []
    for n in names:
        if n in FIXED:
            pass
        elif n.startswith(PREFIXES):
            amount_from_name(n, next(p for p in PREFIXES if n.startswith(p)))
        else:
            raise BadUsageError(
                f"unknown variant {n!r}; use any of {', '.join(FIXED)}, "
                "prune-structured-<percent>, prune-unstructured-<percent>")
        if n not in out:
            out.append(n)
    return out


@dataclass(kw_only=True)
class CompressConfig:
    """What to build and how to measure it."""

    variants: list[str]
    """Variant names (see module docstring)."""
    device: str = "cpu"
    """'cpu' or 'cuda' (already resolved)."""
    max_train_rows: int | None = 100_000
    """Train rows read for fine-tuning and distillation (None: all)."""
    max_test_rows: int | None = 20_000
    """Test rows for quality and timing (None: all)."""
    transfer_fraction: float = 0.5
    """Share of the train rows whose labels distillation does not see (the transfer set): the
    last rows in file order, i.e. the most recent under the contract's time split, whose labels
    would arrive last."""
    tolerance_points: float = 1.0
    """Flag a class whose F1 falls by more than this many points."""
    taus: list[float] = field(default_factory=lambda: [0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    """Cascade thresholds to sweep."""
    cascade_max_loss_points: float = 0.5
    """The published cascade's tau is the cheapest one losing at most this much macro F1."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """Student shape and distillation loss."""
    finetune: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=2, lr=1e-3))
    """The short fine-tune after structured pruning."""
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    """Timing and prices."""
    cache_requests: int = 2000
    """Requests in the cache's Zipf stream."""
    cache_zipf_s: float = 1.1
    """Zipf exponent of the request keys (higher: more repeats)."""
    cache_rate_per_s: float = 200.0
    """Arrival rate of the stream (drives expiry)."""
    cache_ttl_s: float = 5.0
    """Cache entry lifetime."""
    cache_capacity: int = 1024
    """Cache size bound (entries)."""

    def __post_init__(self) -> None:
        self.variants = check_variants(self.variants)
        if not 0.0 <= self.transfer_fraction < 1.0:
            raise BadUsageError("--transfer-fraction must be in [0, 1)")
        if self.device not in ("cpu", "cuda"):
            raise BadUsageError(f"device {self.device!r}: resolve it to cpu or cuda first")
        for n in (self.max_train_rows, self.max_test_rows):
            if n is not None and n < 64:
                raise BadUsageError("row limits must be >= 64")


@dataclass(kw_only=True)
class Variant:
    """One model variant and everything measured about it."""

    name: str
    technique: str
    parameters: dict[str, Any]
    model: Any
    """An nn.Module or any (categorical, numeric) -> logits callable."""
    arch: str | None = None
    """Registry architecture for publishing (None: not publishable, e.g. ONNX, cache)."""
    arch_params: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    extras: dict[str, Any] = field(default_factory=dict)
    quality: Quality | None = None
    delta: Delta | None = None
    measurement: Measurement | None = None
    size_bytes: int | None = None
    requested: bool = True
    """False for control rows (masked model, labels-only student), never published."""


@dataclass(kw_only=True)
class CompressBenchResult:
    experiment: str
    classes: list[str]
    variants: list[Variant]
    records: list[Record]

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


def _on(model: Any, device: str) -> Any:
    return model.to(device) if isinstance(model, nn.Module) else model


class Bench:
    """Builds, evaluates and times variants of one model version (see module docstring)."""

    def __init__(self, model_dir: Path, data_dir: Path, cfg: CompressConfig) -> None:
        self.model_dir = model_dir
        self.cfg = cfg
        self.spec = registry.read_spec(model_dir)
        self.teacher = registry.load_module(model_dir)
        self.pre = Preprocess.read(model_dir)
        self.classes = self.pre.classes
        self.train = load_split(data_dir, "train", self.pre, max_rows=cfg.max_train_rows)
        self.test = load_split(data_dir, "test", self.pre, max_rows=cfg.max_test_rows)
        if len(self.test) < max(cfg.measure.batch_sizes):
            raise BadInputError(f"{data_dir}/test.parquet has {len(self.test)} rows; need at "
                                f"least {max(cfg.measure.batch_sizes)} to time the largest batch")
        self._student: FusedTabularNet | None = None
        self.on_step: Callable[[str], None] = lambda _: None
        """Told what starts next (a variant's build, quality, a timing round): progress."""
        self._tmp = tempfile.TemporaryDirectory(prefix="scalelab-compress-")
        self.workdir = Path(self._tmp.name)

    def close(self) -> None:
        """Remove the scratch directory (ONNX exports)."""
        self._tmp.cleanup()

    # -- variants -----------------------------------------------------------------------------

    def build(self) -> list[Variant]:
        arch, params = self.spec["architecture"], self.spec["params"]
        out = [Variant(name="fp32", technique="baseline (the model as trained)", parameters={},
                       model=self.teacher, arch=arch, arch_params=params,
                       device=self.cfg.device, requested=False)]
        for name in self.cfg.variants:
            self.on_step(f"building {name}")
            out.extend(self._make(name, arch, params))
        return out

    def _make(self, name: str, arch: str, params: dict[str, Any]) -> list[Variant]:
        dev = self.cfg.device
        if name == "int8":
            return [self._int8(arch, params)]
        if name == "fold":
            folded = fold(self.teacher)
            with torch.inference_mode():
                c, x = self.test.categorical[:4096], self.test.numeric[:4096]
                diff = float((folded(c, x) - self.teacher.cpu()(c, x)).abs().max())
            self.teacher = self.teacher.to(dev)
            return [Variant(name=name, technique="embedding folding (exact rewrite: embeddings "
                            "x first layer precomputed, one lookup-and-sum)", parameters={},
                            model=folded, arch=FOLDED, arch_params=folded.cfg.to_dict(),
                            device=dev, extras={"max_abs_logit_diff": diff})]
        if name.startswith("prune-unstructured-"):
            amount = amount_from_name(name, "prune-unstructured-")
            m = prune_unstructured(self.teacher, amount)
            return [Variant(name=name, technique="unstructured L1 pruning, permanent",
                            parameters={"amount": amount}, model=m, arch=arch,
                            arch_params=params, device=dev,
                            extras={"sparsity": sparsity(m), "note": "zeros in dense matrices:"
                                    " dense kernels do the same work"})]
        if name.startswith("prune-structured-"):
            return self._structured(name, arch)
        if name == "distill":
            return self._distill()
        if name == "cascade":
            return [self._cascade(arch, params)]
        if name == "cache":
            return [Variant(name=name, technique="prediction cache (TTL + LRU) before the model",
                            parameters={"ttl_s": self.cfg.cache_ttl_s,
                                        "capacity": self.cfg.cache_capacity,
                                        "zipf_s": self.cfg.cache_zipf_s,
                                        "rate_per_s": self.cfg.cache_rate_per_s},
                            model=self.teacher, device=dev)]
        assert name in ("onnx", "onnx-int8"), name
        int8 = name == "onnx-int8"
        om = ort.tabular(self.teacher, self.workdir / name, int8=int8,
                         n_categorical=int(self.test.categorical.shape[1]),
                         n_numeric=int(self.test.numeric.shape[1]),
                         threads=self.cfg.measure.threads)
        self.teacher = self.teacher.to(dev)
        return [Variant(name=name, technique="ONNX Runtime " + ("dynamic int8" if int8
                                                               else "fp32"),
                        parameters={"provider": "CPU"}, model=om, arch=onnx.ARCH,
                        arch_params={"exported_from": arch, "int8": int8}, device="cpu")]

    def _int8(self, arch: str, params: dict[str, Any]) -> Variant:
        teacher = self.teacher.cpu()
        n = min(len(self.test), 4096)
        choice = choose_int8(teacher, arch, params, workdir=self.workdir,
                             categorical=self.test.categorical[:n], numeric=self.test.numeric[:n],
                             threads=self.cfg.measure.threads)
        self.teacher = teacher.to(self.cfg.device)
        extras: dict[str, Any] = {"candidates_p50_ms_batch1": choice.p50_ms_batch1}
        if self.cfg.device != "cpu":
            extras["note"] = "int8 dynamic kernels are CPU-only"
        return Variant(name="int8", technique=f"dynamic int8 quantization ({choice.backend}, "
                       "the faster int8 path measured at batch 1)",
                       parameters={"dtype": "qint8", "backend": choice.backend},
                       model=choice.model, arch=choice.arch, arch_params=choice.params,
                       device="cpu", extras=extras)

    def _structured(self, name: str, arch: str) -> list[Variant]:
        if arch != "tabular_mlp" or not isinstance(self.teacher, TabularNet):
            raise BadInputError(f"{name}: structured pruning needs a tabular_mlp model, "
                                f"not {arch!r}")
        amount = amount_from_name(name, "prune-structured-")
        teacher = self.teacher.cpu()
        masked, small = prune_structured(teacher, amount)
        with torch.inference_mode():
            c, x = self.test.categorical[:4096], self.test.numeric[:4096]
            diff = float((masked(c, x) - small(c, x)).abs().max())
        before = evaluate(self.test.labels, predict_proba(small, self.test.categorical,
                                                          self.test.numeric).argmax(1),
                          self.classes)
        train(small.to(self.cfg.device), self.train, cross_entropy(self.train.labels),
              self.cfg.finetune)
        self.teacher = self.teacher.to(self.cfg.device)
        extras = {"parameters_before": n_parameters(teacher),
                  "parameters_after": n_parameters(small),
                  "hidden_before": list(teacher.cfg.hidden),
                  "hidden_after": list(small.cfg.hidden),
                  "max_abs_diff_vs_masked_before_finetune": diff,
                  "macro_f1_before_finetune": before.macro_f1,
                  "finetune_epochs": self.cfg.finetune.epochs}
        return [
            Variant(name=name, technique="structured L2 pruning of hidden neurons, channels "
                    "removed, fine-tuned", parameters={"amount": amount,
                                                       "finetune_epochs": self.cfg.finetune.epochs},
                    model=small, arch="tabular_mlp", arch_params=small.cfg.to_dict(),
                    device=self.cfg.device, extras=extras),
            Variant(name=f"{name}-masked", technique="structured masks only (not removed)",
                    parameters={"amount": amount}, model=masked, device=self.cfg.device,
                    requested=False),
        ]

    def _split_train(self) -> tuple[Features, Features]:
        n = len(self.train)
        n_lab = max(1, round(n * (1.0 - self.cfg.transfer_fraction)))
        return self.train.take(slice(0, n_lab)), self.train.take(slice(n_lab, n)).unlabelled()

    def _new_student(self) -> FusedTabularNet:
        return new_student(self._cardinalities(), int(self.train.numeric.shape[1]),
                           len(self.classes), self.cfg.distill).to(self.cfg.device)

    def _cardinalities(self) -> list[int]:
        return [len(v) for v in self.pre.categorical.values()]

    def _macro(self, m: nn.Module) -> float:
        p = predict_proba(m, self.test.categorical, self.test.numeric).argmax(1)
        return evaluate(self.test.labels, p, self.classes).macro_f1

    def _distill(self) -> list[Variant]:
        dc = self.cfg.distill
        labelled, transfer = self._split_train()
        all_labels = self.train
        control = train_on_labels(labelled, self._new_student(), dc)
        control_all = train_on_labels(all_labels, self._new_student(), dc)
        kd_lab = distill(self.teacher, labelled, self._new_student(), dc)
        kd = distill(self.teacher, labelled, self._new_student(), dc, transfer=transfer)
        self._student = kd
        study = {"labelled_rows": len(labelled), "transfer_rows": len(transfer),
                 "macro_f1.labels_only_labelled": self._macro(control),
                 "macro_f1.labels_only_all_labels": self._macro(control_all),
                 "macro_f1.distilled_labelled": self._macro(kd_lab),
                 "macro_f1.distilled_labelled_plus_transfer": self._macro(kd),
                 "macro_f1.teacher": self._macro(self.teacher),
                 # fidelity: share of test rows where the student predicts the teacher's class
                 "teacher_agreement.labels_only_labelled": agreement(self.teacher, control,
                                                                     self.test),
                 "teacher_agreement.labels_only_all_labels": agreement(self.teacher, control_all,
                                                                       self.test),
                 "teacher_agreement.distilled_labelled": agreement(self.teacher, kd_lab,
                                                                   self.test),
                 "teacher_agreement.distilled_labelled_plus_transfer": agreement(
                     self.teacher, kd, self.test)}
        params = {"temperature": dc.temperature, "alpha": dc.alpha, "hidden": dc.hidden,
                  "embedding_dim": dc.embedding_dim, "epochs": dc.train.epochs,
                  "transfer_fraction": self.cfg.transfer_fraction}
        # The student is served folded (exact; nets/folded.py): its job is to be fast, and at
        # batch 1 the op count sets its latency. The unfolded row shows what folding adds.
        served, control_served = fold(kd), fold(control)
        return [
            Variant(name="distill", technique="knowledge distillation into a fused-embedding "
                    "student (labelled + unlabelled transfer rows), served folded",
                    parameters=params, model=served.to(self.cfg.device), arch=FOLDED,
                    arch_params=served.cfg.to_dict(), device=self.cfg.device,
                    extras={"study": study, "student_architecture": "tabular_fused",
                            "student_params": kd.cfg.to_dict()}),
            Variant(name="distill-unfolded", technique="the same student, not folded (control)",
                    parameters=params, model=kd, arch="tabular_fused",
                    arch_params=kd.cfg.to_dict(), device=self.cfg.device, requested=False),
            Variant(name="student-labels", technique="same student, labelled rows only "
                    "(control, no teacher), served folded",
                    parameters={"epochs": dc.train.epochs},
                    model=control_served.to(self.cfg.device), arch=FOLDED,
                    arch_params=control_served.cfg.to_dict(), device=self.cfg.device,
                    requested=False),
        ]

    def _cascade(self, arch: str, params: dict[str, Any]) -> Variant:
        small = self._student
        if small is None:
            labelled, transfer = self._split_train()
            small = distill(self.teacher, labelled, self._new_student(), self.cfg.distill,
                            transfer=transfer)
            self._student = small
        sp = predict_proba(small, self.test.categorical, self.test.numeric)
        lp = predict_proba(self.teacher, self.test.categorical, self.test.numeric)
        points = cascade_mod.sweep(sp, lp, self.cfg.taus)
        f1 = {p.tau: evaluate(self.test.labels, p.predictions, self.classes).macro_f1
              for p in points}
        share = {p.tau: p.share_to_large for p in points}
        base_f1 = evaluate(self.test.labels, lp.argmax(1), self.classes).macro_f1
        tau = cascade_mod.choose_tau(f1, share, base_f1, self.cfg.cascade_max_loss_points)
        served = fold(small).to(self.cfg.device)
        small_spec = {"architecture": FOLDED, "params": served.cfg.to_dict()}
        quick = MeasureConfig(batch_sizes=self.cfg.measure.batch_sizes,
                              calls=max(20, self.cfg.measure.calls // 4),
                              warmup=self.cfg.measure.warmup, threads=self.cfg.measure.threads,
                              price_per_core_hour=self.cfg.measure.price_per_core_hour,
                              price_per_gpu_hour=self.cfg.measure.price_per_gpu_hour)
        nets = [CascadeNet(served, self.teacher, p.tau).eval() for p in points]
        c, x = self.test.categorical.to(self.cfg.device), self.test.numeric.to(self.cfg.device)
        runs: list[list[Measurement]] = [[] for _ in points]
        for _ in range(self.cfg.measure.rounds):
            for i, net in enumerate(nets):
                runs[i].append(measure(net, c, x, quick, device=self.cfg.device))
        sweep_rows = []
        for p, r in zip(points, runs, strict=True):
            m = median_of(r)
            sweep_rows.append({"tau": p.tau, "share_to_large": p.share_to_large,
                               "macro_f1": f1[p.tau],
                               "macro_f1_delta_points": 100.0 * (f1[p.tau] - base_f1),
                               **{f"p50_ms_batch{t.batch_size}": t.p50_ms for t in m.timings}})
        return Variant(name="cascade", technique="cascade: distilled student, model when unsure",
                       parameters={"tau": tau, "max_loss_points":
                                   self.cfg.cascade_max_loss_points},
                       model=CascadeNet(served, self.teacher, tau).eval(), arch="cascade",
                       arch_params={"small": small_spec, "large": {"architecture": arch,
                                                                   "params": params},
                                    "tau": tau},
                       device=self.cfg.device,
                       extras={"share_to_large": share[tau], "sweep": sweep_rows})

    # -- measuring ----------------------------------------------------------------------------

    def evaluate_all(self, variants: list[Variant], experiment: str) -> CompressBenchResult:
        """Quality of every variant, then timing in interleaved rounds (median per variant)."""
        base: Quality | None = None
        inputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for v in variants:
            self.on_step(f"quality of {v.name}")
            v.model = _on(v.model, v.device)
            if v.device not in inputs:
                inputs[v.device] = (self.test.categorical.to(v.device),
                                    self.test.numeric.to(v.device))
            c, x = inputs[v.device]
            probs = predict_proba(v.model, c, x)
            v.quality = evaluate(self.test.labels, probs.argmax(1), self.classes)
            base = base or v.quality
            v.delta = compare(base, v.quality, tolerance_points=self.cfg.tolerance_points)
        runs: dict[str, list[Measurement]] = {v.name: [] for v in variants}
        cache_runs: list[dict[str, float]] = []
        tensor_peaks: dict[str, list[int]] = {}
        for rnd in range(self.cfg.measure.rounds):
            for v in variants:
                self.on_step(f"timing round {rnd + 1}/{self.cfg.measure.rounds}: {v.name}")
                c, x = inputs[v.device]
                # The process's peak resident memory while this variant ran (high-water
                # mark reset first); the tensor estimate stays beside it as its own field.
                with PeakMemory() as peak:
                    if v.name == "cache":
                        m, run = self._measure_cache(v.model, c, x)
                        cache_runs.append(run)
                    else:
                        m = measure(v.model, c, x, self.cfg.measure, device=v.device)
                tensor_peaks.setdefault(v.name, []).append(m.peak_memory_bytes)
                runs[v.name].append(dataclasses.replace(m, peak_memory_bytes=peak.peak_bytes))
        base_size: int | None = None
        for v in variants:
            v.measurement = median_of(runs[v.name])
            if v.name == "cache":
                v.extras["cache"] = {k: float(np.median([r[k] for r in cache_runs]))
                                     for k in cache_runs[0]}
            v.size_bytes = self._size(v)
            # 0 means the estimate saw no tensors (e.g. an ONNX session): not measured.
            v.extras["tensor_peak_bytes"] = max(tensor_peaks[v.name]) or None
            base_size = base_size or v.size_bytes
            if v.size_bytes and base_size:
                v.extras["size_ratio"] = v.size_bytes / base_size
        return CompressBenchResult(experiment=experiment, classes=self.classes, variants=variants,
                                   records=[self._record(i, v, variants[0], experiment)
                                            for i, v in enumerate(variants)])

    def _measure_cache(self, model: Any, c: torch.Tensor,
                       x: torch.Tensor) -> tuple[Measurement, dict[str, float]]:
        cfg = self.cfg
        run = measure_cache(model, c, x, n_requests=cfg.cache_requests, zipf_s=cfg.cache_zipf_s,
                            rate_per_s=cfg.cache_rate_per_s, ttl_s=cfg.cache_ttl_s,
                            capacity=cfg.cache_capacity)
        base = measure(model, c, x, cfg.measure, device=self.cfg.device)
        timings = [type(t)(batch_size=1, p50_ms=run.p50_ms_cached, p95_ms=run.p95_ms_cached,
                           rows_per_s=1e3 / run.mean_ms_cached if run.mean_ms_cached else 0.0)
                   if t.batch_size == 1 else t for t in base.timings]
        m = Measurement(device=base.device, timings=timings,
                        throughput_rows_per_s=base.throughput_rows_per_s,
                        peak_memory_bytes=base.peak_memory_bytes, model_bytes=base.model_bytes,
                        cost_per_1000_usd=base.cost_per_1000_usd, threads=base.threads)
        return m, run.as_dict()

    def _size(self, v: Variant) -> int | None:
        if v.arch is not None and isinstance(v.model, nn.Module):
            with tempfile.TemporaryDirectory(prefix="scalelab-size-") as d:
                write_model_files(Path(d), v.model, arch=v.arch, params=v.arch_params)
                return files_size(Path(d))
        return None

    def _record(self, i: int, v: Variant, base: Variant, experiment: str) -> Record:
        assert v.quality is not None and v.delta is not None and v.measurement is not None
        m, bm = v.measurement, base.measurement
        assert bm is not None
        b1 = m.at(1) or m.timings[0]
        ratios: dict[str, float] = {}
        for t in m.timings:
            bt = bm.at(t.batch_size)
            if bt and t.p50_ms > 0:
                ratios[f"speedup_p50_batch{t.batch_size}"] = bt.p50_ms / t.p50_ms
        quality = {**v.quality.as_dict(), "macro_f1_delta_points": v.delta.macro_f1_points,
                   "worst_class_f1_delta_points": v.delta.worst_class_points}
        n = len(self.test)
        return make_record(
            experiment=experiment, stage=STAGE, variable="variant", level=float(i),
            machine=current_machine(device=m.device),
            input_volume=float(n), input_unit="test rows",
            rate=m.throughput_rows_per_s, rate_unit="predictions/s",
            latency=_latency(b1),
            peak_memory_bytes=m.peak_memory_bytes or None, quality=quality,
            cost=Cost(usd=m.cost_per_1000_usd * n / 1000.0, per_unit_usd=m.cost_per_1000_usd,
                      unit="1,000 predictions"),
            recovery="none (an in-process model: the server's recovery applies)",
            extras={"variant": v.name, "technique": v.technique, "parameters": v.parameters,
                    "device": m.device, "threads": m.threads,
                    "latency_by_batch": {str(t.batch_size): {"p50_ms": t.p50_ms,
                                                             "p95_ms": t.p95_ms,
                                                             "rows_per_s": t.rows_per_s}
                                         for t in m.timings},
                    "size_bytes": v.size_bytes, "model_bytes": m.model_bytes or None,
                    "tensor_peak_bytes": v.extras.get("tensor_peak_bytes"), **ratios,
                    "flagged_classes": v.delta.flagged,
                    # core.sheet.SAMPLES_KEY: the batch-1 calls the latency quantiles rest on
                    **({"samples": len(b1.samples_ms), "samples_unit": "calls"}
                       if b1.samples_ms else {}),
                    "per_class_f1_delta_points": v.delta.per_class_f1_points,
                    "worst_class": v.delta.worst_class,
                    "extras": v.extras})


def _latency(t: BatchTiming) -> Latency:
    """The record's quantiles of one batch size: every recorded one from the pooled calls
    (so the verdict decides them on their count), else the median-of-rounds p50/p95."""
    q = t.quantiles()
    if not q:
        return Latency(p50_ms=t.p50_ms, p95_ms=t.p95_ms)
    return Latency(p50_ms=q[0.5], p90_ms=q[0.9], p95_ms=q[0.95], p99_ms=q[0.99],
                   p999_ms=q[0.999], max_ms=q[1.0])


def run_bench(model_dir: Path, data_dir: Path, cfg: CompressConfig,
              on_step: Callable[[str], None] | None = None) -> CompressBenchResult:
    """Build every requested variant, evaluate and time it; returns variants and records.
    `on_step` is told what starts next (for progress)."""
    # Tiny models train and run dispatch-bound: a second intra-op thread buys nothing and, on a
    # shared machine, stalls every parallel region waiting to be scheduled.
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.measure.threads)
    bench = Bench(model_dir, data_dir, cfg)
    if on_step is not None:
        bench.on_step = on_step
    try:
        bench.teacher = bench.teacher.to(cfg.device)
        variants = bench.build()
        result = bench.evaluate_all(variants, new_experiment_id("compress"))
    finally:
        bench.close()
        torch.set_num_threads(threads)
    for v in result.variants:
        v.extras.setdefault("device", device_label(v.device))
    return result
