import pytest

from scalelab.lab.core.errors import BadInputError
from scalelab.lab.core.units import format_bytes, format_duration, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300.0),
        ("24h", 86400.0),
        ("30s", 30.0),
        ("10ms", 0.01),
        ("1.5h", 5400.0),
        ("2d", 172800.0),
        ("45", 45.0),
        ("250us", 0.00025),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "5 parsecs", "-3s", "1e3s"])
def test_bad_durations_name_the_flag(text: str) -> None:
    with pytest.raises(BadInputError, match="--mtbf"):
        parse_duration(text, what="--mtbf")


def test_sizes() -> None:
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("1000") == 1000
    with pytest.raises(BadInputError):
        parse_size("lots")


def test_formatting() -> None:
    assert format_duration(0.0123) == "12.3 ms"
    assert format_duration(7200) == "2 h"
    assert format_duration(30.56) == "30.6 s"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(100) == "100 B"


def test_numbers_for_people_are_3_significant_digits_with_units() -> None:
    from scalelab.lab.core.units import (
        format_metric,
        format_multiple,
        format_number,
        format_percent,
        sig,
    )

    assert format_number(70354, "samples/s") == "70.4k samples/s"
    assert format_number(999.6) == "1k" and format_number(1234567) == "1.23M"
    assert format_number(0.2373) == "0.237" and format_number(None) == "—"
    assert sig(0.000123) == "0.000123" and sig(2.0) == "2" and sig(-5.5) == "-5.5"
    assert format_bytes(3.399e8) == "324 MiB" and format_bytes(4 * 2**30) == "4 GiB"
    assert format_multiple(4.33333) == "4.33×" and format_multiple(10) == "10×"
    assert format_percent(0.9994) == "99.9%" and format_percent(0) == "0%"
    # availability short of 1 never rounds to 100%: the digits that differ are kept
    assert format_percent(0.99995) == "99.995%" and format_percent(1) == "100%"
    assert format_metric("peak_memory_bytes", 3.399e8) == "324 MiB"
    assert format_metric("p95_ms", 41.234) == "41.2 ms" and format_metric("p99_ms", 2300) == "2.3 s"
    assert format_metric("availability", 0.99) == "99%"
    assert format_metric("cost_per_unit_usd", 0.00123) == "$0.00123"
