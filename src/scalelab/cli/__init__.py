"""The `scalelab` command: `scalelab <part> <verb>`.

Only this package turns library errors into exit codes: ScalelabError and bad flags -> exit 2 with
one line naming the problem and the fix; unexpected errors -> exit 1 with one line (set
SCALELAB_DEBUG=1 for the traceback). Never a traceback by default.
"""

from __future__ import annotations

import os
import sys

import click

from scalelab import __version__
from scalelab.cli import fit, plan, sweep
from scalelab.cli._output import err_console
from scalelab.core.errors import ScalelabError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="scalelab")
def app() -> None:
    """Find where an ML system stops scaling, and why."""


app.add_command(plan.app, "plan")
app.add_command(fit.app, "fit")
app.add_command(sweep.sweep, "sweep")


def _fail(code: int, message: str) -> int:
    err_console.print(
        f"[bold red]error:[/] {message}", markup=True, highlight=False, soft_wrap=True
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
        return _fail(
            1, f"internal error: {type(e).__name__}: {e} (set SCALELAB_DEBUG=1 for the traceback)"
        )


def main() -> None:
    sys.exit(run())
