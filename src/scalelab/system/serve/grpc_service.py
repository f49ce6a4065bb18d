"""The KServe v2 gRPC endpoint (`scalelab serve --grpc-port N`): ServerLive, ServerReady,
ModelReady, ServerMetadata, ModelMetadata and ModelInfer, plus Triton's ModelStatistics, on a
grpc.aio server that runs on the HTTP server's own event loop.

It shares everything behind the wire with the HTTP path: a ModelInfer request is checked by the
same code (its tensors become the HTTP request's, raw_input_contents as the binary extension's
tail), routed by the same repository (canary splits included), admitted by the same queue
(full -> RESOURCE_EXHAUSTED with a retry-after trailer), batched with HTTP requests by the same
batcher, cached and coalesced alike, and counted in the same metrics, statistics and access
log. Errors are gRPC status codes with the HTTP path's message (400 -> INVALID_ARGUMENT,
404 -> NOT_FOUND, 429 -> RESOURCE_EXHAUSTED, 503 -> UNAVAILABLE, 504 -> DEADLINE_EXCEEDED,
else INTERNAL). The client's gRPC deadline, when it sets one, is the request's deadline.
Outputs always go back as raw_output_contents (what tritonclient reads).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scalelab import __version__
from scalelab.lab.core.errors import BadUsageError, import_optional
from scalelab.layers.web.guard import new_request_id
from scalelab.system.serve.context import ServeContext
from scalelab.system.serve.health import EXTENSIONS, model_stats
from scalelab.system.serve.infer import InferHandler, check_inputs
from scalelab.system.serve.protocol import ServeError, decode_inputs, validate_request
from scalelab.system.serve.tensors import to_wire

log = logging.getLogger("scalelab.system.serve")

INSTALL_HINT = "pip install 'scalelab[grpc]' (grpcio and protobuf)"

# the typed contents field of each datatype (FP16 and BF16 have none: raw contents only)
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents",
             "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
             "BYTES": "bytes_contents"}


def grpc_code(status: int) -> Any:
    """The gRPC status code for an HTTP status of the HTTP path."""
    import grpc

    return {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
            413: grpc.StatusCode.RESOURCE_EXHAUSTED, 422: grpc.StatusCode.INVALID_ARGUMENT,
            429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE,
            504: grpc.StatusCode.DEADLINE_EXCEEDED}.get(status, grpc.StatusCode.INTERNAL)


def http_request(req: Any) -> tuple[dict[str, Any], bytes]:
    """A ModelInferRequest as the HTTP path's request document and binary tail: raw contents
    become binary tensors (binary_data_size = their length), typed contents JSON data."""
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise ServeError(400, f"raw_input_contents has {len(raw)} entries for "
                              f"{len(req.inputs)} inputs; give one per input, in order")
    inputs = []
    for i, t in enumerate(req.inputs):
        doc: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if raw:
            doc["parameters"] = {"binary_data_size": len(raw[i])}
        else:
            field = _CONTENTS.get(t.datatype)
            if field is None:
                raise ServeError(400, f"input '{t.name}': {t.datatype} has no typed contents "
                                      "field; send it in raw_input_contents")
            doc["data"] = list(getattr(t.contents, field))
        inputs.append(doc)
    outputs = [{"name": o.name} for o in req.outputs]
    return {"inputs": inputs, **({"outputs": outputs} if outputs else {})}, b"".join(raw)


class InferenceService:
    """The servicer: one coroutine per method, over the HTTP app's context and handler."""

    def __init__(self, ctx: ServeContext, handler: InferHandler) -> None:
        from scalelab.layers.web.oip_grpc import message

        self.ctx, self.handler = ctx, handler
        self._msg = message

    async def _abort(self, context: Any, e: ServeError) -> None:
        trailer = tuple((k.lower(), v) for k, v in e.headers.items())
        if trailer:
            context.set_trailing_metadata(trailer)
        await context.abort(grpc_code(e.status), e.message)

    # the methods carry the proto's names: grpc looks them up by these
    async def ServerLive(self, req: Any, context: Any) -> Any:
        return self._msg("ServerLiveResponse")(live=True)

    async def ServerReady(self, req: Any, context: Any) -> Any:
        return self._msg("ServerReadyResponse")(ready=self.ctx.ready())

    async def ModelReady(self, req: Any, context: Any) -> Any:
        try:
            s = self.ctx.repo.version_state(req.name, req.version or None)
            ok = s.state == "READY"
        except ServeError as e:
            if e.status in (400, 404):
                await self._abort(context, e)
            ok = False
        return self._msg("ModelReadyResponse")(ready=ok)

    async def ServerMetadata(self, req: Any, context: Any) -> Any:
        return self._msg("ServerMetadataResponse")(name="scalelab", version=__version__,
                                                   extensions=EXTENSIONS)

    async def ModelMetadata(self, req: Any, context: Any) -> Any:
        repo = self.ctx.repo
        try:
            entry = repo.entry(req.name)
            if entry.config is None:
                raise ServeError(503, f"model '{req.name}' failed to load: {entry.reason}")
            vs = [str(repo.version_state(req.name, req.version).version)] if req.version \
                else [str(v) for v in sorted(entry.versions)]
        except ServeError as e:
            await self._abort(context, e)
            raise AssertionError("abort raises") from None
        cfg = entry.config
        resp = self._msg("ModelMetadataResponse")(name=req.name, versions=vs,
                                                  platform=cfg.platform)
        for src, dst in ((cfg.inputs, resp.inputs), (cfg.outputs, resp.outputs)):
            for t in src:
                dst.add(name=t.name, datatype=t.datatype, shape=t.shape)
        return resp

    async def ModelStatistics(self, req: Any, context: Any) -> Any:
        from google.protobuf import json_format

        try:
            doc = model_stats(self.ctx.repo, req.name or None, req.version or None)
        except ServeError as e:
            await self._abort(context, e)
            raise AssertionError("abort raises") from None
        return json_format.ParseDict(doc, self._msg("ModelStatisticsResponse")())

    async def ModelInfer(self, req: Any, context: Any) -> Any:
        t0 = time.monotonic()
        h = self.handler
        name, version = req.model_name, (req.model_version or None)
        rid = req.id or new_request_id()
        label = h.begin(name)
        status, served, worker = 500, "", None
        try:
            entry = self.ctx.repo.entry(name)
            if entry.config is None:
                raise ServeError(503, f"model '{name}' failed to load: {entry.reason}")
            cfg = entry.config
            doc, tail = http_request(req)
            parsed = validate_request(doc)
            arrays = decode_inputs(parsed, cfg, tail)
            remaining = context.time_remaining()
            budget = cfg.dynamic_batching.default_timeout_ms / 1000.0 if remaining is None \
                else remaining
            worker = self.ctx.repo.route(name, version, rid, entry)
            check_inputs(entry, worker, arrays)
            served = worker.version_label
            outputs = await h.compute(entry, worker, arrays, rid, t0 + budget)
            names = [o.name for o in req.outputs] or [t.name for t in cfg.outputs]
            specs = {t.name: t for t in cfg.outputs}
            resp = self._msg("ModelInferResponse")(model_name=name,
                                                   model_version=served, id=req.id)
            for n in names:
                spec = specs.get(n)
                if spec is None:
                    raise ServeError(400, f"output '{n}' is not an output of model '{name}'; "
                                          f"its outputs are {list(specs)}")
                arr = outputs[n]
                resp.outputs.add(name=n, datatype=spec.datatype, shape=list(arr.shape))
                resp.raw_output_contents.append(to_wire(arr, spec.datatype))
            status = 200
            return resp
        except ServeError as e:
            status = e.status
            await self._abort(context, e)
            raise AssertionError("abort raises") from None
        except Exception:
            log.exception("grpc infer %s failed", name, extra={"request_id": rid})
            await context.abort(grpc_code(500), "internal server error; see the server log")
            raise AssertionError("abort raises") from None
        finally:
            h.end(label, name, worker, status, t0, rid, served=served, route="grpc infer")


def make_server(ctx: ServeContext, handler: InferHandler, host: str, port: int) -> Any:
    """A grpc.aio server answering the service on host:port (not started). Must be called on
    the event loop the HTTP app runs on: the batcher's queues belong to it."""
    grpc = import_optional("grpc", needed_for="--grpc-port needs grpcio", hint=INSTALL_HINT)
    from scalelab.layers.web.oip_grpc import METHODS, PACKAGE, SERVICE

    service = InferenceService(ctx, handler)
    handlers = {
        m: grpc.unary_unary_rpc_method_handler(getattr(service, m),
                                               request_deserializer=req.FromString,
                                               response_serializer=resp.SerializeToString)
        for m, (req, resp) in METHODS.items()}
    limit = ctx.settings.max_body_bytes
    # several workers share the port (the kernel spreads connections); one server must not
    # silently share it with another process that set SO_REUSEPORT too
    reuse = 1 if ctx.settings.workers > 1 else 0
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.so_reuseport", reuse)])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(f"{PACKAGE}.{SERVICE}", handlers),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise BadUsageError(f"--grpc-port {port}: cannot bind {host}:{port} (in use?)")
    return server
