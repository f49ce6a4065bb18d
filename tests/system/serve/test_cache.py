"""The coalescer and the input keys (the TTL LRU: tests/layers/web/test_ttl_cache.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from scalelab.system.serve.cache import SMALL_KEY_BYTES, Coalescer, digest, input_key


def test_digest_sees_dtype_and_shape() -> None:
    a = np.arange(4, dtype=np.int64)
    assert digest([a]) == digest([a.copy()])
    assert digest([a]) != digest([a.reshape(2, 2)])
    assert digest([a]) != digest([a.astype(np.int32)])


def test_input_key_is_exact_for_small_inputs_and_a_digest_for_large_ones() -> None:
    a = np.arange(4, dtype=np.int64)
    f = np.linspace(0, 1, 14, dtype=np.float32)
    assert input_key([a, f]) == input_key([a.copy(), f.copy()])
    assert hash(input_key([a, f])) == hash(input_key([a.copy(), f.copy()]))
    for other in ([a.reshape(2, 2), f], [a.astype(np.int32), f], [a, f[::-1].copy()], [f, a],
                  [a]):
        assert input_key(other) != input_key([a, f])
    # the same bytes under another dtype or shape are another key
    assert input_key([a.view(np.float64)]) != input_key([a])
    assert input_key([a[::2]]) == input_key([a[::2].copy()])  # strided views by their values
    big = np.zeros(SMALL_KEY_BYTES // 8 + 1, dtype=np.int64)
    assert input_key([big]) == digest([big]) and input_key([big[:-1]]) != digest([big[:-1]])


def test_coalescer_shares_one_result() -> None:
    async def go() -> None:
        co: Coalescer[int] = Coalescer()
        key = ("m", 1, "k")
        assert co.join(key) is None
        lead = co.lead(key)
        assert lead.future is None  # no follower yet: no future made
        follower = co.join(key)
        assert follower is not None and co.join(key) is follower
        co.resolve(key, lead, 5)
        assert await follower == 5 and co.join(key) is None
        # a leader nobody followed leaves nothing behind
        alone = co.lead(key)
        co.resolve(key, alone, 6)
        assert alone.future is None and co.join(key) is None

    asyncio.run(go())


def test_coalescer_failure_and_departure() -> None:
    async def go() -> None:
        co: Coalescer[int] = Coalescer()
        key = ("m", 1, "k")
        lead = co.lead(key)
        follower = co.join(key)
        assert follower is not None
        co.fail(key, lead, ValueError("boom"))
        with pytest.raises(ValueError, match="boom"):
            await follower
        lead = co.lead(key)
        follower = co.join(key)
        assert follower is not None
        co.fail(key, lead, None)  # the leader's client went away
        assert follower.cancelled() and co.join(key) is None
        # a stale leader finishing after a new one registered leaves the new one in place
        old = co.lead(key)
        new = co.lead(key)
        co.resolve(key, old, 1)
        waiting = co.join(key)
        assert waiting is not None and new.future is waiting
        co.resolve(key, new, 2)
        assert await waiting == 2

    asyncio.run(go())


def test_claim_makes_the_first_caller_leader_and_the_rest_followers() -> None:
    async def go() -> None:
        co: Coalescer[int] = Coalescer()
        key = ("m", 1, "k")
        lead, none = co.claim(key)
        assert lead is not None and none is None and lead.future is None
        again, follower = co.claim(key)
        assert again is None and follower is not None and lead.future is follower
        assert co.claim(key) == (None, follower)  # one future for every follower
        co.resolve(key, lead, 7)
        assert await follower == 7
        nxt, none = co.claim(key)  # resolved: the next caller leads again
        assert nxt is not None and nxt is not lead and none is None

    asyncio.run(go())
