"""A GGUF reader whose metadata arrays are read in one pass (the vocabulary is the slow part).

`gguf.GGUFReader` builds every item of a metadata array (SmolLM2's 49,152 tokens and 48,900
merges, each a length and a string) as numpy views, three numpy calls an item: 2.3 CPU-seconds
of each `generate serve` start on the 2-core VM (2026-12-03, load 3.4), half of the model's
load. This subclass parses an array of strings or scalars with `struct` over a memoryview of the
same mapping and keeps gguf's `ReaderField` layout (a length part and a data part per string,
one part per scalar, the same `data` indexes and `types`), with memoryview slices as the parts:
`contents()` reads them the same way (`tobytes`, `tolist`). Tensors, scalars, single strings
and files of the other byte order are gguf's own code.
"""

from __future__ import annotations

import struct
from typing import Any

import gguf
import numpy as np
from gguf.constants import GGUFValueType

_SCALAR_FORMAT = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f", GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d", GGUFValueType.BOOL: "?",
}
"""memoryview formats of gguf's scalar item types (native order: only used on 'I' files)."""

_LEN = struct.Struct("=Q")


class FastGGUFReader(gguf.GGUFReader):
    """gguf.GGUFReader with arrays of strings and scalars parsed in one pass."""

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any],
                                                                       list[int], list[Any]]:
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        sub = GGUFValueType(int(raw_itype[0]))
        n = int(alen[0])
        offs = orig_offs + 12
        mv = memoryview(self.data)  # type: ignore[arg-type]
        parts: list[Any] = [raw_itype, alen]
        if sub == GGUFValueType.STRING:
            unpack = _LEN.unpack_from
            for _ in range(n):
                (slen,) = unpack(mv, offs)
                parts.append(mv[offs:offs + 8].cast("Q"))
                parts.append(mv[offs + 8:offs + 8 + slen])
                offs += 8 + slen
            return offs - orig_offs, parts, list(range(3, 2 + 2 * n + 1, 2)), \
                [GGUFValueType.ARRAY, sub]
        fmt = _SCALAR_FORMAT.get(sub)
        if fmt is None or n == 0:  # nested arrays; empty ones (typed by gguf's loop)
            return super()._get_field_parts(orig_offs, raw_type)
        size = struct.calcsize(fmt)
        items = mv[offs:offs + n * size].cast("B").cast(fmt)  # type: ignore[call-overload]
        parts += [items[i:i + 1] for i in range(n)]
        return 12 + n * size, parts, list(range(2, 2 + n)), [GGUFValueType.ARRAY, sub]
