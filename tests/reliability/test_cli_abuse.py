"""Walk the whole CLI with missing, malformed and out-of-range arguments: always exit 2 with a
one-line message, never a traceback (issue 9, item 8)."""

import click
import pytest

from scalelab.cli import all_commands, app, run

pytestmark = pytest.mark.reliability


def _leaves(cmd: click.Command, path: list[str]) -> list[tuple[list[str], click.Command]]:
    if isinstance(cmd, click.Group):
        out: list[tuple[list[str], click.Command]] = []
        if getattr(cmd, "invoke_without_command", False):
            out.append((path, cmd))
        subs = all_commands() if cmd is app else cmd.commands
        for name, sub in sorted(subs.items()):
            out += _leaves(sub, [*path, name])
        return out
    return [(path, cmd)]


LEAVES = _leaves(app, [])
IDS = [" ".join(p) for p, _ in LEAVES]


class Outcome:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.returncode, self.stdout, self.stderr = code, out, err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    def call(argv: list[str]) -> Outcome:
        code = run(argv)
        cap = capsys.readouterr()
        return Outcome(code, cap.out, cap.err)

    return call


def _one_line_error(p: Outcome) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-500:])
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    assert p.stdout == ""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    # one line: what, where, how to fix
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    assert len(lines[0]) < 600


@pytest.mark.parametrize(("path", "cmd"), LEAVES, ids=IDS)
def test_unknown_option_exits_2(path: list[str], cmd: click.Command, cli) -> None:  # type: ignore[no-untyped-def]
    _one_line_error(cli([*path, "--definitely-not-an-option"]))


NOT_A_DIR = __file__  # a regular file
MISSING = "/nonexistent-scalelab-path/x"


def _bad_values(param: click.Parameter) -> list[str]:
    """Values click itself refuses for `param`'s type: every type it checks (numbers, ranges,
    choices, paths that must exist or be a folder). A string, or a path the command checks in
    its body, has no value wrong for its type alone (their commands' tests check those)."""
    t = param.type
    out: list[str] = []
    if isinstance(t, click.types.IntParamType | click.types.FloatParamType):
        out.append("not-a-number")
    if isinstance(t, click.types._NumberRangeBase):
        if t.min is not None:
            out.append(str(t.min - 1))
        if t.max is not None:
            out.append(str(t.max + 1))
    if isinstance(t, click.Choice):
        out.append("no-such-choice")
    if isinstance(t, click.Path):
        if t.exists:
            out.append(MISSING)
        if not t.file_okay:
            out.append(NOT_A_DIR)
    return out


BAD_VALUES = [
    (path, p.opts[0], bad)
    for path, cmd in LEAVES
    for p in cmd.params
    if isinstance(p, click.Option) and not p.is_flag
    for bad in _bad_values(p)
]


@pytest.mark.parametrize(
    ("path", "opt", "bad"), BAD_VALUES, ids=[f"{' '.join(p)} {o} {b}" for p, o, b in BAD_VALUES]
)
def test_malformed_typed_option_exits_2(path: list[str], opt: str, bad: str, cli) -> None:  # type: ignore[no-untyped-def]
    p = cli([*path, opt, bad])
    _one_line_error(p)
    assert opt in p.stderr or "Invalid value" in p.stderr


@pytest.mark.parametrize(
    "path",
    [
        p
        for p, c in LEAVES
        if any(isinstance(x, click.Argument) and x.required for x in c.params)
        or any(isinstance(x, click.Option) and x.required for x in c.params)
    ],
    ids=lambda p: " ".join(p),
)
def test_missing_required_arguments_exit_2(path: list[str], cli) -> None:  # type: ignore[no-untyped-def]
    _one_line_error(cli(path))
