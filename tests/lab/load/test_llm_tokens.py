"""Token timings, workload specs, token SLOs, goodput and cost: pure functions, exact numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.load.llm.token_slo import (
    Samples,
    TokenStepRule,
    cost_per_1k,
    evaluate,
    goodput,
    parse_token_slo,
)
from scalelab.lab.load.llm.tokens import (
    Event,
    parse_event,
    split_proportional,
    timing,
    tokens_per_event,
)
from scalelab.lab.load.llm.workload import LengthDist, Workload, read_prompts
from scalelab.lab.load.send import Target


def _chat(text: str | None, usage: dict | None = None, finish: str | None = None) -> bytes:
    delta = {} if text is None else {"content": text}
    obj: dict = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj).encode()


def test_parse_event_reads_chat_completions_done_and_errors() -> None:
    e = parse_event(_chat(" a b", {"prompt_tokens": 7, "completion_tokens": 2}, "length"))
    assert e == Event(4, 2, 7, True, None, " a b")
    c = parse_event(b'{"choices":[{"text":"xyz","finish_reason":null}]}')
    assert c == Event(3, None, None, False, None, "xyz")
    assert parse_event(b"[DONE]") is None
    err = parse_event(b'{"error":{"message":"out of KV blocks"}}')
    assert err is not None and err.error == "out of KV blocks"
    with pytest.raises(ValueError):
        parse_event(b"not json")


def test_continuous_usage_counts_tokens_per_chunk_exactly() -> None:
    # Role chunk, then chunks of 3, 3, 1 tokens (cumulative usage 3, 6, 7), then usage-only.
    evs = [parse_event(_chat(None)), parse_event(_chat("abc", {"completion_tokens": 3})),
           parse_event(_chat("def", {"completion_tokens": 6})),
           parse_event(_chat("g", {"completion_tokens": 7}, "length")),
           Event(0, 7, 5, False, None)]
    toks, src, prompt = tokens_per_event([e for e in evs if e is not None])
    assert (toks, src, prompt) == ([0, 3, 3, 1, 0], "usage-continuous", 5)


def test_final_usage_is_split_by_characters_and_sums_exactly() -> None:
    evs = [Event(2, None, None, False, None), Event(6, None, None, False, None),
           Event(2, None, None, True, None), Event(0, 5, 9, False, None)]
    assert tokens_per_event(evs) == ([1, 3, 1, 0], "usage-final", 9)


def test_without_usage_one_token_per_chunk_is_assumed() -> None:
    evs = [Event(0, None, None, False, None), Event(6, None, None, False, None),
           Event(2, None, None, True, None)]
    assert tokens_per_event(evs) == ([0, 1, 1], "chunks", None)


def test_without_usage_a_tokenizer_counts_the_streamed_text() -> None:
    # "a unable" in 2 events: 3 tokens (a, un, ##able) by the counter, split by characters.
    evs = [Event(0, None, None, False, None), Event(2, None, None, False, None, " a"),
           Event(7, None, None, True, None, " unable")]
    words = {"a": 1, "unable": 2}
    assert tokens_per_event(evs, lambda t: sum(words[w] for w in t.split())) == (
        [0, 1, 2], "tokenizer", None)
    # Usage, when the server reports it, wins over the tokenizer.
    evs.append(Event(0, 5, 9, False, None))
    assert tokens_per_event(evs, lambda t: 3)[1:] == ("usage-final", 9)


def test_split_proportional_gives_each_texted_event_a_token_and_the_exact_total() -> None:
    assert split_proportional(10, [1, 1, 8]) == [1, 1, 8]
    assert split_proportional(7, [1, 1, 1]) == [3, 2, 2]
    assert split_proportional(2, [5, 5, 5]) == [1, 1, 0]
    assert split_proportional(3, [1, 0, 100, 1]) == [1, 0, 1, 1]
    assert split_proportional(0, [3, 4]) == [0, 0]
    assert sum(split_proportional(101, [3, 0, 7, 11])) == 101


def test_timing_spreads_a_chunk_over_its_tokens() -> None:
    # Start 0; role chunk at 0.01 (no tokens); 3 tokens at 0.1, 3 at 0.13, 1 at 0.16; end 0.17.
    t = timing(0.0, [0.01, 0.1, 0.13, 0.16], [0, 3, 3, 1], 0.17)
    assert t is not None
    assert t.ttft_s == pytest.approx(0.1) and t.e2e_s == pytest.approx(0.17)
    assert t.output_tokens == 7
    assert t.gaps_s == pytest.approx([0.0, 0.0, 0.01, 0.01, 0.01, 0.03])
    assert sum(t.gaps_s) == pytest.approx(0.16 - 0.1)
    assert t.tpot_s == pytest.approx((0.17 - 0.1) / 6)
    one = timing(0.0, [0.05], [1], 0.05)
    assert one is not None and one.tpot_s is None and one.gaps_s == []
    assert timing(0.0, [0.05], [0], 0.06) is None


def test_length_distributions_parse_sample_and_refuse_bad_forms() -> None:
    rng = np.random.default_rng(0)
    assert LengthDist.parse("128", what="x").sample(rng, 3).tolist() == [128, 128, 128]
    u = LengthDist.parse("uniform:10,12", what="x").sample(rng, 200)
    assert set(u.tolist()) == {10, 11, 12}
    n = LengthDist.parse("normal:100,30", what="x").sample(rng, 2000)
    assert n.min() >= 1 and n.max() <= 400 and abs(float(n.mean()) - 100) < 3
    for bad in ("gauss:1,2", "uniform:5", "uniform:9,3", "fixed:0", "normal:5,-1"):
        with pytest.raises(BadUsageError):
            LengthDist.parse(bad, what="--prompt-tokens")


def test_workload_is_seeded_and_builds_openai_bodies(tmp_path: Path) -> None:
    w = Workload(prompt=LengthDist.parse("uniform:5,9", what="p"),
                 output=LengthDist.parse("fixed:16", what="o"), shared_prefix_words=4,
                 seed=3, distinct=8)
    a, b = w.bodies(), w.bodies()
    assert a == b
    body, words, mt = a[0]
    assert mt == 16 and body["max_tokens"] == 16 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    msgs = body["messages"]
    assert isinstance(msgs, list) and msgs[0]["role"] == "system"
    assert len(msgs[0]["content"].split()) == 4
    assert {m[0]["messages"][0]["content"] for m in a} == {msgs[0]["content"]}  # shared prefix
    assert 5 + 4 <= words <= 9 + 4
    comp = Workload(api="completions", usage="final", ignore_eos=False, distinct=2).bodies()
    assert "prompt" in comp[0][0] and "ignore_eos" not in comp[0][0]
    assert comp[0][0]["stream_options"] == {"include_usage": True}
    req = w.build(Target.parse("http://127.0.0.1:9/v1/chat/completions"))[0]
    assert req.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    pf = tmp_path / "p.jsonl"
    pf.write_text('{"prompt": "hello there"}\nplain line\n\n', encoding="utf-8")
    assert read_prompts(pf) == ["hello there", "plain line"]
    from_file = Workload(prompts_file=pf, distinct=20, seed=1).bodies()
    assert {m[0]["messages"][-1]["content"] for m in from_file} == {"hello there", "plain line"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 3}\n', encoding="utf-8")
    with pytest.raises(BadInputError, match=r"bad\.jsonl:1"):
        read_prompts(bad)


def test_token_slo_parses_and_refuses_bad_terms() -> None:
    s = parse_token_slo("ttft_p95<500ms, tpot_p99<=60, itl_p999<0.1s, e2ep50<5s, avail>=99.9%")
    assert [(o.metric, o.quantile, o.threshold_s) for o in s.objectives] == [
        ("ttft", 0.95, 0.5), ("tpot", 0.99, 0.06), ("itl", 0.999, 0.1), ("e2e", 0.5, 5.0)]
    assert s.availability == 0.999
    assert s.label == "ttft_p95<500ms,tpot_p99<60ms,itl_p99.9<100ms,e2e_p50<5000ms,avail>=99.9%"
    for bad in ("p95<50ms", "ttft_p95<0ms", "ttft_p0<5ms", "avail>=0%", ""):
        with pytest.raises(BadUsageError):
            parse_token_slo(bad)
    # The same term rules as `--slo` for plain HTTP (load/slo.py): a malformed percentage is a
    # usage error naming the term, where it used to escape as a ValueError.
    with pytest.raises(BadUsageError, match=r"'avail>=9\.9\.9%': write availability as a"):
        parse_token_slo("ttft_p95<500ms,avail>=9.9.9%")


def _samples(ttft_ms: list[float], tpot_ms: list[float], out: list[int], requests: int,
             itl: dict[float, tuple[int, int]] | None = None) -> Samples:
    us = lambda xs: np.array([int(x * 1000) for x in xs], dtype=np.int64)  # noqa: E731
    return Samples(ttft_us=us(ttft_ms), tpot_us=us(tpot_ms), e2e_us=us(ttft_ms),
                   output_tokens=np.array(out, dtype=np.int64), requests=requests,
                   itl_within=itl or {})


def test_objectives_goodput_and_cost_are_exact() -> None:
    slo = parse_token_slo("ttft_p50<100ms,tpot_p50<10ms,itl_p90<20ms,avail>=90%")
    # 4 successes of 5 requests; request 2 breaks TTFT, request 3 breaks TPOT; one-token
    # answer (tpot -1) counts as meeting TPOT.
    s = _samples([50, 150, 60, 70], [5, 5, 20, -0.001], [10, 20, 30, 1], 5,
                 {0.02: (90, 100)})
    lines = evaluate(slo, s)
    assert [(x.objective, x.within, x.events, x.met) for x in lines] == [
        ("ttft_p50<100ms", 3, 4, True), ("tpot_p50<10ms", 2, 3, True),
        ("itl_p90<20ms", 90, 100, True), ("avail>=90%", 4, 5, False)]
    g = goodput(slo, s, wall_s=2.0)
    assert (g.good_requests, g.good_output_tokens) == (2, 11)
    assert (g.goodput_rps, g.goodput_tps) == (1.0, 5.5)
    # $3.60/hour at 1000 tokens/s: 3.6 / 3600 / 1000 per token = $0.001 per 1,000 tokens.
    assert cost_per_1k(3.6, 1000.0) == pytest.approx(0.001)
    assert cost_per_1k(3.6, 0.0) is None


def test_step_rule_decides_pass_fail_and_waits_when_unsure() -> None:
    rule = TokenStepRule(slo=parse_token_slo("ttft_p90<100ms,avail>=99%"), min_step_s=1.0,
                         max_step_s=10.0)
    fast = _samples([10.0] * 400, [1.0] * 400, [8] * 400, 400)
    slow = _samples([200.0] * 400, [1.0] * 400, [8] * 400, 400)
    few = _samples([10.0] * 5, [1.0] * 5, [8] * 5, 5)
    failing = _samples([10.0] * 300, [1.0] * 300, [8] * 300, 400)
    assert rule.verdict(fast) == ("pass", True)
    assert rule.verdict(slow) == ("fail", True)
    assert rule.verdict(few) == ("pass", False)
    assert rule.verdict(failing) == ("fail", True)
    assert not rule.should_stop(fast, 0.5) and rule.should_stop(fast, 1.0)
    assert not rule.should_stop(few, 5.0) and rule.should_stop(few, 10.0)


def test_without_an_availability_objective_the_default_99_is_judged_for_misses() -> None:
    # The same asymmetric rule as `load capacity`'s StepRule, on token objectives.
    rule = TokenStepRule(slo=parse_token_slo("ttft_p90<100ms"), min_step_s=3.0)
    # 30 of 100 failed: decided missed (Clopper-Pearson lower bound 0.21 > 1%) at once.
    refused = _samples([10.0] * 70, [1.0] * 70, [8] * 70, 100)
    assert rule.verdict(refused) == ("fail", True)
    assert rule.should_stop(refused, 0.2)
    # 1 of 300 failed: not decided missed, and passing is not required per step.
    one = _samples([10.0] * 299, [1.0] * 299, [8] * 299, 300)
    assert rule.verdict(one) == ("pass", True) and not rule.should_stop(one, 0.2)
    # 5 of 300 (1.7%): not decided missed (lower bound 0.54%), but over the 1% budget: the
    # latencies alone never pass it.
    five = _samples([10.0] * 295, [1.0] * 295, [8] * 295, 300)
    assert rule.verdict(five) == ("fail", False) and not rule.should_stop(five, 0.2)
    # An objective given overrides the default: 5 of 300 meet 98%.
    lax = TokenStepRule(slo=parse_token_slo("ttft_p90<100ms,avail>=98%"), min_step_s=3.0)
    assert lax.verdict(five)[0] == "pass"


def test_tgi_generate_stream_shape_reads_text_end_and_total() -> None:
    # TGI's own /generate_stream: a token object per event; the last carries generated_text
    # and details.generated_tokens (the total, read as final usage); a special token no text.
    evs = [parse_event(b'{"token":{"id":5,"text":"Hel","logprob":-0.1,"special":false},'
                       b'"generated_text":null,"details":null}'),
           parse_event(b'{"token":{"id":6,"text":"lo","logprob":-0.2,"special":false},'
                       b'"generated_text":null,"details":null}'),
           parse_event(b'{"token":{"id":2,"text":"</s>","logprob":0.0,"special":true},'
                       b'"generated_text":"Hello","details":{"finish_reason":"eos_token",'
                       b'"generated_tokens":3}}')]
    assert [e.text for e in evs if e] == ["Hel", "lo", ""]
    assert evs[2] is not None and evs[2].finished and evs[2].completion_tokens == 3
    tokens, source, _ = tokens_per_event([e for e in evs if e is not None])
    assert source == "usage-final" and sum(tokens) == 3


def test_llama_cpp_shapes_read_content_stop_and_timings() -> None:
    # llama.cpp's own /completion: content, stop, and the totals at the end.
    last = parse_event(b'{"content":"","stop":true,"tokens_predicted":4,'
                       b'"tokens_evaluated":9}')
    assert last is not None and last.finished
    assert (last.completion_tokens, last.prompt_tokens) == (4, 9)
    mid = parse_event(b'{"content":" hi","stop":false}')
    assert mid is not None and (mid.text, mid.finished) == (" hi", False)
    # Its OpenAI-compatible stream: a last chunk with timings and no usage.
    fin = parse_event(b'{"choices":[{"delta":{},"finish_reason":"stop","index":0}],'
                      b'"timings":{"prompt_n":11,"predicted_n":6}}')
    assert fin is not None and fin.finished
    assert (fin.completion_tokens, fin.prompt_tokens) == (6, 11)


def test_vllm_reasoning_content_counts_as_generated_text() -> None:
    e = parse_event(b'{"choices":[{"delta":{"reasoning_content":"think"},"index":0}]}')
    assert e is not None and (e.text, e.text_chars) == ("think", 5)
