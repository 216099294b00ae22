import pytest

from autorl.budget import format_duration, parse_duration
from autorl.errors import BudgetError


@pytest.mark.parametrize("text, seconds", [("90m", 5400), ("24h", 86400), ("1h30m", 5400), ("2d", 172800),
                                           ("45s", 45), ("120", 120), ("1.5h", 5400), (" 2m ", 120)])
def test_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "tomorrow", "10x", "1h1h", "-5m", "0", "m"])
def test_bad_budget(text):
    with pytest.raises(BudgetError, match="budget"):
        parse_duration(text)


def test_format():
    assert format_duration(3725) == "1h02m"
    assert format_duration(65) == "1m05s"
    assert format_duration(9) == "9s"
