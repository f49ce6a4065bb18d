"""`--device cores=1,memory=512MiB`: run a command's work under a named target device.

`on_device(render)` turns any command into one that, given `--device SPEC`, runs *itself* (the
same command, the same options, without --device and with --json) as a child held to the profile
(core/device.py) and reports fit / no fit, the child's own JSON, its peak RSS and the CPUs it ran
on. Without --device the command runs as before. Exit codes with --device: 0 when the work fit,
1 when it did not fit the memory limit (the report says why), 2 for a bad spec or when the child
failed for another reason (its last error line is printed).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from scalelab.cli._output import emit
from scalelab.lab.core.device import DeviceProfile, LimitedRun, run_limited
from scalelab.lab.core.errors import RunFailedError
from scalelab.lab.core.units import format_bytes

HELP = ("Run the work as a child held to a target device: cores=N (CPU affinity), "
        "memory=SIZE (cgroup v2 memory.max, else RLIMIT_AS), threads=T; e.g. "
        "cores=1,memory=512MiB. Reports fit / no fit and peak RSS; exit 1 when it does not fit.")


def parse_profile(spec: str | None) -> DeviceProfile | None:
    return DeviceProfile.parse(spec) if spec is not None else None


def child_argv(ctx: click.Context, *, drop: tuple[str, ...], extra: tuple[str, ...] = ()
               ) -> list[str]:
    """The command line that re-runs `ctx`'s command with the same values, less the options
    named in `drop`, plus `extra` options."""
    path: list[str] = []
    c: click.Context | None = ctx
    while c is not None and c.parent is not None:
        path.insert(0, c.info_name or "")
        c = c.parent
    args: list[str] = []
    positional: list[str] = []
    for p in ctx.command.params:
        if p.name is None or p.name in drop or p.name not in ctx.params:
            continue
        v = ctx.params[p.name]
        if isinstance(p, click.Argument):
            positional.extend(str(x) for x in (v if isinstance(v, tuple | list) else [v]))
            continue
        assert isinstance(p, click.Option)
        if v is None:
            continue
        if p.is_flag and not p.secondary_opts:
            if v:
                args.append(p.opts[0])
        elif p.is_flag:
            args.append(p.opts[0] if v else p.secondary_opts[0])
        elif p.multiple:
            for x in v:
                args.extend([p.opts[0], str(x)])
        else:
            args.extend([p.opts[0], str(v)])
    args.extend(extra)
    return ["scalelab", *path, *args, "--", *positional] if positional else \
        ["scalelab", *path, *args]


def device_report(run: LimitedRun, profile: DeviceProfile) -> dict[str, Any]:
    """The device part of a report: the profile, how it was enforced, and how the work fared."""
    return {"profile": profile.as_dict(), **run.as_dict()}


def on_device(summary: Callable[[dict[str, Any]], str]
              ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add `--device SPEC` to a command; `summary(child_json)` is the line people read."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def command(*a: Any, device: str | None, **kw: Any) -> Any:
            if device is None:
                return f(*a, **kw)
            profile = DeviceProfile.parse(device)
            ctx = click.get_current_context()
            argv = child_argv(ctx, drop=("device", "as_json"), extra=("--json",))
            run = run_limited(argv, profile)
            out = device_report(run, profile)
            result: dict[str, Any] | None = None
            if run.fit:
                try:
                    result = json.loads(run.stdout)
                except ValueError:
                    raise RunFailedError(f"the child's output is not JSON: {run.stdout[:200]!r}"
                                         ) from None
            out["result"] = result
            emit(out, bool(kw.get("as_json")), _render(out, summary))
            if run.fit is None:
                raise RunFailedError(f"the work failed on {profile.label}: {run.reason}")
            if not run.fit:
                raise click.exceptions.Exit(1)
            return None

        return click.option("--device", "device", default=None, metavar="SPEC",
                            help=HELP)(command)

    return wrap


def _render(out: dict[str, Any], summary: Callable[[dict[str, Any]], str]
            ) -> Callable[[Console], None]:
    def render(con: Console) -> None:
        from rich.markup import escape
        from rich.table import Table

        p = out["profile"]
        t = Table(title=f"on device {p['label']} (memory limit: {out['mechanism']})")
        for col in ("fit", "peak RSS", "peak VM", "CPUs", "threads", "result"):
            t.add_column(col)
        fit = {True: "yes", False: "NO", None: "error"}[out["fit"]]
        res = summary(out["result"]) if out["result"] is not None else out["reason"]
        t.add_row(fit, format_bytes(out["peak_rss_bytes"]) if out["peak_rss_bytes"] else "-",
                  format_bytes(out["peak_vm_bytes"]) if out["peak_vm_bytes"] else "-",
                  ",".join(map(str, out["cpus"])) if out["cpus"] else "-",
                  str(out["threads"] or "-"), res)
        con.print(t)
        con.print(f"[dim]{escape(out['mechanism_note'])}[/]")
    return render
