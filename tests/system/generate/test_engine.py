"""The engine on the tiny model: continuous batching, paged == contiguous, preemption, prefix
caching, speculative decoding, sampling and stop rules."""

from __future__ import annotations

import pytest
import torch
from gen_helpers import MODEL, TOK, engine, greedy_reference, prompts

from scalelab.lab.core.errors import BadInputError
from scalelab.system.generate.runner import ModelRunner, SeqSlice
from scalelab.system.generate.sampling import top_p_filter
from scalelab.system.generate.sequence import SamplingParams
from scalelab.system.generate.speculative import SpecConfig, accept_greedy, propose

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def test_paged_logits_equal_a_contiguous_forward() -> None:
    runner = ModelRunner(MODEL, num_blocks=32, block_size=4)
    a = TOK.encode("the quick brown fox jumps")
    b = TOK.encode("over the lazy dog")
    with torch.inference_mode():
        full_a = MODEL(torch.tensor([a]))[0]
        full_b = MODEL(torch.tensor([b]))[0]
    # Non-contiguous, interleaved block tables; a prefill chunk of a beside a chunk of b.
    ta, tb = [5, 0, 9, 2, 7, 11, 3], [1, 8, 4, 6, 10]
    got = runner.run(
        [
            SeqSlice(tokens=a[:10], start=0, block_table=ta, logits_rows=10),
            SeqSlice(tokens=b[:3], start=0, block_table=tb, logits_rows=3),
        ]
    )
    assert torch.allclose(got[:10], full_a[:10], atol=1e-5)
    assert torch.allclose(got[10:], full_b[:3], atol=1e-5)
    # Then the rest: a one token at a time, b as one chunk, in the same steps.
    for i in range(10, len(a)):
        j = min(len(b), 3 + (i - 9) * 4)
        k = 3 + (i - 10) * 4
        slices = [SeqSlice(tokens=a[i : i + 1], start=i, block_table=ta, logits_rows=1)]
        if k < len(b):
            slices.append(SeqSlice(tokens=b[k:j], start=k, block_table=tb, logits_rows=j - k))
        got = runner.run(slices)
        assert torch.allclose(got[0], full_a[i], atol=1e-5)
        if k < len(b):
            assert torch.allclose(got[1:], full_b[k:j], atol=1e-5)


def test_continuous_batching_matches_greedy_and_batches_steps() -> None:
    e = engine(max_num_seqs=8)
    ps = prompts(6)
    seqs = e.generate(ps, GREEDY)
    for p, s in zip(ps, seqs, strict=True):
        assert s.output_ids == greedy_reference(MODEL, p, 12)
        assert s.finish_reason == "length"
    assert max(e.stats.seqs_per_step) == 6
    decode_steps = [n for n in e.stats.tokens_per_step if n < 50]
    assert decode_steps and min(decode_steps) > 1
    assert e.blocks.is_whole()


def test_late_short_request_finishes_before_early_long_one() -> None:
    e = engine(max_num_seqs=4)
    long = e.add(TOK.encode("a long story begins"), SamplingParams(max_tokens=60, ignore_eos=True))
    finished_order = []
    for _ in range(5):
        e.step()
    short = e.add(TOK.encode("hi"), SamplingParams(max_tokens=3, ignore_eos=True))
    shared_step = False
    while e.has_work():
        outs = e.step()
        if {o.seq.seq_id for o in outs} >= {long.seq_id, short.seq_id}:
            shared_step = True
        finished_order += [o.seq.seq_id for o in outs if o.finished]
    assert finished_order == [short.seq_id, long.seq_id]
    assert shared_step  # the short one was admitted while the long one kept decoding
    assert e.blocks.is_whole()


def test_preemption_under_a_tiny_pool_completes_every_request_correctly() -> None:
    # 24 blocks of 4 tokens: six 30-token sequences cannot all fit at once.
    e = engine(kv_cache_bytes=24 * 4 * MODEL_KV_PER_TOKEN, max_num_seqs=6)
    ps = prompts(6)
    seqs = e.generate(ps, SamplingParams(max_tokens=14, ignore_eos=True))
    assert e.scheduler.num_preemptions > 0
    for p, s in zip(ps, seqs, strict=True):
        assert s.output_ids == greedy_reference(MODEL, p, 14)
    assert e.blocks.is_whole()


MODEL_KV_PER_TOKEN = 2 * MODEL.cfg.num_layers * MODEL.cfg.num_kv_heads * MODEL.cfg.head_dim * 4


def test_prefix_cache_hits_skip_prefill_with_identical_outputs() -> None:
    system = TOK.encode("You are a careful assistant. Answer briefly and exactly. " * 2)
    ps = [system + TOK.encode(f"Question {i}?") for i in range(4)]
    cold = engine(prefix_caching=False)
    cold_out = [s.output_ids for s in cold.generate(ps, GREEDY)]
    warm = engine(prefix_caching=True)
    warm.generate(ps[:1], GREEDY)
    first = warm.stats.prefill_tokens
    warm_out = [s.output_ids for s in warm.generate(ps[1:], GREEDY)]
    assert warm_out == cold_out[1:]

    # Each later prompt recomputes only what follows its full blocks shared with the first.
    def shared_blocks(p: list[int]) -> int:
        n = 0
        while n < len(p) - 1 and p[n] == ps[0][n]:
            n += 1
        return n // 4

    expected = sum(len(p) - 4 * shared_blocks(p) for p in ps[1:])
    assert warm.stats.prefill_tokens - first == expected < sum(len(p) for p in ps[1:]) // 4
    assert cold.stats.prefill_tokens == sum(len(p) for p in ps)
    assert warm.blocks.stats.hits == sum(shared_blocks(p) for p in ps[1:])
    assert warm.blocks.is_whole()


def test_speculative_greedy_is_token_for_token_plain_greedy() -> None:
    ps = [TOK.encode(f"{i} def f(x): return x + {i}\ndef f(x): return") for i in range(10)]
    ps += prompts(10)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    base = engine()
    plain = [s.output_ids for s in base.generate(ps, params)]
    e = engine(speculative=True, spec=SpecConfig(num_draft=4))
    spec = [s.output_ids for s in e.generate(ps, params)]
    assert spec == plain
    assert e.stats.draft_tokens > 0 and e.stats.accepted_tokens > 0
    assert 0 < e.stats.acceptance_rate <= 1
    # accepted drafts are tokens that took no decode step of their own: fewer steps than the
    # plain engine took for the same outputs
    assert e.stats.steps < base.stats.steps
    assert e.blocks.is_whole()


def test_prompt_lookup_and_greedy_acceptance_exact() -> None:
    cfg = SpecConfig(num_draft=3, ngram_max=2, ngram_min=1)
    assert propose([1, 2, 3, 4, 1, 2], cfg) == [3, 4, 1]
    assert propose([5, 6, 7], cfg) == []
    assert propose([9, 1, 9], cfg) == [1, 9]
    assert accept_greedy([3, 4, 1], [3, 4, 2, 8]) == [3, 4, 2]
    assert accept_greedy([3, 4, 1], [3, 4, 1, 8]) == [3, 4, 1, 8]
    assert accept_greedy([3], [5, 6]) == [5]


def test_seeded_sampling_repeats_and_top_p_keeps_the_nucleus() -> None:
    p = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)
    a = engine().generate(prompts(2), p)
    b = engine().generate(prompts(2), p)
    assert [s.output_ids for s in a] == [s.output_ids for s in b]
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert top_p_filter(probs, 0.8).tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    assert top_p_filter(probs, 0.81).tolist() == pytest.approx(
        [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]
    )


def test_stop_string_cuts_output_and_frees_blocks() -> None:
    e = engine()
    p = TOK.encode("abc")
    ref = TOK.decode(greedy_reference(MODEL, p, 12))
    stop = ref[3:5]
    (s,) = e.generate([p], SamplingParams(max_tokens=12, stop=(stop,), ignore_eos=True))
    assert s.finish_reason == "stop"
    assert s.text == ref[: ref.find(stop)]
    assert e.blocks.is_whole()


def test_too_long_prompt_is_bad_input() -> None:
    e = engine(max_model_len=64)
    with pytest.raises(BadInputError, match="max_model_len is 64"):
        e.add(list(range(64)), GREEDY)
    with pytest.raises(BadInputError, match="max_tokens must be >= 1"):
        SamplingParams(max_tokens=-1)


def test_settings_from_json_build_the_spec_config() -> None:
    e = engine(speculative=True, spec={"num_draft": 2})
    assert e.cfg.spec == SpecConfig(num_draft=2)
    (s,) = e.generate([TOK.encode("abab abab abab")], GREEDY)
    assert s.output_ids == greedy_reference(MODEL, TOK.encode("abab abab abab"), 12)


def test_incremental_detokenization_equals_the_whole_decode() -> None:
    """decode_next's pieces, fed 1-3 tokens at a time (a step's accepted drafts), concatenate
    to decode(all): on text whose characters span 2-4 byte tokens, and on arbitrary bytes
    (invalid UTF-8 included); no piece but the last ends inside a character."""
    import random

    rng = random.Random(0)
    texts = ["héllo wörld", "漢字かな交じり文", "emoji 🙂🚀 and ascii", "a" * 40 + "é" * 7]
    cases = [TOK.encode(t) for t in texts]
    cases += [[rng.randrange(256) for _ in range(rng.randrange(1, 60))] for _ in range(300)]
    for ids in cases:
        whole = TOK.decode(ids)
        got, prefix, read, n = "", 0, 0, 0
        while n < len(ids):
            n = min(len(ids), n + rng.randint(1, 3))
            piece, prefix, read = TOK.decode_next(ids[:n], prefix, read, final=n == len(ids))
            if n < len(ids) and piece:
                valid = TOK.decode(ids[:read]) == got + piece
                assert valid
            got += piece
        assert got == whole, (ids, got, whole)
    for t, ids in zip(texts, cases, strict=False):  # valid text: nothing held back wrongly
        assert TOK.decode(ids) == t


def test_engine_text_is_the_decode_of_its_tokens_with_multibyte_output() -> None:
    # the tiny model emits arbitrary bytes: its texts are full of split characters
    e = engine(speculative=True, spec=SpecConfig(num_draft=3))
    seqs = e.generate(prompts(6), SamplingParams(max_tokens=40, ignore_eos=True))
    for s in seqs:
        assert s.text == TOK.decode(s.output_ids)
    assert e.blocks.is_whole()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN not in this torch")
def test_packed_weights_keep_the_plain_logits_state_dict_and_greedy_output() -> None:
    """The engine's oneDNN-blocked linears (LlmEngineConfig.packed_weights) against the plain
    nn.Linear model: the state dict is bit-identical, logits agree to fp32 rounding, greedy
    engines with and without packing give the same tokens, and packing twice is a no-op."""
    import copy

    from scalelab.layers.nets.llama import build_tiny
    from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
    from scalelab.system.generate.linears import PackedLinear
    from scalelab.system.generate.runner import pack_linears

    plain = build_tiny(seed=4)
    packed = copy.deepcopy(plain)
    assert pack_linears(packed) == 7 * plain.cfg.num_layers + 1  # q k v o gate up down, head
    assert pack_linears(packed) == 0
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())
    want, got = plain.state_dict(), packed.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, plain.cfg.vocab_size, (2, 20), generator=gen)
    with torch.inference_mode():
        ref, out = plain(ids), packed(ids)
        assert torch.allclose(out, ref, atol=1e-5, rtol=1e-4)
        assert torch.equal(copy.deepcopy(packed)(ids), out)  # a copy repacks the same weights
    cfg = {"kv_cache_bytes": 1 << 20, "block_size": 4, "max_model_len": 256}
    ps = prompts(6)
    off = LlmEngine(plain, TOK, LlmEngineConfig(**cfg, packed_weights=False))
    a = off.generate(ps, GREEDY)
    e = LlmEngine(copy.deepcopy(plain), TOK, LlmEngineConfig(**cfg))
    assert isinstance(e.model.lm_head, PackedLinear) and e.runner.packed
    b = e.generate(ps, GREEDY)
    assert [s.output_ids for s in a] == [s.output_ids for s in b]
    assert type(plain.lm_head) is torch.nn.Linear and not off.runner.packed
    # An engine asked for plain weights on a model another engine packed says what runs.
    assert LlmEngine(e.model, TOK, LlmEngineConfig(**cfg, packed_weights=False)).runner.packed
