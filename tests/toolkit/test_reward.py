"""The built-in exact-match reward: extraction and normalisation, case by case; custom reward loading."""

import pytest

from autorl.toolkit.reward import (
    RewardError,
    answers_match,
    extract_answer,
    load_reward,
    math_exact_match,
    normalise,
    score,
    string_exact_match,
)


@pytest.mark.parametrize(
    "text,answer,method",
    [
        (r"so the answer is \boxed{42}.", "42", "boxed"),
        (r"\boxed{1} then \boxed{2}", "2", "boxed"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", "boxed"),
        (r"\boxed{a_{b_{c}}} done", "a_{b_{c}}", "boxed"),
        ("3 apples and 5 pears, total 8", "8", "last_number"),
        ("it costs 1,000 dollars", "1,000", "last_number"),
        ("about -3.5 degrees", "-3.5", "last_number"),
        ("no digits here", None, "none"),
        (r"\boxed{12", "12", "last_number"),  # unbalanced box: fall back to the last number
        (
            "<|channel|>analysis<|message|>maybe 7<|end|><|channel|>final<|message|>It is 9<|return|>",
            "9",
            "last_number",
        ),
    ],
)
def test_extraction(text, answer, method):
    assert extract_answer(text) == (answer, method)


@pytest.mark.parametrize(
    "raw,norm",
    [
        ("$42$", "42"),
        (r"\(x+1\)", "x+1"),
        (r"\text{yes}", "yes"),
        (r"\textbf{7}", "7"),
        (r"\mathrm{cm}", "cm"),
        (r"\mathbf{\text{v}}", "v"),
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\tfrac{3}{4}", r"\frac{3}{4}"),
        ("a   b\n c", "a b c"),
        ("1,000,000", "1000000"),
        ("042", "42"),
        ("-007", "-7"),
        ("0.5", "0.5"),
        ("0", "0"),
        ("42.", "42"),
        ("  $ 12 $ ", "12"),
    ],
)
def test_normalisation(raw, norm):
    assert normalise(raw) == norm


@pytest.mark.parametrize(
    "answer,label,match",
    [
        ("42", "42", True),
        ("42.0", "42", True),
        ("0.3333333", "0.33333330001", True),
        ("0.334", "0.333", False),
        ("1,000", "1000", True),
        (r"\dfrac{1}{2}", r"\frac{1}{2}", True),
        ("x+1", "x + 1", False),
        ("1e6", "1000000", True),
        ("41", "42", False),
    ],
)
def test_matching(answer, label, match):
    assert answers_match(answer, label) is match


def test_math_reward_fields():
    out = math_exact_match(r"thus \boxed{$1,024$}", "1024", truncated=False)
    assert out == {
        "reward": 1.0,
        "correctness": 1.0,
        "has_answer": 1.0,
        "has_boxed": 1.0,
        "parse_method": 2.0,
        "truncated": 0.0,
    }
    miss = math_exact_match("no idea", "5", truncated=True)
    assert (
        miss["reward"] == 0.0 and miss["has_answer"] == 0.0 and miss["parse_method"] == 0.0 and miss["truncated"] == 1.0
    )


def test_builtin_task_reward_is_plain_string_match():
    assert string_exact_match("82", "82")["reward"] == 1.0
    assert string_exact_match("082", "82")["reward"] == 0.0
    assert string_exact_match("82<pad>", "82")["reward"] == 0.0
    assert load_reward("builtin:exact_match", builtin_task=True)[0] is string_exact_match
    assert load_reward("builtin:exact_match", builtin_task=False)[0] is math_exact_match


def test_custom_reward_from_file_and_module(tmp_path, monkeypatch):
    (tmp_path / "myreward.py").write_text(
        "def reward(completion, label):\n    return {'reward': 0.5, 'note': 'x'}\n"
        "def plain(completion, label):\n    return len(completion)\n"
    )
    fn, builtin = load_reward(str(tmp_path / "myreward.py"), True)
    assert not builtin and score(fn, builtin, "abc", "x", False) == {
        "reward": 0.5,
        "correctness": 0.0,
        "truncated": 0.0,
    }
    monkeypatch.syspath_prepend(str(tmp_path))
    fn, _ = load_reward("myreward:plain", False)
    assert score(fn, False, "abc", "x", True) == {"reward": 3.0, "correctness": 1.0, "truncated": 1.0}


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("nosuchmodule_xyz:reward", "failed to import"),
        ("json:no_such_function", "has no function"),
        ("/nonexistent/reward.py", "not found"),
        ("builtin:fuzzy", "unknown built-in reward"),
        ("justaname", "neither module:function"),
    ],
)
def test_bad_reward_specs_are_user_errors(spec, fragment):
    with pytest.raises(RewardError, match=fragment):
        load_reward(spec, True)


def test_reward_file_that_raises_on_import(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RewardError, match="RuntimeError: boom"):
        load_reward(str(path), True)


def test_bad_return_type(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def reward(c, l):\n    return 'yes'\n")
    fn, builtin = load_reward(str(path), True)
    with pytest.raises(RewardError, match="returned str"):
        score(fn, builtin, "a", "b", False)
