"""`scalelab compress ...` (the compression and routing bench) and `scalelab model minilm`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from scalelab.cli._output import emit, err_console, json_option, parse_list
from scalelab.cli._prices import core_hour_option, prices_option, resolve_prices
from scalelab.cli._progress import live_progress
from scalelab.cli._progress import shown as progress_shown
from scalelab.lab.core.device import DeviceProfile
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.core.records import (
    append_records,
)
from scalelab.lab.core.units import format_bytes, parse_duration

DEFAULT_VARIANTS = "int8,prune-structured-50,prune-unstructured-90,distill,cascade"


def _render_compress(out: dict[str, Any]) -> Any:
    def render(con: Console) -> None:
        t = Table(title=f"compress {out['model']} on {out['device']}")
        for col in ("variant", "macro F1", "Δ pts", "worst class Δ pts", "p50 ms b1 (×fp32)",
                    "p50 ms b32 (×fp32)", "size", "$/1k pred"):
            t.add_column(col, justify="left" if col in ("variant", "worst class Δ pts")
                         else "right")

        def lat(r: dict[str, Any], b: str) -> str:
            if b not in r["latency"]:
                return "-"
            return f"{r['latency'][b]['p50_ms']:.3f} ({r['speedup_p50'].get(b, 0.0):.2f}×)"

        for r in out["variants"]:
            d = r["delta"]
            flag = " !" if d["flagged"] else ""
            t.add_row(
                r["name"] + (" (control)" if r["control"] else ""),
                f"{r['quality']['macro_f1']:.4f}", f"{d['macro_f1_points']:+.2f}",
                f"{d['worst_class']} {d['worst_class_points']:+.2f}{flag}",
                lat(r, "1"), lat(r, "32"),
                format_bytes(r["size_bytes"]) if r["size_bytes"] else "-",
                f"{r['cost_per_1000_usd']:.1e}")
        con.print(t)
        if out.get("on_device"):
            _render_on_device(out["on_device"], con)
        for p in out["published"]:
            con.print(f"published {p['variant']} as {p['path']}")
        con.print("! = a class lost more F1 than the tolerance; × = fp32 p50 / variant p50")
        if out.get("plot"):
            con.print(f"Pareto plot: {out['plot']}")
        if out.get("records"):
            con.print(f"records appended to {out['records']}")
    return render


@click.command("compress")
@click.option("--model", "model_path", required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Model version directory (model.json, model.safetensors, preprocess.json).")
@click.option("--data", "data_dir", required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Dataset directory with train.parquet and test.parquet.")
@click.option("--variants", default=DEFAULT_VARIANTS, show_default=True,
              help="Comma-separated: int8, prune-structured-<pct>, prune-unstructured-<pct>, "
                   "distill, cascade, cache, onnx, onnx-int8.")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|SPEC",
              help="Where to run (auto: CUDA when torch sees one). A target-device SPEC "
                   "(cores=1,memory=512MiB[,threads=1]) builds on this machine's CPU, then "
                   "times every variant at batch 1 in a child held to that device: pinned "
                   "CPUs, threads, memory limit (cgroup v2, else RLIMIT_AS); fit / no fit.")
@click.option("--publish", "publish_repo", type=click.Path(file_okay=False, path_type=Path),
              help="Write each publishable variant as a new version in this model repository.")
@click.option("--model-name", help="Model name in --publish REPO (default: the parent's).")
@click.option("--lineage", type=click.Path(dir_okay=False, path_type=Path),
              help="Lineage store (default $SCALELAB_LINEAGE or ./.scalelab/lineage.db).")
@click.option("--no-lineage", is_flag=True, help="Do not record published versions in lineage.")
@click.option("--records", type=click.Path(dir_okay=False, path_type=Path),
              help="Append one record per variant (JSON Lines).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Pareto plot of macro F1 vs batch-1 p50 latency (.png or .svg).")
@click.option("--max-train-rows", type=int, default=100_000, show_default=True)
@click.option("--max-test-rows", type=int, default=20_000, show_default=True)
@click.option("--epochs", type=int, default=6, show_default=True,
              help="Student training epochs (distillation and its control).")
@click.option("--finetune-epochs", type=int, default=2, show_default=True,
              help="Fine-tune epochs after structured pruning.")
@click.option("--temperature", type=float, default=4.0, show_default=True,
              help="Distillation temperature T.")
@click.option("--alpha", type=float, default=0.7, show_default=True,
              help="Weight of the soft (teacher) term in the distillation loss.")
@click.option("--student-hidden", default="64", show_default=True,
              help="Student hidden widths, comma-separated.")
@click.option("--transfer-fraction", type=float, default=0.5, show_default=True,
              help="Share of train rows used unlabelled (the distillation transfer set).")
@click.option("--taus", default="0.5,0.6,0.7,0.8,0.9,0.95", show_default=True,
              help="Cascade thresholds to sweep.")
@click.option("--cascade-max-loss", type=float, default=0.5, show_default=True,
              help="Publish the cascade at the cheapest tau losing at most this macro-F1 (pts).")
@click.option("--tolerance", type=float, default=1.0, show_default=True,
              help="Flag classes whose F1 falls by more than this many points.")
@click.option("--batch-sizes", default="1,32", show_default=True)
@click.option("--calls", type=int, default=200, show_default=True,
              help="Timed calls per batch size.")
@click.option("--threads", type=int, default=1, show_default=True,
              help="torch threads while timing (a serving worker's).")
@click.option("--rounds", type=int, default=3, show_default=True,
              help="Timing rounds, variants interleaved; the median round is reported.")
@prices_option
@core_hour_option
@click.option("--price-per-gpu-hour", type=float,
              help="Overrides the price table's gpu_hour_usd for this run (--prices).")
@click.option("--cache-ttl", default="5s", show_default=True, help="Cache entry lifetime.")
@click.option("--cache-rate", type=float, default=200.0, show_default=True,
              help="Request rate of the cache's stream (per second).")
@click.option("--cache-zipf", type=float, default=1.1, show_default=True,
              help="Zipf exponent of request keys.")
@click.option("--cache-capacity", type=int, default=1024, show_default=True)
@click.option("--cache-requests", type=int, default=2000, show_default=True)
@json_option
def compress(model_path: Path, data_dir: Path, variants: str, device: str,
             publish_repo: Path | None, model_name: str | None, lineage: Path | None,
             no_lineage: bool, records: Path | None, plot: Path | None,
             max_train_rows: int, max_test_rows: int, epochs: int, finetune_epochs: int,
             temperature: float, alpha: float, student_hidden: str, transfer_fraction: float,
             taus: str, cascade_max_loss: float, tolerance: float, batch_sizes: str,
             calls: int, threads: int, rounds: int, prices_file: Path | None,
             price_per_core_hour: float | None, price_per_gpu_hour: float | None,
             cache_ttl: str, cache_rate: float, cache_zipf: float,
             cache_capacity: int, cache_requests: int, as_json: bool) -> None:
    """Build compressed variants of a flights model and measure each on the same test rows.

    Example: scalelab compress --model repo/flights/1 --data out/flights --plot pareto.png
    """
    from scalelab.system.compress.bench import CompressConfig, run_bench
    from scalelab.system.compress.distill import DistillConfig
    from scalelab.system.compress.measure import MeasureConfig, resolve_device
    from scalelab.system.compress.summary import (
        on_device,
        pareto_points,
        publish_variants,
        variant_row,
    )
    from scalelab.system.compress.trainer import TrainConfig

    if plot is not None and plot.suffix.lower() not in (".png", ".svg"):
        raise BadUsageError(f"--plot {plot}: use a .png or .svg file name")
    if cache_rate <= 0 or cache_requests < 1:
        raise BadUsageError("--cache-rate must be > 0 and --cache-requests >= 1")
    profile = DeviceProfile.parse(device) if "=" in device else None
    dev = "cpu" if profile is not None else resolve_device(device)
    prices = resolve_prices(prices_file, core_hour_usd=price_per_core_hour,
                            gpu_hour_usd=price_per_gpu_hour)
    cfg = CompressConfig(
        variants=parse_list(variants, what="--variants", kind=str), device=dev,
        max_train_rows=max_train_rows, max_test_rows=max_test_rows,
        transfer_fraction=transfer_fraction, tolerance_points=tolerance,
        taus=parse_list(taus, what="--taus"), cascade_max_loss_points=cascade_max_loss,
        distill=DistillConfig(temperature=temperature, alpha=alpha,
                              hidden=parse_list(student_hidden, what="--student-hidden",
                                                kind=int),
                              train=TrainConfig(epochs=epochs, batch_size=256)),
        finetune=TrainConfig(epochs=finetune_epochs, lr=1e-3),
        measure=MeasureConfig(batch_sizes=parse_list(batch_sizes, what="--batch-sizes",
                                                     kind=int),
                              calls=calls, threads=threads, rounds=rounds,
                              price_per_core_hour=prices.core_hour_usd,
                              price_per_gpu_hour=prices.gpu_hour_usd),
        cache_requests=cache_requests, cache_zipf_s=cache_zipf, cache_rate_per_s=cache_rate,
        cache_ttl_s=parse_duration(cache_ttl, what="--cache-ttl"),
        cache_capacity=cache_capacity)
    if not as_json and not progress_shown():
        err_console.print(f"building {', '.join(cfg.variants)} on {dev} ...")
    with live_progress(f"compress on {dev}") as progress:
        result = run_bench(model_path, data_dir, cfg,
                           on_step=lambda what: progress.update(note=f"compress: {what}"))
    base = result.variants[0]
    out: dict[str, Any] = {
        "experiment": result.experiment, "model": str(model_path), "data": str(data_dir),
        "device": base.measurement.device if base.measurement else dev,
        "classes": result.classes,
        "variants": [variant_row(v, base) for v in result.variants],
        "published": [], "records": str(records) if records else None,
        "plot": str(plot) if plot else None,
    }
    if profile is not None:
        out["on_device"] = on_device(result, profile, model_path, data_dir, cfg, calls)
    if plot is not None:
        from scalelab.system.compress.pareto import plot as draw

        draw(pareto_points(result), plot, title=f"quality vs latency ({out['device']})",
             xlabel="p50 latency at batch 1 (ms)", ylabel="macro F1 (test)")
    if publish_repo is not None:
        out["published"] = publish_variants(result, model_path, publish_repo, model_name,
                                            lineage, not no_lineage)
    if records is not None:
        append_records(records, result.records)
    emit(out, as_json, _render_compress(out))


def _render_on_device(od: dict[str, Any], con: Console) -> None:
    t = Table(title=f"on device {od['profile']['label']} (memory limit: {od['mechanism']}), "
                    "batch 1")
    for col in ("variant", "fit", "p50 ms", "p95 ms", "peak RSS", "peak VM", "CPUs",
                "threads", "why not"):
        t.add_column(col, justify="left" if col in ("variant", "why not") else "right")
    for r in od["variants"]:
        fit = {True: "yes", False: "NO", None: "-" if not r["measured"] else "error"}[r["fit"]]
        t.add_row(r["variant"], fit,
                  f"{r['p50_ms']:.3f}" if "p50_ms" in r else "-",
                  f"{r['p95_ms']:.3f}" if "p95_ms" in r else "-",
                  format_bytes(r["peak_rss_bytes"]) if r.get("peak_rss_bytes") else "-",
                  format_bytes(r["peak_vm_bytes"]) if r.get("peak_vm_bytes") else "-",
                  ",".join(map(str, r["cpus"])) if r.get("cpus") else "-",
                  str(r.get("threads") or "-"), r["reason"])
    con.print(t)
    con.print(f"[dim]{escape(od['mechanism_note'])}[/]")


@click.group("model", no_args_is_help=True)
def app() -> None:
    """The model part's workloads beyond `scalelab compress` (the MiniLM transformer)."""


@app.command("minilm")
@click.option("--sentences", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Text file, one sentence per line (quality set and timing inputs).")
@click.option("--backends", default="fp32,torch-int8,onnx-fp32,onnx-int8", show_default=True)
@click.option("--batch-sizes", default="1,8,32", show_default=True)
@click.option("--calls", type=int, default=10, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--k", "k", type=int, default=5, show_default=True,
              help="Neighbours compared for top-k retrieval agreement.")
@click.option("--records", type=click.Path(dir_okay=False, path_type=Path),
              help="Append one record per backend (JSON Lines).")
@json_option
def minilm(sentences: Path, backends: str, batch_sizes: str, calls: int, threads: int, k: int,
           records: Path | None, as_json: bool) -> None:
    """all-MiniLM-L6-v2 embeddings: fp32 vs torch int8 vs ONNX Runtime fp32/int8.

    Example: scalelab model minilm --sentences tests/system/compress/data/sentences.txt
    """
    from scalelab.system.compress.minilm import MiniLMConfig, read_sentences, run_minilm_bench

    cfg = MiniLMConfig(backends=parse_list(backends, what="--backends", kind=str),
                       batch_sizes=parse_list(batch_sizes, what="--batch-sizes", kind=int),
                       calls=calls, threads=threads, k=k)
    texts = read_sentences(sentences)
    with tempfile.TemporaryDirectory(prefix="scalelab-minilm-") as d:
        bench = run_minilm_bench(texts, cfg, Path(d))
    rows, device = bench.rows, bench.device
    if records is not None:
        append_records(records, bench.records)
    out = {"experiment": bench.experiment, "sentences": len(texts), "device": device,
           "threads": threads,
           "backends": rows, "records": str(records) if records else None}

    def render(con: Console) -> None:
        t = Table(title=f"all-MiniLM-L6-v2 on {device}, {threads} thread(s)")
        t.add_column("backend")
        for col in ("cos mean", "cos min", "top-1 agree", f"top-{k} overlap"):
            t.add_column(col, justify="right")
        for b in cfg.batch_sizes:
            t.add_column(f"p50 b{b} ms", justify="right")
        t.add_column("size", justify="right")
        for row in rows:
            q = row["quality"]
            t.add_row(row["backend"], f"{q['cosine_mean']:.4f}", f"{q['cosine_min']:.4f}",
                      f"{q['top1_agreement']:.3f}", f"{q['topk_overlap']:.3f}",
                      *[f"{row['latency'][str(b)]['p50_ms']:.2f}" for b in cfg.batch_sizes],
                      format_bytes(row["size_bytes"]))
        con.print(t)
    emit(out, as_json, render)


@app.command("time")
@click.option("--model", "model_dir", required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Model version directory (model.json + weights).")
@click.option("--rows", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Rows to time on: safetensors with 'categorical' and 'numeric' tensors.")
@click.option("--calls", type=int, default=200, show_default=True, help="Timed calls.")
@click.option("--warmup", type=int, default=20, show_default=True, help="Untimed calls first.")
@json_option
def time_cmd(model_dir: Path, rows: Path, calls: int, warmup: int, as_json: bool) -> None:
    """Load one model version and time it at batch 1 in this process (what `compress --device
    SPEC` runs in each held child; useful alone under taskset or a container limit).

    Example: scalelab model time --model repo/flights/1 --rows rows.safetensors
    """
    from scalelab.system.compress.ondevice import time_version

    if calls < 1 or warmup < 0:
        raise BadUsageError("--calls must be >= 1 and --warmup >= 0")
    out = time_version(model_dir, rows, calls=calls, warmup=warmup)
    emit(out, as_json, lambda con: con.print(
        f"{model_dir}: p50 {out['p50_ms']:.3f} ms, p95 {out['p95_ms']:.3f} ms at batch 1 "
        f"({calls} calls, {out['torch_threads']} torch thread(s))"))
