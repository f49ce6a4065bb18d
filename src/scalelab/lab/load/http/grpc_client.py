"""The load generator over the KServe v2 gRPC protocol (`scalelab load run grpc://HOST:PORT/MODEL`).

`GrpcConnection` stands in for `connection.HttpConnection` in the engine: one grpc.aio channel
(its own HTTP/2 connection: channels do not share subchannels here) with one ModelInfer call
outstanding at a time, so the open-loop schedule, the connection cap, timeouts, histograms and
records work unchanged. A call's status becomes the HTTP status the server would have answered
(RESOURCE_EXHAUSTED -> 429, UNAVAILABLE -> 503, DEADLINE_EXCEEDED -> 504, INVALID_ARGUMENT ->
400, NOT_FOUND -> 404, others 500), so error tables read the same for both protocols.

Requests are the OIP payloads' JSON bodies turned into serialized ModelInferRequests once,
before the run (tensors as raw_input_contents, as tritonclient sends them).
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.load.send import Target

INSTALL_HINT = "pip install 'scalelab[grpc]' (grpcio and protobuf)"
METHOD = "/inference.GRPCInferenceService/ModelInfer"
DEFAULT_PORT = 8001
"""Triton's and KServe's conventional gRPC port, when the URL gives none."""

_NP = {"BOOL": "?", "UINT8": "u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
       "INT8": "i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2",
       "FP32": "<f4", "FP64": "<f8"}


def _grpc() -> Any:
    try:
        import grpc
    except ImportError as e:
        raise BadUsageError(f"grpc:// targets need grpcio ({e}); {INSTALL_HINT}") from None
    return grpc


def _status(code: Any) -> int:
    grpc = _grpc()
    return {grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503,
            grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.INVALID_ARGUMENT: 400,
            grpc.StatusCode.NOT_FOUND: 404}.get(code, 500)


def model_of(target: Target, model: str | None) -> str:
    """The model a grpc:// URL names (its path), or --model; BadUsageError when neither."""
    named = target.path.strip("/")
    if model and named and model != named:
        raise BadUsageError(f"the URL names model {named!r} but --model is {model!r}; give one")
    if not (model or named):
        raise BadUsageError("a grpc:// URL needs the model: grpc://HOST:PORT/MODEL")
    return model or named


def raw_tensor(datatype: str, data: list[Any]) -> bytes:
    """A JSON tensor's flat data in the binary form (BYTES: length-prefixed UTF-8)."""
    if datatype == "BYTES":
        parts = [str(v).encode() for v in data]
        return b"".join(struct.pack("<I", len(p)) + p for p in parts)
    if datatype == "BF16":
        f = np.asarray(data, dtype=np.float32).view(np.uint32)
        return (f >> 16).astype("<u2").tobytes()  # truncation: load payloads are random
    if datatype not in _NP:
        raise BadInputError(f"datatype {datatype} cannot be sent over gRPC")
    return np.asarray(data, dtype=_NP[datatype]).tobytes()


def encode_infer(model: str, version: int | None, body: bytes) -> bytes:
    """One OIP JSON infer body as a serialized ModelInferRequest (raw contents)."""
    from scalelab.layers.web.oip_grpc import message

    doc = json.loads(body)
    req = message("ModelInferRequest")(model_name=model,
                                       model_version=str(version) if version else "")
    for t in doc["inputs"]:
        flat = np.asarray(t["data"], dtype=object).reshape(-1).tolist() \
            if t["datatype"] == "BYTES" else np.asarray(t["data"]).reshape(-1).tolist()
        req.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        req.raw_input_contents.append(raw_tensor(t["datatype"], flat))
    out: bytes = req.SerializeToString()
    return out


def fetch_metadata(target: Target, model: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """ModelMetadata over gRPC, as the HTTP metadata document's inputs."""
    grpc = _grpc()
    from scalelab.layers.web.oip_grpc import message

    req_cls, resp_cls = message("ModelMetadataRequest"), message("ModelMetadataResponse")
    with grpc.insecure_channel(f"{target.host}:{target.port}") as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelMetadata",
                              request_serializer=req_cls.SerializeToString,
                              response_deserializer=resp_cls.FromString)
        try:
            meta = call(req_cls(name=model), timeout=timeout_s)
        except grpc.RpcError as e:
            raise BadInputError(f"ModelMetadata for {model!r} at {target.host}:{target.port} "
                                f"failed: {e.code().name} {e.details()}; is the gRPC server "
                                "up and the model loaded?") from None
    return {"name": meta.name, "inputs": [
        {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs]}


class GrpcConnection:
    """One channel, one ModelInfer in flight; the engine's connection interface."""

    def __init__(self, channel: Any, on_response: Callable[..., None],
                 on_lost: Callable[..., None], clock: Callable[[], float],
                 timeout_s: float) -> None:
        self.channel = channel
        self._call = channel.unary_unary(METHOD)  # bytes in, bytes out: encoded before the run
        self._on_response, self._on_lost, self._time = on_response, on_lost, clock
        self._timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None
        self.token: Any = None
        self.sent_at = 0.0
        self.closed = False
        self.by_server = False
        self.retryable = False
        """A channel reconnects by itself: the engine never resends on it."""
        self.request = b""

    @classmethod
    async def connect(cls, target: Target, on_response: Callable[..., None],
                      on_lost: Callable[..., None], clock: Callable[[], float],
                      timeout_s: float) -> GrpcConnection:
        """A ready channel to `target` (ConnectionRefusedError when it cannot connect in
        time: the engine counts that like a refused TCP connect)."""
        grpc = _grpc()
        ch = grpc.aio.insecure_channel(f"{target.host}:{target.port}",
                                       options=[("grpc.use_local_subchannel_pool", 1)])
        try:
            await asyncio.wait_for(ch.channel_ready(), timeout=timeout_s)
        except TimeoutError:
            await ch.close()
            raise ConnectionRefusedError(f"no gRPC server at {target.host}:{target.port}") \
                from None
        return cls(ch, on_response, on_lost, clock, timeout_s)

    def send(self, request: bytes, token: Any) -> None:
        assert self.token is None and not self.closed
        self.token = token
        self.sent_at = self._time()
        self._task = asyncio.get_running_loop().create_task(self._run(request))

    async def _run(self, request: bytes) -> None:
        grpc = _grpc()
        try:
            await self._call(request, timeout=self._timeout_s + 1.0)
            status = 200
        except grpc.aio.AioRpcError as e:
            status = _status(e.code())
        token, self.token = self.token, None
        if not self.closed and token is not None:
            self._on_response(self, status, token, self._time())

    def abort(self) -> None:
        """Drop the call in flight (the engine's timeout) and the channel."""
        if self.closed:
            return
        self.close()
        token, self.token = self.token, None
        self._on_lost(self, None, token)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        asyncio.get_running_loop().create_task(self.channel.close())
