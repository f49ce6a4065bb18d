"""Conformance: every endpoint of `scalelab generate serve` driven by the official `openai`
client (and httpx for vLLM's /tokenize, /detokenize, /version), against a real server on
127.0.0.1 with the tiny model and an API key. Checks the shapes OpenAI's clients parse, usage
sent once, logprobs equal to an independent forward pass, every unsupported field refused with
its name, and Bearer authentication."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

import scalelab
from llmkit import generate_server
from requires import requires
from scalelab.lab.load.llm.tokens import parse_event, tokens_per_event
from scalelab.layers.web.spawn import Spawned
from scalelab.system.generate.models import load_model

openai = requires("openai")

MODEL = "tiny-llama"
KEY = "sk-conformance-test"
MAX_MODEL_LEN = 512
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    log = tmp_path_factory.mktemp("conf") / "server.log"
    # the fp32 weights the plain reference forward uses (the CLI default is q4)
    with generate_server(log, "--weights", "fp32", "--max-num-seqs", "4", "--max-model-len",
                         str(MAX_MODEL_LEN), "--kv-cache-bytes", "4MiB", "--block-size", "8",
                         "--request-timeout", "60", "--api-key", KEY,
                         unset=["SCALELAB_API_KEY"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: Spawned) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def post(server: Spawned, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30)


def reference_logprobs(prompt: list[int], output: list[int]) -> list[float]:
    """log P(output[i] | prompt + output[:i]) by one plain forward of the same seeded model."""
    model = load_model("tiny", MAX_MODEL_LEN).model
    ids = torch.tensor([prompt + output])
    with torch.inference_mode():
        lp = torch.log_softmax(model(ids)[0].float(), -1)
    n = len(prompt)
    return [float(lp[n - 1 + i, t]) for i, t in enumerate(output)]


def test_models_list_and_retrieve(client: Any) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    card = client.models.retrieve(MODEL)
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "scalelab")
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.code == "model_not_found"


def test_tokenize_detokenize_version(server: Spawned) -> None:
    r = post(server, "/tokenize", {"model": MODEL, "prompt": "hello",
                                   "return_token_strs": True}).json()
    assert r == {"count": 5, "max_model_len": MAX_MODEL_LEN, "tokens": list(b"hello"),
                 "token_strs": list("hello")}
    assert post(server, "/detokenize", {"tokens": list(b"hello")}).json() == {"prompt": "hello"}
    chat = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == [257, *b"user\nhi", 258, *b"\n", 257, *b"assistant\n"]
    assert httpx.get(server.url + "/version", timeout=10).json() == {
        "version": scalelab.__version__}
    bad = post(server, "/detokenize", {"tokens": [5, 99999]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert post(server, "/tokenize", {"model": "x", "prompt": "a"}).status_code == 404
    assert post(server, "/tokenize", {"prompt": "a", "messages": []}).status_code == 400


def test_completions_whole_with_logprobs_match_a_plain_forward(client: Any) -> None:
    # The legacy top_logprobs is a dict by token text, so tokens that decode alike (bytes of no
    # whole UTF-8 character all read "\ufffd") share one key, as in vLLM: this prompt's top 3
    # on the tiny model decode apart at each of the 6 steps.
    r = client.completions.create(model=MODEL, prompt="abc", max_tokens=6, temperature=0,
                                  logprobs=3, extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert (r.object, c.finish_reason, r.usage.prompt_tokens, r.usage.completion_tokens) == (
        "text_completion", "length", 3, 6)
    assert r.usage.total_tokens == 3 + 6  # OpenAI's usage: prompt + completion
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert all(len(t) == 3 for t in lp.top_logprobs)
    # greedy: the chosen token is the most likely one
    assert lp.token_logprobs == [max(t.values()) for t in lp.top_logprobs]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0,
        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 5 == chat.usage.completion_tokens
    assert all(e.token == e.top_logprobs[0].token and e.logprob == e.top_logprobs[0].logprob
               for e in content)
    out = [e.bytes[0] for e in content]  # byte tokenizer: a token's id is its byte
    prompt = [257, *b"user\nhi", 258, *b"\n", 257, *b"assistant\n"]
    assert chat.usage.prompt_tokens == len(prompt)
    assert chat.usage.total_tokens == len(prompt) + 5
    ref = reference_logprobs(prompt, out)
    assert [e.logprob for e in content] == pytest.approx(ref, abs=1e-3)
    plain = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0,
        extra_body={"ignore_eos": True})
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == chat.choices[0].message.content


def test_logit_bias_and_penalties_steer_the_choice(client: Any) -> None:
    z = ord("z")
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 6, "temperature": 0, "logprobs": True,
                            "top_logprobs": 20, "extra_body": {
                                "ignore_eos": True, "return_tokens_as_token_ids": True}}
    forced = client.chat.completions.create(**body, logit_bias={str(z): 100})
    assert forced.choices[0].message.content == "zzzzzz"
    bias, freq, pres = 5.0, 2.0, 2.0
    r = client.chat.completions.create(**body, logit_bias={str(z): bias},
                                       frequency_penalty=freq, presence_penalty=pres)
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content != "zzzzzz"  # the penalties broke the repetition
    seen: list[int] = []
    for e in content:
        # logprobs are the raw model's (as vLLM's); greedy picked the best adjusted score
        def score(tok: int, lp: float) -> float:
            c = seen.count(tok)
            return lp + (bias if tok == z else 0.0) - freq * c - (pres if c else 0.0)

        def tid(token: str) -> int:
            return int(token.removeprefix("token_id:"))

        chosen = score(tid(e.token), e.logprob)
        assert all(chosen >= score(tid(t.token), t.logprob) - 1e-5 for t in e.top_logprobs)
        seen.append(tid(e.token))


def test_stream_usage_comes_once_and_only_when_asked(client: Any, server: Spawned) -> None:
    body = {"model": MODEL, "prompt": "stream me", "max_tokens": 9, "temperature": 0,
            "extra_body": {"ignore_eos": True}}
    plain = list(client.completions.create(stream=True, **body))
    assert all(ch.usage is None for ch in plain)
    with_usage = list(client.completions.create(
        stream=True, stream_options={"include_usage": True}, **body))
    used = [ch for ch in with_usage if ch.usage is not None]
    assert len(used) == 1 and used[0] is with_usage[-1] and used[0].choices == []
    assert used[0].usage.completion_tokens == 9 and used[0].usage.prompt_tokens == 9
    text = "".join(ch.choices[0].text for ch in with_usage if ch.choices)
    whole = client.completions.create(**body)
    assert text == whole.choices[0].text
    # vLLM's continuous_usage_stats, read by scalelab's own load tester: exact tokens per event
    with httpx.stream("POST", server.url + "/v1/completions", headers=AUTH, timeout=30, json={
            "model": MODEL, "prompt": "stream me", "max_tokens": 9, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as r:
        datas = [ln[6:].encode() for ln in r.iter_lines() if ln.startswith("data: ")]
    events = [e for e in map(parse_event, datas) if e is not None]
    assert all(e.completion_tokens is not None for e in events)
    counts, source, prompt = tokens_per_event(events)
    assert (source, sum(counts), prompt) == ("usage-continuous", 9, 9)
    chat = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
        stream=True, stream_options={"include_usage": True}, logprobs=True,
        extra_body={"ignore_eos": True}))
    assert chat[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chat if ch.choices][-1] == "length"
    assert sum(len(ch.choices[0].logprobs.content) for ch in chat
               if ch.choices and ch.choices[0].logprobs) == 4
    assert chat[-1].choices == [] and chat[-1].usage.completion_tokens == 4


def test_n_choices_whole_and_streamed(client: Any, server: Spawned) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": "once", "max_tokens": 5,
                            "temperature": 1.0, "seed": 7, "n": 3,
                            "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**body)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (4, 15)
    texts = [c.text for c in whole.choices]
    assert len(set(texts)) > 1  # seeds 7, 8, 9: different samples
    # choice i is the single request with seed 7 + i
    alone = client.completions.create(**{**body, "n": 1, "seed": 8})
    assert alone.choices[0].text == texts[1]
    chunks = list(client.completions.create(**body, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = ["".join(ch.choices[0].text for ch in chunks
                        if ch.choices and ch.choices[0].index == i) for i in range(3)]
    assert streamed == texts
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert reasons.count("length") == 3
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 15
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0,
        n=2, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy
    pool = httpx.get(server.url + "/v1/debug/pool", headers=AUTH, timeout=10).json()
    assert pool["outstanding"] == 0


def test_echo_prepends_the_prompt(client: Any) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": "echo me", "max_tokens": 4,
                            "temperature": 0, "extra_body": {"ignore_eos": True}}
    plain = client.completions.create(**body).choices[0].text
    echoed = client.completions.create(**body, echo=True)
    assert echoed.choices[0].text == "echo me" + plain
    assert echoed.usage.completion_tokens == 4
    chunks = list(client.completions.create(**body, echo=True, stream=True))
    assert chunks[0].choices[0].text == "echo me"
    assert "".join(ch.choices[0].text for ch in chunks) == "echo me" + plain
    ids = client.completions.create(**{**body, "prompt": list(b"echo me")}, echo=True)
    assert ids.choices[0].text == "echo me" + plain  # token ids echo as their text


def test_null_fields_mean_their_defaults(server: Spawned) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "n": None, "temperature": None, "top_p": None, "presence_penalty": None,
        "logprobs": None, "stream": None, "tools": None, "stop": None, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1 and r.json()["usage"]["completion_tokens"] == 2
    missing = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=30,
                         json={"model": None, "prompt": "x"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"


def test_content_parts_and_every_role(client: Any) -> None:
    def ask(messages: list[dict[str, Any]]) -> Any:
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4,
                                              temperature=0, extra_body={"ignore_eos": True})

    as_text = ask([{"role": "system", "content": "be terse\nalways"},
                   {"role": "user", "content": "hi"}])
    as_parts = ask([{"role": "developer", "content": [{"type": "text", "text": "be terse"},
                                                      {"type": "text", "text": "always"}]},
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    tool = ask([{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "let me look"},
                {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}])
    assert tool.usage.prompt_tokens == len(
        "\x01user\nweather?\x02\n\x01assistant\nlet me look\x02\n\x01tool\nsunny\x02\n"
        "\x01assistant\n")  # one token per byte, \x01/\x02 standing for <|im_start|>/<|im_end|>


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("chat", {"presence_penalty": 2.5}, "presence_penalty"),
    ("chat", {"frequency_penalty": -3}, "frequency_penalty"),
    ("chat", {"logit_bias": {"hello": 10}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("completions", {"logit_bias": {"99999": 1}}, "logit_bias"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("chat", {"n": 17}, "n"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("chat", {"reasoning_effort": "high"}, "reasoning_effort"),
    ("chat", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("chat", {"guided_json": {}}, "guided_json"),
    ("chat", {"chat_template_kwargs": {"tools": [{"type": "function"}]}},
     "chat_template_kwargs"),
    ("chat", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "messages.0.content.1"),
    ("chat", {"messages": [{"role": "narrator", "content": "a"}]}, "messages.0.role"),
    ("completions", {"echo": True, "logprobs": 1}, "echo"),
    ("completions", {"suffix": "end"}, "suffix"),
    ("completions", {"best_of": 3}, "best_of"),
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"top_k": 5}, "top_k"),
])
def test_unsupported_fields_are_refused_by_name(client: Any, path: str, extra: dict[str, Any],
                                                param: str) -> None:
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 2}
    if path == "chat":
        messages = extra.pop("messages", [{"role": "user", "content": "hi"}])
        call = client.chat.completions.create
        base["messages"] = messages
    else:
        call = client.completions.create
        base["prompt"] = "hi"
    with pytest.raises(openai.BadRequestError) as e:
        call(**base, extra_body=extra)
    assert e.value.param == param, e.value.body
    assert e.value.type == "invalid_request_error"
    assert param.split(".")[0] in e.value.message


def test_api_key_is_required_on_v1_only(server: Spawned) -> None:
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL, prompt="x", max_tokens=1)
    r = httpx.get(server.url + "/v1/models", timeout=10)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    for open_path in ("/health", "/metrics", "/version"):
        assert httpx.get(server.url + open_path, timeout=10).status_code == 200, open_path
    pool = httpx.get(server.url + "/v1/debug/pool", headers=AUTH, timeout=10).json()
    assert pool["whole"] and pool["outstanding"] == 0
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert "vllm:request_prefill_time_seconds_count" in metrics
    assert "scalelab_kv_cache_blocks" in metrics and "vllm:kv_cache_blocks" not in metrics
