"""What `scalelab load` sends: the payload flags, the pool of requests they build (HTTP or
grpc://), the engine config of a level, and the check that a level got any answer at all."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from scalelab.cli._output import err_console
from scalelab.cli._sweep import trace_sample_option
from scalelab.lab.core.errors import BadUsageError, RunFailedError
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.clock import LOOP_IMPLS, resolve_loop
from scalelab.lab.load.http import payloads
from scalelab.lab.load.http.generator import HttpConfig
from scalelab.lab.load.http.result import LoadResult
from scalelab.lab.load.result import LevelResult, all_failed_line
from scalelab.lab.load.schedule import Mode
from scalelab.lab.load.send import Target

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""An HTTP header name (RFC 9110's token)."""


def parse_headers(given: tuple[str, ...] | list[str]) -> tuple[tuple[str, str], ...]:
    """-H NAME:VALUE flags as (name, value) pairs; bad usage for a malformed one."""
    out: list[tuple[str, str]] = []
    for h in given:
        name, sep, value = h.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not _TOKEN.match(name):
            raise BadUsageError(f"-H {h!r}: give NAME:VALUE, e.g. -H 'X-Tenant: a' (a header "
                                "name is letters, digits and -)")
        if "\r" in value or "\n" in value:
            raise BadUsageError(f"-H {name}: the value holds a line break; give one line")
        out.append((name, value))
    return tuple(out)


def connection_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """How to talk to the server, as `load` and `load llm` both take it: headers and TLS."""
    opts = [
        click.option("-H", "--header", "headers", multiple=True, metavar="NAME:VALUE",
                     help="Send this header with every request (repeatable); e.g. "
                          "-H 'Authorization: Bearer TOKEN'. Values never reach records, "
                          "reports or logs: only the names do."),
        click.option("--cacert", type=click.Path(path_type=Path, dir_okay=False),
                     help="https: trust this CA bundle (PEM) instead of the system's."),
        click.option("--insecure", is_flag=True,
                     help="https: verify neither the certificate nor the host name."),
        click.option("--api-key-env", metavar="NAME",
                     help="Send 'Authorization: Bearer $NAME' (the key read from this "
                          "environment variable, so it never appears in a command line)."),
    ]
    return functools.reduce(lambda acc, o: o(acc), reversed(opts), f)


def api_key_of(kw: dict[str, Any]) -> str | None:
    """The key of --api-key-env NAME (bad usage when NAME is unset), else --api-key."""
    name = kw.get("api_key_env")
    if name:
        key = os.environ.get(name)
        if not key:
            raise BadUsageError(f"--api-key-env {name}: ${name} is not set; export the key "
                                "in it (or drop the flag)")
        return key
    return kw.get("api_key") or None


def target_of(url: str, kw: dict[str, Any]) -> Target:
    """The URL's target with the run's headers (-H, then the API key as a Bearer token unless
    -H gave an Authorization) and TLS trust (--cacert, --insecure)."""
    target = Target.parse(url)
    api_key = api_key_of(kw)
    headers = parse_headers(kw.get("headers") or ())
    if api_key and not any(n.lower() == "authorization" for n, _ in headers):
        headers = (*headers, ("Authorization", f"Bearer {api_key}"))
    cafile = kw.get("cacert")
    if cafile is not None and not Path(cafile).is_file():
        raise BadUsageError(f"--cacert {cafile}: no such file; give the PEM file of the CA "
                            "that signed the server's certificate")
    if (cafile or kw.get("insecure")) and target.scheme != "https":
        raise BadUsageError("--cacert and --insecure apply to https:// URLs only")
    return dataclasses.replace(target, headers=headers,
                               cafile=None if cafile is None else str(cafile),
                               insecure=bool(kw.get("insecure")))


def header_names(target: Target) -> list[str]:
    """The names of the headers a run sent (for its JSON and records: never the values)."""
    return [n for n, _ in target.headers]


def request_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--payload", type=click.Choice(["auto", *payloads.PAYLOADS]),
                     default="auto", show_default=True,
                     help="auto: flights with --model-repo, oip with --model, else get."),
        click.option("--model", help="Model name (OIP payloads)."),
        click.option("--model-version", type=int, help="Model version (default: latest)."),
        click.option("--model-repo", type=click.Path(path_type=Path),
                     help="Model repository holding NAME/VERSION/preprocess.json (flights)."),
        click.option("--data", type=click.Path(path_type=Path),
                     help="Features parquet or dataset dir (test.parquet) to sample rows from."),
        click.option("--body", type=click.Path(path_type=Path), help="JSON file to POST."),
        click.option("--requests-file", type=click.Path(path_type=Path),
                     help="Recorded requests, JSON Lines."),
        click.option("--batch", type=int, default=1, show_default=True,
                     help="Rows per OIP request."),
        click.option("--timeout", default="10s", show_default=True,
                     help="A request unanswered this long after its due time is a timeout."),
        click.option("--max-connections", type=int, default=1024, show_default=True,
                     help="Open loop: most connections per process."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed for Poisson arrivals and payload sampling."),
        click.option("--event-loop", "loop_impl", type=click.Choice(list(LOOP_IMPLS)),
                     default="auto", show_default=True,
                     help="The generator's asyncio event loop: auto = uvloop when installed, "
                          "else asyncio (not --loop, which picks open or closed loop)."),
        click.option("--loop-impl", "loop_impl_old", type=click.Choice(list(LOOP_IMPLS)),
                     hidden=True, help="Old spelling of --event-loop."),
        click.option("--realtime", is_flag=True,
                     help="Run the generator in SCHED_FIFO (Linux, root or CAP_SYS_NICE): "
                          "on-time sends on a busy machine."),
        trace_sample_option,
    ]
    return connection_options(functools.reduce(lambda acc, o: o(acc), reversed(opts), f))


def _grpc_requests(target: Target, kw: dict[str, Any]) -> tuple[Target, list[bytes], str]:
    """grpc://HOST:PORT/MODEL: OIP payloads (random from ModelMetadata, or flights rows) as
    serialized ModelInferRequests."""
    from scalelab.lab.load.http import grpc_client

    kind = kw["payload"]
    if kind == "auto":
        kind = "flights" if kw.get("model_repo") else "oip"
    if kind not in ("oip", "flights"):
        raise BadUsageError(f"--payload {kind} is HTTP-only; a grpc:// URL sends OIP infer "
                            "requests (--payload oip or flights)")
    if kw.get("trace_sample"):
        raise BadUsageError("--trace-sample marks HTTP requests; it does not apply to grpc://")
    model = grpc_client.model_of(target, kw.get("model"))
    version = kw.get("model_version")
    plain = dataclasses.replace(target, path="/")
    if kind == "flights":
        if not kw.get("model_repo"):
            raise BadUsageError("--payload flights needs --model-repo REPO")
        specs = payloads.flights(plain, model=model, repo=kw["model_repo"], data=kw.get("data"),
                                 version=version, batch=kw["batch"], seed=kw["seed"])
    else:
        meta = grpc_client.fetch_metadata(target, model)
        specs = payloads.oip_random(plain, model, meta, batch=kw["batch"], seed=kw["seed"],
                                    version=version)
    return target, [grpc_client.encode_infer(model, version, s.body or b"{}")
                    for s in specs], f"{kind} (grpc)"


def build_requests(url: str, kw: dict[str, Any]) -> tuple[Target, list[bytes], str]:
    target = target_of(url, kw)
    if target.scheme == "grpc":
        return _grpc_requests(target, kw)
    kind = kw["payload"]
    if kind == "auto":
        kind = "flights" if kw.get("model_repo") else ("oip" if kw.get("model") else "get")
        if kw.get("body"):
            kind = "json"
        if kw.get("requests_file"):
            kind = "file"
    if kind in ("oip", "flights") and not kw.get("model"):
        raise BadUsageError(f"--payload {kind} needs --model NAME")
    if kind == "get":
        specs = payloads.plain_get(target)
    elif kind == "json":
        if not kw.get("body"):
            raise BadUsageError("--payload json needs --body FILE")
        specs = payloads.json_body(target, kw["body"])
    elif kind == "file":
        if not kw.get("requests_file"):
            raise BadUsageError("--payload file needs --requests-file FILE.jsonl")
        specs = payloads.recorded(target, kw["requests_file"])
    elif kind == "flights":
        if not kw.get("model_repo"):
            raise BadUsageError("--payload flights needs --model-repo REPO")
        specs = payloads.flights(target, model=kw["model"], repo=kw["model_repo"],
                                 data=kw.get("data"), version=kw.get("model_version"),
                                 batch=kw["batch"], seed=kw["seed"])
    else:
        meta = payloads.fetch_metadata(target, kw["model"])
        specs = payloads.oip_random(target, kw["model"], meta, batch=kw["batch"],
                                    seed=kw["seed"], version=kw.get("model_version"))
    return target, payloads.encode(target, specs), kind


def engine_config(target: Target, reqs: list[bytes], mode: Mode, kw: dict[str, Any],
            warmup_s: float, concurrency: int = 1) -> HttpConfig:
    timeout_s = parse_duration(kw["timeout"], what="--timeout")
    return HttpConfig(target=target, requests=reqs, mode=mode, concurrency=concurrency,
                        warmup_s=warmup_s, timeout_s=timeout_s,
                        max_connections=kw["max_connections"],
                        loop_impl=resolve_loop(kw.get("loop_impl_old") or kw.get("loop_impl")
                                               or "auto"),
                        realtime=bool(kw.get("realtime")),
                        trace_sample=float(kw.get("trace_sample") or 0.0),
                        trace_seed=int(kw.get("seed") or 0))


def check_ran(r: LoadResult, url: str) -> None:
    """Stop when the server never answered at all (down, wrong port); a level the server
    answered with errors (503s under overload, timeouts) is a measurement, not a failure."""
    unreachable = r.errors_by_kind.get("refused", 0) + r.errors_by_kind.get("other", 0)
    if r.requests > 0 and r.successes == 0 and unreachable == r.failures:
        kinds = ", ".join(f"{k}={v}" for k, v in r.errors_by_kind.items()) or "none"
        raise RunFailedError(f"no request to {url} got an answer ({r.requests} sent; errors: "
                             f"{kinds}); is the server up at that address?")


def exit_if_all_failed(results: Sequence[LevelResult], url: str, *, llm: bool = False) -> None:
    """After the output: when every measured request failed, one stderr line with the likely
    cause, and exit status 1 (a run whose every request failed never exits 0)."""
    line = all_failed_line(results, url=url, llm=llm)
    if line is not None:
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)
        raise click.exceptions.Exit(1)


def failures_cell(lv: dict[str, Any]) -> str:
    """A level's failures for a table: each status (404×50) and each other kind (reset×3)."""
    parts = [f"{code}×{n}" for code, n in lv["errors_by_status"].items()]
    parts += [f"{k}×{n}" for k, n in lv["errors_by_kind"].items() if k != "status"]
    return ",".join(parts) or "0"
