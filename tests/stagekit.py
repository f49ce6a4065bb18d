"""Running one diagnose stage alone in a test: the config that enables only it, and the serve
stage run on a small model repository (no data or training steps before it)."""

import sys
from pathlib import Path

from scalelab.lab.core.records import Record, read_records
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.run import Diagnosis, Runner
from scalelab.lab.diagnose.stages.train import FEATURES, SERVED_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parent / "system" / "serve"))
from serve_fixtures import add_model

OFF = "{enabled: false}"


def stages_yaml(on: dict[str, str]) -> str:
    """A config with one repeat where only the stages in `on` run, each with its settings."""
    from scalelab.lab.diagnose.stages import SECTIONS

    body = ", ".join(f"{s.name}: {on.get(s.name, OFF)}" for s in SECTIONS)
    return "repeats: 1\nstages: {" + body + "}\n"


def run_serve_alone(tmp_path: Path, serve: str) -> tuple[Diagnosis, list[Record]]:
    """The serve stage alone (settings `serve`, quick mode, OUT = tmp_path/out) on a one-version
    flights-like model: every step must succeed; the diagnosis and the stage's records."""
    repo = tmp_path / "repo"
    add_model(repo, "flights", {1: 1})
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text(stages_yaml({"serve": serve}))
    runner = Runner(load_config(cfg, "quick"), tmp_path / "out", "quick")
    runner.ctx.provide(SERVED_MODEL, repo)
    runner.ctx.provide(FEATURES, None)
    d = runner.run()
    assert [(r.step.label, r.error) for r in d.steps if not r.ok] == []
    return d, [r for r in read_records(tmp_path / "out" / "records.jsonl") if r.stage == "serve"]
