"""The machines and containers behind an endpoint, as a Prometheus server saw them over a level:
its HTTP API (`GET /api/v1/query`) asked for the node_exporter, cAdvisor and DCGM series of the
level's window — for systems that are not on this host, whose processes cannot be read here.

Each query sums over the series that match `match` (a label matcher such as
`instance="10.0.0.5:9100"`, or every series when empty); a query whose series do not exist
answers nothing and that signal is not measured.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from scalelab.lab.core.errors import BadInputError

NODE = "https://github.com/prometheus/node_exporter"
CADVISOR = "https://github.com/google/cadvisor/blob/master/docs/storage/prometheus.md"
DCGM = "https://docs.nvidia.com/datacenter/dcgm/latest/gpu-telemetry/dcgm-exporter.html"


@dataclass(frozen=True, kw_only=True)
class Query:
    field: str
    """The `ServerSignals` field it fills."""
    promql: str
    """With {m} for the label matcher and {w} for the window, e.g. '30s'."""
    source: str
    scale: float = 1.0


QUERIES: tuple[Query, ...] = (
    # node_exporter: the machine's busy cores (every mode but idle and iowait) and its cores
    Query(field="busy_cores", source="node_exporter " + NODE,
          promql='sum(rate(node_cpu_seconds_total{{mode!~"idle|iowait",{m}}}[{w}]))'),
    Query(field="cores", source="node_exporter " + NODE,
          promql='count(node_cpu_seconds_total{{mode="idle",{m}}})'),
    Query(field="rss_bytes", source="node_exporter " + NODE,
          promql="max_over_time((sum(node_memory_MemTotal_bytes{{{m}}})"
                 " - sum(node_memory_MemAvailable_bytes{{{m}}}))[{w}:])"),
    # cAdvisor: the containers' CPU and working set (read when node_exporter is absent)
    Query(field="busy_cores", source="cAdvisor " + CADVISOR,
          promql='sum(rate(container_cpu_usage_seconds_total{{container!="",{m}}}[{w}]))'),
    Query(field="rss_bytes", source="cAdvisor " + CADVISOR,
          promql='max_over_time(sum(container_memory_working_set_bytes{{container!="",{m}}})'
                 "[{w}:])"),
    # DCGM exporter: GPU utilisation in percent, framebuffer used in MiB
    Query(field="gpu_util", source="DCGM " + DCGM, scale=0.01,
          promql="max_over_time(sum(DCGM_FI_DEV_GPU_UTIL{{{m}}})[{w}:])"),
    Query(field="gpu_memory_bytes", source="DCGM " + DCGM, scale=float(2**20),
          promql="max_over_time(sum(DCGM_FI_DEV_FB_USED{{{m}}})[{w}:])"),
)
"""In order: the first query of a field that answers fills it."""


def instant(base: str, promql: str, at: float, timeout_s: float = 5.0) -> float | None:
    """The scalar value of an instant query at unix time `at`; None when it has no series.
    A server that does not answer, or answers an error: BadInputError naming the URL."""
    url = f"{base.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode(
        {"query": promql, "time": f"{at:.3f}"})
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            doc: Any = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise BadInputError(f"prometheus {base}: {e.code} for {promql!r}; check the URL "
                            "(the server's root, e.g. http://host:9090)") from e
    except (OSError, ValueError) as e:
        raise BadInputError(f"prometheus {base} did not answer ({e}); check `prometheus:` "
                            "in scalelab.yaml") from e
    if doc.get("status") != "success":
        raise BadInputError(f"prometheus {base}: {doc.get('error', 'query failed')} "
                            f"for {promql!r}")
    result = doc.get("data", {}).get("result") or []
    if not result:
        return None
    v = float(result[0]["value"][1])
    return v if math.isfinite(v) else None


def window(seconds: float) -> str:
    """A range selector covering the level (at least 2 s, so a rate has two samples at the
    default 1 s scrape interval)."""
    return f"{max(2, math.ceil(seconds))}s"


def read_window(base: str, *, start: float, end: float, match: str = "") -> tuple[
        dict[str, Any], dict[str, str]]:
    """(fields, field → source) of the queries over [start, end] (unix seconds)."""
    out: dict[str, Any] = {}
    sources: dict[str, str] = {}
    w = window(end - start)
    for q in QUERIES:
        if q.field in out:
            continue
        v = instant(base, q.promql.format(m=match, w=w), end)
        if v is None:
            continue
        v *= q.scale
        out[q.field] = int(v) if q.field in ("cores", "rss_bytes", "gpu_memory_bytes") else v
        sources[q.field] = f"prometheus {base}: {q.source}"
    if out.get("cores") == 0:
        del out["cores"]
    return out, sources
