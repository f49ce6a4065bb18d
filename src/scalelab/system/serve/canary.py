"""Which version answers: the routing state in REPO/<model>/serving.json and the split rule.

    {"current": 1, "candidate": 2, "mode": "canary", "weight": 0.1, "seed": 0, "previous": null}

mode "canary" sends `weight` of unversioned requests to the candidate; "shadow" answers from
current and mirrors each request to the candidate, recording disagreement, never changing the
response; "none" serves current only. The split hashes (seed, request id), so a request id always
lands on the same version and a run is reproducible. The file is written atomically; the server
polls its mtime, so `scalelab serve rollback` takes effect within a poll interval (or at once
through POST /v2/repository/models/{name}/load).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.layers.nets.repository import (
    check_version,
    model_dir,
    read_json,
    versions,
    write_json,
)

ROUTING_FILE = "serving.json"
Mode = Literal["none", "canary", "shadow"]


@dataclass(kw_only=True, frozen=True)
class Routing:
    """A model's traffic routing."""

    current: int | None = None
    """Version answering unversioned requests; None = the newest loaded version."""
    candidate: int | None = None
    """Version under test (canary or shadow), or None."""
    mode: Mode = "none"
    """How the candidate sees traffic."""
    weight: float = 0.0
    """Fraction of unversioned requests the candidate answers in canary mode."""
    seed: int = 0
    """Salt of the request-id hash that splits traffic."""
    previous: int | None = None
    """Version that was current before the last promotion (what rollback restores)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.weight <= 1.0:
            raise BadInputError(f"canary weight {self.weight} must lie in [0, 1]")
        if self.mode not in ("none", "canary", "shadow"):
            raise BadInputError(f"routing mode {self.mode!r} must be none, canary or shadow")
        if self.mode != "none" and self.candidate is None:
            raise BadInputError(f"routing mode {self.mode!r} needs a candidate version")

    def versions(self) -> set[int]:
        return {v for v in (self.current, self.candidate) if v is not None}


def bucket(seed: int, request_id: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, request id)."""
    h = hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


def choose(r: Routing, request_id: str, default: int) -> int:
    """The version answering an unversioned request (pure)."""
    current = r.current if r.current is not None else default
    if r.mode == "canary" and r.candidate is not None and bucket(r.seed, request_id) < r.weight:
        return r.candidate
    return current


def routing_path(repo: str | Path, model: str) -> Path:
    return model_dir(repo, model) / ROUTING_FILE


def read_routing(repo: str | Path, model: str) -> Routing:
    p = routing_path(repo, model)
    if not p.is_file():
        return Routing()
    raw = read_json(p)
    allowed = set(Routing.__dataclass_fields__)
    extra = set(raw) - allowed
    if extra:
        raise BadInputError(f"{p}: unknown fields {sorted(extra)}; allowed {sorted(allowed)}")
    try:
        return Routing(**raw)
    except TypeError as e:
        raise BadInputError(f"{p}: {e}") from None


def write_routing(repo: str | Path, model: str, r: Routing) -> Path:
    p = routing_path(repo, model)
    write_json(p, asdict(r))
    return p


def _require_version(repo: str | Path, model: str, version: int) -> int:
    v = check_version(version)
    if v not in versions(repo, model):
        raise BadUsageError(f"model {model!r} has no version {v} in {repo}; "
                            f"versions: {versions(repo, model)}")
    return v


def current_version(repo: str | Path, model: str, r: Routing, *,
                    excluding: int | None = None) -> int:
    """The version that answers today: serving.json's current, else the newest other one."""
    if r.current is not None:
        return r.current
    vs = [v for v in versions(repo, model) if v != excluding]
    if not vs:
        raise BadUsageError(f"model {model!r} has no version to compare against")
    return vs[-1]


def start_candidate(repo: str | Path, model: str, candidate: int, *, mode: Mode,
                    weight: float, seed: int = 0) -> Routing:
    """Route a share of traffic (canary) or a mirror of it (shadow) to `candidate`."""
    r = read_routing(repo, model)
    cand = _require_version(repo, model, candidate)
    cur = current_version(repo, model, r, excluding=cand)
    if cand == cur:
        raise BadUsageError(f"version {cand} is already current; pick another candidate")
    new = replace(r, current=cur, candidate=cand, mode=mode,
                  weight=weight if mode == "canary" else 0.0, seed=seed)
    write_routing(repo, model, new)
    return new


def promote(repo: str | Path, model: str, candidate: int) -> Routing:
    r = read_routing(repo, model)
    cand = _require_version(repo, model, candidate)
    cur = current_version(repo, model, r, excluding=cand)
    new = Routing(current=cand, previous=cur, seed=r.seed)
    write_routing(repo, model, new)
    return new


def rollback(repo: str | Path, model: str) -> tuple[Routing, str]:
    """Stop the candidate if one is live, else restore the version current before promotion."""
    r = read_routing(repo, model)
    if r.candidate is not None:
        new = replace(r, candidate=None, mode="none", weight=0.0)
        what = f"stopped candidate {r.candidate}; all traffic on version {r.current}"
    elif r.previous is not None:
        new = Routing(current=r.previous, seed=r.seed)
        what = f"restored version {r.previous} (was {r.current})"
    else:
        raise BadUsageError(f"model {model!r} has no candidate and no previous version to roll "
                            "back to")
    write_routing(repo, model, new)
    return new, what
