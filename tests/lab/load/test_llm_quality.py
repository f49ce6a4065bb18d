"""The greedy-agreement quality probe: exact comparisons (pure), then `load llm run
--quality-probe` against the deterministic server whose text changes with concurrency only
when asked (`--diverge-at`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmkit import llm_server
from scalelab.cli import run
from scalelab.lab.core.records import read_records
from scalelab.lab.core.sheet import build_sheet
from scalelab.lab.load.llm.quality import agreement, basis_of, compare, reference_problem
from scalelab.lab.load.llm.stream import ProbeAnswer
from scalelab.lab.report.document import sheet_cells


def _ans(i: int, pieces: list[str], tokens: list[int] | None = None,
         source: str = "usage-continuous") -> ProbeAnswer:
    return ProbeAnswer(index=i, pieces=pieces, tokens=tokens or [1] * len(pieces),
                       source=source)  # type: ignore[arg-type]


def test_compare_counts_reference_tokens_before_the_first_differing_character() -> None:
    ref = _ans(0, [" a", " b", " c", " d"])
    assert compare(ref, _ans(0, [" a", " b", " c", " d"])).identical
    m = compare(ref, _ans(0, [" a", " b", " X", " d"]))
    assert (m.identical, m.matched_tokens, m.reference_tokens, m.share) == (False, 2, 4, 0.5)
    # Chunked differently but the same text and token count: identical.
    assert compare(ref, _ans(0, [" a b", " c d"], [2, 2])).identical
    # A shorter answer that is a prefix: its tokens matched, not identical.
    short = compare(ref, _ans(0, [" a", " b", " c"]))
    assert (short.identical, short.matched_tokens) == (False, 3)
    # Same text, another token count (the tokenization differs): not identical, all matched.
    other = compare(ref, _ans(0, [" a b c d"], [3]))
    assert (other.identical, other.matched_tokens) == (False, 4)
    # A reference event of 3 tokens counts only when all of it precedes the divergence.
    coarse = _ans(0, [" a b c", " d e"], [3, 2])
    assert compare(coarse, _ans(0, [" a b X d e"], [5])).matched_tokens == 0
    assert compare(coarse, _ans(0, [" a b c d X"], [5])).matched_tokens == 3


def test_agreement_averages_per_prompt_and_says_why_when_it_cannot() -> None:
    ref = [_ans(0, [" a", " b"]), _ans(1, [" c", " d", " e", " f"])]
    level = [_ans(1, [" c", " d", " E", " F"]), _ans(0, [" a", " b"]),
             ProbeAnswer(index=0, pieces=[], tokens=[], source=None, error="timeout")]
    a = agreement(ref, level)
    assert (a.compared, a.failed, a.identical_share, a.prefix_agreement) == (2, 1, 0.5, 0.75)
    assert a.quality() == {"greedy_identical_share": 0.5, "greedy_prefix_agreement": 0.75}
    assert a.basis == "tokens (exact: one token per event)" and a.not_measured is None
    hot = agreement(ref, level, temperature=0.7)
    assert hot.quality() == {} and "temperature 0.7" in str(hot.not_measured)
    assert hot.extras()["quality_not_measured"] == hot.not_measured
    mute = [ProbeAnswer(index=0, pieces=[], tokens=[], source="usage-final")]
    assert "no text" in str(reference_problem(mute, 0.0))
    dead = [ProbeAnswer(index=0, pieces=[], tokens=[], source=None, error="refused")]
    assert reference_problem(dead, 0.0) == ("every reference request (one at a time) failed: "
                                            "refused×1")
    lost = agreement(ref, level[2:])
    assert lost.quality() == {} and lost.not_measured == "no probe request succeeded at this level"
    assert basis_of([_ans(0, [" a"], source="chunks")]).startswith("chunks")
    assert basis_of([_ans(0, [" a b"], [2])]).startswith("whole events")


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """Two deterministic servers whose text depends on the prompt: one changes it from token 3
    on for streams that overlap another, one never does (divergence past max_tokens)."""
    with (llm_server("--ttft-ms", "20", "--gap-ms", "10", "--diverge-at", "3") as diverging,
          llm_server("--ttft-ms", "20", "--gap-ms", "10", "--diverge-at", "1000") as steady):
        yield {"diverging": diverging, "steady": steady}


def _levels(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str,
            concurrency: str = "1,4") -> tuple[list[dict], Path]:
    recs = tmp_path / f"q{len(list(tmp_path.iterdir()))}.jsonl"
    # Four clients send their first requests together: the probe's three prompts are the
    # first measured requests, so each overlaps three other streams for its whole length.
    rc = run(["load", "llm", url, "--concurrency", concurrency, "--requests", "8", "--warmup", "0s",
              "--output-tokens", "8", "--prompt-tokens", "fixed:6", "--quality-probe", "3",
              "--records", str(recs), "--json", *extra])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)["levels"], recs


def test_agreement_is_one_when_the_text_does_not_change_under_load(
        servers: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    levels, recs = _levels(servers["steady"], tmp_path, capsys)
    assert [lv["quality"]["identical_share"] for lv in levels] == [1.0, 1.0]
    assert [lv["quality"]["prefix_agreement"] for lv in levels] == [1.0, 1.0]
    assert all(lv["quality"]["compared"] == 3 for lv in levels)
    got = read_records(recs)
    assert [r.quality for r in got] == [{"greedy_identical_share": 1.0,
                                         "greedy_prefix_agreement": 1.0}] * 2
    assert got[1].extras["quality_probe"]["basis"] == "tokens (exact: one token per event)"


def test_agreement_drops_by_the_exact_share_when_concurrency_changes_the_text(
        servers: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    levels, recs = _levels(servers["diverging"], tmp_path, capsys)
    one, four = (lv["quality"] for lv in levels)
    assert (one["identical_share"], one["prefix_agreement"]) == (1.0, 1.0)
    # Tokens 0-2 of 8 match, token 3 differs: 3/8 for every probe answer under load.
    assert (four["identical_share"], four["prefix_agreement"], four["compared"]) == (0.0, 0.375, 3)
    rows = build_sheet(read_records(recs))
    assert sheet_cells(rows[1])[12] == "greedy_identical_share=0, greedy_prefix_agreement=0.375"


def test_sampling_is_not_measured_and_the_sheet_says_why(
        servers: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    levels, recs = _levels(servers["steady"], tmp_path, capsys, "--temperature", "0.8",
                           concurrency="1")
    assert all(lv["quality"]["identical_share"] is None for lv in levels)
    assert "temperature 0.8" in levels[0]["quality"]["not_measured"]
    got = read_records(recs)
    assert got[0].quality == {} and "temperature 0.8" in got[0].extras["quality_not_measured"]
    cell = sheet_cells(build_sheet(got)[0])[12]
    assert cell.startswith("not measured (sampling at temperature 0.8")


def test_a_probe_larger_than_the_workload_is_bad_usage(
        servers: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["load", "llm", servers["steady"], "--concurrency", "1", "--requests", "2",
                "--distinct", "2", "--quality-probe", "3"]) == 2
    assert "--quality-probe must lie in [0, --distinct=2]" in capsys.readouterr().err
