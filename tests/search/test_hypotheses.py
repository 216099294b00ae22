"""The hypotheses library: loading, validation, search spaces, status and ranking."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autorl.engine.config import EngineConfig
from autorl.judge.diagnose import bottleneck_names, diagnose, diagnose_run, symptom_names
from autorl.ledger import Trial
from autorl.recipe import Objective, SearchParam, VerdictSettings, params_model, validate_recipe
from autorl.search.hypotheses import (
    DEMOTE_AFTER,
    SHIPPED_DIR,
    HypothesisError,
    can_change,
    describe_space,
    fixed_values,
    load_hypothesis,
    load_library,
    probe_params,
    rank,
    resolve_search,
    seed_params,
    status,
    study_name,
)
from autorl.search.hypotheses_strategy import MAX_CHAIN, continuation, fingerprint, parent_of
from autorl.search.optuna_study import Search, study_names
from autorl.states import Proposer, TrialStatus, Verdict

ROOT = Path(__file__).resolve().parents[2]
INCUMBENT = EngineConfig().model_dump(mode="json")


@pytest.fixture(scope="module")
def library():
    return load_library([SHIPPED_DIR])


def by_id(library, hid):
    return next(h for h in library if h.id == hid)


def write(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / "hypotheses"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(text)
    return p


GOOD = """---
id: x01-test
title: A test hypothesis
priority: medium
symptoms: [flat_learning]
overrides: {scale_rewards: false}
search:
  lr: {scale: [1.0, 4.0], log: true}
success: {confirm: it improves, refute: it does not}
backends: [embedded]
---
Body text.
"""


# ---------------------------------------------------------------- the shipped library


def test_shipped_library_loads_and_validates(library):
    ids = [h.id for h in library]
    assert ids == sorted(ids) and len(ids) == len(set(ids)) >= 18
    assert all(h.body and h.source and h.success.confirm for h in library)
    for n in range(1, 7):  # seed 002's H01..H06
        assert any(i.startswith(f"h0{n}-") for i in ids)


def test_playbook_rows_each_have_a_hypothesis(library):
    rows = ["flat_learning", "instability", "reward_hacking", "loss_grad_spikes", "length_collapse", "high_truncation"]
    for row in rows:
        assert any(row in h.symptoms and h.actionable() and h.applies_to("embedded") for h in library), row


def test_every_symptom_has_an_embedded_hypothesis(library):
    runnable = [h for h in library if h.actionable() and h.applies_to("embedded")]
    for name in symptom_names():
        assert any(name in h.symptoms for h in runnable), name


RUNNABLE = [h.id for h in load_library([SHIPPED_DIR]) if h.actionable() and h.applies_to("embedded")]


@pytest.mark.parametrize("hid", RUNNABLE)
def test_each_runnable_hypothesis_builds_valid_recipes(library, hid):
    """Its fixed values plus the first and the extreme points of its space validate as embedded recipes."""
    h = by_id(library, hid)
    space = resolve_search(h, INCUMBENT, {})
    points = [seed_params(space, INCUMBENT)]
    points += [{k: (p.choices[-1] if p.choices else _top(p)) for k, p in space.items()}]
    for point in points:
        recipe = validate_recipe({"backend": "embedded", "train": {**fixed_values(h, INCUMBENT), **point}})
        assert all(recipe.train[k] == v for k, v in {**h.overrides, **point}.items())


def _importable(backend: str) -> bool:
    try:
        params_model(backend)
    except ImportError:
        return False
    return True


REQUIRED = {"openrlhf": {"pretrain": "some/model", "prompt_data": "prompts.jsonl"}}
PAIRS = [
    (h.id, b)
    for h in load_library([SHIPPED_DIR])
    if h.actionable()
    for b in (h.backends or [])
    if b != "embedded" and _importable(b)
]


@pytest.mark.parametrize("hid,backend", PAIRS)
def test_runnable_hypotheses_fit_their_other_backends(library, hid, backend):
    """On each listed backend, the fixed values and the space's end points validate as that backend's recipe."""
    h = by_id(library, hid)
    base = {**REQUIRED.get(backend, {})}
    incumbent = params_model(backend).model_validate(base).model_dump(mode="json")
    space = resolve_search(h, incumbent, {})
    for point in (
        seed_params(space, incumbent),
        {k: (p.choices[-1] if p.choices else _top(p)) for k, p in space.items()},
    ):
        train = {**base, **h.overrides, **point}
        validate_recipe({"backend": backend, "train": train})


def _top(p: SearchParam):
    return int(p.high) if p.int else p.high


def test_docs_cover_symptoms_bottlenecks_and_library(library):
    text = (ROOT / "docs" / "hypotheses.md").read_text()
    for name in symptom_names() + bottleneck_names() + [h.id for h in library]:
        assert re.search(rf"\b{re.escape(name)}\b", text), name


# ---------------------------------------------------------------- malformed files

BAD = [
    ("no front matter", lambda t: t.replace("---\n", "", 1), "front matter"),
    ("bad yaml", lambda t: t.replace("priority: medium", "priority: [medium"), "not valid YAML"),
    (
        "unknown field",
        lambda t: t.replace("priority: medium", "priorty: medium"),
        "unknown key 'priorty': did you mean 'priority'",
    ),
    ("bad priority", lambda t: t.replace("priority: medium", "priority: urgent"), "priority: Input should be"),
    ("missing title", lambda t: t.replace("title: A test hypothesis\n", ""), "'title' is missing"),
    (
        "unknown symptom",
        lambda t: t.replace("[flat_learning]", "[flat_lerning]"),
        "'symptoms': unknown name 'flat_lerning': did you mean 'flat_learning'",
    ),
    ("unknown train key", lambda t: t.replace("scale_rewards: false", "learning_rate: 0.1"), "overrides.learning_rate"),
    ("bad override value", lambda t: t.replace("scale_rewards: false", "loss_type: ppo"), "overrides.loss_type"),
    ("two range forms", lambda t: t.replace("{scale: [1.0, 4.0], log: true}", "{scale: [1, 4], low: 1}"), "search.lr"),
    ("int key without int", lambda t: t.replace("lr: {scale", "gens: {scale"), "search.gens"),
    (
        "bad choice",
        lambda t: t.replace("lr: {scale: [1.0, 4.0], log: true}", "loss_type: {choices: [grpo, ppo]}"),
        "search.loss_type",
    ),
    (
        "key fixed and searched",
        lambda t: t.replace("scale_rewards: false", "lr: 0.001"),
        "'search.lr' is also in overrides",
    ),
    ("id mismatch", lambda t: t.replace("id: x01-test", "id: x02-test"), "'id'"),
    ("missing patch", lambda t: t.replace("backends:", "patch: patches/nope.patch\nbackends:"), "'patch'"),
    ("reserved field", lambda t: t.replace("backends:", "body: hi\nbackends:"), "'body'"),
    ("patch outside, absolute", lambda t: t.replace("backends:", "patch: /etc/passwd\nbackends:"), "is outside"),
    (
        "patch outside, relative",
        lambda t: t.replace("backends:", "patch: ../../../../etc/passwd\nbackends:"),
        "is outside",
    ),
    (
        "infinite scale",
        lambda t: t.replace("{scale: [1.0, 4.0], log: true}", "{scale: [1.0, .inf], log: true}"),
        "search.lr",
    ),
    ("infinite override", lambda t: t.replace("scale_rewards: false", "max_grad_norm: .inf"), "not a finite number"),
    ("NUL in patch", lambda t: t.replace("backends:", 'patch: "patches/a\\0b.patch"\nbackends:'), "'patch'"),
]


@pytest.mark.parametrize("case,edit,field", BAD, ids=[b[0] for b in BAD])
def test_malformed_file_names_file_and_field(tmp_path, case, edit, field):
    path = write(tmp_path, "x01-test.md", edit(GOOD))
    with pytest.raises(HypothesisError) as exc:
        load_library([path.parent])
    msg = str(exc.value)
    assert str(path) in msg and field in msg, msg
    assert "\n" not in msg


def test_good_file_loads_with_patch(tmp_path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "terse.patch").write_text("--- a/x\n+++ b/x\n")
    path = write(tmp_path, "x01-test.md", GOOD.replace("backends:", "patch: patches/terse.patch\nbackends:"))
    h = load_hypothesis(path)
    assert h.patch_path() == (tmp_path / "patches" / "terse.patch").resolve()
    assert h.body == "Body text." and h.overrides == {"scale_rewards": False}


def test_later_folder_overrides_earlier(tmp_path, library):
    write(tmp_path, "h13-flat-learning.md", GOOD.replace("x01-test", "h13-flat-learning"))
    merged = load_library([SHIPPED_DIR, tmp_path / "hypotheses"])
    assert len(merged) == len(library)
    assert by_id(merged, "h13-flat-learning").title == "A test hypothesis"


@pytest.mark.parametrize("edit", [lambda t: t.replace("\n", "\r\n"), lambda t: "\ufeff" + t], ids=["crlf", "bom"])
def test_a_file_saved_with_windows_line_ends_or_a_byte_order_mark_loads(tmp_path, edit):
    """Recipes load either way; a hypothesis was refused as having "no YAML front matter"."""
    path = tmp_path / "hypotheses"
    path.mkdir()
    (path / "x01-test.md").write_bytes(edit(GOOD).encode())
    (h,) = load_library([path])
    assert h.id == "x01-test" and h.overrides == {"scale_rewards": False}


def test_a_relative_range_past_the_largest_number_is_refused_where_it_resolves(tmp_path):
    """`scale: [1e308, 1e308]` of an incumbent 200 overflowed inside a study (a traceback after its baseline); it is
    a HypothesisError there, which the strategy takes as "passed over", not the end of the study."""
    text = GOOD.replace("lr: {scale: [1.0, 4.0], log: true}", "steps: {scale: [1.0e308, 1.0e308], int: true}")
    h = load_hypothesis(write(tmp_path, "x01-test.md", text))
    with pytest.raises(HypothesisError, match="past the largest number"):
        resolve_search(h, {**INCUMBENT, "steps": 200}, {})


def test_missing_folder_is_a_user_error(tmp_path):
    with pytest.raises(HypothesisError, match="not found"):
        load_library([tmp_path / "nope"])


# ---------------------------------------------------------------- search spaces


def test_relative_range_resolves_against_incumbent(library):
    h = by_id(library, "h13-flat-learning")
    space = resolve_search(h, {**INCUMBENT, "lr": 1e-4, "kl_coef": 0.2, "gens": 8}, {})
    assert set(space) == set(h.search)
    assert (space["lr"].low, space["lr"].high, space["lr"].log) == (pytest.approx(1.5e-4), pytest.approx(1e-2), True)
    assert (space["kl_coef"].low, space["kl_coef"].high) == (0.0, pytest.approx(0.2))
    assert (space["gens"].low, space["gens"].high, space["gens"].int) == (8, 16, True)
    assert "lr=[0.00015, 0.01] log" in describe_space(space)


def test_recipe_search_limits_the_space(library):
    h = by_id(library, "h13-flat-learning")
    limits = {"lr": SearchParam(low=1e-6, high=5e-4, log=True), "gens": SearchParam(choices=[4, 8])}
    space = resolve_search(h, {**INCUMBENT, "lr": 1e-4}, limits)
    assert space["lr"].high == pytest.approx(5e-4) and space["lr"].low == pytest.approx(1.5e-4)
    out = resolve_search(h, {**INCUMBENT, "lr": 1e-3}, limits)  # range lies wholly above the limit
    assert out["lr"].low == out["lr"].high == pytest.approx(5e-4)
    choices = resolve_search(
        by_id(library, "h03-kl-divergence"), INCUMBENT, {"kl_coef": SearchParam(choices=[0.0, 0.2, 5.0])}
    )
    assert choices["kl_coef"].choices == [0.0, 0.2]


def test_relative_log_range_needs_positive_incumbent(library):
    with pytest.raises(HypothesisError, match="lr"):
        resolve_search(by_id(library, "h13-flat-learning"), {**INCUMBENT, "lr": 0.0}, {})


def test_fixed_values_and_seed_point(library):
    h = by_id(library, "h01-advantage-scaling")
    fixed = fixed_values(h, INCUMBENT)
    assert fixed["scale_rewards"] is False and fixed["loss_type"] == "dr_grpo" and fixed["lr"] == INCUMBENT["lr"]
    space = resolve_search(h, INCUMBENT, {})
    assert seed_params(space, INCUMBENT) == {"lr": INCUMBENT["lr"]}  # scale [1, 4]: the incumbent is the low end
    h13 = by_id(library, "h13-flat-learning")
    point = seed_params(resolve_search(h13, INCUMBENT, {}), INCUMBENT)
    assert point["lr"] == pytest.approx(1.5 * INCUMBENT["lr"]) and isinstance(point["gens"], int)


def test_study_name_moves_with_incumbent(library):
    h = by_id(library, "h13-flat-learning")
    a = study_name(h, INCUMBENT)
    assert a.startswith("autorl/h13-flat-learning/") and a == study_name(h, dict(INCUMBENT))
    assert study_name(h, {**INCUMBENT, "lr": 3e-4}) != a
    assert study_name(h, {**INCUMBENT, "seed": 7}) == a  # keys outside the hypothesis do not matter


# ---------------------------------------------------------------- status


def trials_for(hid: str, verdicts: list) -> list[Trial]:
    """Trials of ``hid``: a verdict, or (verdict, half-width of its 95 % interval around 0)."""
    out = []
    for v in verdicts:
        v, half = v if isinstance(v, tuple) else (v, None)
        ci = {"ci_low": -half, "ci_high": half} if half is not None else {}
        out.append(Trial(hypothesis=hid, verdict=v, status=TrialStatus.COMPLETE if v else TrialStatus.RUNNING, **ci))
    return out


IMPROVED, REGRESSED, FLAT, CRASH, PRUNED = Verdict
STATUS_CASES = [
    ([], "pending", "low"),
    ([None], "testing", "low"),
    ([IMPROVED], "validated", "medium"),
    ([IMPROVED, IMPROVED], "validated", "high"),
    ([IMPROVED, REGRESSED], "inconclusive", "medium"),
    ([FLAT], "inconclusive", "low"),
    ([FLAT, REGRESSED], "inconclusive", "low"),  # a flat trial without an interval says nothing
    ([(FLAT, 0.01), REGRESSED], "invalidated", "medium"),  # this one could see +0.014: evidence against
    ([(FLAT, 0.05), (FLAT, 0.05)], "inconclusive", "low"),  # +-0.05 could see only +0.071, not 0.03
    ([(FLAT, 0.01), (FLAT, 0.015)], "invalidated", "medium"),
    ([REGRESSED, REGRESSED, FLAT], "invalidated", "high"),
    ([CRASH, PRUNED], "inconclusive", "low"),
    ([CRASH, None], "testing", "low"),
]


@pytest.mark.parametrize("verdicts,state,confidence", STATUS_CASES)
def test_status_from_verdicts(library, verdicts, state, confidence):
    h = by_id(library, "h13-flat-learning")
    noise = trials_for("h14-instability", [IMPROVED, IMPROVED])  # other hypotheses' trials are ignored
    st = status(h, noise + trials_for(h.id, verdicts))
    assert (st.status, st.confidence) == (state, confidence)
    assert st.counts["tried"] == sum(v is not None for v in verdicts)
    assert st.demoted == (st.counts["tried"] >= DEMOTE_AFTER and IMPROVED not in verdicts)


def test_inconclusive_says_what_its_flat_tests_could_see(library):
    h = by_id(library, "h13-flat-learning")
    st = status(h, trials_for(h.id, [(FLAT, 0.05), (FLAT, 0.06)]))
    assert st.status == "inconclusive" and st.detectable == pytest.approx(0.05 * 1.4294, abs=1e-4)
    assert st.note == (
        "2 flat trial(s) could detect a gain of +0.071 or more, not the 0.03 worth finding (verdict.meaningful_effect)"
    )
    loose = status(h, trials_for(h.id, [(FLAT, 0.05), (FLAT, 0.05)]), VerdictSettings(meaningful_effect=0.1))
    assert loose.status == "invalidated" and loose.note == ""  # a user who cares only about 0.1 hears "no"


# ---------------------------------------------------------------- ranking


def stream(reward_rise: float, spike_at: int | None = None, n: int = 40) -> tuple[list[dict], list[dict]]:
    steps = [
        {
            "step": t,
            "reward_mean": 0.3 + reward_rise * t / n + 0.01 * (-1) ** t,
            "entropy_mean": 0.8,
            "grad_norm": 150.0 if t == spike_at else 0.5 + 0.05 * (-1) ** t,
        }
        for t in range(1, n + 1)
    ]
    evals = [{"step": s, "eval/id/greedy_pass@1": 0.55 + reward_rise * s / n} for s in range(0, n + 1, 10)]
    return steps, evals


def flat_diagnosis():
    return diagnose(*stream(0.0), {"max_grad_norm": 1.0})


def spiking_diagnosis():
    return diagnose(*stream(0.15, spike_at=20), {"max_grad_norm": 1.0})


def test_rank_picks_flat_learning_for_a_flat_stream(library):
    ranked = rank(library, flat_diagnosis(), [], "embedded")
    top = ranked[0]
    assert top.hypothesis.id == "h13-flat-learning"
    assert "flat_learning" in top.why and "priority high" in top.why and "pending" in top.why


def test_rank_picks_an_instability_hypothesis_for_a_spiking_stream(library):
    d = spiking_diagnosis()
    top = rank(library, d, [], "embedded")[0]
    assert top.hypothesis.id == "h16-loss-grad-spikes"
    assert "loss_grad_spikes" in top.why and "bottleneck unstable" in top.why


def test_repeated_non_improvement_demotes(library):
    d = flat_diagnosis()
    trials = trials_for("h13-flat-learning", [FLAT] * DEMOTE_AFTER)
    ranked = rank(library, d, trials, "embedded")
    assert ranked[0].hypothesis.id != "h13-flat-learning"
    demoted = next(r for r in ranked if r.hypothesis.id == "h13-flat-learning")
    assert demoted.status.demoted and "demoted" in demoted.why
    one_try = rank(library, d, trials[:1], "embedded")
    assert one_try[0].hypothesis.id == "h13-flat-learning"


def test_validated_hypothesis_is_exploited_until_it_stops_helping(library):
    d = flat_diagnosis()
    trials = trials_for("h08-batching", [IMPROVED])
    top = rank(library, d, trials, "embedded")[0]
    assert top.hypothesis.id == "h08-batching" and "exploit" in top.why
    stale = trials + trials_for("h08-batching", [FLAT, FLAT])
    ranked = rank(library, d, stale, "embedded")
    h08 = next(r for r in ranked if r.hypothesis.id == "h08-batching")
    assert ranked[0].hypothesis.id == "h13-flat-learning"
    assert h08.status.status == "validated" and not h08.status.exploit


def test_rank_is_deterministic(library):
    d = spiking_diagnosis()
    first = [r.hypothesis.id for r in rank(library, d, [], "embedded")]
    shuffled = library[:]
    random.Random(3).shuffle(shuffled)
    assert [r.hypothesis.id for r in rank(shuffled, d, [], "embedded")] == first
    scores = [r.score for r in rank(library, d, [], "embedded")]
    assert scores == sorted(scores, reverse=True)


def test_rank_filters_by_backend_and_advisory(library):
    embedded = {r.hypothesis.id for r in rank(library, None, [], "embedded")}
    assert "h02-token-masking" not in embedded and "h13-flat-learning" in embedded
    trl = {r.hypothesis.id for r in rank(library, None, [], "trl", advisory=True)}
    assert {"h02-token-masking", "h13-flat-learning"} <= trl and "h03-kl-divergence" not in trl
    runnable = {r.hypothesis.id for r in rank(library, None, [], "command")}
    assert runnable == {h.id for h in library if h.actionable() and h.applies_to("command")}
    assert "h02-token-masking" not in {r.hypothesis.id for r in rank(library, None, [], "trl")}


def collapse_diagnosis():
    """The shape of a real embedded run at lr 3e-3: one good step, then reward 0 and degenerate outputs."""
    steps = [
        {
            "step": t,
            "reward_mean": 0.22 if t == 1 else 0.0,
            "frac_zero_std_groups": 0.16 if t == 1 else 1.0,
            "advantage_std": 0.9 if t == 1 else 0.0,
            "log_ratio_abs_max": 12.0 if t == 2 else 0.01,
            "truncated_rate": 0.0 if t == 1 else 1.0,
            "grad_norm": 1.4 if t == 1 else 0.0,
            "entropy_mean": 0.7,
        }
        for t in range(1, 41)
    ]
    evals = [{"step": s, "eval/id/greedy_pass@1": 0.52 if s == 0 else 0.0} for s in range(0, 41, 10)]
    return diagnose(steps, evals, {"max_grad_norm": 1.0})


def test_rank_prefers_the_cause_over_its_consequences(library):
    d = collapse_diagnosis()
    assert d.bottleneck == "unstable" and {"zero_std_groups", "reward_stuck", "instability"} <= d.names()
    ranked = rank(library, d, [], "embedded")
    assert ranked[0].hypothesis.id == "h14-instability"
    h05 = next(r for r in ranked if r.hypothesis.id == "h05-reward-signal")
    assert h05.score == 5 + 5 + 1  # two side symptoms (consequences of the collapse) and low priority


@pytest.mark.slow
def test_real_embedded_runs_are_diagnosed(tmp_path, library):
    """The embedded engine at lr 0 is diagnosed flat, at lr 3e-3 unstable; rank follows."""
    got = {}
    for lr in (0.0, 3e-3):
        cfg = tmp_path / f"c{lr}.json"
        cfg.write_text(json.dumps({"lr": lr, "steps": 30, "batch_prompts": 16, "eval_every": 10, "eval_size": 200}))
        out = tmp_path / f"m{lr}.jsonl"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "autorl.engine",
                "--config",
                str(cfg),
                "--metrics-out",
                str(out),
                "--cache-dir",
                str(tmp_path / "cache"),
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=600,
        )
        got[lr] = diagnose_run(out, {"max_grad_norm": 1.0})
    assert got[0.0].bottleneck == "stable_low_accuracy" and "flat_learning" in got[0.0].names()
    assert got[3e-3].bottleneck == "unstable"
    assert rank(library, got[0.0], [], "embedded")[0].hypothesis.id == "h13-flat-learning"
    assert rank(library, got[3e-3], [], "embedded")[0].hypothesis.id == "h14-instability"


def test_probe_params_tests_the_idea_not_the_incumbent(library):
    """The first trial of a hypothesis sits mid-range on its first key, so it can confirm or refute it."""
    h05 = by_id(library, "h05-reward-signal")
    space = resolve_search(h05, {**INCUMBENT, "gens": 2}, {})
    probe = probe_params(h05, space, {**INCUMBENT, "gens": 2})
    first = next(iter(h05.search))
    assert probe[first] != {**INCUMBENT, "gens": 2}.get(first)
    h13 = by_id(library, "h13-flat-learning")
    space = resolve_search(h13, {**INCUMBENT, "lr": 1e-7}, {"lr": SearchParam(low=1e-6, high=1e-2, log=True)})
    probe = probe_params(h13, space, {**INCUMBENT, "lr": 1e-7})
    assert probe["lr"] == pytest.approx((1e-6 * 1e-5) ** 0.5, rel=1e-6)


def test_continuation_pushes_a_flat_but_better_hypothesis(library):
    """Flat with a positive gain: test the same hypothesis again around that trial; not after MAX_CHAIN, not if worse."""
    base = Trial(number=1, attempt="attempt-01-baseline", proposer=Proposer.BASELINE, verdict=None)
    step = Trial(
        number=2,
        attempt="attempt-02-h13",
        proposer=Proposer.HYPOTHESIS,
        hypothesis="h13-flat-learning",
        verdict=FLAT,
        delta=0.024,
        params={"lr": 3.2e-6},
    )
    found = continuation([base, step], library)
    assert found is not None
    h, params, why = found
    assert h.id == "h13-flat-learning" and params == {"lr": 3.2e-6} and "+0.0240" in why
    assert continuation([base, step.replace(delta=-0.01)], library) is None
    assert continuation([base, step.replace(verdict=IMPROVED)], library) is None
    chain = [base] + [step.replace(number=2 + i, attempt=f"attempt-{2 + i:02d}") for i in range(MAX_CHAIN)]
    assert continuation(chain, library) is None


def test_a_trial_with_no_effect_is_not_pushed(library):
    """Every metric identical to its parent: the idea had no effect, so no continuation (issue 15)."""
    step = {
        "type": "step",
        "step": 1,
        "reward_mean": 0.4,
        "loss": -0.01,
        "grad_norm": 1.2,
        "kl": 0.0,
        "clip_ratio": 0.0,
        "tokens_per_s": 900.0,
    }
    ev = {"type": "eval", "step": 1, "eval/id/greedy_pass@1": 0.5, "eval/id/items": [1, 0]}
    same = [{**step, "tokens_per_s": 400.0, "time_update_s": 3.0}, ev]
    assert fingerprint([step, ev]) == fingerprint(same)
    assert fingerprint([step, ev]) != fingerprint([{**step, "loss": -0.02}, ev])
    assert fingerprint([step, ev]) != fingerprint([step, {**ev, "eval/id/greedy_pass@1": 0.51}])
    base = Trial(
        number=1,
        attempt="attempt-01-baseline",
        status=TrialStatus.COMPLETE,
        params={"lr": 1e-6, "eps_clip": 0.2, "seed": 0},
    )
    repeat = Trial(
        number=2,
        attempt="attempt-02",
        status=TrialStatus.COMPLETE,
        params={"lr": 1e-6, "eps_clip": 0.2, "seed": 1},
        changed={"seed": 1},
    )
    trial = Trial(
        number=3,
        attempt="attempt-03-h13",
        proposer=Proposer.HYPOTHESIS,
        hypothesis="h13-flat-learning",
        status=TrialStatus.COMPLETE,
        verdict=FLAT,
        delta=0.004,
        params={"lr": 1e-6, "eps_clip": 0.3, "seed": 0},
        changed={"eps_clip": 0.3},
    )
    assert parent_of(trial, [base, repeat, trial]) is base
    assert parent_of(trial.replace(changed={}), [base, repeat, trial]) is None
    assert continuation([base, repeat, trial], library) is not None
    assert continuation([base, repeat, trial], library, inert={"h13-flat-learning"}) is None


def test_resume_fails_running_trials_of_every_per_hypothesis_study(tmp_path):
    db = tmp_path / "ledger.sqlite"
    space = {"lr": SearchParam(low=1e-6, high=1e-2, log=True)}
    for name in ("study-a", "study-a/h13-flat-learning/0123abcd", "study-a/h01-x/ffff0000", "study-b"):
        Search(db, name).ask(space)  # left RUNNING, as by a killed controller
    names = study_names(db, "study-a")
    assert sorted(names) == ["study-a", "study-a/h01-x/ffff0000", "study-a/h13-flat-learning/0123abcd"]
    assert sum(Search(db, n).fail_running() for n in names) == 3
    assert Search(db, "study-b").fail_running() == 1


def test_a_flat_test_blind_to_every_possible_gain_says_so(library):
    """A pass@1 gain is at most 1 minus the parent's value; a test whose detectable gain is beyond that could see
    nothing, and the note says so instead of naming an impossible gain."""
    h = by_id(library, "h13-flat-learning")
    wide = [t.replace(objective=0.6, delta=0.0) for t in trials_for(h.id, [(FLAT, 1.8), (FLAT, 1.7)])]
    st = status(h, wide, objective=Objective(metric="eval/id/greedy_pass@1"))
    assert st.status == "inconclusive" and st.detectable is None
    assert st.note == (
        "2 flat trial(s) could detect no gain eval/id/greedy_pass@1 allows over the parent, not the "
        "0.03 worth finding (verdict.meaningful_effect)"
    )
    mixed = status(
        h, wide + [wide[0].replace(ci_low=-0.05, ci_high=0.05)], objective=Objective(metric="eval/id/greedy_pass@1")
    )
    assert mixed.detectable == pytest.approx(0.05 * 1.4294, abs=1e-4) and "+0.071 or more" in mixed.note


def test_a_hypothesis_that_cannot_change_the_working_point_is_passed_over(library):
    """h06 sets lora_rank 0: on a recipe that already trains every parameter each of its trials repeated the
    baseline (two GPU studies spent half their budget so); with LoRA on it is a real test."""
    by_id = {h.id: h for h in library}
    h06, h03 = by_id["h06-lora-sync"], by_id["h03-kl-divergence"]
    assert not can_change(h06, {"lora_rank": 0, "lr": 1e-6}, {})
    assert can_change(h06, {"lora_rank": 16, "lr": 1e-6}, {})
    assert can_change(h03, {"kl_coef": 0.0, "kl_estimator": "k1"}, {})
    only = {"kl_coef": SearchParam(choices=[0.0]), "kl_estimator": SearchParam(choices=["k1"])}
    assert not can_change(h03.model_copy(update={"overrides": {}}), {"kl_coef": 0.0, "kl_estimator": "k1"}, only)
