"""Prometheus text exposition read by prometheus-client's own parser (never by regex).

Every scrape scalelab reads — the engine signals of a load level (`load.scrape`), the tabular
server's response counter (`diagnose.stages.serve`), the governance cell (`web.governance`) —
goes through `prometheus_client.parser`, so labels with commas or braces in their values,
escaped quotes, histograms and `# TYPE` lines are read as Prometheus itself reads them. A
malformed exposition is an `ExpositionError` naming the source and the first bad line.
"""

from __future__ import annotations

import math

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from scalelab.lab.core.errors import BadInputError


class ExpositionError(BadInputError):
    """Text that is not Prometheus text exposition format."""


def _first_bad_line(text: str) -> tuple[int, str, str] | None:
    """(line number, line, parser message) of the first sample line the parser refuses alone."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except (ValueError, TypeError, IndexError) as e:
            return n, line, str(e)
    return None


def metric_families(text: str, source: str) -> list[Metric]:
    """Every family in `text` (from `source`, e.g. the URL), as prometheus-client parses it."""
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as e:
        bad = _first_bad_line(text)
        where = f"line {bad[0]}: {bad[1][:120]!r} ({bad[2]})" if bad else f"{e}"
        raise ExpositionError(
            f"{source} is not Prometheus text exposition format: {where}; point the scrape "
            "at a Prometheus /metrics endpoint") from None


def sample_sums(text: str, source: str) -> dict[str, float]:
    """Each sample name's value summed over its label sets (``x_bucket`` over every ``le``,
    a labelled counter over all its children); NaN and infinite values are left out."""
    out: dict[str, float] = {}
    for fam in metric_families(text, source):
        for s in fam.samples:
            v = float(s.value)
            if math.isfinite(v):
                out[s.name] = out.get(s.name, 0.0) + v
    return out
