"""The llm stage's levels sized sequentially on the deterministic OpenAI-compatible server
(tests/lab/load/llm_server.py: TTFT exactly 20 ms from arrival): chunks of real `scalelab load llm
run` (in-process) merged exactly, a level continuing while its TTFT p95 is undecided and
stopping at the first chunk that decides it."""

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmkit import llm_server
from scalelab.cli import run
from scalelab.lab.core.objectives import Objective
from scalelab.lab.core.records import Record, read_records
from scalelab.lab.diagnose.config import load_config
from scalelab.lab.diagnose.run import Runner
from scalelab.lab.diagnose.sizing import LevelClock, pending, size_level
from scalelab.lab.diagnose.stages.llm import LlmStage
from scalelab.lab.load.histogram import LatencyHistogram
from scalelab.lab.load.llm.result import merge_records as merge_llm_chunks

SERVER = Path(__file__).parents[1] / "load" / "llm_server.py"
TTFT_MS = 20.0
FIRST = 10
"""Requests of a level's first chunk (the stage's `requests`): too few for any p95 bound."""


@pytest.fixture
def llm_url() -> Iterator[str]:
    with llm_server("--ttft-ms", f"{TTFT_MS:g}", "--gap-ms", "2") as url:
        yield url


class Chunks:
    """A level's chunks as the stage runs them: the first by request count, later ones by
    duration; keeps what each was asked and measured."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.asked: list[float] = []
        self.records: list[Record] = []

    def __call__(self, seconds: float, index: int) -> Record | None:
        self.asked.append(seconds)
        path = self.tmp / f"chunk-{index}.jsonl"
        length = ["--requests", str(FIRST)] if index == 0 else ["--duration", f"{seconds:.3g}s"]
        with contextlib.redirect_stdout(io.StringIO()):
            rc = run(["load", "llm", "run", self.url, "--concurrency", "2", *length,
                      "--warmup", "0s", "--prompt-tokens", "fixed:8", "--output-tokens",
                      "fixed:4", "--records", str(path), "--json"])
        if rc != 0:
            return None
        rec = read_records(path)[0]
        self.records.append(rec)
        return rec


def _window(r: Record, asked: float) -> float:
    return r.wall_s or asked


TTFT_OK = Objective(metric="p95_ms", max=200.0, label="TTFT p95 ≤ 200 ms")
TTFT_TIGHT = Objective(metric="p95_ms", max=10.0, label="TTFT p95 ≤ 10 ms")


def _size(chunks: Chunks, objective: Objective, share_s: float) -> Record:
    got = size_level(chunks, [objective], first_s=0.5, share_s=share_s,
                     merge=merge_llm_chunks, window=_window)
    assert got is not None
    return got


def test_an_llm_level_continues_while_undecided_then_stops_when_decided(
    llm_url: str, tmp_path: Path
) -> None:
    """TTFT p95 ≤ 200 ms with TTFT 20 ms: 10 requests bound no p95 (the order-statistic rule
    needs 59 at 95%), so more chunks run, each at least 0.5 s, and the level stops at the
    first chunk whose merged record decides it, well inside its 30 s share."""
    chunks = Chunks(llm_url, tmp_path)
    got = _size(chunks, TTFT_OK, share_s=30.0)
    assert len(chunks.records) >= 2
    assert chunks.asked[0] == 0.5 and all(a >= 0.5 for a in chunks.asked[1:])
    assert chunks.records[0].extras["samples"] == FIRST
    for k in range(1, len(chunks.records)):
        assert pending(merge_llm_chunks(chunks.records[:k]), [TTFT_OK]), k
    assert pending(got, [TTFT_OK]) == []
    n = sum(r.extras["samples"] for r in chunks.records)
    sizing = got.extras["sizing"]
    assert (sizing["stopped"], sizing["undecided"], sizing["samples"]) == ("decided", [], n)
    assert sizing["chunks"] == len(chunks.records) and n >= 59
    assert LatencyHistogram.decode(got.histograms["ttft"]).count == n
    assert got.latency is not None and got.latency.p95_ms is not None
    assert TTFT_MS <= got.latency.p95_ms <= 200.0
    assert got.failures == 0 and got.extras["availability"] == 1.0


def test_an_llm_level_missing_its_objective_stops_at_the_first_chunk(
    llm_url: str, tmp_path: Path
) -> None:
    """TTFT p95 ≤ 10 ms where every TTFT is ≥ 20 ms: 10 requests already show it missed."""
    chunks = Chunks(llm_url, tmp_path)
    got = _size(chunks, TTFT_TIGHT, share_s=30.0)
    assert chunks.asked == [0.5]
    assert (got.extras["sizing"]["chunks"], got.extras["sizing"]["stopped"]) == (1, "decided")


def test_an_undecided_llm_level_stops_when_its_share_is_spent(llm_url: str,
                                                               tmp_path: Path) -> None:
    """Availability ≥ 99% needs 299 requests without a failure: a 1.5 s share ends first."""
    avail = Objective(metric="availability", min=0.99, label="availability ≥ 99%")
    chunks = Chunks(llm_url, tmp_path)
    got = _size(chunks, avail, share_s=1.5)
    sizing = got.extras["sizing"]
    assert sizing["stopped"] == "time share spent"
    assert len(sizing["undecided"]) == 1
    assert sizing["undecided"][0].startswith("availability ≥ 99%: ")
    assert "needs ≥ 299" in sizing["undecided"][0]


def test_llm_is_a_sized_stage_with_its_minimum_in_the_budget_split(tmp_path: Path) -> None:
    """The default two series: both servers started at once (13 s), the baseline's target
    decided (its first chunk: 2.5 s start + 1 s warm-up + 3 s window + 2 s quality probe; the
    chunk its p95s need: 59 - 10 requests at the quiet 5.35/s with the 1.1 margin and a 2.5 s
    start) and its curve step over the other three levels (6 + 3 × 4 s), 51.6 s; its least
    is that without the curve step; the candidate runs from what is left (advice, not a
    decision); the spare time goes to serve and llm in proportion to their minimums."""
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("budget: 3m\nstages: {data: {enabled: false}, train: {enabled: false},"
                   " model: {enabled: false}, retrieval: {enabled: false},"
                   " online: {enabled: false},"
                   " serve: {levels: [1, 2], duration: 2s, batching: ['off'], capacity: false}}\n")
    r = Runner(load_config(cfg, "default"), tmp_path / "out", "default")
    shares = {s.stage: s for s in r.shares}
    decide = 2.5 + 49 / 5.35 * 1.1
    llm = 13.0 + 8.0 + decide + 18.0
    assert shares["llm"].sized and shares["llm"].minimum_s == pytest.approx(llm)
    assert shares["llm"].least_s == pytest.approx(llm - 18.0)
    assert shares["serve"].minimum_s == 10.5  # a 3 s server start, 1.5 s + 2 levels x 3 s
    # 180 s less the minimums and serve's shared inputs (features 3.5 s, served model 6.5 s)
    assert shares["features"].share_s + shares["served-model"].share_s == 10.0
    spare = 180.0 - 10.0 - 10.5 - llm
    assert r.ctx.shares["llm"] == pytest.approx(llm + spare * llm / (llm + 10.5))
    assert r.ctx.shares["serve"] == pytest.approx(10.5 + spare * 10.5 / (llm + 10.5))
    # a user's endpoint: one first step, plus the capacity search when it has a TTFT objective,
    # and the search's 10 s confirmation at its answer
    stage, llm = LlmStage(), r.cfg.stages.llm  # the default objectives: TTFT p95 ≤ 2 s
    user = llm.model_copy(update={"url": "http://127.0.0.1:9"})
    assert stage.minimum_s(user, 1) == 12.0 + 25.0 + 10.0
    assert stage.minimum_s(user.model_copy(update={"capacity": False}), 1) == 12.0


def test_a_started_level_clock_counts_the_work_before_the_first_level() -> None:
    """The llm stage's first step measures every level's first chunk before any level is
    sized: its time comes out of the stage's share."""
    now = [0.0]
    clock = LevelClock(share_s=100.0, levels=4, cap_s=0.0, clock=lambda: now[0])
    clock.start()
    now[0] = 20.0  # the first step (all levels' first chunks)
    assert clock.next_share() == 20.0  # (100 - 20) / 4
