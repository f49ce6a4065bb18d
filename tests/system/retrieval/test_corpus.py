from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.system.retrieval.corpus import (
    DOCS_FILE,
    FRESH_MONTH,
    CorpusSpec,
    build_corpus,
    read_corpus,
    write_corpus,
)


def test_levels_grow_by_appending_and_share_questions() -> None:
    one = build_corpus(CorpusSpec(level=1, base_docs=100, questions=30))
    two = build_corpus(CorpusSpec(level=2, base_docs=100, questions=30))
    assert len(one.docs) == 100 and len(two.docs) == 200
    assert two.docs[:100] == one.docs
    assert two.questions == one.questions
    assert build_corpus(CorpusSpec(level=2, base_docs=100, questions=30)) == two


def test_another_seed_is_another_corpus() -> None:
    a = build_corpus(CorpusSpec(base_docs=100, questions=10, seed=1))
    b = build_corpus(CorpusSpec(base_docs=100, questions=10, seed=2))
    assert [d.key for d in a.docs] != [d.key for d in b.docs]


def test_answers_are_in_their_source_documents(small) -> None:  # type: ignore[no-untyped-def]
    by_key = {d.key: d for d in small.corpus.docs}
    for q in small.corpus.questions:
        assert q.answer in by_key[q.doc_key].text
    fresh = {d.key: d for d in small.corpus.fresh_docs}
    assert small.corpus.fresh_questions
    for q in small.corpus.fresh_questions:
        assert q.answer in fresh[q.doc_key].text
        assert f"2013-{FRESH_MONTH:02d}-" in q.doc_key
    # Fresh ids continue after the corpus; no fresh fact is already in it.
    assert small.corpus.fresh_docs[0].id == len(small.corpus.docs)
    assert not set(fresh) & set(by_key)


def test_past_the_real_facts_come_unique_distractors() -> None:
    c = build_corpus(CorpusSpec(level=12, base_docs=1500, questions=10))
    assert len(c.docs) == 18_000
    keys = [d.key for d in c.docs]
    assert len(set(keys)) == len(keys)
    # Real facts: 16 airlines + 1,458 airports + 3,322 planes + Jan-Nov weather and flights.
    real = 16_648
    tail = c.docs[real:]
    assert tail and all(d.key.split(":")[0] in {"airline", "airport", "plane", "weather",
                                                "flights"} for d in tail)
    dated = [d.key for d in tail if d.kind in ("weather", "flights")]
    assert dated and all(":2014-" in k for k in dated)


def test_round_trip_and_tamper_refusal(small, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    back = read_corpus(small.dir)
    assert back == small.corpus
    m = json.loads((small.dir / "manifest.json").read_text())
    assert m["kind"] == "corpus" and m["rows"] == 1500
    assert m["parameters"]["seed"] == 13 and m["parameters"]["spec_version"] == 1
    d = write_corpus(small.corpus, tmp_path / "c")
    p = d / DOCS_FILE
    p.write_text(p.read_text().replace("Plane", "Plone", 1))
    with pytest.raises(BadInputError, match="does not match the corpus manifest"):
        read_corpus(d)


@pytest.mark.parametrize("kw", [{"level": 0}, {"base_docs": 5}, {"questions": 0},
                                {"fresh_questions": -1}])
def test_bad_spec(kw: dict[str, float]) -> None:
    with pytest.raises(BadUsageError):
        CorpusSpec(**kw)  # type: ignore[arg-type]
