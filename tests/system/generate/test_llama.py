"""nets/llama.py against transformers' LlamaForCausalLM built from the same tensors.

The README's promise that our Llama is transformers' Llama, held in `make test` on the tiny model
(the same check on SmolLM2 itself is `slow`: tests/system/generate/test_smollm2.py). transformers is
a dev dependency, imported plainly: a missing package fails here rather than skipping.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from scalelab.lab.core.errors import BadInputError
from scalelab.layers.nets.llama import LlamaConfig, LlamaForCausalLM, build_tiny, tiny_config
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.sequence import SamplingParams
from scalelab.system.generate.tokenizer import byte_tokenizer


def hf_twin(model: LlamaForCausalLM) -> torch.nn.Module:
    """An independent implementation holding exactly our tensors."""
    c = model.cfg
    hf_cfg = transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        attention_bias=False,
        mlp_bias=False,
    )
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected
    assert set(missing) <= {"lm_head.weight"}
    return hf


def test_logits_and_greedy_tokens_match_transformers() -> None:
    model = build_tiny(seed=3)
    hf = hf_twin(model)
    ids = torch.randint(
        0, model.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1)
    )
    with torch.inference_mode():
        ours = model(ids)
        theirs = hf(input_ids=ids).logits
    assert ours.shape == (2, 24, model.cfg.vocab_size)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-4)
    # Greedy continuation, token for token.
    seq = ids[:1]
    with torch.inference_mode():
        for _ in range(12):
            a = int(model(seq)[0, -1].argmax())
            b = int(hf(input_ids=seq).logits[0, -1].argmax())
            assert a == b
            seq = torch.cat([seq, torch.tensor([[a]])], dim=1)
    # The serving path (paged KV cache, packed linears, a batch of two) continues the same
    # prompts with transformers' greedy tokens, token for token.
    eng = LlmEngine(model, byte_tokenizer(), LlmEngineConfig(kv_cache_bytes=1 << 20, block_size=4,
                                                             max_model_len=256))
    prompts = [ids[0].tolist(), ids[1, :13].tolist()]
    got = eng.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    for p, s in zip(prompts, got, strict=True):
        want, x = [], torch.tensor([p])
        with torch.inference_mode():
            for _ in range(12):
                want.append(int(hf(input_ids=x).logits[0, -1].argmax()))
                x = torch.cat([x, torch.tensor([[want[-1]]])], dim=1)
        assert s.output_ids == want
    assert eng.blocks.is_whole()


def test_training_step_reduces_loss() -> None:
    model = build_tiny(seed=0).train()
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_config_rejects_bad_head_split() -> None:
    with pytest.raises(BadInputError, match="num_kv_heads"):
        LlamaConfig(
            vocab_size=10,
            hidden_size=64,
            intermediate_size=8,
            num_layers=1,
            num_heads=4,
            num_kv_heads=3,
        )
    assert tiny_config().head_dim == 16
