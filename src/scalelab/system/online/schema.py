"""The stream's reference schema, written by the data part's own `scalelab data infer` (run as a
subprocess: this part reads the data part's files, never its code) from the clean 2013 events.

One reviewed change after inference: the weather and calendar features get no PSI/JS skew
threshold. A window's month and day of week are its calendar, not a shift (a daily window has
one day of week, a different one each day). Weather
is one value per airport and hour broadcast to its flights, so its distribution moves a lot from
one window to the next in normal data (measured on 2013: temperature PSI between consecutive days
has median 2.1 and p99 9.5; pressure median 5.7); a PSI threshold there would block every update.
Their ranges and null rates are still checked on arrival. Schedule, route and plane features and
the categoricals keep the schema's defaults (their natural day-to-day PSI is ~0.00-0.02, so a
rescale or a renamed code stands out).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from scalelab.lab.core.errors import RunFailedError
from scalelab.layers.lineage.manifest import atomic_write_json
from scalelab.system.online.stream import ReplayConfig, build_stream

NO_SKEW = ("month", "day_of_week", "temp", "dewp", "humid", "wind_speed", "precip", "pressure",
           "visib")


def write_schema(out: Path, config: ReplayConfig | None = None) -> Path:
    """Infer the feature events' schema with `scalelab data infer`, then the reviewed edit."""
    s = build_stream(config or ReplayConfig())
    with tempfile.TemporaryDirectory(prefix="scalelab-online-") as tmp:
        events = Path(tmp) / "events.parquet"
        s.feature_events().write_parquet(events)
        raw = Path(tmp) / "schema.json"
        r = subprocess.run([sys.executable, "-m", "scalelab", "data", "infer", str(events),
                            "--out", str(raw), "--json"], capture_output=True, text=True,
                           check=False)
        if r.returncode != 0:
            raise RunFailedError(f"`scalelab data infer` failed ({r.returncode}): "
                                 f"{r.stderr.strip()[-300:]}")
        schema = json.loads(raw.read_text(encoding="utf-8"))
    for c in schema["columns"]:
        if c["name"] in NO_SKEW:
            c["skew"] = {"psi": None, "js": None}
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, schema)
    return out
