"""`scalelab load llm sessions URL`: N users holding K-turn conversations; TTFT per turn."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._export import output_option
from scalelab.cli._output import emit, json_option
from scalelab.cli._sweep import fmt_ms
from scalelab.lab.core.errors import RunFailedError
from scalelab.lab.core.units import parse_duration
from scalelab.lab.load.llm.sessions import (
    SessionPlan,
    run_sessions,
    sharegpt_turns,
    synthetic_turns,
)


@click.command("sessions")
@click.argument("url")
@click.option("--users", type=int, default=4, show_default=True,
              help="Conversations at once (one connection each).")
@click.option("--turns", type=int, default=3, show_default=True, help="Turns per conversation.")
@click.option("--think", default="1s", show_default=True,
              help="Mean think time between an answer and the next turn (exponential).")
@click.option("--turn-words", type=int, default=32, show_default=True,
              help="Words of each user message (synthetic; --dataset sharegpt uses its own).")
@click.option("--output-tokens", type=int, default=32, show_default=True,
              help="max_tokens of every answer.")
@click.option("--dataset", type=click.Choice(["sharegpt"]),
              help="The users' messages: the human turns of ShareGPT conversations with "
                   "--turns of them or more.")
@click.option("--model", "model_name", help="The model field (default: GET /v1/models' first).")
@click.option("--metrics-url", help="The server's /metrics: its prefix cache hit rate over the "
              "run (vLLM's vllm:prefix_cache_hits_total / _queries_total).")
@click.option("--timeout", default="60s", show_default=True, help="Per request.")
@click.option("--seed", type=int, default=0, show_default=True)
@output_option
@json_option
def sessions_cmd(url: str, users: int, turns: int, think: str, turn_words: int,
                 output_tokens: int, dataset: str | None, model_name: str | None,
                 metrics_url: str | None, timeout: str, seed: int, output: Any,
                 as_json: bool) -> None:
    """Each user sends its conversation so far (its turns and the server's answers) at every
    turn, after a think time: the prompt grows, its prefix is the last turn's prompt.

    \b
    Exit status: 0 done; 2 bad usage or input; 70 internal error; a run whose turns all
    failed exits 2 naming the first failure.
    """
    from scalelab.cli.load_llm import served_model
    from scalelab.lab.load.send import Target

    if dataset == "sharegpt":
        from scalelab.lab.load.llm.dataset import sharegpt_conversations

        msgs = sharegpt_turns(sharegpt_conversations()[0], users, turns, seed)
    else:
        from scalelab.lab.load.llm.workload import WORDS

        msgs = synthetic_turns(users, turns, turn_words, WORDS, seed)
    model = model_name or served_model(Target.parse(url)) or "default"
    plan = SessionPlan(users=users, turns=msgs, think_s=parse_duration(think, what="--think"),
                       max_tokens=output_tokens, model=model, seed=seed,
                       timeout_s=parse_duration(timeout, what="--timeout"))
    res = run_sessions(url, plan, metrics_url=metrics_url)
    if res.turns and all(t.error is not None for t in res.turns):
        raise RunFailedError(f"every turn against {url} failed (first: {res.turns[0].error}); "
                             "is it an OpenAI-compatible chat server?")
    doc = {"url": url, "users": users, "turns": turns, "think_s": plan.think_s,
           "messages": dataset or f"synthetic, {turn_words} words", "model": model,
           "wall_s": res.wall_s, "prefix_cache_hit_rate": res.prefix_cache_hit_rate,
           "levels": res.per_turn()}
    emit(doc, as_json, lambda c: _render(c, doc))


def _render(c: Console, doc: dict[str, Any]) -> None:
    hit = doc["prefix_cache_hit_rate"]
    t = Table(title=f"{doc['users']} users × {doc['turns']} turns, think {doc['think_s']:g} s; "
                    f"prefix cache hits {'not published' if hit is None else f'{hit:.1%}'}",
              title_justify="left")
    for h in ("turn", "requests", "failed", "prompt tokens", "TTFT p50", "TTFT p95", "e2e p50"):
        t.add_column(h, justify="right")
    for lv in doc["levels"]:
        pt = lv["prompt_tokens_mean"]
        t.add_row(str(lv["turn"]), str(lv["requests"]), str(lv["failures"]),
                  "—" if pt is None else f"{pt:.0f}", fmt_ms(lv["ttft"].p50_ms),
                  fmt_ms(lv["ttft"].p95_ms), fmt_ms(lv["e2e"].p50_ms))
    c.print(t)
