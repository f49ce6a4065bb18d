"""The schema file format (`scalelab.schema/1`): per column its type, nullability, null-rate
bound, range, domain, uniqueness and skew thresholds; the expected row count.

One reader and writer for every part: the data part infers and validates datasets against it
(data.schema), the online part validates arriving events against the same file (online.ingest).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.jsonfile import read_json_object

FORMAT = "scalelab.schema/1"
TYPES = ("integer", "float", "string", "boolean", "datetime", "date", "duration", "time", "other")


def logical_type(dtype: pl.DataType | str) -> str:
    """The schema's type of a polars dtype (or of its text form, as stored in statistics)."""
    t = str(dtype)
    if t.startswith(("Int", "UInt")):
        return "integer"
    if t.startswith(("Float", "Decimal")):
        return "float"
    if t in ("String", "Utf8") or t.startswith(("Categorical", "Enum")):
        return "string"
    for prefix, name in (("Boolean", "boolean"), ("Datetime", "datetime"), ("Date", "date"),
                         ("Duration", "duration"), ("Time", "time")):
        if t.startswith(prefix):
            return name
    return "other"


def type_ok(expected: str, actual: str) -> bool:
    # Integers widen to floats without loss of meaning; nothing else converts silently.
    return expected == actual or (expected == "float" and actual == "integer")


@dataclasses.dataclass(kw_only=True)
class SkewThresholds:
    """Drift/skew thresholds; a feature is flagged when any measure exceeds its threshold."""

    linf: float | None = 0.1
    """Categoricals: L-infinity distance between value distributions (TFDV's measure)."""
    js: float | None = 0.1
    """Numerics: Jensen-Shannon divergence (base 2, in [0, 1]) on shared bins."""
    psi: float | None = 0.2
    """Numerics: population stability index on shared bins (0.1-0.2 moderate, > 0.2 major)."""
    ks_pvalue: float | None = None
    """Numerics: flag when the two-sample KS p-value is below this. Off by default: on 100k+
    rows a KS test rejects for shifts far too small to matter."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)
                                  or not math.isfinite(v) or v < 0):
                raise BadInputError(f"skew threshold {f.name} must be a number >= 0 or null, "
                                    f"got {v!r}")


@dataclasses.dataclass(kw_only=True)
class ColumnSchema:
    """What one column must look like."""

    name: str
    type: str
    """One of TYPES; integer data is accepted where float is expected."""
    nullable: bool = True
    """False: any null is an anomaly."""
    max_null_rate: float | None = None
    """Largest accepted fraction of nulls (None: no bound beyond `nullable`)."""
    min: float | None = None
    """Smallest accepted value (numeric columns)."""
    max: float | None = None
    """Largest accepted value (numeric columns)."""
    domain: list[str] | None = None
    """Accepted values of a categorical column (None: any value)."""
    unique: bool = False
    """Every non-null value must occur once (a key)."""
    skew: dict[str, float | None] | None = None
    """Per-feature skew/drift thresholds overriding the schema's `skew_defaults`, e.g.
    {"psi": 0.3} or {"linf": null} (null turns that measure's flag off)."""

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise BadInputError(f"column {self.name!r}: type {self.type!r} is not one of "
                                f"{', '.join(TYPES)}")
        if self.max_null_rate is not None and not 0 <= self.max_null_rate <= 1:
            raise BadInputError(f"column {self.name!r}: max_null_rate must be in [0, 1]")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise BadInputError(f"column {self.name!r}: min {self.min} > max {self.max}")
        if self.skew is not None:
            _skew(self.skew, f"column {self.name!r}: skew")


@dataclasses.dataclass(kw_only=True)
class Schema:
    """A dataset's schema: its columns in order, the row count and the skew thresholds."""

    columns: list[ColumnSchema]
    expected_rows: int | None = None
    """Expected row count (None: not checked)."""
    row_tolerance: float = 0.1
    """Accepted relative change of the row count vs `expected_rows` or the previous dataset."""
    skew_defaults: SkewThresholds = dataclasses.field(default_factory=SkewThresholds)
    """Thresholds for features without their own `skew`."""

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise BadInputError(f"schema lists column(s) twice: {', '.join(dup)}")
        if self.row_tolerance < 0:
            raise BadInputError(f"row_tolerance must be >= 0, got {self.row_tolerance}")

    def column(self, name: str) -> ColumnSchema | None:
        return next((c for c in self.columns if c.name == name), None)

    def skew_for(self, name: str) -> SkewThresholds:
        c = self.column(name)
        if c is None or not c.skew:
            return self.skew_defaults
        return dataclasses.replace(self.skew_defaults, **c.skew)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT,
                "rows": {"expected": self.expected_rows, "tolerance": self.row_tolerance},
                "skew_defaults": dataclasses.asdict(self.skew_defaults),
                "columns": [{k: v for k, v in dataclasses.asdict(c).items()} for c in self.columns]}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")

    @classmethod
    def from_dict(cls, d: Any, where: str = "schema") -> Schema:
        """Parse, naming the first problem's location (e.g. `schema.json: columns[3].min`)."""
        obj = _obj(d, where, {"format", "rows", "skew_defaults", "columns"})
        if obj.get("format") != FORMAT:
            raise BadInputError(f"{where}: format must be {FORMAT!r}, got {obj.get('format')!r}")
        rows = _obj(obj.get("rows", {}), f"{where}: rows", {"expected", "tolerance"})
        cols_raw = obj.get("columns")
        if not isinstance(cols_raw, list):
            raise BadInputError(f"{where}: 'columns' must be a list of column objects")
        cols = []
        fields = {f.name for f in dataclasses.fields(ColumnSchema)}
        for i, c in enumerate(cols_raw):
            at = f"{where}: columns[{i}]"
            c = _obj(c, at, fields)
            if not isinstance(c.get("name"), str) or not c["name"]:
                raise BadInputError(f"{at}: 'name' must be a non-empty string")
            at = f"{at} ({c['name']})"
            domain = c.get("domain")
            if domain is not None and not (isinstance(domain, list)
                                           and all(isinstance(v, str) for v in domain)):
                raise BadInputError(f"{at}.domain: must be a list of strings or null")
            kw: dict[str, Any] = dict(
                name=c["name"], type=_typed(c, "type", str, at, required=True),
                nullable=_typed(c, "nullable", bool, at, default=True),
                max_null_rate=_num(c, "max_null_rate", at), min=_num(c, "min", at),
                max=_num(c, "max", at), domain=domain,
                unique=_typed(c, "unique", bool, at, default=False),
                skew=None if c.get("skew") is None else dict(
                    _obj(c["skew"], f"{at}.skew",
                         {f.name for f in dataclasses.fields(SkewThresholds)})))
            cols.append(_located(at, functools.partial(ColumnSchema, **kw)))
        expected = rows.get("expected")
        if expected is not None and (not isinstance(expected, int) or isinstance(expected, bool)
                                     or expected < 0):
            raise BadInputError(f"{where}: rows.expected must be a whole number >= 0 or null")
        tol = _num(rows, "tolerance", f"{where}: rows")
        return _located(where, lambda: cls(
            columns=cols, expected_rows=expected, row_tolerance=0.1 if tol is None else tol,
            skew_defaults=_skew(obj.get("skew_defaults", {}), f"{where}: skew_defaults")))

    @classmethod
    def load(cls, path: Path) -> Schema:
        d = read_json_object(
            path, fix="create a schema with `scalelab data infer DATA --out schema.json`"
        )
        return cls.from_dict(d, str(path))


_T = TypeVar("_T")


def _located(where: str, make: Callable[[], _T]) -> _T:
    """`make()`, its own checks' BadInputError prefixed with `where` (the file and the column)
    unless the message already starts with it."""
    try:
        return make()
    except BadInputError as e:
        if str(e).startswith(where.split(":")[0]):
            raise
        raise BadInputError(f"{where}: {e}") from None


def _obj(d: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise BadInputError(f"{where}: expected an object, got {type(d).__name__}")
    extra = sorted(set(d) - allowed)
    if extra:
        raise BadInputError(f"{where}: unknown key(s) {', '.join(map(repr, extra))}; "
                            f"allowed: {', '.join(sorted(allowed))}")
    return d


def _typed(d: dict[str, Any], key: str, t: type, at: str, *, required: bool = False,
           default: Any = None) -> Any:
    if key not in d:
        if required:
            raise BadInputError(f"{at}: missing {key!r}")
        return default
    v = d[key]
    if not isinstance(v, t):
        raise BadInputError(f"{at}.{key}: expected {t.__name__}, got {v!r}")
    return v


def _num(d: dict[str, Any], key: str, at: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise BadInputError(f"{at}.{key}: expected a finite number or null, got {v!r}")
    return float(v)


def _skew(d: Any, at: str) -> SkewThresholds:
    obj = _obj(d, at, {f.name for f in dataclasses.fields(SkewThresholds)})
    defaults = SkewThresholds()
    return SkewThresholds(**{k: obj.get(k, getattr(defaults, k)) for k in
                             (f.name for f in dataclasses.fields(SkewThresholds))})
