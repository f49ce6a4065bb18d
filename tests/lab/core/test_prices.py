"""The one price table: read from a scalelab.yaml, a file of prices, $SCALELAB_PRICES."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.prices import ENV, Prices, price_table, read_prices
from scalelab.lab.diagnose.config import load_config


def test_defaults_are_the_diagnose_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    table, where = price_table(None)
    assert where == "built-in defaults"
    assert table == load_config(None).prices
    assert (table.core_hour_usd, table.gpu_hour_usd) == (0.048, 3.0)


def test_a_scalelab_yaml_and_a_file_of_prices(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "scalelab.yaml"
    cfg.write_text("prices:\n  core_hour_usd: 0.1\nrepeats: 1\nstages: {}\n")
    # the same file diagnose reads gives the same table to every other command
    assert read_prices(cfg) == load_config(cfg).prices == Prices(core_hour_usd=0.1)
    flat = tmp_path / "prices.yaml"
    flat.write_text("gpu_hour_usd: 2.5\n")
    assert read_prices(flat) == Prices(gpu_hour_usd=2.5)
    monkeypatch.setenv(ENV, str(flat))
    table, where = price_table(None)
    assert (table.gpu_hour_usd, where) == (2.5, f"${ENV}={flat}")
    assert price_table(cfg)[0].core_hour_usd == 0.1  # a given file wins over the env
    assert Prices(core_hour_usd=0.05, gpu_hour_usd=2.0).hourly_usd(4, 1) == pytest.approx(2.2)


@pytest.mark.parametrize(("text", "message"), [
    ("prices:\n  core_hour_usd: -1\n", "core_hour_usd"),
    ("prices:\n  cpu_hour: 1\n", "known: core_hour_usd"),
    ("prices: [1, 2]\n", "must be a mapping"),
    ("- 1\n", "top level must be a mapping"),
    ("prices: {core_hour_usd: 1\n", "not valid YAML"),
])
def test_bad_tables_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(BadInputError, match=message):
        read_prices(f)
    with pytest.raises(BadInputError, match="does not exist"):
        read_prices(tmp_path / "missing.yaml")
