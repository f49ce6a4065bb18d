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
