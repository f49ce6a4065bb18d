"""How the engine's OpenMP threads wait: passively, so a busy core does not stall every product.

torch's CPU build runs its intra-op threads on GNU OpenMP (libgomp, shipped in torch/lib). Each
int4 product (`aten._weight_int4pack_mm_for_cpu`) is a parallel region; at its end a thread
that is done spins (300,000 rounds by default) waiting for the others. When another process
holds the second core, the thread due there waits for a scheduler slice while the first spins
on its own core, ~120 times a token: SmolLM2 q4 at 2 threads fell to 0.52 tokens/s at one
stream on a machine at load 9, against 21.6 with a passive wait (docs/generate-benchmark.md, "A busy
neighbour"). `torch.set_num_threads` does not change the wait; only the environment does, and
libgomp reads it once, when torch is imported. So `scalelab generate` sets it before that, in
the process that runs the engine (its workers and children inherit it).

A user's own setting of any of the variables below wins: nothing is set then.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
"""What an OpenMP runtime reads for how long a thread spins: libgomp the first two, Intel's
(KMP) the last; any one set by the user means the user chose."""

PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}


def wait_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` so the engine's threads sleep instead of spinning:
    none when the user set any of WAIT_VARS."""
    if any(k in environ for k in WAIT_VARS):
        return {}
    return dict(PASSIVE)


def passive_wait(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Add wait_env to the environment (os.environ by default) and return what was added.

    Effective only before torch is first imported in this process (libgomp reads the
    environment when it is loaded); afterwards it still reaches child processes."""
    env = os.environ if environ is None else environ
    added = wait_env(env)
    env.update(added)
    return added
