"""`scalelab load --trace-sample`: the marked requests' trace ids are exactly the traces the
tabular server (tracing on at sample 0: it follows clients only) wrote; TraceSampler's choice."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "system" / "serve"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from inproc import serving
from serve_fixtures import add_model

from scalelab.cli import run
from scalelab.lab.core.errors import BadUsageError
from scalelab.lab.load.trace_sample import TraceSampler
from scalelab.layers.observe.traces import assemble, read_spans
from scalelab.layers.web.trace import TraceConfig
from scalelab.layers.web.traceparent import parse
from scalelab.system.serve.app import ServeApp
from scalelab.system.serve.context import ServeContext
from scalelab.system.serve.settings import ServerSettings

REQ = b"POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\n\r\n{}"


def test_sampler_marks_a_seeded_share() -> None:
    s = TraceSampler(0.25, seed=3, keep=5)
    marked = [s.mark(REQ) for _ in range(400)]
    again = TraceSampler(0.25, seed=3, keep=5)
    assert [m != REQ for m in marked] == [again.mark(REQ) != REQ for _ in range(400)]
    assert s.count == sum(m != REQ for m in marked) and 60 < s.count < 140
    assert len(s.trace_ids) == 5  # listed up to `keep`, counted past it
    first = next(m for m in marked if m != REQ)
    header = first.split(b"\r\n")[1].decode()
    tp = parse(header.removeprefix("traceparent: "))
    assert tp is not None and tp.sampled and tp.trace_id == s.trace_ids[0]
    with pytest.raises(BadUsageError, match="--trace-sample"):
        TraceSampler(0.0)


def test_load_trace_ids_are_the_servers_traces(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "flights", {1: 1})
    out = tmp_path / "spans.jsonl"
    ctx = ServeContext.build(ServerSettings(model_repo=repo, access_log="off",
                                            trace=TraceConfig(out=str(out))))
    switch = sys.getswitchinterval()
    try:
        with serving(ServeApp(ctx)) as url:
            rc = run(["load", f"{url}/v2/models/flights/infer", "--model", "flights",
                      "--payload", "oip", "--concurrency", "2", "--requests", "40",
                      "--warmup", "0s", "--no-cold-start", "--trace-sample", "0.5",
                      "--seed", "7", "--json"])
            cap = capsys.readouterr()
            assert rc == 0, cap.err
            assert ctx.tracing is not None
            ctx.tracing.flush()
    finally:
        sys.setswitchinterval(switch)
        gc.unfreeze()
    (level,) = json.loads(cap.out)["levels"]
    assert level["successes"] == 40
    ids = level["trace_ids"]
    assert level["traced_requests"] == len(ids) and 0 < len(ids) < 40
    traces = assemble(read_spans([out]))
    assert sorted(t.trace_id for t in traces) == sorted(ids)
    assert all(len(t.spans) == 8 for t in traces)


def test_load_llm_trace_ids_are_the_generative_servers_traces(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from scalelab.layers.nets.llama import build_tiny
    from scalelab.system.generate.app import ApiSettings, build_app
    from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
    from scalelab.system.generate.tokenizer import byte_tokenizer

    out = tmp_path / "spans.jsonl"
    cfg = {"kv_cache_bytes": 1 << 20, "block_size": 4, "max_model_len": 512}
    app = build_app(ApiSettings(model="tiny", engine=cfg, trace=TraceConfig(out=str(out))),
                    LlmEngine(build_tiny(seed=1), byte_tokenizer(), LlmEngineConfig(**cfg),
                              name="tiny-llama"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with serving(app) as url:
            rc = run(["load", "llm", url, "--model", "tiny-llama", "--concurrency", "2",
                      "--requests", "12", "--warmup", "0s", "--output-tokens", "4",
                      "--prompt-tokens", "fixed:8",
                      "--trace-sample", "0.5", "--seed", "3", "--json"])
            cap = capsys.readouterr()
            assert rc == 0, cap.err
    finally:
        torch.set_num_threads(threads)
    (level,) = json.loads(cap.out)["levels"]
    ids = level["trace_ids"]
    assert level["successes"] == 12 and level["traced_requests"] == len(ids) and 0 < len(ids) < 12
    traces = assemble(read_spans([out]))  # the server flushed when it stopped
    assert sorted(t.trace_id for t in traces) == sorted(ids)
    assert all({s.name for s in t.spans} >= {"queue", "prefill", "decode"} for t in traces)
