"""The KServe v2 / Open Inference Protocol gRPC schema (package `inference`, service
`GRPCInferenceService`), as protobuf descriptors built in code; the server (serve.grpc_service)
and the load generator (load.grpc_client) both speak it. Needs only protobuf, not grpcio.

The messages, field numbers and types are those of the published `grpc_predict_v2.proto`
(KServe, Apache-2.0: github.com/kserve/kserve, python/kserve/kserve/protocol/grpc/; Triton's
`grpc_service.proto`, BSD-3-Clause, is a superset with the same numbers, which is why
`tritonclient.grpc` talks to it). They are written out here with `descriptor_pb2` rather than
compiled from the .proto by protoc: no generated files to keep in step with the installed
protobuf runtime, and no build step. InferParameter also carries Triton's `double_param` (4) and
`uint64_param` (5), which tritonclient may send, and Triton's ModelStatistics method (the
statistics extension) is described too. Only the methods this server answers are described
(the repository ones are HTTP-only here).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = "GRPCInferenceService"

_F = descriptor_pb2.FieldDescriptorProto
_T = {"bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING, "int64": _F.TYPE_INT64,
      "uint64": _F.TYPE_UINT64, "int32": _F.TYPE_INT32, "uint32": _F.TYPE_UINT32,
      "float": _F.TYPE_FLOAT, "double": _F.TYPE_DOUBLE, "bytes": _F.TYPE_BYTES}

# (name, number, type, repeated) — a type that is not a scalar names a message
Field = tuple[str, int, str, bool]


def _message(name: str, fields: list[Field], *, nested: tuple[Any, ...] = (),
             params_at: int | None = None, oneof: str | None = None, scope: str = "") -> Any:
    """A message; `scope` is the enclosing message's name and a dot, for a nested one."""
    m = descriptor_pb2.DescriptorProto(name=name)
    for fname, number, ftype, repeated in fields:
        f = m.field.add(name=fname, number=number,
                        label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
        if ftype in _T:
            f.type = _T[ftype]
        else:
            f.type = _F.TYPE_MESSAGE
            f.type_name = f".{PACKAGE}.{ftype}"
        if oneof is not None:
            f.oneof_index = 0
    if oneof is not None:
        m.oneof_decl.add(name=oneof)
    m.nested_type.extend(nested)
    if params_at is not None:  # map<string, InferParameter> parameters = params_at
        entry = descriptor_pb2.DescriptorProto(name="ParametersEntry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, type=_F.TYPE_MESSAGE, label=_F.LABEL_OPTIONAL,
                        type_name=f".{PACKAGE}.InferParameter")
        m.nested_type.append(entry)
        m.field.add(name="parameters", number=params_at, type=_F.TYPE_MESSAGE,
                    label=_F.LABEL_REPEATED,
                    type_name=f".{PACKAGE}.{scope}{name}.ParametersEntry")
    return m


def _file() -> Any:
    fd = descriptor_pb2.FileDescriptorProto(name="scalelab/grpc_predict_v2.proto",
                                            package=PACKAGE, syntax="proto3")
    tensor_meta = _message("TensorMetadata", [("name", 1, "string", False),
                                              ("datatype", 2, "string", False),
                                              ("shape", 3, "int64", True)])
    in_tensor = _message("InferInputTensor", [
        ("name", 1, "string", False), ("datatype", 2, "string", False),
        ("shape", 3, "int64", True), ("contents", 5, "InferTensorContents", False)],
        params_at=4, scope="ModelInferRequest.")
    out_wanted = _message("InferRequestedOutputTensor", [("name", 1, "string", False)],
                          params_at=2, scope="ModelInferRequest.")
    out_tensor = _message("InferOutputTensor", [
        ("name", 1, "string", False), ("datatype", 2, "string", False),
        ("shape", 3, "int64", True), ("contents", 5, "InferTensorContents", False)],
        params_at=4, scope="ModelInferResponse.")
    fd.message_type.extend([
        _message("ServerLiveRequest", []),
        _message("ServerLiveResponse", [("live", 1, "bool", False)]),
        _message("ServerReadyRequest", []),
        _message("ServerReadyResponse", [("ready", 1, "bool", False)]),
        _message("ModelReadyRequest", [("name", 1, "string", False),
                                       ("version", 2, "string", False)]),
        _message("ModelReadyResponse", [("ready", 1, "bool", False)]),
        _message("ServerMetadataRequest", []),
        _message("ServerMetadataResponse", [("name", 1, "string", False),
                                            ("version", 2, "string", False),
                                            ("extensions", 3, "string", True)]),
        _message("ModelMetadataRequest", [("name", 1, "string", False),
                                          ("version", 2, "string", False)]),
        _message("ModelMetadataResponse", [
            ("name", 1, "string", False), ("versions", 2, "string", True),
            ("platform", 3, "string", False),
            ("inputs", 4, "ModelMetadataResponse.TensorMetadata", True),
            ("outputs", 5, "ModelMetadataResponse.TensorMetadata", True)],
            nested=(tensor_meta,)),
        _message("ModelInferRequest", [
            ("model_name", 1, "string", False), ("model_version", 2, "string", False),
            ("id", 3, "string", False),
            ("inputs", 5, "ModelInferRequest.InferInputTensor", True),
            ("outputs", 6, "ModelInferRequest.InferRequestedOutputTensor", True),
            ("raw_input_contents", 7, "bytes", True)],
            nested=(in_tensor, out_wanted), params_at=4),
        _message("ModelInferResponse", [
            ("model_name", 1, "string", False), ("model_version", 2, "string", False),
            ("id", 3, "string", False),
            ("outputs", 5, "ModelInferResponse.InferOutputTensor", True),
            ("raw_output_contents", 6, "bytes", True)],
            nested=(out_tensor,), params_at=4),
        _message("InferParameter", [
            ("bool_param", 1, "bool", False), ("int64_param", 2, "int64", False),
            ("string_param", 3, "string", False), ("double_param", 4, "double", False),
            ("uint64_param", 5, "uint64", False)], oneof="parameter_choice"),
        _message("InferTensorContents", [
            ("bool_contents", 1, "bool", True), ("int_contents", 2, "int32", True),
            ("int64_contents", 3, "int64", True), ("uint_contents", 4, "uint32", True),
            ("uint64_contents", 5, "uint64", True), ("fp32_contents", 6, "float", True),
            ("fp64_contents", 7, "double", True), ("bytes_contents", 8, "bytes", True)]),
        # Triton's statistics extension (its grpc_service.proto; tritonclient asks for it)
        _message("StatisticDuration", [("count", 1, "uint64", False), ("ns", 2, "uint64", False)]),
        _message("InferStatistics", [(k, i, "StatisticDuration", False) for i, k in enumerate((
            "success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
            "cache_hit", "cache_miss"), start=1)]),
        _message("InferBatchStatistics", [("batch_size", 1, "uint64", False)] + [
            (k, i, "StatisticDuration", False) for i, k in enumerate((
                "compute_input", "compute_infer", "compute_output"), start=2)]),
        _message("ModelStatistics", [
            ("name", 1, "string", False), ("version", 2, "string", False),
            ("last_inference", 3, "uint64", False), ("inference_count", 4, "uint64", False),
            ("execution_count", 5, "uint64", False),
            ("inference_stats", 6, "InferStatistics", False),
            ("batch_stats", 7, "InferBatchStatistics", True)]),
        _message("ModelStatisticsRequest", [("name", 1, "string", False),
                                            ("version", 2, "string", False)]),
        _message("ModelStatisticsResponse", [("model_stats", 1, "ModelStatistics", True)]),
    ])
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def message(name: str) -> Any:
    """The message class `inference.<name>`."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


METHODS = {m: (message(f"{m}Request"), message(f"{m}Response")) for m in (
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
    "ModelStatistics")}
"""Method name -> (request class, response class)."""
