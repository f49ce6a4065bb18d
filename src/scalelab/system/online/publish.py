"""Publishing through the serving repository: a candidate the updater's gate accepted is written
as the next version of REPO/<model>/ and goes through the serving part's own release path, run as
`scalelab` subprocesses (this part never imports serve): `serve canary` (the candidate takes a
share of traffic), then `serve promote` (the existing gate, on the held-out labelled window, as a
holdout file), else `serve rollback` to stop the canary; an automatic rollback is
`serve rollback`. Each call costs a process start (~2-4 s with torch), so this path suits
weekly or monthly updates; the benchmark's in-process gate is the same rule (core/gate.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.lab.core.errors import BadUsageError, RunFailedError
from scalelab.layers.nets import repository
from scalelab.system.online.learner import Learner


def _scalelab(*argv: str) -> tuple[int, dict[str, Any], str]:
    r = subprocess.run([sys.executable, "-m", "scalelab", *argv, "--json"], capture_output=True,
                       text=True, check=False)
    try:
        doc = json.loads(r.stdout) if r.stdout.strip() else {}
    except json.JSONDecodeError:
        doc = {}
    return r.returncode, doc, r.stderr.strip()


class RepositoryPublisher:
    """Versions in REPO/<model>, released through `scalelab serve canary/promote/rollback`."""

    def __init__(self, repo: Path, model: str, *, tolerance: float, canary_weight: float = 0.1
                 ) -> None:
        self.repo, self.model = repo, model
        self.tolerance, self.weight = tolerance, canary_weight
        self.versions: dict[int, int] = {}
        """In-process version -> repository version."""
        self.calls: list[dict[str, Any]] = []

    def bootstrap(self, learner: Learner, manifest: dict[str, Any]) -> int:
        if repository.versions(self.repo, self.model):
            raise BadUsageError(f"model {self.model!r} already has versions in {self.repo}; a "
                                "replay publishes a fresh model (pass another --model)")
        vdir = learner.save(self.repo, self.model, manifest=manifest)
        self.versions[learner.version] = int(vdir.name)
        return int(vdir.name)

    def _call(self, *argv: str) -> tuple[int, dict[str, Any]]:
        code, doc, err = _scalelab("serve", *argv, "--model-repo", str(self.repo), "--model",
                                   self.model)
        self.calls.append({"argv": list(argv), "exit": code})
        if code not in (0, 1):
            raise RunFailedError(f"scalelab serve {argv[0]} failed ({code}): {err[-300:]}")
        return code, doc

    def __call__(self, cand: Learner, holdout: pl.DataFrame) -> tuple[bool, list[str]]:
        vdir = cand.save(self.repo, self.model, manifest={"source": "scalelab online"})
        v = int(vdir.name)
        self.versions[cand.version] = v
        self._call("canary", "--candidate", str(v), "--weight", str(self.weight))
        with tempfile.TemporaryDirectory(prefix="scalelab-holdout-") as tmp:
            h = Path(tmp) / "holdout.parquet"
            holdout.write_parquet(h)
            code, doc = self._call("promote", "--candidate", str(v), "--holdout", str(h),
                                   "--tolerance", str(self.tolerance))
        if code == 0 and doc.get("accepted"):
            return True, []
        self._call("rollback")  # stop the canary: all traffic back on current
        return False, [str(r) for r in doc.get("reasons", [])] or ["refused"]

    def rolled_back(self, bad: Learner, restored: Learner) -> None:
        self._call("rollback")
