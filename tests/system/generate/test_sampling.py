"""OpenAI's logit adjustments on one row, with exact numbers."""

from __future__ import annotations

import pytest
import torch

from scalelab.lab.core.errors import BadInputError
from scalelab.system.generate.sampling import adjust_logits, token_logprobs
from scalelab.system.generate.sequence import SamplingParams


def test_bias_and_penalties_are_openais_formula() -> None:
    row = torch.zeros(6)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias={4: -100.0,
                                                                                 5: 3.0})
    out = adjust_logits(row, p, [1, 1, 1, 2])
    # token 1 seen 3 times: -(3 * 0.25 + 0.5); token 2 once: -(0.25 + 0.5)
    assert out.tolist() == [0.0, -1.25, -0.75, 0.0, -100.0, 3.0]
    assert row.tolist() == [0.0] * 6  # the raw row is untouched (logprobs read it)
    assert adjust_logits(row, SamplingParams(frequency_penalty=1.0), []).tolist() == [0.0] * 6


def test_logprobs_of_chosen_tokens_and_their_top_k() -> None:
    rows = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))
    a, b = token_logprobs(rows, [1, 2], 2)
    assert a.token_id == 1 and a.logprob == pytest.approx(float(torch.log(torch.tensor(0.25))))
    assert [i for i, _ in a.top] == [0, 1] or [i for i, _ in a.top] == [0, 2]
    assert [i for i, _ in b.top] == [2, 1] and b.top[0][1] == pytest.approx(b.logprob)
    assert token_logprobs(rows, [0], 0)[0].top == ()


def test_out_of_range_settings_are_bad_input() -> None:
    with pytest.raises(BadInputError, match="penalty"):
        SamplingParams(presence_penalty=3.0)
    with pytest.raises(BadInputError, match="logit_bias"):
        SamplingParams(logit_bias={1: 200.0})
    with pytest.raises(BadInputError, match="logprobs"):
        SamplingParams(logprobs=21)
