"""hnswlib's index file, checked before hnswlib reads it.

hnswlib's `load_index` trusts its input: a header field off by a few bytes (a wrong magic, a
file of another index written over this one) makes it index memory it never allocated, and the
process dies with SIGSEGV instead of an error. The manifest's sha256 catches damage to the file
alone; this catches bytes that are consistent with their manifest but are not the index the
spec names (a file and manifest copied together from somewhere else, bytes damaged before they
were saved). Layout (hnswlib 0.8, `HierarchicalNSW::saveIndex`):

    header   offsetLevel0, max_elements, cur_element_count, size_data_per_element,
             label_offset, offsetData (size_t); maxlevel (int); enterpoint_node (uint32);
             maxM, maxM0, M (size_t); mult (double); ef_construction (size_t)
    level 0  cur_element_count x size_data_per_element: link count (uint32, low 16 bits used),
             maxM0 neighbour ids (uint32), the vector (dim float32), the label (size_t)
    upper    per element: its upper levels' bytes (uint32), then per level a link count and
             maxM neighbour ids

Every neighbour id must name an element in the file and every vector must be finite; the check
is numpy over level 0 and one small read per element above it.
"""

from __future__ import annotations

import struct

import numpy as np

from scalelab.lab.core.errors import BadInputError

HEADER = struct.Struct("<QQQQQQiIQQQdQ")


def check_hnswlib_bytes(data: bytes, dim: int, m: int) -> None:
    """Raise BadInputError naming the first inconsistency of `data` as an hnswlib inner-product
    index of `dim` floats and M=`m` (what `HnswlibIndex.to_bytes` writes)."""

    def bad(what: str) -> BadInputError:
        return BadInputError(f"hnswlib index data is not an index of dim {dim}, M={m}: {what}")

    if len(data) < HEADER.size:
        raise bad(f"{len(data)} bytes is shorter than its {HEADER.size}-byte header")
    (off0, max_el, cur, per_el, label_off, data_off, maxlevel, enter, max_m, max_m0, mm,
     _mult, _efc) = HEADER.unpack_from(data, 0)
    links0 = 2 * m * 4 + 4
    want = {"offsetLevel0": (off0, 0), "M": (mm, m), "maxM": (max_m, m), "maxM0": (max_m0, 2 * m),
            "offsetData": (data_off, links0), "label_offset": (label_off, links0 + 4 * dim),
            "size_data_per_element": (per_el, links0 + 4 * dim + 8)}
    for name, (got, expected) in want.items():
        if got != expected:
            raise bad(f"header field {name} is {got}, expected {expected}")
    if cur > max_el:
        raise bad(f"{cur} elements in a capacity of {max_el}")
    if cur and (enter >= cur or maxlevel < 0):
        raise bad(f"entry point {enter} / top level {maxlevel} outside {cur} elements")
    end0 = HEADER.size + cur * per_el
    if len(data) < end0 + 4 * cur:
        raise bad(f"{len(data)} bytes cannot hold {cur} elements of {per_el} bytes")
    level0 = np.frombuffer(data, np.uint8, count=cur * per_el, offset=HEADER.size)
    level0 = level0.reshape(cur, per_el)
    counts = level0[:, :4].copy().view(np.uint32)[:, 0] & 0xFFFF
    ids = level0[:, 4:links0].copy().view(np.uint32)
    if (counts > 2 * m).any():
        raise bad("a level-0 link count exceeds maxM0")
    used = np.arange(2 * m)[None, :] < counts[:, None]
    if (ids[used] >= cur).any():
        raise bad("a level-0 link names an element that does not exist")
    vecs = level0[:, data_off:label_off].copy().view(np.float32)
    if not np.isfinite(vecs).all():
        raise bad("a stored vector is not finite")
    per_level = m * 4 + 4
    pos = end0
    for _ in range(cur):
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if size % per_level or pos + size > len(data):
            raise bad(f"upper-level links of {size} bytes at offset {pos - 4}")
        if size:
            block = np.frombuffer(data, np.uint32, count=size // 4, offset=pos)
            block = block.reshape(-1, m + 1)
            n = block[:, 0] & 0xFFFF
            if (n > m).any() or (block[:, 1:][np.arange(m)[None, :] < n[:, None]] >= cur).any():
                raise bad(f"an upper-level link at offset {pos} is out of range")
            pos += size
    if pos != len(data):
        raise bad(f"{len(data) - pos} bytes after the last element")
