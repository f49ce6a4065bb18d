"""Teacher-forced quality (generate.quality): the windows every side reads, next-token agreement,
and how `evaluate` compares a setting with fp32 and with llama.cpp's predictions."""

from __future__ import annotations

import dataclasses

import pytest

from scalelab.system.generate.llamacpp import LlamaCppReference
from scalelab.system.generate.models import load_model
from scalelab.system.generate.quality import (
    NEAR_TIE,
    evaluate,
    heldout,
    reference,
    score_text,
    token_agreement,
    windows,
)


def test_windows_cut_the_ids_as_the_perplexity_reads_them() -> None:
    # Each window: `window` inputs and the next id (the last input's target); the final one
    # shorter; a lone last id predicts nothing and is left out.
    assert windows(list(range(10)), 4) == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9]]
    assert windows(list(range(9)), 4) == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]]


def test_token_agreement_is_the_share_of_equal_positions() -> None:
    assert token_agreement([1, 2, 3, 4], [1, 9, 3, 9]) == 0.5
    # no drift: a difference at one position does not count against the next
    assert token_agreement([5, 6, 7, 8], [9, 6, 7, 8]) == 0.75
    with pytest.raises(ValueError, match="3 and 2 positions"):
        token_agreement([1, 2, 3], [1, 2])


def test_evaluate_compares_a_setting_with_llamacpps_predictions_position_by_position() -> None:
    ref = reference("tiny", num_tokens=4, seed=1)
    plain = evaluate("tiny", "q4", num_tokens=4, seed=1, ref=ref)
    assert plain.positions == len(ref.score.argmax) > 100
    assert plain.llamacpp_agreement is None and plain.llamacpp_near_ties is None
    assert evaluate("tiny", "fp32", num_tokens=4, seed=1, ref=ref).next_token_agreement == 1.0

    # A llama.cpp that predicts q4's own tokens but at 10 positions, 3 of them near ties.
    q4 = load_model("tiny", 512, seed=1, weights="q4")
    mine = score_text(q4.model, q4.tokenizer, heldout()["text"]).argmax
    n = len(mine)
    theirs = [t + 1 if i < 10 else t for i, t in enumerate(mine)]
    margin = [NEAR_TIE / 2 if i < 3 or i >= n - 3 else 1.0 for i in range(n)]
    lc = LlamaCppReference(source="test", version="0", argmax=theirs, margin=margin,
                           perplexity=1.0)
    q = evaluate("tiny", "q4", num_tokens=4, seed=1, ref=dataclasses.replace(ref, llamacpp=lc))
    assert q.llamacpp_agreement == (n - 10) / n
    # near ties are counted among the differences only (the last 3 positions agree)
    assert q.llamacpp_near_ties == 3
    assert q.next_token_agreement == token_agreement(mine, ref.score.argmax)
