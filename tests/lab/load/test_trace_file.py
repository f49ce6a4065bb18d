"""The request trace file read by `load --replay` and `autoscale simulate --trace`."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.load.trace_file import read_trace


def test_ours_burstgpt_and_azure_headers(tmp_path: Path) -> None:
    ours = tmp_path / "ours.csv"
    ours.write_text("timestamp,input_tokens,output_tokens\n5,10,1\n2,20,2\n")
    t = read_trace(ours)
    assert t.times_s.tolist() == [0.0, 3.0]
    assert t.input_tokens is not None and t.input_tokens.tolist() == [20, 10]
    assert t.output_tokens is not None and t.output_tokens.tolist() == [2, 1]
    burst = tmp_path / "burst.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,0,1087,API log\n")
    b = read_trace(burst)
    assert b.times_s.tolist() == [0.0, 40.0] and b.input_tokens is not None
    assert b.input_tokens.tolist() == [472, 1087]
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    a = read_trace(azure)
    assert a.times_s[1] == pytest.approx(4.314579, abs=1e-6)
    assert a.output_tokens is not None and a.output_tokens.tolist() == [44, 109]


def test_bad_rows_name_their_line(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("timestamp,input_tokens\n1,2\nyesterday,3\n")
    with pytest.raises(BadInputError, match=r"t.csv:3: 'yesterday'"):
        read_trace(f)
    f.write_text("time,rate\n0,1\n")
    with pytest.raises(BadInputError, match="timestamp column"):
        read_trace(f)
