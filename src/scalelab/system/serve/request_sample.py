"""A bounded, rotating sample of served requests (inputs and outputs) as JSON Lines, for the data
part's train/serve skew check.

One row per input row: request id, model, version, time, then flat feature columns decoded with
the version's preprocess.json (raw categorical values, de-standardised numerics) when it has one,
else the raw tensors per input; then the outputs. Files are `requests-<seq>.jsonl`, at most
`max_rows` rows each; the oldest is deleted beyond `max_files`, so the disk cost is bounded.
Writes happen on the inference thread, after the response is ready, under a lock.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.system.serve.canary import bucket
from scalelab.system.serve.features import Preprocess, decode


@dataclass(kw_only=True, frozen=True)
class RequestSampleConfig:
    """Where and how much of the traffic is logged."""

    directory: Path
    """Folder for requests-<seq>.jsonl files (created)."""
    rate: float = 1.0
    """Fraction of requests logged, chosen by request-id hash (so a retry logs the same way)."""
    max_rows: int = 10_000
    """Rows per file before rotating."""
    max_files: int = 10
    """Files kept; older ones are deleted."""

    def __post_init__(self) -> None:
        if not 0 < self.rate <= 1 or self.max_rows < 1 or self.max_files < 1:
            raise ValueError("sampling needs 0 < rate <= 1, max_rows >= 1, max_files >= 1")


class RequestSampler:
    def __init__(self, cfg: RequestSampleConfig) -> None:
        self.cfg = cfg
        cfg.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        existing = sorted(self._files())
        self._seq = (int(existing[-1].stem.split("-")[1]) + 1) if existing else 1
        self._rows = 0

    def _files(self) -> list[Path]:
        return sorted(self.cfg.directory.glob("requests-*.jsonl"),
                      key=lambda p: int(p.stem.split("-")[1]) if p.stem.split("-")[1].isdigit()
                      else 0)

    def wants(self, request_id: str) -> bool:
        return self.cfg.rate >= 1 or bucket(7, request_id) < self.cfg.rate

    def record(self, *, request_id: str, model: str, version: int, input_names: list[str],
               inputs: list[np.ndarray], outputs: dict[str, np.ndarray],
               pre: Preprocess | None) -> None:
        if not self.wants(request_id):
            return
        n = inputs[0].shape[0]
        if pre is not None and len(inputs) == 2:
            try:
                feats = decode(inputs[0], inputs[1], pre)
            except ValueError:
                feats = None
        else:
            feats = None
        if feats is None:
            feats = [{name: _plain(a[i]) for name, a in zip(input_names, inputs, strict=True)}
                     for i in range(n)]
        ts = time.time()
        lines = []
        for i in range(n):
            row: dict[str, Any] = {"request_id": request_id, "model": model, "version": version,
                                   "ts": ts, "row": i, **feats[i]}
            for name, a in outputs.items():
                row[f"out_{name}"] = a[i].tolist()
            lines.append(json.dumps(row, separators=(",", ":")))
        with self._lock:
            i = 0
            while i < len(lines):
                if self._rows >= self.cfg.max_rows:
                    self._seq += 1
                    self._rows = 0
                chunk = lines[i:i + self.cfg.max_rows - self._rows]
                path = self.cfg.directory / f"requests-{self._seq}.jsonl"
                with path.open("a", encoding="utf-8") as f:
                    f.write("\n".join(chunk) + "\n")
                self._rows += len(chunk)
                i += len(chunk)
            for old in self._files()[:-self.cfg.max_files]:
                old.unlink(missing_ok=True)


def _plain(row: Any) -> Any:
    """One row as JSON values (BYTES elements as UTF-8 text, undecodable bytes replaced)."""
    v = row.tolist() if isinstance(row, np.ndarray) else row
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v
