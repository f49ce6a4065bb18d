"""The paged KV cache's bookkeeping: fixed-size blocks from one pool, per-sequence block tables,
reference counts, and a prefix cache keyed by chained block hashes (vLLM's design).

A full block's key is hash(parent block's key, its tokens), so equal keys mean equal prefixes up
to and including that block. A block whose last user finishes keeps its key and goes to the tail
of the free queue; it is reused as-is on a hit, or evicted (key dropped) when the pool hands out
the least recently freed block. No tensors here: the runner owns the memory these ids index.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from scalelab.lab.core.errors import BadUsageError
from scalelab.system.generate.sequence import Sequence


def block_key(parent: int | None, tokens: tuple[int, ...]) -> int:
    """Chained key of a full block (Python's int-tuple hash is stable across processes)."""
    return hash((parent, tokens))


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    key: int | None = None
    tokens: tuple[int, ...] = ()


@dataclass
class PrefixStats:
    queries: int = 0
    """Full prompt blocks looked up."""
    hits: int = 0
    """Of those, found in the cache."""
    evictions: int = 0
    query_tokens: int = 0
    """Prompt tokens of the sequences looked up (vLLM's `prefix_cache_queries` unit)."""
    hit_tokens: int = 0
    """Of those, tokens found cached (whole blocks; vLLM's `prefix_cache_hits`)."""

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class BlockManager:
    """Hands out blocks of `block_size` token slots from a pool of `num_blocks`."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise BadUsageError(
                f"the KV pool needs >= 1 block of >= 1 token (got {num_blocks} x {block_size}); "
                "raise the KV cache budget"
            )
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Insertion order is the LRU order: the head is evicted first.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}
        self.stats = PrefixStats()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return len(self.blocks) - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def is_whole(self) -> bool:
        """Every block free and unreferenced (what a drained engine must look like)."""
        return len(self.free) == len(self.blocks) and all(b.ref_count == 0 for b in self.blocks)

    def problems(self) -> list[str]:
        """Broken invariants of the pool and its prefix cache (empty when consistent): a free
        block with references, a referenced block missing from both, a cache entry pointing
        at a block keyed otherwise. A fault test asserts this is empty after every failure."""
        out: list[str] = []
        free = set(self.free)
        if len(free) != len(self.free) or not free <= set(range(len(self.blocks))):
            out.append("the free queue holds duplicate or unknown block ids")
        for b in self.blocks:
            if b.ref_count < 0:
                out.append(f"block {b.block_id} has ref_count {b.ref_count}")
            elif (b.ref_count == 0) != (b.block_id in free):
                out.append(f"block {b.block_id}: ref_count {b.ref_count}, "
                           f"{'in' if b.block_id in free else 'not in'} the free queue")
            if (b.key is None) != (not b.tokens):
                out.append(f"block {b.block_id}: key and tokens disagree")
        for key, block_id in self.cached.items():
            if self.blocks[block_id].key != key:
                out.append(f"prefix cache entry {key} -> block {block_id} keyed otherwise")
        return out

    def _take_free(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.key is not None:
            if self.cached.get(block.key) == block_id:
                del self.cached[block.key]
                self.stats.evictions += 1
            block.key, block.tokens = None, ()
        block.ref_count = 1
        return block_id

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks matching the sequence's leading full blocks (never its last token:
        that one must be computed to get the logits for the next token)."""
        if not self.prefix_caching:
            return []
        hits: list[int] = []
        parent: int | None = None
        full = (len(seq.token_ids) - 1) // self.block_size
        for i in range(full):
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            key = block_key(parent, tokens)
            block_id = self.cached.get(key)
            if block_id is None or self.blocks[block_id].tokens != tokens:
                break
            hits.append(block_id)
            parent = key
        return hits

    def allocate(self, seq: Sequence) -> bool:
        """Blocks for every token of a waiting sequence, reusing cached prefix blocks.

        Returns False (and changes nothing) when the pool cannot hold it now.
        """
        assert not seq.block_table, "allocate() is for sequences holding no blocks"
        hits = self._prefix_hits(seq)
        need = self.blocks_for(len(seq.token_ids))
        # A hit on a free (cached, unreferenced) block still takes it out of the free queue.
        from_free = need - sum(1 for b in hits if self.blocks[b].ref_count > 0)
        if from_free > len(self.free):
            return False
        if self.prefix_caching:
            self.stats.queries += (len(seq.token_ids) - 1) // self.block_size
            self.stats.hits += len(hits)
            self.stats.query_tokens += len(seq.token_ids)
            self.stats.hit_tokens += len(hits) * self.block_size
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        seq.block_table.extend(self._take_free() for _ in range(need - len(hits)))
        seq.num_computed = len(hits) * self.block_size
        seq.num_hashed_blocks = len(hits)
        seq.cached_prompt_tokens = seq.num_computed
        return True

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Enough blocks for `num_tokens` slots; False (nothing taken) if the pool is short."""
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need <= 0:
            return True
        if need > len(self.free):
            return False
        seq.block_table.extend(self._take_free() for _ in range(need))
        return True

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - len(seq.block_table) <= len(self.free)

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's references; unreferenced blocks join the free queue's tail.

        Freed back to front so that a sequence's tail blocks, the least likely to be shared,
        are evicted before its head blocks.
        """
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0
            if block.ref_count == 0:
                self.free[block_id] = None
        seq.block_table = []
        seq.num_computed = 0
        seq.num_hashed_blocks = 0

    def register_full_blocks(self, seq: Sequence) -> None:
        """Key every block whose tokens are all computed, so later prompts can reuse it."""
        if not self.prefix_caching:
            return
        full = seq.num_computed // self.block_size
        if full <= seq.num_hashed_blocks:
            return
        i = seq.num_hashed_blocks
        parent = self.blocks[seq.block_table[i - 1]].key if i > 0 else None
        for i in range(seq.num_hashed_blocks, full):
            block = self.blocks[seq.block_table[i]]
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            key = block_key(parent, tokens)
            if block.key is None:
                block.key, block.tokens = key, tokens
                # An equal block computed concurrently by another sequence keeps the entry.
                self.cached.setdefault(key, block.block_id)
            parent = block.key
        seq.num_hashed_blocks = full
