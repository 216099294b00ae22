import pytest

from autorl.budget import format_duration, parse_duration
from autorl.errors import BudgetError


@pytest.mark.parametrize(
    "text, seconds",
    [("90m", 5400), ("24h", 86400), ("1h30m", 5400), ("2d", 172800), ("45s", 45), ("1.5h", 5400), (" 2m ", 120)],
)
def test_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "tomorrow", "10x", "1h1h", "-5m", "0", "m"])
def test_bad_budget(text):
    with pytest.raises(BudgetError, match="budget"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["10", "120", "1.5"])
def test_a_number_without_a_unit_says_which_units(text):
    with pytest.raises(BudgetError, match=f"budget '{text}' has no unit: write {text}m for minutes, {text}h for hours"):
        parse_duration(text)


def test_cli_budget_without_a_unit_is_one_line_and_exit_2(tmp_path):
    from tests.conftest import run_cli

    assert run_cli("init", str(tmp_path / "ws")).returncode == 0
    r = run_cli("-C", str(tmp_path / "ws"), "run", "--budget", "10")
    assert r.returncode == 2 and r.stderr.strip() == (
        "autorl: error: budget '10' has no unit: write 10m for minutes, 10h for hours or 10s for seconds"
    )
    assert not (tmp_path / "ws" / "ledger.sqlite").exists()


def test_format():
    assert format_duration(3725) == "1h02m"
    assert format_duration(65) == "1m05s"
    assert format_duration(9) == "9s"
