"""The main job: plan the steps for each stage, run them with progress, judge, report.

Reference system (defaults): flights data through the pipeline at growing volume; the trainer at
1, 2, 4 workers; the model server under growing arrival rate with batching off and on; the
compression variants of the trained model. The user's own system: `custom` stages in the YAML
(a command to sweep — e.g. your own pipeline over growing inputs — or an HTTP endpoint to
load) and `stages.serve.url`.
Ctrl-C stops the current step and still writes the report from what was measured.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from scalelab.core.machine import current_machine
from scalelab.core.records import Record, new_experiment_id, read_records
from scalelab.core.sheet import SheetRow, build_sheet
from scalelab.core.verdict import Verdict, judge
from scalelab.diagnose.config import DiagnoseConfig, Mode
from scalelab.diagnose.goals import MODEL_BASELINE, SERVE_SERIES, TRAIN_SERIES, stage_goals
from scalelab.diagnose.steps import Step, StepResult, kill_tree, run_step, scalelab_cmd
from scalelab.report.document import ReportFiles, write_report

RECORDS = "records.jsonl"
CONFIG = "config.yaml"


@dataclass(kw_only=True)
class Outcome:
    out: Path
    experiment: str
    steps: list[StepResult] = field(default_factory=list)
    interrupted: bool = False
    sheet: list[SheetRow] = field(default_factory=list)
    verdict: Verdict | None = None
    files: ReportFiles | None = None


Progress = Callable[[str, int, int], None]
"""(label of the step starting, index, total) — the CLI draws the bar."""


def _levels_text(levels: list[float]) -> str:
    return ",".join(f"{v:g}" for v in levels)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 90.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


@contextlib.contextmanager
def model_server(repo: Path, logs: Path) -> Iterator[str | None]:
    """Run `scalelab serve run` on a free loopback port; yields its base URL (None if it failed)."""
    port = _free_port()
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / f"server-{repo.name}.log").open("wb") as log:
        proc = subprocess.Popen(
            scalelab_cmd(
                [
                    "serve",
                    "run",
                    "--model-repo",
                    str(repo),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ]
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            yield base if _wait_ready(f"{base}/v2/health/ready", proc) else None
        finally:
            kill_tree(proc, grace_s=5.0)


def _batching_repo(src: Path, dst: Path, batching: bool, serial_ms: float = 0.0) -> Path:
    """A copy of the repository whose model config turns dynamic batching off or on (and, with
    `serial_ms`, whose model sleeps that long per forward call)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for cfg_path in dst.glob("*/config.json"):
        cfg = json.loads(cfg_path.read_text("utf-8"))
        if batching:
            cfg["max_batch_size"] = max(int(cfg.get("max_batch_size", 64)), 64)
            cfg.setdefault("dynamic_batching", {})["max_queue_delay_ms"] = 2
        else:
            cfg["max_batch_size"] = 1
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n", "utf-8")
    if serial_ms > 0:
        for spec_path in dst.glob("*/[0-9]*/model.json"):
            spec = json.loads(spec_path.read_text("utf-8"))
            if spec.get("architecture") == "tabular_mlp":
                spec["architecture"] = "delay_mlp"
                spec["params"] = {**spec["params"], "batch_ms": serial_ms, "row_ms": 0.0}
                spec_path.write_text(json.dumps(spec, indent=2) + "\n", "utf-8")
    return dst


class Runner:
    """Plans and runs the steps of one diagnosis into OUT (records, logs, work files, report)."""

    def __init__(
        self, cfg: DiagnoseConfig, out: Path, mode: Mode, progress: Progress | None = None
    ) -> None:
        self.cfg, self.out, self.mode = cfg, out, mode
        self.work = out / "work"
        self.logs = out / "logs"
        self.sink = out / RECORDS
        self.progress = progress
        self.outcome = Outcome(out=out, experiment=new_experiment_id("diagnose"))
        self._n = 0
        self._total = 0

    # -- plumbing -----------------------------------------------------------------------
    def _rec(self, name: str) -> Path:
        p = self.work / "records" / f"{name}.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.unlink(missing_ok=True)
        return p

    def _run(self, step: Step) -> StepResult:
        self._n += 1
        if self.progress:
            self.progress(step.label, self._n, self._total)
        res = run_step(step, logs=self.logs, experiment=self.outcome.experiment, sink=self.sink)
        self.outcome.steps.append(res)
        return res

    # -- stages -------------------------------------------------------------------------
    def data_steps(self) -> None:
        d = self.cfg.stages.data
        if not d.enabled:
            return
        argv = [
            "data",
            "bench",
            "--scale",
            _levels_text(d.levels),
            "--sample",
            str(d.sample_rows),
            "--repeats",
            str(self.cfg.repeats),
            "--work",
            str(self.work / "data-bench"),
            "--price-per-core-hour",
            str(self.cfg.prices.core_hour_usd),
            "--json",
        ]
        rec = self._rec("data")
        self._run(
            Step(
                stage="data",
                label="data pipeline at " + _levels_text(d.levels) + "×",
                argv=[*argv, "--records", str(rec)],
                records=rec,
                timeout_s=900,
            )
        )

    def features(self) -> Path | None:
        """The flights features the trainer and the compression bench read (pipeline output)."""
        gen, ds = self.work / "flights-gen", self.work / "dataset"
        rows = max(self.cfg.stages.train.limit_rows, 20000)
        r = self._run(
            Step(
                stage="data",
                label="prepare features",
                argv=[
                    "data",
                    "generate",
                    "--scale",
                    "1",
                    "--sample",
                    str(rows),
                    "--out",
                    str(gen),
                    "--json",
                ],
                timeout_s=300,
            )
        )
        if not r.ok:
            return None
        r = self._run(
            Step(
                stage="data",
                label="pipeline to features",
                argv=[
                    "data",
                    "run",
                    "--input",
                    str(gen / "x1"),
                    "--out",
                    str(ds),
                    "--lineage",
                    str(self.work / "lineage.db"),
                    "--json",
                ],
                timeout_s=300,
            )
        )
        return ds if r.ok else None

    def train_steps(self, dataset: Path | None) -> Path | None:
        t = self.cfg.stages.train
        data_args = ["--data", str(dataset)] if dataset else []
        if t.enabled:
            rec = self._rec("train")
            self._run(
                Step(
                    stage="train",
                    label="train workers " + ",".join(map(str, t.workers)),
                    argv=[
                        "train",
                        "bench",
                        "--nproc",
                        ",".join(map(str, t.workers)),
                        "--mode",
                        "strong",
                        "--batch",
                        str(t.batch),
                        "--steps",
                        str(t.steps),
                        "--limit",
                        str(t.limit_rows),
                        *data_args,
                        "--records",
                        str(rec),
                        "--json",
                    ],
                    records=rec,
                    series=TRAIN_SERIES,
                    timeout_s=1200,
                )
            )
        if not (self.cfg.stages.serve.enabled or self.cfg.stages.model.enabled):
            return None
        repo = self.work / "repo"
        if repo.exists():
            shutil.rmtree(repo)
        r = self._run(
            Step(
                stage="train",
                label="train the served model",
                argv=[
                    "train",
                    "--nproc",
                    "1",
                    "--limit",
                    str(t.limit_rows),
                    "--epochs",
                    "2",
                    "--batch",
                    str(t.batch),
                    *data_args,
                    "--repo",
                    str(repo),
                    "--lineage",
                    str(self.work / "lineage.db"),
                    "--json",
                ],
                timeout_s=900,
            )
        )
        return repo if r.ok else None

    def serve_steps(self, repo: Path | None, dataset: Path | None) -> None:
        s = self.cfg.stages.serve
        if not s.enabled:
            return
        rates = [s.base_rate * m for m in s.levels]
        load_args = [
            "--rates",
            _levels_text(rates),
            "--duration",
            s.duration,
            "--warmup",
            "1s",
            "--json",
        ]
        if s.url:
            rec = self._rec("serve")
            self._run(
                Step(
                    stage="serve",
                    label=f"load {s.url}",
                    argv=["load", "run", s.url, *load_args, "--records", str(rec)],
                    records=rec,
                    series=SERVE_SERIES[s.baseline],
                    tag=_as_serve,
                    timeout_s=900,
                )
            )
            return
        if repo is None:
            return
        payload = ["--payload", "flights", "--model", "flights", "--model-repo", str(repo)]
        if dataset:
            payload += ["--data", str(dataset / "test.parquet")]
        for setting in s.batching:
            series = SERVE_SERIES[setting]
            srepo = _batching_repo(repo, self.work / f"repo-batching-{setting}", setting == "on",
                                   s.serial_ms)
            with model_server(srepo, self.logs) as base:
                if base is None:
                    self.outcome.steps.append(
                        StepResult(
                            step=Step(stage="serve", label=f"serve {series}", argv=[]),
                            ok=False,
                            returncode=None,
                            wall_s=0.0,
                            error=f"the model server did not become ready (log: {self.logs})",
                        )
                    )
                    continue
                for rep in range(self.cfg.repeats):
                    rec = self._rec(f"serve-{setting}-{rep}")
                    self._run(
                        Step(
                            stage="serve",
                            label=f"serve {series} #{rep + 1}",
                            argv=[
                                "load",
                                "run",
                                f"{base}/v2/models/flights/infer",
                                *load_args,
                                *payload,
                                "--records",
                                str(rec),
                            ],
                            records=rec,
                            series=series,
                            tag=functools.partial(_restage, stage="serve", repeat=rep),
                            timeout_s=600,
                        )
                    )

    def model_steps(self, repo: Path | None, dataset: Path | None) -> None:
        m = self.cfg.stages.model
        if not m.enabled or repo is None:
            return
        versions = sorted(int(p.name) for p in (repo / "flights").iterdir() if p.name.isdigit())
        if not versions:
            return
        rec = self._rec("model")
        argv = [
            "compress",
            "--model",
            str(repo / "flights" / str(versions[-1])),
            "--variants",
            ",".join(m.variants),
            "--records",
            str(rec),
            "--json",
        ]
        if dataset:
            argv += ["--data", str(dataset)]
        self._run(
            Step(
                stage="model",
                label="compress " + ",".join(m.variants),
                argv=argv,
                records=rec,
                tag=_variant_series,
                timeout_s=1200,
            )
        )

    def custom_steps(self) -> None:
        for c in self.cfg.custom:
            rec = self._rec(f"custom-{c.name}")
            if c.kind == "sweep":
                argv = [
                    "sweep",
                    "--var",
                    f"{c.var}=" + _levels_text(c.levels),
                    "--repeats",
                    str(self.cfg.repeats),
                    "--records",
                    str(rec),
                    "--json",
                ]
                if c.metric:
                    argv += ["--metric", c.metric]
                argv += ["--", *(c.command or [])]
            else:
                argv = [
                    "load",
                    "run",
                    c.url or "",
                    "--rates",
                    _levels_text([c.base_rate * lv for lv in c.levels]),
                    "--duration",
                    c.duration,
                    "--records",
                    str(rec),
                    "--json",
                ]
                if c.body:
                    argv += ["--payload", "json", "--body", c.body]
            self._run(
                Step(
                    stage=c.name,
                    label=f"{c.name} ({c.kind})",
                    argv=argv,
                    records=rec,
                    tag=functools.partial(_restage, stage=c.name),
                    timeout_s=3600,
                )
            )

    # -- the whole job ------------------------------------------------------------------
    def plan_size(self) -> int:
        s = self.cfg.stages
        n = (1 if s.data.enabled else 0) + len(self.cfg.custom)
        needs_model = (s.serve.enabled and not s.serve.url) or s.model.enabled
        if s.train.enabled or needs_model:
            n += 2  # features
        n += (1 if s.train.enabled else 0) + (1 if needs_model else 0)
        if s.serve.enabled:
            n += 1 if s.serve.url else len(s.serve.batching) * self.cfg.repeats
        n += 1 if s.model.enabled else 0
        return n

    def run(self) -> Outcome:
        self.out.mkdir(parents=True, exist_ok=True)
        self.sink.write_text("", encoding="utf-8")  # a results dir is always rebuildable
        (self.out / CONFIG).write_text(
            yaml.safe_dump(
                {"mode": self.mode, **self.cfg.model_dump(mode="json")},
                sort_keys=False,
                allow_unicode=True,
            ),
            "utf-8",
        )
        self._total = self.plan_size()
        s = self.cfg.stages
        try:
            self.data_steps()
            needs_model = (s.serve.enabled and not s.serve.url) or s.model.enabled
            dataset = self.features() if (s.train.enabled or needs_model) else None
            repo = self.train_steps(dataset) if (s.train.enabled or needs_model) else None
            self.serve_steps(repo, dataset)
            self.model_steps(repo, dataset)
            self.custom_steps()
        except KeyboardInterrupt:
            self.outcome.interrupted = True
        self.outcome.sheet, self.outcome.verdict, self.outcome.files = rebuild(
            self.out, self.cfg, self.mode
        )
        return self.outcome


def _restage(r: Record, stage: str, repeat: int | None = None) -> Record:
    upd: dict[str, object] = {"stage": stage}
    if repeat is not None:
        upd["repeat"] = repeat
    return r.model_copy(update=upd)


def _as_serve(r: Record) -> Record:
    return _restage(r, "serve")


def _variant_series(r: Record) -> Record:
    variant = r.extras.get("variant")
    extras = dict(r.extras)
    extras["series"] = MODEL_BASELINE if variant in (None, "baseline", "fp32") else str(variant)
    return r.model_copy(update={"extras": extras})


def rebuild(
    out: Path, cfg: DiagnoseConfig, mode: Mode
) -> tuple[list[SheetRow], Verdict, ReportFiles]:
    """Sheet, verdict and report from OUT/records.jsonl: what `scalelab report OUT` calls."""
    sink = out / RECORDS
    records = read_records(sink) if sink.exists() else []
    sheet = build_sheet(records)
    m = current_machine()
    goals = stage_goals(cfg)
    verdict = judge(goals, sheet, cores=m.cores, memory_bytes=m.memory_bytes)
    files = write_report(out, sheet, verdict, goals, m, {"mode": mode, "records": len(records)})
    return sheet, verdict, files
