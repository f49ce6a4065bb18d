"""Retrieval quality as pure functions: recall against exact search, hits against ground truth.

Recall@k follows ann-benchmarks: a returned neighbour counts when its true similarity is at
least the k-th best true similarity (minus a small epsilon), so ties at the k-th place are not
held against an index that picked another of the tied vectors. True similarities are recomputed
from the vectors, never taken from the index (a PQ index reports approximate scores).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EPS = 1e-5
"""Similarity slack for ties (float32 dot products of unit vectors agree to ~1e-6)."""


def true_scores(vectors: np.ndarray, queries: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """[m, k] exact inner products of each query with the vectors its row of `ids` names
    (-inf where an index returned -1, i.e. fewer than k results)."""
    safe = np.where(ids < 0, 0, ids)
    s = np.einsum("md,mkd->mk", queries, vectors[safe])
    return np.where(ids < 0, -np.inf, s).astype(np.float32)


def recall_at_k(exact_kth: np.ndarray, found_true: np.ndarray, k: int) -> float:
    """Mean over queries of |{returned j : true_sim(j) >= kth exact sim - EPS}| / k.

    `exact_kth` [m]: the k-th best exact similarity per query; `found_true` [m, <=k]: the true
    similarities of what the index returned."""
    if found_true.shape[0] == 0:
        return 0.0
    hits = (found_true[:, :k] >= exact_kth[:, None] - EPS).sum(axis=1)
    return float(np.mean(np.minimum(hits, k) / k))


def hit_rate(ids: np.ndarray, truth: Sequence[int], k: int) -> float:
    """Share of queries whose ground-truth document is among the first k ids."""
    t = np.asarray(truth, dtype=np.int64)
    if t.size == 0:
        return 0.0
    return float(np.mean((ids[:, :k] == t[:, None]).any(axis=1)))


def answer_accuracy(top_texts: Sequence[str], answers: Sequence[str]) -> float:
    """Share of questions whose top retrieved document contains the answer's words (what an
    extractive reader given that one document could answer)."""
    if not answers:
        return 0.0
    ok = sum(1 for t, a in zip(top_texts, answers, strict=True) if a.lower() in t.lower())
    return ok / len(answers)


def mrr(ids: np.ndarray, truth: Sequence[int], k: int) -> float:
    """Mean reciprocal rank of the ground-truth document within the first k (0 if absent)."""
    t = np.asarray(truth, dtype=np.int64)
    if t.size == 0:
        return 0.0
    match = ids[:, :k] == t[:, None]
    ranks = np.where(match.any(axis=1), match.argmax(axis=1) + 1, 0)
    return float(np.mean(np.where(ranks > 0, 1.0 / np.maximum(ranks, 1), 0.0)))
