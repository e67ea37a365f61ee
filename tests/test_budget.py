import re

import pytest

from ckptplan.errors import CkptplanError
from ckptplan.values.budget import format_budget_at_least, format_bytes, parse_budget

pytestmark = pytest.mark.torchfree


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12GB", 12 * 10**9),
        ("12 gb", 12 * 10**9),
        ("11.5GiB", int(11.5 * 2**30)),
        ("800MB", 800 * 10**6),
        ("512MiB", 512 * 2**20),
        ("3000000000", 3_000_000_000),
        ("1e9", 10**9),
        ("64KiB", 65536),
        ("12G", 12 * 10**9),
        ("12gb", 12 * 10**9),
        ("12Gi", 12 * 2**30),
        ("12M", 12 * 10**6),
        ("12K", 12 * 10**3),
        ("12kB", 12 * 10**3),
        ("12T", 12 * 10**12),
        ("1", 1),
        ("1001", 1001),
        ("64B", 64),
    ],
)
def test_absolute_budgets(text: str, expected: int) -> None:
    assert parse_budget(text).resolve(unchecked_peak=1) == expected


@pytest.mark.parametrize(("text", "fraction"), [("0.6", 0.6), ("60%", 0.6), ("1.0", 1.0)])
def test_fractions_of_the_unchecked_peak(text: str, fraction: float) -> None:
    assert parse_budget(text).resolve(unchecked_peak=1000) == int(fraction * 1000)


@pytest.mark.parametrize("text", ["12XB", "twelve", "", "-1GB", "0", "1.5", "GB12"])
def test_malformed_budgets_are_one_line_errors(text: str) -> None:
    with pytest.raises(CkptplanError) as info:
        parse_budget(text)
    message = str(info.value)
    assert "\n" not in message
    assert "12GB" in message


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("60", "budget '60' is 60 bytes: did you mean 60% or 60GB?"),
        ("2", "did you mean 2% or 2GB?"),
        ("800", "did you mean 800MB or 800GB?"),
        ("1000", "did you mean 1000MB or 1000GB?"),
    ],
)
def test_a_bare_number_too_small_for_any_step_is_refused_with_a_hint(text: str, hint: str) -> None:
    """A forgotten unit: refused when parsed, before any profiling (``1`` stays one byte)."""
    with pytest.raises(CkptplanError, match=re.escape(hint)):
        parse_budget(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("12Gb", "budget '12Gb' is gigabits; write 12GB for gigabytes"),
        ("12Mb", "is megabits; write 12MB for megabytes"),
        ("12Gbit", "is gigabits; write 12GB for gigabytes"),
        ("1.5gbits", "is gigabits; write 1.5GB for gigabytes"),
        ("12Gib", "is gibibits; write 12GiB for gibibytes"),
        ("12Kb", "is kilobits; write 12KB for kilobytes"),
    ],
)
def test_bit_units_are_refused(text: str, message: str) -> None:
    with pytest.raises(CkptplanError, match=re.escape(message)):
        parse_budget(text)


def test_formatting() -> None:
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_bytes(1536) == "1.50 KiB"
    assert parse_budget(format_budget_at_least(123_456_789)).resolve(1) >= 123_456_789
