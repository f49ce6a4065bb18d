"""Every measured step's records get their energy: RAPL over the step where readable, else the
model on the core-seconds their cost charges (core/energy.py), at the one price table's watts
per core.

The runner wraps each step's tagger with `energy_tagger`; the meter starts when the step is
about to run and is read when its first record is tagged (the step's process has exited by
then). A step that writes one record gets all of its joules; one that writes several (levels,
variants) measured them in one interval, so its joules are shared out in proportion to the
core-seconds each record's own cost charged (none: the model applies).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from scalelab.lab.core.energy import (
    POWERCAP,
    RaplMeter,
    charged_core_seconds,
    share_by_core_seconds,
    with_energy,
)
from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.records import Record, read_records
from scalelab.lab.diagnose.schema import Prices
from scalelab.lab.diagnose.steps import Step, Tagger


class EnergyTagger:
    """A step's tagger followed by its energy (see the module docstring)."""

    def __init__(self, inner: Tagger | None, prices: Prices, records: Path | None,
                 root: Path = POWERCAP) -> None:
        self.inner, self.prices, self.records = inner, prices, records
        self.meter = RaplMeter(root).start()
        self._shares: dict[int, float | None] | None = None

    def _measured(self, r: Record) -> float | None:
        if self._shares is None:
            joules = self.meter.stop()
            self._shares = {}
            if joules is not None and self.records is not None and self.records.exists():
                try:
                    raw = read_records(self.records)
                except BadInputError:
                    raw = []
                if len(raw) == 1:  # e.g. a serving level, priced only by its stage's tagger
                    self._shares[_key(raw[0])] = joules
                else:
                    core = [charged_core_seconds(x, self.prices.core_hour_usd) for x in raw]
                    for x, j in zip(raw, share_by_core_seconds(joules, core), strict=True):
                        self._shares[_key(x)] = j
        return self._shares.get(_key(r))

    def __call__(self, r: Record) -> Record:
        measured = self._measured(r)
        tagged = self.inner(r) if self.inner else r
        return with_energy(tagged, core_hour_usd=self.prices.core_hour_usd,
                           watts_per_core=self.prices.watts_per_core, measured_j=measured)


def _key(r: Record) -> int:
    # a record is the same before and after the runner's tagging in these fields
    return hash((r.stage, r.variable, r.level, r.repeat, r.timestamp))


def energy_tagger(step: Step, prices: Prices) -> Step:
    """`step` with its tagger followed by the energy of each record."""
    return dataclasses.replace(step, tag=EnergyTagger(step.tag, prices, step.records))
