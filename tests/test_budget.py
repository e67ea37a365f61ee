import pytest

from ckptplan.budget import format_budget_at_least, format_bytes, parse_budget
from ckptplan.errors import CkptplanError

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


def test_formatting() -> None:
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_bytes(1536) == "1.50 KiB"
    assert parse_budget(format_budget_at_least(123_456_789)).resolve(1) >= 123_456_789
