"""A user's endpoint as a stage sees it: whether it has /metrics, and the notes that go with it.

The load steps sample an endpoint's Prometheus /metrics for the engine's own signals (running
and waiting sequences, KV usage); an endpoint without one gives none, which used to pass in
silence. The stage probes /metrics once before loading, and a missing or unreadable one becomes
a note on every record of the step (extras["metrics_note"]) that the stage's advice repeats, so
the report says which signals were not measured and why.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record, read_records
from scalelab.lab.core.sheet import SheetRow, build_sheet
from scalelab.lab.core.verdict import Advice, capacity
from scalelab.layers.web.exposition import ExpositionError, sample_sums

DEFAULT_AVAILABILITY = 0.99
"""The availability objective of a user's endpoint whose config names none."""
DEFAULT_AVAILABILITY_LABEL = "availability ≥ 99% (default: the config names none)"


def with_availability(objectives: list[Objective]) -> list[Objective]:
    """A user endpoint's objectives with availability among them: the config's own
    (availability or failure_rate), else 99%, labelled as the default in every output."""
    if any(o.metric in ("availability", "failure_rate") for o in objectives):
        return objectives
    return [*objectives, Objective(metric="availability", min=DEFAULT_AVAILABILITY,
                                   label=DEFAULT_AVAILABILITY_LABEL)]


def sized_by(objectives: list[Objective]) -> list[Objective]:
    """The objectives a level is sized to decide (diagnose.sizing): all but the default
    availability. Showing 99% takes 367 answered requests in a row, so a level is not
    lengthened to prove it; its failures still miss it (judged like any objective)."""
    return [o for o in objectives if o.label != DEFAULT_AVAILABILITY_LABEL]


NOTE = "metrics_note"
"""The record extra holding the note (a string: the sheet keeps it, the advisors read it)."""


def metrics_url(url: str) -> str:
    """The endpoint's /metrics: same scheme, host and port, path /metrics."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}/metrics"


def metrics_note(url: str, timeout_s: float = 5.0) -> str | None:
    """None when `url` answers Prometheus text; else what is missing and why. An endpoint that
    does not answer at all gets no note: its load step fails and says so."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            text = r.read(8 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return f"no /metrics at {url} ({e.code}): engine signals not measured"
    except (OSError, ValueError):
        return None
    try:
        sample_sums(text, url)
    except ExpositionError:
        return f"/metrics at {url} is not Prometheus text: engine signals not measured"
    return None


def noted(r: Record, *, note: str | None) -> Record:
    """The record with the step's note (unchanged without one)."""
    if not note:
        return r
    return r.model_copy(update={"extras": {**r.extras, NOTE: note}})


def notes(rows: list[SheetRow]) -> list[str]:
    """The distinct notes of a stage's rows, in order."""
    out: list[str] = []
    for r in rows:
        n = r.extras.get(NOTE)
        if isinstance(n, str) and n and n not in out:
            out.append(n)
    return out


def with_notes(advice: Advice, rows: list[SheetRow]) -> Advice:
    """The advice with the rows' notes after its prediction (the verdict prints both)."""
    said = notes(rows)
    if not said:
        return advice
    predicted = "; ".join([*([advice.predicted] if advice.predicted else []), *said])
    return Advice(intervention=advice.intervention, predicted=predicted)


def grid_start(levels: Path, objectives: list[Objective], default: float) -> float:
    """Where a capacity search starts: the highest rate the level sweep measured to meet the
    objectives (the search skips the slow low-rate steps below it), never under `default`.
    The level sweep's short levels and constant arrivals are kinder than the search's Poisson
    ones, so the search starts below it: at the larger of half that rate and `default`."""
    rows = build_sheet(read_records(levels)) if levels.is_file() else []
    return max(default, (capacity(rows, objectives) or 0.0) / 2.0)
