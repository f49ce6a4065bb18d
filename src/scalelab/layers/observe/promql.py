"""A small PromQL parser: checks the expressions the dashboard and the rules are made of, and
lists the metric names they read.

It covers the language those expressions use (selectors with matchers, range selectors,
aggregations with by/without, function calls, binary operators with precedence, `bool`,
`on`/`ignoring`, numbers, strings) and checks value types the way Prometheus does: `rate`
wants a range vector, `histogram_quantile` a scalar and an instant vector, a range vector is no
operand of arithmetic. `promtool check rules` is the full check where Debian's prometheus
package is installed; this one runs everywhere, so a malformed expression never ships. Grafana's
`$__rate_interval` and `$__interval` are read as durations (Grafana substitutes them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from scalelab.lab.core.errors import BadInputError

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<duration>\[\s*(?:\$__rate_interval|\$__interval|(?:\d+(?:ms|s|m|h|d|w|y))+)
        (?:\s*:\s*(?:(?:\d+(?:ms|s|m|h|d|w|y))+)?)?\s*\])
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){},])
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
""", re.VERBOSE)

AGGREGATIONS = {"sum", "avg", "min", "max", "count", "stddev", "stdvar", "group", "topk",
                "bottomk", "quantile", "count_values"}
_PARAM_AGG = {"topk", "bottomk", "quantile", "count_values"}
# function -> argument types ("v" instant vector, "m" range vector, "s" scalar), result type
FUNCTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "rate": (("m",), "v"), "irate": (("m",), "v"), "increase": (("m",), "v"),
    "delta": (("m",), "v"), "avg_over_time": (("m",), "v"), "max_over_time": (("m",), "v"),
    "min_over_time": (("m",), "v"), "sum_over_time": (("m",), "v"),
    "histogram_quantile": (("s", "v"), "v"), "clamp_min": (("v", "s"), "v"),
    "clamp_max": (("v", "s"), "v"), "abs": (("v",), "v"), "absent": (("v",), "v"),
    "vector": (("s",), "v"), "scalar": (("v",), "s"), "time": ((), "s"),
}
_BINARY = [{"or"}, {"and", "unless"}, {"==", "!=", "<=", "<", ">=", ">"}, {"+", "-"},
           {"*", "/", "%", "atan2"}, {"^"}]
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass
class Parsed:
    """What an expression reads: its value type and the metric names of its selectors."""

    type: str
    """"vector", "scalar", "matrix" (range vector) or "string"."""
    metrics: set[str] = field(default_factory=set)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise BadInputError(f"PromQL {expr!r}: unexpected {expr[pos:pos + 12]!r} at "
                                f"column {pos + 1}")
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append((kind, m.group()))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.toks = _tokens(expr)
        self.i = 0
        self.metrics: set[str] = set()

    def fail(self, why: str) -> BadInputError:
        at = self.toks[self.i][1] if self.i < len(self.toks) else "the end"
        return BadInputError(f"PromQL {self.expr!r}: {why} (at {at!r})")

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def kind(self) -> str | None:
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> str:
        if self.i >= len(self.toks):
            raise self.fail(f"expected {want!r}" if want else "unexpected end")
        tok = self.toks[self.i][1]
        if want is not None and tok != want:
            raise self.fail(f"expected {want!r}")
        self.i += 1
        return tok

    def labels(self) -> None:
        self.label_list("(", ")", lambda: None)

    def label_list(self, open_: str, close: str, after_name: Callable[[], None]) -> None:
        """`open_` label names, each followed by what `after_name` reads, comma-separated (a
        trailing comma allowed), `close`."""
        self.take(open_)
        while self.peek() != close:
            name = self.take()
            if not _LABEL.match(name):
                raise self.fail(f"{name!r} is not a label name")
            after_name()
            if self.peek() == ",":
                self.take(",")
        self.take(close)

    def parse(self) -> Parsed:
        out = self.binary(0)
        if self.i != len(self.toks):
            raise self.fail("unexpected token")
        return Parsed(type=out, metrics=self.metrics)

    def binary(self, level: int) -> str:
        if level == len(_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in _BINARY[level]:
            op = self.take()
            if self.peek() == "bool":
                self.take()
            if self.peek() in ("on", "ignoring"):
                self.take()
                self.labels()
                if self.peek() in ("group_left", "group_right"):
                    self.take()
                    if self.peek() == "(":
                        self.labels()
            # ^ is right-associative; the rest are left-associative
            right = self.binary(level if op == "^" else level + 1)
            for side in (left, right):
                if side in ("matrix", "string"):
                    raise self.fail(f"a {side} is no operand of {op!r}")
            if op in ("and", "or", "unless") and "scalar" in (left, right):
                raise self.fail(f"{op!r} needs vectors on both sides")
            left = "scalar" if left == right == "scalar" else "vector"
        return left

    def unary(self) -> str:
        if self.peek() in ("-", "+"):
            self.take()
            t = self.unary()
            if t not in ("scalar", "vector"):
                raise self.fail("unary minus needs a number or a vector")
            return t
        return self.postfix()

    def postfix(self) -> str:
        t = self.primary()
        if self.kind() == "duration":
            if t != "vector":
                raise self.fail("a range needs an instant vector before it")
            self.take()
            t = "matrix"
        if self.peek() == "offset":
            self.take()
            self.take()
        return t

    def primary(self) -> str:
        kind, tok = (self.toks[self.i] if self.i < len(self.toks) else (None, None))
        if tok is None:
            raise self.fail("unexpected end")
        if kind == "number":
            self.take()
            return "scalar"
        if kind == "string":
            self.take()
            return "string"
        if tok == "(":
            self.take()
            t = self.binary(0)
            self.take(")")
            return t
        if tok == "{":
            self.matchers()
            return "vector"
        if kind != "ident":
            raise self.fail("expected an expression")
        self.take()
        if tok in AGGREGATIONS:
            return self.aggregation(tok)
        if self.peek() == "(":
            return self.call(tok)
        if not _NAME.match(tok):
            raise self.fail(f"{tok!r} is not a metric name")
        self.metrics.add(tok)
        if self.peek() == "{":
            self.matchers()
        return "vector"

    def matchers(self) -> None:
        self.label_list("{", "}", self.matcher)

    def matcher(self) -> None:
        """The operator and quoted value after a label name; a regex must compile."""
        if self.take() not in ("=", "!=", "=~", "!~"):
            self.i -= 1
            raise self.fail("expected a matcher (=, !=, =~, !~)")
        if self.kind() != "string":
            raise self.fail("a label matcher needs a quoted value")
        value = self.take()
        if self.toks[self.i - 2][1] in ("=~", "!~"):
            try:
                re.compile(value[1:-1].encode().decode("unicode_escape"))
            except re.error as e:
                raise self.fail(f"bad regex {value}: {e}") from None

    def aggregation(self, op: str) -> str:
        if self.peek() in ("by", "without"):
            self.take()
            self.labels()
        self.take("(")
        if op in _PARAM_AGG:
            p = self.binary(0)
            if p not in ("scalar", "string"):
                raise self.fail(f"{op}'s parameter must be a number or string")
            self.take(",")
        t = self.binary(0)
        if t != "vector":
            raise self.fail(f"{op} needs an instant vector, not a {t}")
        self.take(")")
        if self.peek() in ("by", "without"):
            self.take()
            self.labels()
        return "vector"

    def call(self, name: str) -> str:
        if name not in FUNCTIONS:
            raise self.fail(f"unknown function {name!r}")
        want, result = FUNCTIONS[name]
        self.take("(")
        got = []
        while self.peek() != ")":
            got.append(self.binary(0))
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        names = {"v": "vector", "m": "matrix", "s": "scalar"}
        if [names[w] for w in want] != got:
            raise self.fail(f"{name} takes ({', '.join(names[w] for w in want)}), "
                            f"got ({', '.join(got)})")
        return names[result]


def parse(expr: str) -> Parsed:
    """Check `expr`; raises BadInputError naming the problem and where it is."""
    if not expr.strip():
        raise BadInputError("PromQL: empty expression")
    return _Parser(expr).parse()


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects (after checking it)."""
    return parse(expr).metrics
