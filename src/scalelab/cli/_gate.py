"""Exit 1 when a command's objectives were missed: the status a CI job or script gates on.

The command's output (table or `--json` document) is printed first and complete; the reason
goes to stderr as one line. Exit statuses of every command: 0 done; 1 an objective was missed
(or a `--fail-on` gate failed); 2 bad usage or input; 70 internal error; 130 interrupted.
"""

from __future__ import annotations

import click

from scalelab.cli._output import err_console


def exit_if_missed(missed: list[str]) -> None:
    """After the output: one stderr line naming what was missed, and exit status 1."""
    if missed:
        err_console.print("objective missed: " + "; ".join(missed), markup=False,
                          highlight=False, soft_wrap=True)
        raise click.exceptions.Exit(1)
