"""OIP tensor datatypes: how each one is held in the server, read from the wire and written back.

Every numeric datatype maps to a numpy dtype, with two that numpy lacks handled here:

- BF16 is held as float32 whose low 16 bits are zero (every bfloat16 value is exactly a
  float32). On the wire it is 2 bytes per element (the float32's high half, little-endian), in
  JSON plain numbers; numbers that are not bfloat16 values are rounded to the nearest one (ties
  to even), as a client converting to bfloat16 does.
- BYTES is held as a numpy object array of `bytes`. In the binary forms (the HTTP binary
  extension, gRPC raw contents) each element is a 4-byte little-endian length and then its
  bytes, as Triton writes it; in JSON each element is a string (UTF-8).

The network sees `FEED_DTYPES`: unsigned integers wider than 8 bits arrive as int64 (torch's
index type; a UINT64 above 2^63-1 is refused, not wrapped) and BF16 as float32. Why: the
server's networks take int64 indices and float32 features; widening is exact.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

NP_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "BF16": np.dtype(np.float32), "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64), "BYTES": np.dtype(object),
}
"""How the server holds each datatype (BF16 as float32, BYTES as an object array of bytes)."""

WIRE_SIZE: dict[str, int] = {k: (2 if k == "BF16" else v.itemsize) for k, v in NP_DTYPES.items()
                             if k != "BYTES"}
"""Bytes per element in the binary forms (BYTES has none: each element has its own length)."""

FEED_DTYPES: dict[str, np.dtype[Any]] = {
    **NP_DTYPES, "UINT16": np.dtype(np.int64), "UINT32": np.dtype(np.int64),
    "UINT64": np.dtype(np.int64), "BF16": np.dtype(np.float32)}
"""The dtype a network receives for each datatype (see the module docstring)."""

KINDS = {"BOOL": "b", "UINT8": "iu", "UINT16": "iu", "UINT32": "iu", "UINT64": "iu",
         "INT8": "iu", "INT16": "iu", "INT32": "iu", "INT64": "iu", "FP16": "iuf",
         "BF16": "iuf", "FP32": "iuf", "FP64": "iuf", "BYTES": "U"}
"""numpy kinds a JSON value list may arrive as, per datatype: ints are fine for floats, floats
are not fine for ints (1.5 is not an INT64), booleans only for BOOL, strings only for BYTES."""

_INT64_MAX = np.iinfo(np.int64).max


class TensorError(ValueError):
    """A tensor's data does not fit its datatype or shape; the message says how (the caller
    prefixes the input's name)."""


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), still as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    nan = np.isnan(x)
    out = (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    if nan.any():  # rounding must not turn a NaN's payload into an infinity
        out = np.where(nan, np.float32("nan"), out)
    return out.reshape(np.shape(x))


def bf16_bytes(x: np.ndarray) -> bytes:
    """float32 values as bfloat16 on the wire: the rounded value's high 16 bits, little-endian."""
    u = round_bf16(x).reshape(-1).view(np.uint32)
    return (u >> 16).astype("<u2").tobytes()


def from_bf16_bytes(raw: bytes | memoryview, count: int, offset: int = 0) -> np.ndarray:
    """`count` bfloat16 values at `offset` of `raw`, as float32."""
    half = np.frombuffer(raw, dtype="<u2", count=count, offset=offset)
    return (half.astype(np.uint32) << 16).view(np.float32)


def bytes_elements(raw: bytes | memoryview, count: int, offset: int = 0) -> tuple[np.ndarray, int]:
    """`count` BYTES elements (4-byte little-endian length, then the bytes) from `offset` of
    `raw`: the object array and the offset just past them. TensorError when `raw` ends early."""
    out = np.empty(count, dtype=object)
    view = memoryview(raw)
    end = len(view)
    for i in range(count):
        if offset + 4 > end:
            raise TensorError(f"BYTES element {i} has no 4-byte length prefix (the data ends at "
                              f"byte {end}); each element is a little-endian uint32 length "
                              "and then its bytes")
        (n,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + n > end:
            raise TensorError(f"BYTES element {i} says {n} bytes but only {end - offset} "
                              "remain")
        out[i] = bytes(view[offset:offset + n])
        offset += n
    return out, offset


def bytes_blob(arr: np.ndarray) -> bytes:
    """An object array of bytes (or str) in the binary form: length-prefixed elements."""
    parts = []
    for v in arr.reshape(-1):
        b = v if isinstance(v, bytes) else str(v).encode()
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def from_binary(raw: bytes | memoryview, datatype: str, count: int, *,
                offset: int = 0, size: int | None = None) -> np.ndarray:
    """`count` elements of `datatype` from the binary form, exactly `size` bytes when given
    (TensorError otherwise), as the server holds them (a flat array)."""
    if datatype == "BYTES":
        arr, end = bytes_elements(raw if size is None else memoryview(raw)[:offset + size],
                                  count, offset)
        if size is not None and end != offset + size:
            raise TensorError(f"{size} bytes of BYTES data hold {count} elements in the first "
                              f"{end - offset} bytes; binary_data_size must be the elements' "
                              "lengths plus 4 bytes each")
        return arr
    want = count * WIRE_SIZE[datatype]
    if size is not None and size != want:
        raise TensorError(f"binary data of {size} bytes is not {count} x "
                          f"{WIRE_SIZE[datatype]} bytes of {datatype}")
    if offset + want > len(raw):
        raise TensorError(f"binary data ends early: {count} {datatype} values need {want} "
                          f"bytes, {len(raw) - offset} remain")
    if datatype == "BF16":
        return from_bf16_bytes(raw, count, offset)
    dtype = NP_DTYPES[datatype]
    le = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
    return np.frombuffer(raw, dtype=le, count=count, offset=offset).astype(dtype)


def binary_size(raw: bytes | memoryview, datatype: str, count: int, offset: int) -> int:
    """How many bytes `count` elements of `datatype` take at `offset` (walks BYTES lengths)."""
    if datatype != "BYTES":
        return count * WIRE_SIZE[datatype]
    return bytes_elements(raw, count, offset)[1] - offset


def from_values(values: list[Any], datatype: str, shape: list[int]) -> np.ndarray:
    """A JSON (or typed gRPC) value list for a tensor of `shape`, as the server holds
    `datatype`, flat; TensorError naming what is wrong (ragged rows, count, kind, range,
    non-finite)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        flat = _flatten_strings(values)
        if len(flat) != count:
            raise TensorError(f"shape {shape} needs {count} values, got {len(flat)}")
        out = np.empty(count, dtype=object)
        for i, v in enumerate(flat):
            if isinstance(v, str):
                out[i] = v.encode()
            elif isinstance(v, bytes):
                out[i] = v
            else:
                raise TensorError(f"BYTES element {i} is {type(v).__name__}, not a string")
        return out
    try:
        raw = np.asarray(values).reshape(-1)  # nested data is row-major, like flat
    except (ValueError, TypeError, OverflowError):
        raise TensorError("nested data is ragged; every row must have the same length") \
            from None
    if raw.size != count:
        raise TensorError(f"shape {shape} needs {count} values, got {raw.size}")
    if raw.size and raw.dtype.kind not in KINDS[datatype]:
        what = "integers beyond 64 bits" if raw.dtype.kind == "O" else \
            f"values of kind {raw.dtype.name}"
        raise TensorError(f"{what} are not {datatype}")
    dtype = NP_DTYPES[datatype]
    if dtype.kind in "iu" and raw.size and raw.dtype != dtype:
        info = np.iinfo(dtype)
        lo, hi = raw.min(), raw.max()
        if lo < info.min or hi > info.max:
            raise TensorError(f"value {lo if lo < info.min else hi} lies outside {datatype}'s "
                              f"range [{info.min}, {info.max}]")
    with np.errstate(over="ignore"):  # beyond the dtype's range: inf, refused below
        arr = raw.astype(dtype, copy=False)
    if datatype == "BF16":
        arr = round_bf16(arr)
    if dtype.kind == "f" and not np.isfinite(arr).all():
        raise TensorError("values must be finite numbers (within the datatype's range)")
    return arr


def _flatten_strings(values: list[Any]) -> list[Any]:
    """Nested lists flattened row-major (iteratively: no recursion limit for deep nesting)."""
    out: list[Any] = []
    stack = [iter(values)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def check_feedable(arr: np.ndarray, datatype: str) -> None:
    """TensorError when `arr` cannot widen to its FEED_DTYPES entry exactly (a UINT64 above
    2^63-1: the network takes int64)."""
    if datatype == "UINT64" and arr.size and int(arr.max()) > _INT64_MAX:
        raise TensorError(f"UINT64 value {int(arr.max())} exceeds 2^63-1, the largest index "
                          "this model's network takes (int64)")


def to_wire(arr: np.ndarray, datatype: str) -> bytes:
    """An output array in the binary form of `datatype`."""
    if datatype == "BYTES":
        return bytes_blob(arr)
    if datatype == "BF16":
        return bf16_bytes(arr)
    dtype = NP_DTYPES[datatype]
    a = np.ascontiguousarray(arr, dtype=dtype)
    return a.astype(dtype.newbyteorder("<"), copy=False).tobytes()


def to_json(arr: np.ndarray, datatype: str) -> Any:
    """An output array as its JSON data (flat): numbers, booleans, or strings for BYTES
    (UTF-8, undecodable bytes replaced)."""
    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                for v in arr.reshape(-1)]
    if datatype == "BF16":
        return round_bf16(np.asarray(arr, dtype=np.float32)).reshape(-1)
    return np.ascontiguousarray(arr, dtype=NP_DTYPES[datatype]).reshape(-1)
