"""The `scalelab` command: `scalelab <part> <verb>`.

Only this package turns library errors into exit codes: ScalelabError and bad flags -> exit 2
with one line naming the problem and the fix; unexpected errors -> exit 70 (EX_SOFTWARE) with
one line (set SCALELAB_DEBUG=1 for the traceback). Never a traceback by default. A command that
checks something (e.g. `data validate`) exits 1 when the check finds problems.

Subcommands load lazily: `scalelab plan amdahl` never imports torch or Dask.
"""

from __future__ import annotations

import importlib
import os
import sys

import click
from rich.markup import escape

from scalelab import __version__
from scalelab.cli._extras import install_hint
from scalelab.cli._output import err_console
from scalelab.lab.core.errors import ScalelabError

# name -> (module, attribute, one-line help shown by `scalelab --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "diagnose": (
        "scalelab.cli.diagnose",
        "diagnose",
        "The main job: scale all seven stages, name the one that breaks.",
    ),
    "report": ("scalelab.cli.diagnose", "report", "Rebuild a diagnosis report from records."),
    "plan": (
        "scalelab.cli.plan",
        "app",
        "Planning calculators (Amdahl, HPA, checkpoints, LR, Chinchilla).",
    ),
    "fit": ("scalelab.cli.fit", "app", "Fit scaling laws to measurements (USL, Chinchilla)."),
    "sweep": ("scalelab.cli.sweep", "sweep", "Scale your own command one variable at a time."),
    "data": (
        "scalelab.cli.data",
        "app",
        "The data pipeline: generate, run, validate, skew, bench.",
    ),
    "lineage": ("scalelab.cli.lineage", "app", "Dataset and model lineage: show, impacted."),
    "train": (
        "scalelab.cli.train",
        "app",
        "Data-parallel training under torchrun; bench, scaling law.",
    ),
    "serve": ("scalelab.cli.serve", "app", "The Open Inference Protocol model server."),
    "deploy": (
        "scalelab.cli.deploy",
        "app",
        "Kubernetes manifests; Grafana dashboard and alert rules.",
    ),
    "load": ("scalelab.cli.load", "app", "Open-loop load tests and capacity search."),
    "autoscale": ("scalelab.cli.autoscale", "app", "Replay traffic against the HPA algorithm."),
    "compress": ("scalelab.cli.model", "compress", "Compression and routing variants of a model."),
    "model": ("scalelab.cli.model", "app", "Model workloads (the MiniLM transformer bench)."),
    "generate": (
        "scalelab.cli.generate",
        "app",
        "Token generation: OpenAI-compatible server, one-off completions.",
    ),
    "online": (
        "scalelab.cli.online",
        "app",
        "Online learning under review: replay, ingest, update, gate, roll back.",
    ),
    "retrieval": (
        "scalelab.cli.retrieval",
        "app",
        "Retrieval: corpus with ground truth, embeddings, indexes, serve, bench.",
    ),
    "compare": (
        "scalelab.cli.compare",
        "compare_cmd",
        "Is run B better than run A? Per metric, at a confidence (CI regression gates).",
    ),
    "trace": ("scalelab.cli.trace", "app", "Request traces: slowest as waterfalls, p99 by span."),
}


class LazyGroup(click.Group):
    """Imports a subcommand's module only when that subcommand runs (or its help is shown)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None:
            return None
        module, attr, _ = spec
        cmd = getattr(importlib.import_module(module), attr)
        assert isinstance(cmd, click.Command)
        from scalelab.cli._export import give_output

        return give_output(cmd)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, _, text) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="scalelab")
def app() -> None:
    """Find where an ML system stops scaling, and why."""


def all_commands() -> dict[str, click.Command]:
    """Every top-level command, imported (for tests and docs that walk the whole CLI)."""
    ctx = click.Context(app)
    return {
        name: cmd
        for name in app.list_commands(ctx)
        if (cmd := app.get_command(ctx, name)) is not None
    }


def _fail(code: int, message: str) -> int:
    err_console.print(
        f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True
    )
    return code


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status (tests call this; `main` exits with it)."""
    try:
        rv = app.main(args=argv, prog_name="scalelab", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.NoArgsIsHelpError as e:
        if e.ctx is not None:
            click.echo(e.ctx.get_help())
        return 2
    except click.UsageError as e:
        cmd = e.ctx.command_path if e.ctx else "scalelab"
        return _fail(2, f"{e.format_message()} (see '{cmd} --help')")
    except click.ClickException as e:
        return _fail(2, e.format_message())
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort:
        return _fail(130, "interrupted")
    except ScalelabError as e:
        return _fail(2, str(e))
    except KeyboardInterrupt:
        return _fail(130, "interrupted; what was measured so far was kept")
    except Exception as e:
        if os.environ.get("SCALELAB_DEBUG"):
            raise
        hint = install_hint(e.name) if isinstance(e, ModuleNotFoundError) else None
        if hint is not None:
            return _fail(2, hint)
        return _fail(
            70, f"internal error: {type(e).__name__}: {e} (set SCALELAB_DEBUG=1 for the traceback)"
        )


def main() -> None:
    sys.exit(run())
