"""Every registered backend through the same hook tests: what only a backend knows about its train keys (its OOM
knobs, its work keys, where a full run's length goes, its gradient clip, its eval protocol) names keys its own
train block has, and each hook's answer is a recipe that still validates. A backend added to the registry is
tested here without a line of this file changing; one whose example is missing fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from autorl.backends.base import Backend, LaunchPlan, OomKnob, TrialSpec, get_backend
from autorl.backends.registry import BACKENDS
from autorl.data import shipped
from autorl.errors import UserError
from autorl.recipe import Recipe, load_recipe, params_model, validate_recipe

COMMAND = {
    "argv": ["python", "train.py", "--lr", "{lr}", "--batch", "{micro_batch}", "--out", "{run_dir}/m"],
    "lr": 1e-5,
    "micro_batch": 0,
    "batch_prompts": 4,
    "gens": 8,
    "max_new_tokens": 64,
    "steps": 10,
    "max_grad_norm": 1.0,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 2,
}


def example(name: str) -> Recipe:
    """A real recipe of each backend: the shipped examples, a typical command recipe."""
    if name == "embedded":
        return load_recipe(shipped("recipes", "default.yaml"))
    if name == "trl":
        return load_recipe(shipped("recipes", "trl-addition.yaml"))
    if name == "openrlhf":
        return load_recipe(shipped("recipes", "openrlhf-tiny.yaml"), ["openrlhf_version=0.10.4"])
    if name == "command":
        return validate_recipe({"name": "cmd", "backend": "command", "train": COMMAND})
    raise AssertionError(f"no example recipe for backend {name}: add one to this suite")


def _names_of_its_train(backend: Backend, keys: list[str]) -> list[str]:
    """The keys its train model does not declare (none allowed unless the model takes any key)."""
    model = params_model(backend.name)
    if model.model_config.get("extra") == "allow":
        return []
    return [k for k in keys if k not in model.model_fields]


@pytest.fixture(params=sorted(BACKENDS))
def backend(request) -> Backend:
    return get_backend(request.param)


def test_the_registry_names_each_backend_by_its_own_name(backend):
    assert isinstance(backend, Backend) and BACKENDS[backend.name]
    assert example(backend.name).params.__class__ is params_model(backend.name)


def test_what_a_backend_declares_about_its_keys_names_its_own_keys(backend):
    knob_keys = [k for knob in backend.oom_knobs for k in (*knob.keys, *knob.keeps.values())]
    declared = [
        *knob_keys,
        *backend.work_keys,
        backend.steps_key,
        backend.episodes_key,
        backend.grad_clip_key,
        *params_model(backend.name).run_length_keys,
    ]
    assert not _names_of_its_train(backend, [k for k in declared if k]), backend.name
    assert backend.work_keys and all(isinstance(k, OomKnob) and k.floor >= 1 for k in backend.oom_knobs)


def test_an_oom_retry_reduces_to_a_recipe_that_still_validates(backend):
    recipe = example(backend.name)
    reduced = backend.oom_retry(recipe.train)
    if not backend.oom_knobs:
        assert reduced is None
        return
    assert reduced, f"{backend.name}: its example has a knob above its floor"
    knob_keys = {k for knob in backend.oom_knobs for k in (*knob.keys, *knob.keeps.values())}
    assert set(reduced) <= knob_keys
    smaller = recipe.with_train(**reduced)
    assert all(isinstance(smaller.train[k], int) and smaller.train[k] < 10**9 for k in reduced)
    at_floor = {**recipe.train, **{k: knob.floor for knob in backend.oom_knobs for k in knob.keys}}
    assert backend.oom_retry(at_floor) is None


def test_the_knob_a_trial_changed_is_reduced_first(backend):
    if len(backend.oom_knobs) < 2:
        pytest.skip(f"{backend.name} has fewer than two knobs")
    train = dict(example(backend.name).train)
    last = backend.oom_knobs[-1]
    key = next((k for k in last.keys if isinstance(train.get(k), int) and train[k] > last.floor), None)
    if key is None:
        pytest.skip(f"{backend.name}'s example sets no value above the floor of its last knob")
    assert set(backend.oom_retry(train, changed=[key])) == {key}


def test_trial_values_and_full_run_values_validate(backend):
    recipe = example(backend.name)
    values = backend.trial_values({k: recipe.train[k] for k in list(recipe.search)[:1]}, recipe)
    recipe.with_train(**values)
    for steps, episodes in ((10, None), (None, 2)):
        try:
            full = backend.full_run_values(recipe, steps, episodes)
        except UserError as exc:
            assert "\n" not in str(exc) and ("--steps" in str(exc) or "--episodes" in str(exc))
            continue
        key, asked = (backend.steps_key, steps) if steps else (backend.episodes_key, episodes)
        assert recipe.with_train(**full).train[key] == asked


def test_a_full_run_asked_to_evaluate_its_checkpoints_validates_or_is_refused_in_one_line(backend, tmp_path):
    """`autorl promote --eval-every 4`: values the backend's own parameters accept, which a full run of the
    SmolLM2 recipe then evaluates as it trains (a checkpoint glob), or one line naming the flag."""
    recipe = example(backend.name)
    try:
        values = backend.full_run_values(recipe, None, None, eval_every=4)
    except UserError as exc:
        assert "\n" not in str(exc) and "--eval-every" in str(exc)
        return
    full = recipe.with_train(**values)
    assert values and all(full.train[k] == v for k, v in values.items())
    if backend.name == "openrlhf":
        smol = load_recipe(shipped("recipes", "openrlhf-smollm2.yaml"))
        smol = smol.with_train(**backend.full_run_values(smol, None, 2, eval_every=8))
        spec = TrialSpec(
            attempt="attempt-13-full-x", recipe=smol, worktree=tmp_path, run_dir=tmp_path / "run", cache_dir=tmp_path
        )
        assert backend.checkpoint_glob(spec)


def test_planned_steps_and_grad_clip_are_numbers(backend):
    recipe = example(backend.name)
    assert isinstance(backend.planned_steps(recipe), int) and backend.planned_steps(recipe) >= 0
    clip = backend.max_grad_norm(recipe)
    assert clip is None or clip > 0


def test_a_plan_and_its_eval_are_argv_without_a_shell(backend, tmp_path):
    recipe = example(backend.name)
    spec = TrialSpec(
        attempt="attempt-01-x",
        recipe=recipe,
        worktree=Path.cwd(),
        run_dir=tmp_path / "run",
        cache_dir=tmp_path / "cache",
        seed=3,
    )
    plan = backend.plan(spec)
    assert isinstance(plan, LaunchPlan) and plan.argv and not plan.shell and plan.backend == backend.name
    evaluation = backend.eval_plan(spec)
    assert evaluation is None or (evaluation.argv[1:3] == ["-m", "autorl.evaluate"] and not evaluation.shell)


@pytest.mark.parametrize(
    "name, train, changed, expected",
    [
        ("embedded", {"micro_batch": 8, "gens": 8, "max_new_tokens": 64}, (), {"micro_batch": 4}),
        ("embedded", {"micro_batch": 0, "batch_prompts": 32, "gens": 8, "max_new_tokens": 5}, (), {"micro_batch": 128}),
        ("embedded", {"micro_batch": 1, "gens": 8, "max_new_tokens": 64}, (), {"gens": 4}),
        ("embedded", {"micro_batch": 1, "gens": 2, "max_new_tokens": 64}, (), {"max_new_tokens": 32}),
        ("embedded", {"micro_batch": 1, "gens": 3, "max_new_tokens": 64}, (), {"gens": 2}),
        ("embedded", {"micro_batch": 8, "gens": 16, "max_new_tokens": 64}, ("gens",), {"gens": 8}),
        ("embedded", {"micro_batch": 1, "gens": 2, "max_new_tokens": 1}, (), None),
        ("embedded", {"micro_batch": 0, "batch_prompts": 1, "gens": 3, "max_new_tokens": 1}, (), {"gens": 2}),
        ("openrlhf", {"micro_train_batch_size": 4, "gens": 8}, (), {"micro_train_batch_size": 2}),
        ("openrlhf", {"micro_train_batch_size": 1, "gens": 16, "generate_max_len": 4096}, (), {"gens": 8}),
        (
            "openrlhf",
            {"micro_train_batch_size": 1, "gens": 2, "max_new_tokens": None, "generate_max_len": 4096},
            (),
            {"generate_max_len": 2048},
        ),
        ("trl", {"batch_prompts": 4, "gens": 8, "max_new_tokens": 64}, (), {"gens": 4}),
        ("trl", {"batch_prompts": 4, "gens": 2, "max_new_tokens": 64}, (), {"max_new_tokens": 32}),
        (
            "command",
            {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "num_generations": 8},
            (),
            {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4},
        ),
        (
            "command",
            {"n_samples_per_prompt": 16, "max_completion_length": 512},
            ("max_completion_length",),
            {"max_completion_length": 256},
        ),
    ],
)
def test_oom_retry_halves_the_backends_own_knobs(name, train, changed, expected):
    """The micro-batch before the group size (floor 2) before the generation limit; what the trial changed first;
    the embedded engine's micro_batch 0 ('all at once') made explicit; TRL-style accumulation doubled."""
    assert get_backend(name).oom_retry(train, changed=changed) == expected
