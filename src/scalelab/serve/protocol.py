"""Open Inference Protocol v2 (KServe/Triton REST) on the wire: request models, tensor decoding
and validation against a model's config, response encoding, and the binary tensor extension
that tritonclient uses by default (JSON header + raw little-endian bytes).

Every validation error is a `ServeError` with an HTTP status and a message naming the input.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scalelab.serve.config import ModelConfig

HEADER_LENGTH = "Inference-Header-Content-Length"

NP_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
# numpy kinds a JSON value list may arrive as, per datatype: ints are fine for floats, floats
# are not fine for ints (1.5 is not an INT64), and booleans only for BOOL.
_KINDS = {"BOOL": "b", "UINT8": "iu", "INT8": "iu", "INT16": "iu", "INT32": "iu", "INT64": "iu",
          "FP16": "iuf", "FP32": "iuf", "FP64": "iuf"}


class ServeError(Exception):
    """An answer other than 200: status, a message naming the problem, optional headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RequestInput(_Wire):
    name: str = Field(min_length=1)
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: Any = None


class RequestOutput(_Wire):
    name: str = Field(min_length=1)
    parameters: dict[str, Any] | None = None


class InferenceRequest(_Wire):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | None = None


def _field_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "body"
    return f"invalid inference request: field '{loc}': {err['msg']}"


def parse_request(body: bytes, header_length: str | None) -> tuple[InferenceRequest, bytes]:
    """Split a body into its JSON request and the binary tail (empty without the extension)."""
    tail = b""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise ServeError(400, f"{HEADER_LENGTH} header {header_length!r} is not an integer") \
                from None
        if not 0 < n <= len(body):
            raise ServeError(400, f"{HEADER_LENGTH} {n} does not fit the {len(body)}-byte body")
        body, tail = body[:n], body[n:]
    try:
        raw = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ServeError(400, f"request body is not valid JSON: {e}") from None
    except RecursionError:  # nesting deeper than the parser's stack: a bad request, not a 500
        raise ServeError(400, "request body is nested too deeply to parse") from None
    if not isinstance(raw, dict):
        raise ServeError(400, "request body must be a JSON object with 'inputs'")
    try:
        return InferenceRequest.model_validate(raw), tail
    except ValidationError as e:
        raise ServeError(422, _field_error(e)) from None


def _check_shape(spec_shape: list[int], shape: list[int], name: str, max_batch: int) -> None:
    if len(shape) != len(spec_shape) or any(s != -1 and s != d for s, d in
                                             zip(spec_shape, shape, strict=True)):
        raise ServeError(400, f"input '{name}': shape {shape} does not match the model's "
                              f"{spec_shape} (-1 = any)")
    if any(d < 0 for d in shape):
        raise ServeError(400, f"input '{name}': shape {shape} has a negative dimension")
    if shape[0] < 1 or shape[0] > max_batch:
        raise ServeError(400, f"input '{name}': batch dimension {shape[0]} must lie in "
                              f"[1, max_batch_size={max_batch}]; split the request")


def decode_inputs(req: InferenceRequest, cfg: ModelConfig, tail: bytes) -> list[np.ndarray]:
    """Validate the request's tensors against `cfg` and return them in cfg.inputs order."""
    given = {}
    for inp in req.inputs:
        if inp.name in given:
            raise ServeError(400, f"input '{inp.name}' is given twice")
        given[inp.name] = inp
    expected = [t.name for t in cfg.inputs]
    unknown = [n for n in given if n not in expected]
    if unknown:
        raise ServeError(400, f"input '{unknown[0]}' is not an input of model '{cfg.name}'; "
                              f"its inputs are {expected}")
    missing = [n for n in expected if n not in given]
    if missing:
        raise ServeError(400, f"input '{missing[0]}' is missing; model '{cfg.name}' needs "
                              f"{expected}")
    offset = 0
    arrays: dict[str, np.ndarray] = {}
    for inp in req.inputs:
        spec = cfg.input(inp.name)
        assert spec is not None
        if inp.datatype != spec.datatype:
            raise ServeError(400, f"input '{inp.name}': datatype {inp.datatype} is not the "
                                  f"model's {spec.datatype}")
        _check_shape(spec.shape, inp.shape, inp.name, cfg.max_batch_size)
        count = math.prod(inp.shape)
        dtype = NP_DTYPES[spec.datatype]
        size = (inp.parameters or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size != count * dtype.itemsize:
                raise ServeError(400, f"input '{inp.name}': binary_data_size {size} is not "
                                      f"{count} x {dtype.itemsize} bytes for shape {inp.shape}")
            if offset + size > len(tail):
                raise ServeError(400, f"input '{inp.name}': binary data ends early")
            le = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
            arr = np.frombuffer(tail, dtype=le, count=count, offset=offset).astype(dtype)
            offset += size
        else:
            if not isinstance(inp.data, list):
                raise ServeError(400, f"input '{inp.name}': 'data' must be a (flat or nested) "
                                      "JSON array")
            try:
                raw = np.asarray(inp.data).reshape(-1)  # nested data is row-major, like flat
            except (ValueError, TypeError):
                raise ServeError(400, f"input '{inp.name}': nested data is ragged; every row "
                                      "must have the same length") from None
            if raw.size != count:
                raise ServeError(400, f"input '{inp.name}': shape {inp.shape} needs {count} "
                                      f"values, got {raw.size}")
            if raw.size and raw.dtype.kind not in _KINDS[spec.datatype]:
                raise ServeError(400, f"input '{inp.name}': values of kind {raw.dtype.name} "
                                      f"are not {spec.datatype}")
            arr = raw.astype(dtype, copy=False)
            if dtype.kind == "f" and not np.isfinite(arr).all():
                raise ServeError(400, f"input '{inp.name}': values must be finite numbers")
        arrays[inp.name] = arr.reshape(inp.shape)
    if offset != len(tail):
        raise ServeError(400, f"binary data has {len(tail) - offset} bytes no input claims")
    rows = {a.shape[0] for a in arrays.values()}
    if len(rows) != 1:
        raise ServeError(400, f"inputs disagree on the batch dimension: "
                              f"{ {n: a.shape[0] for n, a in arrays.items()} }")
    return [arrays[n] for n in expected]


def wants_binary(req: InferenceRequest) -> dict[str, bool]:
    """Output name -> whether the client asked for it as binary (the extension)."""
    default = bool((req.parameters or {}).get("binary_data_output", False))
    if not req.outputs:
        return {"*": default}
    return {o.name: bool((o.parameters or {}).get("binary_data", default)) for o in req.outputs}


def encode_response(*, model: str, version: int, request_id: str | None,
                    outputs: dict[str, np.ndarray], cfg: ModelConfig,
                    req: InferenceRequest) -> tuple[bytes, dict[str, str]]:
    """The response body (JSON, or JSON + binary tail) and its extra headers."""
    binary = wants_binary(req)
    names = [o.name for o in req.outputs] if req.outputs else [t.name for t in cfg.outputs]
    unknown = [n for n in names if n not in outputs]
    if unknown:
        raise ServeError(400, f"output '{unknown[0]}' is not an output of model '{model}'; "
                              f"its outputs are {[t.name for t in cfg.outputs]}")
    specs = {t.name: t for t in cfg.outputs}
    out_json: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for n in names:
        arr = np.ascontiguousarray(outputs[n], dtype=NP_DTYPES[specs[n].datatype])
        entry: dict[str, Any] = {"name": n, "datatype": specs[n].datatype, "shape": list(arr.shape)}
        if binary.get(n, binary.get("*", False)):
            blob = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = arr.reshape(-1).tolist()
        out_json.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": str(version), "outputs": out_json}
    if request_id is not None:
        doc["id"] = request_id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream",
                                    HEADER_LENGTH: str(len(head))}
