"""A response cache (LRU with a TTL) and request coalescing, both keyed by model, version and the
input tensors (`input_key`: their bytes themselves when small, else a SHA-256 digest).

The cache saves the forward pass for repeated inputs, at the cost of memory (max_entries
responses) and staleness bounded by the TTL. Coalescing makes identical requests that arrive
while the first is still computing wait for that one result instead of each taking queue space.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np

from scalelab.layers.web.ttl_cache import TtlLru
from scalelab.system.serve.tensors import bytes_blob

V = TypeVar("V")
Key = tuple[str, int, Hashable]
__all__ = ["SMALL_KEY_BYTES", "Coalescer", "Lead", "TtlLru", "digest", "input_key"]

SMALL_KEY_BYTES = 1024
"""Inputs up to this many bytes in all are keyed by their bytes (exact, and ~3x cheaper than
hashing them: a 1-row flights request is 88 bytes); larger ones by their digest, so a cache
entry's key stays small."""


def input_key(arrays: Sequence[np.ndarray]) -> Hashable:
    """A key equal for equal tensor lists (dtype, shape and values) and different otherwise:
    the tensors' (dtype, shape, bytes) when they are small, else `digest` (SHA-256)."""
    size = 0
    for a in arrays:
        if a.dtype.hasobject:  # BYTES: an object array's own bytes are pointers, not values
            return digest(arrays)
        size += a.nbytes
    if size > SMALL_KEY_BYTES:
        return digest(arrays)
    return tuple([(a.dtype, a.shape, a.tobytes()) for a in arrays])  # dtypes hash by value


def digest(arrays: Sequence[np.ndarray]) -> str:
    """SHA-256 over each tensor's dtype, shape and bytes (so [1,2] and [[1],[2]] differ)."""
    h = hashlib.sha256()
    for a in arrays:
        c = np.ascontiguousarray(a)
        h.update(f"{c.dtype.str}|{c.shape}|".encode())
        h.update(bytes_blob(c) if c.dtype.hasobject else c.tobytes())
    return h.hexdigest()


class Lead(Generic[V]):
    """A leader's registration for one key: the future its followers share, made only when
    the first follower joins (most requests have none, and then cost no future at all)."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[V] | None = None


class Coalescer(Generic[V]):
    """Identical concurrent computations share one result (the first caller computes)."""

    def __init__(self) -> None:
        self._inflight: dict[Key, Lead[V]] = {}

    def claim(self, key: Key) -> tuple[Lead[V] | None, asyncio.Future[V] | None]:
        """`join` and `lead` in one dict operation (the key's hash, a tuple of the tensors'
        bytes, is computed once, not twice): (lead, None) when the caller computes `key` and
        must `resolve` or `fail` it, else (None, the in-flight result to await)."""
        mine: Lead[V] = Lead()
        lead = self._inflight.setdefault(key, mine)
        if lead is mine:
            return mine, None
        if lead.future is None:
            lead.future = asyncio.get_running_loop().create_future()
        return None, lead.future

    def join(self, key: Key) -> asyncio.Future[V] | None:
        """The in-flight result for `key` to await, or None if the caller must compute it."""
        lead = self._inflight.get(key)
        if lead is None:
            return None
        if lead.future is None:
            lead.future = asyncio.get_running_loop().create_future()
        return lead.future

    def lead(self, key: Key) -> Lead[V]:
        """Register the caller as computing `key`; it must then `resolve` or `fail`."""
        lead: Lead[V] = Lead()
        self._inflight[key] = lead
        return lead

    def _drop(self, key: Key, lead: Lead[V]) -> asyncio.Future[V] | None:
        held = self._inflight.pop(key, None)
        if held is not None and held is not lead:  # another leader's since: keep it
            self._inflight[key] = held
        fut = lead.future
        return None if fut is None or fut.done() else fut

    def resolve(self, key: Key, lead: Lead[V], value: V) -> None:
        """The leader's result: every follower gets it."""
        fut = self._drop(key, lead)
        if fut is not None:
            fut.set_result(value)

    def fail(self, key: Key, lead: Lead[V], error: Exception | None) -> None:
        """The leader failed with `error` (followers get it too), or went away (None: their
        wait is cancelled and each computes for itself)."""
        fut = self._drop(key, lead)
        if fut is None:
            return
        if error is None:
            fut.cancel()
        else:
            fut.set_exception(error)
            fut.exception()  # mark retrieved: followers may all have gone away
