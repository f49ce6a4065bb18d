"""What the serve stage is configured with, and the reference server it starts: the settings
(`stages.serve`), each batching setting's copy of the model repository, and the `serve run`
command line.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

from pydantic import Field

from scalelab.lab.core.objectives import Objective
from scalelab.lab.diagnose.commands import ServeRun
from scalelab.lab.diagnose.schema import Duration, EndpointAccess, HttpUrl, Levels, StageSettings
from scalelab.lab.diagnose.stages.endpoint import with_availability
from scalelab.lab.diagnose.steps import scalelab_cmd
from scalelab.layers.nets.model_config import ModelConfig, load_model_config
from scalelab.layers.nets.registry import read_spec, write_spec
from scalelab.layers.nets.repository import CONFIG_FILE, write_json

SERIES = {"off": "batching=off", "on": "batching=on"}
MODEL = "flights"
BATCH_MAX = 64
"""The largest batch the batching series may form."""
BATCH_DELAY_MS = 2.0
"""How long the batcher waits for batch-mates: short against a 50 ms p95 objective."""


class ServeSettings(StageSettings, EndpointAccess):
    """`stages.serve`: open-loop arrival rates against the model server."""

    base_rate: float = Field(default=40.0, gt=0)
    """Arrival rate (requests/s) at 1×."""
    levels: Levels = Field(default_factory=lambda: [1.0, 2.0, 5.0, 10.0])
    """Multiples of the base rate."""
    duration: Duration = "3s"
    """Measured time per level (after a 1 s warm-up)."""
    batching: list[Literal["off", "on"]] = Field(
        default_factory=lambda: ["off", "on"]  # type: ignore[arg-type]
    )
    """Batching settings to measure, each a series."""
    baseline: Literal["off", "on"] = "off"
    """Which batching setting is 'today's system'; the other is the candidate intervention."""
    url: HttpUrl | None = None
    """The user's own HTTP endpoint instead of the reference model server."""
    server_pid: int | None = Field(default=None, ge=1)
    """With `url`: the local process serving it, whose CPU, memory and threads are read each
    level (default: the process listening on the URL's port when it is on this machine)."""
    capacity: bool = True
    """Also search the highest rate meeting the latency objective (`scalelab load capacity`),
    per batching setting: where serving stops meeting it, not only whether 10× passes."""
    capacity_max_steps: int = Field(default=8, ge=2, le=40)
    """Bound on the capacity search's steps (each one a short load level)."""

    def built_objectives(self) -> list[Objective]:
        """With `url`, availability among them (99% where the config names none)."""
        objectives = super().built_objectives()
        return with_availability(objectives) if self.url else objectives
    capacity_step: Duration = "2s"
    """Shortest "longest capacity step" (the search's --max-step, raised so the first rate can
    reach the requests the step rule needs; --min-step is half of this)."""
    capacity_availability: bool = False
    """Also judge the availability objective in every capacity step. Off by default: showing
    99.9% at 95% confidence takes 3,688 requests a step (92 s at 40 requests/s), so the search
    decides on the latency objective and availability is judged on the level sweep."""
    replicas: list[int] = Field(default_factory=lambda: [1, 2])
    """Replica counts of the replica sweep (server processes behind one port, 1 torch thread
    each), each a capacity search at the objectives (series 'replicas=N capacity'); counts
    above the machine's cores are dropped. Runs only with `capacity`; [] turns it off."""
    threads: bool = True
    """Also the vertical series: one process with T torch threads for each count T > 1 of
    `replicas` (series 'threads=T capacity'), on the same cores as T replicas."""
    level_cap: Duration = "60s"
    """With --full (no budget), the most a sized level may run while its objectives are still
    undecided (availability ≥ 99.9% alone needs 2,995 requests: 75 s at 40 requests/s)."""
    replicas_batching: Literal["off", "on"] = "on"
    """The batching setting the replica sweep replicates."""
    serial_ms: float = Field(default=0.0, ge=0, le=10_000)
    """An artificial serial section added to every forward call of the served model (the
    "delay_mlp" architecture): throttles serving on purpose, to rehearse the verdict."""


def batching_repo(src: Path, dst: Path, *, batching: bool, serial_ms: float = 0.0) -> Path:
    """A copy of a model repository whose models batch dynamically or not (and, with
    `serial_ms`, whose flights model sleeps that long per forward call)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for cfg_path in dst.glob(f"*/{CONFIG_FILE}"):
        cfg = load_model_config(cfg_path.parent)
        if batching:
            delay = cfg.dynamic_batching.model_copy(update={"max_queue_delay_ms": BATCH_DELAY_MS})
            new = {"max_batch_size": max(cfg.max_batch_size, BATCH_MAX), "dynamic_batching": delay}
        else:
            new = {"max_batch_size": 1}
        cfg = ModelConfig.model_validate({**cfg.model_dump(), **new})
        write_json(cfg_path, cfg.model_dump(mode="json", exclude_none=True))
    if serial_ms > 0:
        for spec_dir in (p.parent for p in dst.glob("*/[0-9]*/model.json")):
            spec = read_spec(spec_dir)
            if spec["architecture"] == "tabular_mlp":
                extra = {k: v for k, v in spec.items() if k not in ("architecture", "params")}
                params = {**spec["params"], "batch_ms": serial_ms, "row_ms": 0.0}
                write_spec(spec_dir, arch="delay_mlp", params=params, extra=extra)
    return dst


def serve_cmd(repo: Path, port: int, *, workers: int | None = None,
              torch_threads: int | None = None, trace_out: Path | None = None) -> list[str]:
    """The reference server's command line (`scalelab serve run`) on `port`."""
    return scalelab_cmd(ServeRun(model_repo=repo, port=port, workers=workers,
                                 torch_threads=torch_threads, trace_out=trace_out).to_argv())
