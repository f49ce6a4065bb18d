"""`scalelab diagnose` (the main job) and `scalelab report` (rebuild a report from records)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from scalelab.cli._export import output_option
from scalelab.cli._output import emit, err_console, json_option
from scalelab.cli._progress import live_progress
from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.jsonfile import read_json_object
from scalelab.lab.core.verdict import Verdict
from scalelab.lab.diagnose.budget import parse_budget
from scalelab.lab.diagnose.config import Mode, defaults_text, load_config, stored_config
from scalelab.lab.diagnose.gate import FailOn, gate_failure
from scalelab.lab.diagnose.run import RECORDS, Runner, process_started, rebuild
from scalelab.lab.diagnose.steps import StepResult
from scalelab.lab.report.document import ReportFiles
from scalelab.lab.report.screen import print_screen


def render_verdict(c: Console, verdict: Verdict, report: Path, *, verbose: bool = False) -> None:
    """The first screen (one line a stage, then where the report is); with `verbose`, the
    report's Markdown first: the long verdict, the checks and the full sheet."""
    if verbose:
        c.print(report.with_name("report.md").read_text("utf-8"), markup=False,
                highlight=False, soft_wrap=True)
    print_screen(c, verdict, report)


def failed_step_lines(steps: list[StepResult]) -> list[str]:
    """The stderr lines before the first screen: one a failed step (the system under test did
    not answer, a command broke). A step cut for lack of time (stopped at its stage's
    deadline, or never started) is no failure: like the progress bar it is not printed (four
    such lines led the demo's screen in a CI log); the report's Time section and run.json's
    `cut_steps` say what it left out and why, and the screen what stayed undecided."""
    return [f"step failed: {s.step.label}: {s.error}" for s in steps
            if not s.ok and s.cut is None]


fail_on_option = click.option(
    "--fail-on",
    type=click.Choice(["miss", "undecided"]),
    default=None,
    help="Exit 1 when a stage missed an objective (miss), or when any check was missed, "
    "undecided or not measured (undecided); the report is written either way.",
)


def _gate_exit(verdict: Verdict, fail_on: FailOn | None) -> None:
    why = gate_failure(verdict, fail_on)
    if why is not None:
        err_console.print(why, markup=False, highlight=False, soft_wrap=True)
        raise click.exceptions.Exit(1)


def _written(files: ReportFiles) -> dict[str, Any]:
    """The report's JSON document as written: `--json` prints exactly report.json."""
    return read_json_object(files.json)


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="Objectives YAML merged over the defaults (see --print-config).",
)
@click.option("--quick", "mode", flag_value="quick", help="About a minute on 2 cores.")
@click.option("--full", "mode", flag_value="full",
              help="As long as deciding needs (a cap per level still applies).")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("scalelab-out"),
    show_default=True,
    help="Directory for records, logs, work files and the report.",
)
@click.option(
    "--budget",
    metavar="DURATION",
    help="Stage time to spend, e.g. 5m or 4m30s: each stage gets its minimum, the stages "
    "whose levels are sized (serve) share the rest; a level runs until its objectives are "
    "decided or its share is spent. Default: the config's budget (none with --full).",
)
@click.option("--print-config", is_flag=True, help="Print the default objectives YAML and exit.")
@fail_on_option
@output_option
@json_option
def diagnose(
    config_path: Path | None,
    mode: str | None,
    out: Path,
    budget: str | None,
    print_config: bool,
    fail_on: FailOn | None,
    as_json: bool,
    output: Path | None,
) -> None:
    """Scale the reference ML system along its four bottlenecks and name the one that breaks.

    Runs, one variable at a time: the data pipeline at growing volume, the trainer at growing
    worker counts, the model server at growing arrival rates (batching off and on), and the
    compression variants; then prints the first screen (one line a stage) and writes
    OUT/report.html, report.md (the long verdict and the sheet) and report.json.

    Example: scalelab diagnose --quick --out scalelab-out --fail-on miss

    \b
    Exit status: 0 measured and judged (and the --fail-on gate, if any, passed); 1 a stage
    failed (its system did not answer: refused connections, every request an error, a server
    that never started) or the gate failed; 2 bad usage or a bad config (nothing ran); 70
    internal error; 130 interrupted (the report holds what was measured).
    """
    if print_config:
        sys.stdout.write(defaults_text())
        return
    m: Mode = "quick" if mode == "quick" else "full" if mode == "full" else "default"
    budget_s = parse_budget(budget) if budget is not None else None
    cfg = load_config(config_path, m)
    if out.exists() and not out.is_dir():
        raise BadUsageError(f"--out {out} is a file; give a directory")
    Runner(cfg, out, m, budget_s=budget_s).plan_budget()  # a short budget: exit 2, nothing ran
    with live_progress("diagnose", total=1) as progress:

        def on_step(label: str, i: int, total: int) -> None:
            progress.update(total=total, completed=i - 1, note=label)

        runner = Runner(cfg, out, m, progress=on_step, budget_s=budget_s,
                        started=process_started())
        outcome = runner.run()
    assert outcome.verdict is not None and outcome.files is not None
    for line in failed_step_lines(outcome.steps):
        err_console.print(f"[yellow]{line}[/]", markup=True, highlight=False)
    if outcome.interrupted:
        err_console.print("interrupted: the report holds what was measured before Ctrl-C")
    def render(c: Console) -> None:
        render_verdict(c, outcome.verdict, out / "report.html")  # type: ignore[arg-type]

    emit(_written(outcome.files), as_json, render)
    if outcome.interrupted:
        # The report is written; the status still tells a script the run was cut short.
        raise click.exceptions.Exit(130)
    if outcome.failures:
        # A stage whose system under test did not answer is a failed run (1), not bad usage (2).
        raise click.exceptions.Exit(1)
    _gate_exit(outcome.verdict, fail_on)


@click.command()
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="Objectives to judge against (default: the ones the run stored).",
)
@click.option("--verbose", is_flag=True,
              help="Print the long verdict, the checks and the full sheet (report.md) first.")
@fail_on_option
@output_option
@json_option
def report(
    results_dir: Path, config_path: Path | None, verbose: bool, fail_on: FailOn | None,
    as_json: bool, output: Path | None,
) -> None:
    """Rebuild the report (HTML, Markdown, JSON) from a results directory's records.

    Prints the first screen (one line a stage); --verbose adds the long verdict and the
    full sheet.

    Example: scalelab report scalelab-out --fail-on undecided

    \b
    Exit status: 0 done (and the --fail-on gate, if any, passed); 1 the gate failed;
    2 bad usage or input; 70 internal error.
    """
    if not (results_dir / RECORDS).is_file():
        raise BadInputError(
            f"{results_dir} has no {RECORDS}; pass the --out directory of a scalelab diagnose run"
        )
    cfg, mode = stored_config(results_dir, config_path)
    _, verdict, files = rebuild(results_dir, cfg, mode)

    def render(c: Console) -> None:
        render_verdict(c, verdict, results_dir / "report.html", verbose=verbose)

    emit(_written(files), as_json, render)
    _gate_exit(verdict, fail_on)
