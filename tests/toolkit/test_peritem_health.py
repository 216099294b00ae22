"""The completion-health measures every eval writes (``autorl.toolkit.peritem``), on completions as models write them."""

from __future__ import annotations

import pytest

from autorl.toolkit.peritem import completion_health, evaluate_split, format_only, repeat_share


@pytest.mark.parametrize(
    "text,expected",
    [
        ("82", False),
        ("", False),
        ("=", True),
        ("+=", True),
        ("\\boxed{}", True),
        ("<answer></answer>", True),
        ("\\boxed{42}", False),
        ("The answer is 7.", False),
        ("**  **", True),
    ],
)
def test_format_only_is_an_answer_with_no_content(text, expected):
    assert format_only(text) is expected


def test_repeat_share_counts_repeated_ngrams():
    assert repeat_share("82") == 0.0  # too short to repeat a 3-gram
    assert repeat_share("123456") == 0.0  # every character 3-gram new
    assert repeat_share("77777777") == pytest.approx(5 / 6)  # one 3-gram, six times
    words = "so the answer is so the answer is so the answer is"
    assert repeat_share(words) == pytest.approx(1 - 4 / 10)  # word 3-grams once a completion has enough words


def test_health_of_a_split():
    outputs = [("82", False), ("", False), ("=", False), ("9999999", True)]
    h = completion_health("id", outputs)
    assert h["eval/id/length_mean"] == pytest.approx((2 + 0 + 1 + 7) / 4)
    assert h["eval/id/truncated_rate"] == 0.25 and h["eval/id/empty_rate"] == 0.25
    assert h["eval/id/format_only_rate"] == 0.25
    assert h["eval/id/repeat_mean"] == pytest.approx((1 - 1 / 5) / 4)


def test_a_task_judge_scores_the_same_completions_independently():
    """The reward's judge passes anything long; the task's exact match does not: both are written per item."""
    gen = lambda prompts, t: [("82", False), ("12345", False)]  # noqa: E731
    loose = lambda text, label, tr: float(len(text) >= 2)  # noqa: E731
    exact = lambda text, label, tr: float(text == label)  # noqa: E731
    out = evaluate_split(gen, "id", ["37+45=", "1+1="], ["82", "2"], loose, task_judge=exact)
    assert out["eval/id/items"] == [1, 1] and out["eval/id/task_items"] == [1, 0]
    assert out["eval/id/task_pass@1"] == 0.5 and out["eval/id/greedy_pass@1"] == 1.0
