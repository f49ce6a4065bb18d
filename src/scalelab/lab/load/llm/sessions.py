"""Multi-turn sessions: N users, each holding a K-turn chat with think time between turns.

Each turn sends the whole conversation so far (the user's turns and the server's own answers),
so the prompt grows turn by turn and its prefix is the previous turn's prompt: the workload a
prefix cache exists for. TTFT is reported per turn index, so a cache that works shows as a
TTFT that stays flat while the prompt grows. The prefix cache's hit rate is read from the
server's metrics where it publishes vLLM's counters (vllm:prefix_cache_hits_total over
vllm:prefix_cache_queries_total, in tokens).

Each user is a thread with one keep-alive connection: a closed loop (a user's next turn waits
for the answer and the think time), timed from when the request is written.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.histogram import LatencyHistogram

PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"


@dataclass(frozen=True, kw_only=True)
class SessionPlan:
    users: int
    """Conversations held at once (one thread and connection each)."""
    turns: list[list[str]]
    """Per user, the user's message at each turn (all of the same length K)."""
    think_s: float = 1.0
    """Mean think time between an answer and the user's next turn (exponential, seeded)."""
    max_tokens: int = 32
    """Each answer's max_tokens."""
    model: str = "default"
    ignore_eos: bool = True
    timeout_s: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.users < 1 or len(self.turns) != self.users:
            raise BadUsageError(f"--users must be at least 1 with one conversation each; got "
                                f"{self.users} users and {len(self.turns)} conversations")
        if not self.turns[0] or any(len(t) != len(self.turns[0]) for t in self.turns):
            raise BadUsageError("every conversation needs the same number of turns (--turns)")
        if self.think_s < 0 or self.max_tokens < 1:
            raise BadUsageError("--think must be >= 0 and --output-tokens >= 1")


@dataclass(kw_only=True)
class Turn:
    user: int
    turn: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None


@dataclass(kw_only=True)
class SessionsResult:
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0
    prefix_cache_hit_rate: float | None = None
    """Hits over queries of the server's prefix cache across the run; None where not published."""

    def per_turn(self) -> list[dict[str, Any]]:
        """Per turn index: TTFT and e2e percentiles, mean prompt tokens, failures."""
        k = 1 + max((t.turn for t in self.turns), default=-1)
        out = []
        for i in range(k):
            ts = [t for t in self.turns if t.turn == i]
            ok = [t for t in ts if t.error is None]
            ttft, e2e = LatencyHistogram(), LatencyHistogram()
            for t in ok:
                if t.ttft_s is not None:
                    ttft.record(t.ttft_s)
                if t.e2e_s is not None:
                    e2e.record(t.e2e_s)
            prompts = [t.prompt_tokens for t in ok if t.prompt_tokens is not None]
            out.append({"turn": i + 1, "requests": len(ts), "failures": len(ts) - len(ok),
                        "ttft": ttft.percentiles(), "e2e": e2e.percentiles(),
                        "prompt_tokens_mean": float(np.mean(prompts)) if prompts else None})
        return out


def _stream(conn: http.client.HTTPConnection, path: str, body: dict[str, Any],
            turn: Turn) -> str:
    """Send one streamed chat request; fill `turn`'s timings and counts; the answer's text."""
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json",
                                                   "Accept": "text/event-stream"})
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        turn.error = f"status {resp.status}"
        return ""
    parts: list[str] = []
    done = False
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            break
        ev = json.loads(payload)
        for ch in ev.get("choices") or []:
            text = (ch.get("delta") or {}).get("content") or ""
            if text and turn.ttft_s is None:
                turn.ttft_s = time.perf_counter() - t0
            parts.append(text)
        usage = ev.get("usage")
        if usage:
            turn.prompt_tokens = usage.get("prompt_tokens", turn.prompt_tokens)
            turn.output_tokens = usage.get("completion_tokens", turn.output_tokens)
    resp.read()
    turn.e2e_s = time.perf_counter() - t0
    if not done or turn.ttft_s is None:
        turn.error = "dropped" if not done else "empty"
    return "".join(parts)


def _user(url: str, plan: SessionPlan, u: int, out: list[Turn], lock: threading.Lock) -> None:
    parts = urlsplit(url)
    path = parts.path if parts.path.endswith("/chat/completions") \
        else parts.path.rstrip("/") + "/v1/chat/completions"
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                      timeout=plan.timeout_s)
    rng = np.random.default_rng([plan.seed, u])
    history: list[dict[str, str]] = []
    try:
        for k, text in enumerate(plan.turns[u]):
            history.append({"role": "user", "content": text})
            body: dict[str, Any] = {
                "model": plan.model, "messages": history, "stream": True,
                "max_tokens": plan.max_tokens, "temperature": 0.0,
                "stream_options": {"include_usage": True}}
            if plan.ignore_eos:
                body["ignore_eos"] = True
            turn = Turn(user=u, turn=k)
            try:
                answer = _stream(conn, path, body, turn)
            except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
                turn.error = type(e).__name__
                answer = ""
                conn.close()  # reconnects on the next request
            with lock:
                out.append(turn)
            if turn.error is not None:
                return  # a conversation without its answer cannot go on
            history.append({"role": "assistant", "content": answer})
            if k + 1 < len(plan.turns[u]) and plan.think_s > 0:
                time.sleep(float(rng.exponential(plan.think_s)))
    finally:
        conn.close()


def _prefix_counts(metrics_url: str | None) -> tuple[float, float] | None:
    if not metrics_url:
        return None
    from scalelab.lab.load.scrape import parse_metrics

    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        m = parse_metrics(r.read().decode("utf-8", "replace"), metrics_url)
    if PREFIX_HITS not in m or PREFIX_QUERIES not in m:
        return None
    return m[PREFIX_HITS], m[PREFIX_QUERIES]


def run_sessions(url: str, plan: SessionPlan, *, metrics_url: str | None = None
                 ) -> SessionsResult:
    """Hold every user's conversation to its end (or its first failed turn)."""
    before = _prefix_counts(metrics_url)
    out: list[Turn] = []
    lock = threading.Lock()
    threads = [threading.Thread(target=_user, args=(url, plan, u, out, lock), daemon=True,
                                name=f"session-{u}") for u in range(plan.users)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    res = SessionsResult(turns=sorted(out, key=lambda t: (t.user, t.turn)),
                         wall_s=time.perf_counter() - t0)
    after = _prefix_counts(metrics_url)
    if before is not None and after is not None and after[1] > before[1]:
        res.prefix_cache_hit_rate = (after[0] - before[0]) / (after[1] - before[1])
    return res


def synthetic_turns(users: int, turns: int, words: int, vocab: tuple[str, ...],
                    seed: int) -> list[list[str]]:
    """Each user's K messages of `words` seeded words."""
    rng = np.random.default_rng(seed)
    v = np.asarray(vocab)
    return [[" ".join(rng.choice(v, size=words).tolist()) for _ in range(turns)]
            for _ in range(users)]


def sharegpt_turns(convs: list[dict[str, Any]], users: int, turns: int,
                   seed: int) -> list[list[str]]:
    """Each user's K human turns, in order, from a ShareGPT conversation of K exchanges or more
    (drawn with the seed)."""
    long = [c for c in convs if isinstance(c.get("conversations"), list)
            and len([m for m in c["conversations"] if m.get("from") == "human"]) >= turns]
    if len(long) < 1:
        raise BadUsageError(f"no ShareGPT conversation has {turns} human turns; lower --turns")
    pick = np.random.default_rng(seed).choice(len(long), size=users, replace=len(long) < users)
    return [[str(m.get("value", "")) for m in long[i]["conversations"]
             if m.get("from") == "human"][:turns] for i in pick.tolist()]
