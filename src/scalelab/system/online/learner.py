"""The model the updater refreshes: the flights TabularNet (nets/tabular.py), fine-tuned in process
on CPU. One fine-tune of a week of flights (~6,000 rows, 2 epochs) takes a fraction of a second;
a torchrun launch per window would cost more than the update itself.

Compute is counted two ways: samples processed (rows x epochs, exact and machine-independent)
and CPU seconds of this process (what it cost here).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets import registry, repository
from scalelab.layers.nets.feature_version import KEY as FEATURE_VERSION_KEY
from scalelab.layers.nets.flights import CLASSES, NUMERIC, serving_config
from scalelab.layers.nets.tabular import TabularConfig, TabularNet
from scalelab.system.online.features import FeatureSpec

ARCH = "tabular_mlp"


@dataclass(kw_only=True)
class TrainConfig:
    """How a model is fitted and fine-tuned."""

    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """TabularNet hidden widths."""
    bootstrap_epochs: int = 4
    """Epochs of the first fit (on the bootstrap window)."""
    epochs: int = 2
    """Epochs of each fine-tune."""
    batch: int = 256
    lr: float = 2e-3
    """Adam learning rate for the first fit."""
    finetune_lr: float = 1e-3
    """Adam learning rate of a fine-tune (smaller: it refreshes, not relearns)."""
    class_weight_power: float = 0.5
    """Weight the loss by (inverse class frequency of the bootstrap labels) ** power: ~78% of
    2013's flights are on time and an unweighted fit (0) predicts little else (macro F1 ~0.22);
    fully balanced weights (1) push fine-tunes towards rare classes until on-time F1 collapses
    (0.83 -> 0.41 on a held-out week); the square root sits between."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.bootstrap_epochs < 1 or self.batch < 1:
            raise BadInputError("epochs, bootstrap_epochs and batch must be >= 1")
        if not (self.lr > 0 and self.finetune_lr > 0):
            raise BadInputError("learning rates must be > 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainingCost:
    """Compute spent: rows x epochs and CPU seconds (training and evaluation separately)."""

    samples: int = 0
    train_cpu_s: float = 0.0
    predictions: int = 0
    predict_cpu_s: float = 0.0

    def add(self, other: TrainingCost) -> None:
        self.samples += other.samples
        self.train_cpu_s += other.train_cpu_s
        self.predictions += other.predictions
        self.predict_cpu_s += other.predict_cpu_s


class Learner:
    """A TabularNet with the FeatureSpec it encodes with, and the compute it has spent."""

    def __init__(self, spec: FeatureSpec, cfg: TrainConfig, net: nn.Module | None = None,
                 version: int = 1) -> None:
        self.spec = spec
        self.cfg = cfg
        self.version = version
        self.trained_until = 0
        """Microseconds: the end of the newest data it was trained on (for staleness)."""
        self.class_weight: torch.Tensor | None = None
        """Loss weights per class, fixed at the first fit (fine-tunes keep them)."""
        if net is None:
            torch.manual_seed(cfg.seed)
            net = TabularNet(self.net_config())
        self.net = net

    def net_config(self) -> TabularConfig:
        return TabularConfig(cardinalities=self.spec.cardinalities(), n_numeric=len(NUMERIC),
                             hidden=list(self.cfg.hidden), n_classes=len(CLASSES))

    def clone(self, version: int) -> Learner:
        out = Learner(self.spec, self.cfg, copy.deepcopy(self.net), version)
        out.trained_until = self.trained_until
        out.class_weight = self.class_weight
        return out

    def fit(self, cat: np.ndarray, num: np.ndarray, y: np.ndarray, *, epochs: int, lr: float,
            seed: int) -> TrainingCost:
        """Minibatch Adam over the rows, `epochs` times, in a seeded order."""
        n = len(y)
        if n == 0:
            return TrainingCost()
        c0 = time.process_time()
        tc, tn, ty = torch.from_numpy(cat), torch.from_numpy(num), torch.from_numpy(y)
        if self.cfg.class_weight_power and self.class_weight is None:
            counts = np.bincount(y, minlength=len(CLASSES)).astype(np.float64)
            w = np.where(counts > 0, counts.sum() / (len(CLASSES) * np.maximum(counts, 1)), 0.0)
            self.class_weight = torch.tensor(w ** self.cfg.class_weight_power,
                                             dtype=torch.float32)
        opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        g = torch.Generator().manual_seed(seed)
        self.net.train()
        for _ in range(epochs):
            perm = torch.randperm(n, generator=g)
            for s in range(0, n, self.cfg.batch):
                idx = perm[s:s + self.cfg.batch]
                loss = nn.functional.cross_entropy(self.net(tc[idx], tn[idx]), ty[idx],
                                                   weight=self.class_weight)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        self.net.eval()
        return TrainingCost(samples=n * epochs, train_cpu_s=time.process_time() - c0)

    def predict(self, cat: np.ndarray, num: np.ndarray) -> tuple[np.ndarray, TrainingCost]:
        c0 = time.process_time()
        out = []
        with torch.inference_mode():
            for s in range(0, len(cat), 16384):
                logits = self.net(torch.from_numpy(cat[s:s + 16384]),
                                  torch.from_numpy(num[s:s + 16384]))
                out.append(logits.argmax(dim=1).numpy())
        pred = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
        return pred, TrainingCost(predictions=len(pred), predict_cpu_s=time.process_time() - c0)

    def save(self, repo: str | Path, name: str, *, manifest: dict[str, Any]) -> Path:
        """Write this model as the next version of REPO/NAME in the serving layout: model.json
        (with its feature version), model.safetensors, preprocess.json and manifest.json; built
        under a temporary name and renamed, so the server never sees half a version."""
        root = Path(repo)
        mdir = repository.model_dir(root, name)
        mdir.mkdir(parents=True, exist_ok=True)
        if not (mdir / repository.CONFIG_FILE).exists():
            repository.write_json(mdir / repository.CONFIG_FILE, serving_config(name))
        version = repository.next_version(root, name)
        tmp = mdir / f".{version}.tmp"
        registry.save_module(tmp, self.net, arch=ARCH, params=self.net_config().to_dict(),
                             extra={"classes": list(CLASSES),
                                    FEATURE_VERSION_KEY: self.spec.version})
        repository.write_json(tmp / "preprocess.json", self.spec.to_dict())
        repository.write_json(tmp / repository.MANIFEST_FILE,
                              {"kind": "model", "name": f"{name}/{version}",
                               "feature_version": self.spec.version, **manifest})
        final = repository.version_dir(root, name, version)
        tmp.rename(final)
        return final
