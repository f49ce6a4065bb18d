"""The block manager: reference counts, chained prefix keys, LRU eviction (exact counts)."""

from __future__ import annotations

import pytest

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.generate.blocks import BlockManager, block_key
from scalelab.system.generate.sequence import SamplingParams, Sequence

P = SamplingParams(max_tokens=4)


def seq(tokens: list[int]) -> Sequence:
    return Sequence(tokens, P)


def test_allocate_release_returns_every_block() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    s = seq(list(range(10)))  # 10 tokens -> 3 blocks
    assert bm.allocate(s)
    assert len(s.block_table) == 3 and bm.num_used == 3 and bm.num_free == 5
    assert bm.grow(s, 13) and len(s.block_table) == 4
    bm.release(s)
    assert bm.is_whole() and s.block_table == []


def test_allocate_refuses_without_side_effects_when_short() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    s = seq(list(range(9)))  # needs 3
    assert not bm.allocate(s)
    assert bm.is_whole() and s.block_table == []


def test_prefix_hit_shares_blocks_and_skips_their_tokens() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(list(range(10)))
    assert bm.allocate(a)
    a.num_computed = 10
    bm.register_full_blocks(a)  # blocks 0 and 1 are full -> keyed
    b = seq([*range(8), 99, 98, 97])
    assert bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.num_computed == 8 and b.cached_prompt_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert bm.stats.queries == 2 + 2 and bm.stats.hits == 2
    # Keys chain: the second block's key depends on the first block's.
    k0 = block_key(None, (0, 1, 2, 3))
    assert bm.blocks[a.block_table[1]].key == block_key(k0, (4, 5, 6, 7))
    bm.release(a)
    bm.release(b)
    assert bm.is_whole()


def test_last_token_is_never_a_hit() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(list(range(8)))
    assert bm.allocate(a)
    a.num_computed = 8
    bm.register_full_blocks(a)
    bm.release(a)
    b = seq(list(range(8)))  # identical: block 1 holds the last token -> recomputed
    assert bm.allocate(b)
    assert b.num_computed == 4


def test_freed_cached_blocks_are_reused_then_evicted_lru() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = seq([1, 2, 3, 4, 5])  # 3 blocks
    assert bm.allocate(a)
    a.num_computed = 5
    bm.register_full_blocks(a)
    bm.release(a)  # all free again, two of them still keyed
    assert bm.num_free == 4 and len(bm.cached) == 2
    b = seq([1, 2, 9])  # hits the first block from the free queue
    assert bm.allocate(b)
    assert b.num_computed == 2 and bm.num_free == 2
    c = seq([7, 7, 7, 7, 7])  # needs 3 > 2 free: refused, nothing evicted
    assert not bm.allocate(c) and len(bm.cached) == 2
    bm.release(b)
    assert bm.allocate(c)  # takes 3 of 4 free blocks, evicting the least recently freed
    assert bm.stats.evictions >= 1
    bm.release(c)
    assert bm.is_whole()


def test_bad_pool_is_a_usage_error() -> None:
    with pytest.raises(BadUsageError, match="KV cache budget"):
        BlockManager(num_blocks=0, block_size=16)


def test_problems_names_each_broken_invariant_and_none_when_consistent() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    s = seq([1, 2, 3, 4, 5])
    assert bm.allocate(s)
    s.num_computed = 4
    bm.register_full_blocks(s)
    assert bm.problems() == [] and len(bm.cached) == 2
    bm.blocks[s.block_table[2]].ref_count = 0  # a leak: referenced by nobody, yet not free
    bm.cached[12345] = s.block_table[0]  # a cache entry pointing at a block keyed otherwise
    assert bm.problems() == [
        f"block {s.block_table[2]}: ref_count 0, not in the free queue",
        f"prefix cache entry 12345 -> block {s.block_table[0]} keyed otherwise",
    ]
