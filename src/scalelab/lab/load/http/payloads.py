"""What the generator sends: a small pool of distinct requests, encoded once, used round-robin.

Kinds:
- "get": GET the URL (health checks, trivial endpoints).
- "json": POST one JSON file to the URL.
- "file": recorded requests, JSON Lines, one `{"method"?, "path"?, "headers"?, "body"?}` per line
  (method defaults to POST with a body, GET without; path defaults to the URL's).
- "oip": Open Inference Protocol v2 infer requests (our server, Triton, KServe, MLServer) with
  random-but-valid tensors built from GET /v2/models/NAME metadata: floats ~ N(0, 1), integers 0
  (index 0 is "unknown" in the flights contract, and is valid for any vocabulary), booleans
  random, BYTES "x"; -1 dimensions take --batch, other dims as declared.
- "flights": OIP requests for a flights model built from real rows: a features parquet (or a
  dataset directory's test.parquet) encoded with the model version's preprocess.json from the
  repository, exactly as training encoded them; without data, random rows valid under the same
  preprocess.json (vocabulary indices in range, standardised numerics ~ N(0, 1)).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.lab.core.jsonfile import read_json_object, read_jsonl_objects
from scalelab.lab.load.send import Target, build_request
from scalelab.layers.nets.repository import CONFIG_FILE

if TYPE_CHECKING:
    from scalelab.layers.nets.flights import Preprocess

PayloadKind = Literal["get", "json", "file", "oip", "flights"]
PAYLOADS: tuple[PayloadKind, ...] = ("get", "json", "file", "oip", "flights")
POOL = 256
"""Distinct requests sampled per run (cycled): enough to defeat a response cache keyed on the
body, few enough to encode in milliseconds."""


@dataclass(frozen=True, kw_only=True)
class RequestSpec:
    """One request before encoding."""

    method: str
    """HTTP method."""
    path: str
    """Path (and query) on the target."""
    body: bytes | None = None
    """Body bytes, or None."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra headers."""


def encode(target: Target, specs: list[RequestSpec]) -> list[bytes]:
    return [build_request(target, method=s.method, path=s.path, body=s.body, headers=s.headers)
            for s in specs]


def plain_get(target: Target) -> list[RequestSpec]:
    return [RequestSpec(method="GET", path=target.path)]


def json_body(target: Target, body_file: str | Path) -> list[RequestSpec]:
    p = Path(body_file)
    if not p.is_file():
        raise BadInputError(f"--body {p}: no such file; give a JSON file to POST")
    raw = p.read_bytes()
    try:
        json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInputError(f"--body {p}: not JSON ({e}); give a JSON document") from e
    return [RequestSpec(method="POST", path=target.path, body=raw)]


_REQUEST = "object with optional keys method, path, headers, body"


def recorded(target: Target, requests_file: str | Path) -> list[RequestSpec]:
    p = Path(requests_file)
    if not p.is_file():
        raise BadInputError(f"--requests-file {p}: no such file; give a JSON Lines file")
    specs: list[RequestSpec] = []
    for lineno, obj in read_jsonl_objects(p, fix=f"each line must be one JSON {_REQUEST}"):
        if not set(obj) <= {"method", "path", "headers", "body"}:
            raise BadInputError(
                f"{p}:{lineno}: each line must be one JSON {_REQUEST}")
        body = None if "body" not in obj else json.dumps(obj["body"]).encode()
        path = str(obj.get("path") or target.path)
        if not path.startswith("/"):
            raise BadInputError(f"{p}:{lineno}: path {path!r} must start with '/'")
        headers = obj.get("headers") or {}
        if not isinstance(headers, dict):
            raise BadInputError(f"{p}:{lineno}: headers must be an object")
        method = str(obj.get("method") or ("POST" if body is not None else "GET")).upper()
        specs.append(RequestSpec(method=method, path=path, body=body,
                                 headers={str(k): str(v) for k, v in headers.items()}))
    if not specs:
        raise BadInputError(f"{p}: no requests in the file")
    return specs


def infer_path(target: Target, model: str, version: int | None = None) -> str:
    """The OIP infer path; a URL that already ends in /infer is used as given."""
    if target.path.rstrip("/").endswith("/infer"):
        return target.path
    base = target.path.rstrip("/")
    if base.endswith(f"/v2/models/{model}"):
        base = base[: -len(f"/v2/models/{model}")]
    ver = f"/versions/{version}" if version is not None else ""
    return f"{base}/v2/models/{model}{ver}/infer"


def fetch_metadata(target: Target, model: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """GET /v2/models/NAME (OIP model metadata)."""
    url = f"{target.base}/v2/models/{model}"
    try:
        with target.urlopen(url, timeout_s=timeout_s) as r:
            meta = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise BadInputError(f"GET {url} answered {e.code}; is {model!r} loaded there?") from e
    except (urllib.error.URLError, OSError) as e:
        raise BadInputError(f"could not GET {url} ({e}); is the server up?") from e
    except json.JSONDecodeError as e:
        raise BadInputError(f"GET {url} did not return JSON model metadata") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("inputs"), list):
        raise BadInputError(f"GET {url}: no 'inputs' in the model metadata")
    return meta


def _oip_body(tensors: list[tuple[str, str, list[int], list[Any]]]) -> bytes:
    return json.dumps({"inputs": [
        {"name": n, "datatype": dt, "shape": shape, "data": data}
        for n, dt, shape, data in tensors]}, separators=(",", ":")).encode()


def _random_tensor(spec: dict[str, Any], batch: int, rng: np.random.Generator
                   ) -> tuple[str, str, list[int], list[Any]]:
    name, dt = str(spec["name"]), str(spec["datatype"]).upper()
    shape = [batch if int(d) < 0 else int(d) for d in spec["shape"]]
    n = int(np.prod(shape)) if shape else 1
    data: list[Any]
    if dt.startswith("FP"):
        data = np.round(rng.standard_normal(n), 5).tolist()
    elif dt.startswith(("INT", "UINT")):
        data = [0] * n
    elif dt == "BOOL":
        data = rng.integers(0, 2, n).astype(bool).tolist()
    elif dt == "BYTES":
        data = ["x"] * n
    else:
        raise BadInputError(f"input {name!r} has datatype {dt}, which the sampler cannot build")
    return name, dt, shape, data


def oip_random(target: Target, model: str, metadata: dict[str, Any], *, batch: int = 1,
               count: int = POOL, seed: int = 0, version: int | None = None) -> list[RequestSpec]:
    if batch < 1:
        raise BadUsageError(f"--batch must be at least 1, got {batch}")
    rng = np.random.default_rng(seed)
    path = infer_path(target, model, version)
    try:
        return [RequestSpec(method="POST", path=path, body=_oip_body(
            [_random_tensor(s, batch, rng) for s in metadata["inputs"]])) for _ in range(count)]
    except (KeyError, TypeError, ValueError) as e:
        raise BadInputError(f"model metadata inputs are malformed ({e})") from e


def _latest_version(repo: Path, model: str) -> int:
    d = repo / model
    vs = sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit()) \
        if d.is_dir() else []
    if not vs:
        raise BadInputError(f"{d}: no model versions; train or publish {model!r} into {repo}")
    return vs[-1]


def flights(target: Target, *, model: str, repo: str | Path, data: str | Path | None = None,
            version: int | None = None, batch: int = 1, count: int = POOL,
            seed: int = 0) -> list[RequestSpec]:
    """OIP requests for a flights model from real (or random valid) feature rows."""
    if batch < 1:
        raise BadUsageError(f"--batch must be at least 1, got {batch}")
    root = Path(repo)
    ver = version if version is not None else _latest_version(root, model)
    # Imported here: polars (behind the contract) is only needed for flights payloads.
    from scalelab.layers.nets.flights import Preprocess

    fix = "--model-repo must hold a trained flights model"
    pre = Preprocess.read(root / model / str(ver))
    cfg_path = root / model / CONFIG_FILE
    cfg = read_json_object(cfg_path, fix=fix)
    try:
        names = [str(i["name"]) for i in cfg["inputs"]]
    except (KeyError, TypeError) as e:
        raise BadInputError(f"{cfg_path}: no list of named inputs ({e}); {fix}") from None
    if names != ["categorical", "numeric"]:
        raise BadInputError(f"{cfg_path}: inputs {names}; the flights sampler needs "
                            "[categorical, numeric]; use --payload oip for other models")
    rng = np.random.default_rng(seed)
    rows = count * batch
    cats, nums = pre.categorical, pre.numeric
    if data is not None:
        cat, num = _encode_rows(Path(data), pre, rows, rng)
    else:
        cat = np.stack([rng.integers(0, max(1, len(v)), rows) for v in cats.values()], axis=1) \
            if cats else np.zeros((rows, 0), dtype=np.int64)
        num = rng.standard_normal((rows, len(nums))).astype(np.float32)
    path = infer_path(target, model, version)
    specs = []
    for i in range(count):
        c = cat[i * batch:(i + 1) * batch]
        x = num[i * batch:(i + 1) * batch]
        specs.append(RequestSpec(method="POST", path=path, body=_oip_body([
            ("categorical", "INT64", [batch, len(cats)], c.reshape(-1).tolist()),
            ("numeric", "FP32", [batch, len(nums)],
             [round(float(v), 5) for v in x.reshape(-1)]),
        ])))
    return specs


def _encode_rows(data: Path, pre: Preprocess, rows: int, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Sample `rows` rows (with replacement) and encode them as training did (nets.flights)."""
    import polars as pl

    path = data / "test.parquet" if data.is_dir() else data
    if not path.is_file():
        raise BadInputError(f"--data {data}: no parquet file there (a dataset directory needs "
                            "test.parquet)")
    try:
        frame = pl.read_parquet(path, columns=[*pre.categorical, *pre.numeric])
    except Exception as e:  # polars raises several types for missing columns / bad files
        raise BadInputError(f"--data {path}: cannot read the feature columns ({e})") from e
    if frame.height == 0:
        raise BadInputError(f"--data {path}: no rows")
    frame = frame[rng.integers(0, frame.height, rows).tolist()]
    return pre.encode(frame, where=f"--data {path}")
