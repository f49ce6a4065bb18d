"""Every typed command a diagnosis runs matches the click command it targets."""

from pathlib import Path

import click
import pytest

from scalelab.cli import app
from scalelab.lab.diagnose.commands import COMMANDS, Command, DataBench, LoadRun, ServeRun, Sweep


def _click(cmd: type[Command]) -> click.Command:
    ctx = click.Context(app)
    found: click.Command = app
    for word in cmd.path:
        assert isinstance(found, click.Group), f"{cmd.path}: {word} is not a subcommand"
        nxt = found.get_command(ctx, word)
        assert nxt is not None, f"scalelab {' '.join(cmd.path)}: no such command"
        found = nxt
    return found


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c.path))
def test_every_field_is_an_option_of_the_cli(cmd: type[Command]) -> None:
    target = _click(cmd)
    options = {o for p in target.params if isinstance(p, click.Option) for o in p.opts}
    missing = {f: fl for f, fl in cmd.flags().items() if fl not in options}
    assert not missing, f"scalelab {' '.join(cmd.path)} has no option {missing}"
    assert ("--json" in options) == cmd.emits_json
    positional = [p for p in target.params if isinstance(p, click.Argument)]
    import dataclasses

    ours = [f for f in dataclasses.fields(cmd) if f.metadata.get("positional")]
    rest = [f for f in dataclasses.fields(cmd) if f.metadata.get("rest")]
    assert len(ours) + len(rest) == len(positional)


def test_argv_is_exact() -> None:
    assert DataBench(scale=[1, 2, 5.5], sample=1500, work=Path("w"), repeats=2).to_argv() == [
        "data", "bench", "--json", "--scale", "1,2,5.5", "--sample", "1500", "--repeats", "2",
        "--work", "w",
    ]
    # Floats reach the CLI exactly (not %g), and None/False fields are left out.
    assert LoadRun(url="http://h/x", rates=[1234567.0, 0.125], duration="2s").to_argv() == [
        "load", "run", "--json", "http://h/x", "--rates", "1234567,0.125", "--duration", "2s",
    ]
    assert Sweep(var="n=1,2", command=["job", "--n", "{n}"]).to_argv() == [
        "sweep", "--json", "--var", "n=1,2", "--repeats", "1", "--", "job", "--n", "{n}",
    ]
    assert ServeRun(model_repo=Path("r"), port=9).to_argv() == [
        "serve", "run", "--model-repo", "r", "--host", "127.0.0.1", "--port", "9",
        "--log-level", "warning",
    ]
