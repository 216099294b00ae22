"""Inputs generated from the schemas themselves: a backend's train model (its fields' types and bounds), the recipe's
search block (``SearchParam``), ``--set`` items, hypothesis front matter and the CLI's own commands and options.

Each strategy has a valid form (every value one the schema takes, a search space that fits its train block) and an
any form (valid and invalid mixed: wrong types, out of bounds, unknown keys, empty or mixed choices, log scales
through zero, steps, nested keys)."""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Any

import annotated_types as at
import yaml
from hypothesis import strategies as st

from autorl.recipe import SearchParam, params_model

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = yaml.safe_load((ROOT / "recipes" / "default.yaml").read_text())
MODEL = params_model(DEFAULT["backend"])
FIELDS = MODEL.model_fields
SAFE = (
    "lr",
    "eps_clip",
    "kl_coef",
    "gens",
    "temperature",
    "max_grad_norm",
    "entropy_coef",
    "scale_rewards",
    "loss_type",
)

junk_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
junk = st.recursive(
    junk_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
key_name = st.one_of(
    st.sampled_from(sorted(FIELDS)), st.from_regex(r"[a-z_]{1,10}(\.[a-z_]{1,6}){0,2}", fullmatch=True)
)


def _bounds(name: str) -> tuple[float | None, bool, float | None, bool]:
    """A field's (low, low inclusive, high, high inclusive) from its metadata."""
    lo = hi = None
    lo_in = hi_in = True
    for m in FIELDS[name].metadata:
        if isinstance(m, at.Ge):
            lo, lo_in = float(m.ge), True  # type: ignore[arg-type]
        elif isinstance(m, at.Gt):
            lo, lo_in = float(m.gt), False  # type: ignore[arg-type]
        elif isinstance(m, at.Le):
            hi, hi_in = float(m.le), True  # type: ignore[arg-type]
        elif isinstance(m, at.Lt):
            hi, hi_in = float(m.lt), False  # type: ignore[arg-type]
    return lo, lo_in, hi, hi_in


def kind(name: str) -> str:
    ann = FIELDS[name].annotation
    if typing.get_origin(ann) is typing.Literal:
        return "literal"
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(ann, "other")  # type: ignore[arg-type]


def valid_value(name: str) -> st.SearchStrategy[Any]:
    """A value the train model takes for ``name``, from its type and bounds."""
    k = kind(name)
    if k == "literal":
        return st.sampled_from(typing.get_args(FIELDS[name].annotation))
    if k == "bool":
        return st.booleans()
    lo, lo_in, hi, hi_in = _bounds(name)
    if k == "int":
        low = int(lo if lo is not None else -1000) + (0 if lo_in else 1)
        return st.integers(low, min(int(hi if hi is not None else 1000) - (0 if hi_in else 1), low + 1000))
    if k == "float":
        low = lo if lo is not None else -10.0
        return st.floats(low, hi if hi is not None else low + 10, exclude_min=not lo_in, exclude_max=not hi_in)
    return st.just(FIELDS[name].default)


@st.composite
def valid_search(draw: st.DrawFn, train: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A search block that fits ``train``: choices the model takes with the base among them, or a range of a
    numeric key the model takes at both ends and between (log scales above zero, with a base above zero)."""
    out: dict[str, dict[str, Any]] = {}
    for name in draw(st.lists(st.sampled_from(SAFE), unique=True, max_size=4)):
        k, base = kind(name), train.get(name, FIELDS[name].default)
        if k in ("float", "int") and draw(st.booleans()):
            lo, lo_in, hi, hi_in = _bounds(name)
            low = max(lo if lo is not None else 0.0, 0.0) + (0 if lo_in else 1e-3)
            a = (
                draw(st.floats(low, low + 5))
                if k == "float"
                else draw(st.integers(math.ceil(low), math.ceil(low) + 20))
            )
            b = draw(st.floats(a, a + 5)) if k == "float" else draw(st.integers(a, a + 20))
            if hi is not None:
                a, b = min(a, hi - (0 if hi_in else 1e-3)), min(b, hi - (0 if hi_in else 1e-3))
            log = draw(st.booleans()) and a > 0 and base > 0
            out[name] = {"low": a, "high": b, "log": log, "int": k == "int"}
        else:
            others = draw(st.lists(valid_value(name), max_size=3))
            out[name] = {"choices": list(dict.fromkeys([base, *others]))}
    return out


@st.composite
def valid_recipe(draw: st.DrawFn) -> dict[str, Any]:
    data = yaml.safe_load(yaml.safe_dump(DEFAULT))
    for name in draw(st.lists(st.sampled_from(SAFE), unique=True, max_size=3)):
        data["train"][name] = draw(valid_value(name))
    data["train"]["steps"] = draw(st.integers(1, 5))
    data["search"] = draw(valid_search(data["train"]))
    return data


def any_search_param() -> st.SearchStrategy[Any]:
    keys = st.sampled_from([*SearchParam.model_fields, "step", "scale", "q"])
    numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6), st.just(0))
    value = st.one_of(numbers, st.booleans(), st.lists(junk_scalar, max_size=4), junk)
    return st.one_of(st.dictionaries(keys, value, max_size=4), junk)


@st.composite
def any_recipe(draw: st.DrawFn) -> dict[str, Any]:
    """A valid recipe with a few things changed at random: train values, search params, top-level keys."""
    data = draw(valid_recipe())
    for name in draw(st.lists(key_name, max_size=2)):
        data["train"][name] = draw(st.one_of(junk, valid_value(name) if name in FIELDS else junk))
    for name in draw(st.lists(key_name, max_size=3)):
        data["search"][name] = draw(any_search_param())
    if draw(st.booleans()):
        data[draw(st.sampled_from(["search", "objective", "verdict", "timeout_s", "extra", "train"]))] = draw(junk)
    return data


def render(value: Any) -> str:
    return (
        value
        if isinstance(value, str)
        else yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    )


@st.composite
def any_set(draw: st.DrawFn) -> str:
    """A ``--set KEY=VALUE`` item: a train key (or dotted path, or a made-up one) and any value, as typed."""
    key = draw(st.one_of(key_name, st.sampled_from(["verdict.min_effect", "objective.k", "timeout_s", "=", ""])))
    value = draw(st.one_of(valid_value(key) if key in FIELDS else junk, junk))
    sep = draw(st.sampled_from(["=", "=", " = ", ""]))
    return f"{key}{sep}{render(value)}"


@st.composite
def valid_set(draw: st.DrawFn, data: dict[str, Any]) -> str:
    """A ``--set`` item a recipe takes: a key it does not search (its base must stay in its choices)."""
    name = draw(st.sampled_from([k for k in SAFE if k not in data.get("search", {})] or ["steps"]))
    return f"{name}={render(draw(valid_value(name)))}"


HYPOTHESIS_FIELDS = ("id", "title", "priority", "symptoms", "overrides", "search", "success", "backends", "patch")


@st.composite
def any_hypothesis(draw: st.DrawFn) -> tuple[str, dict[str, Any], str]:
    """A hypothesis file's name, front matter and body: the shipped form with fields changed, dropped or added."""
    meta: dict[str, Any] = {
        "id": "h90-generated",
        "title": "A generated hypothesis",
        "priority": "high",
        "symptoms": ["instability"],
        "overrides": {"scale_rewards": False},
        "search": {"lr": {"scale": [1.0, 4.0], "log": True}},
        "success": {"confirm": "better", "refute": "not better"},
        "backends": ["embedded"],
    }
    for name in draw(st.lists(st.sampled_from([*HYPOTHESIS_FIELDS, "body", "source", "x"]), max_size=3)):
        if draw(st.booleans()):
            meta.pop(name, None)
        else:
            meta[name] = draw(
                st.one_of(junk, st.dictionaries(key_name, st.one_of(junk, any_search_param()), max_size=2))
            )
    stem = draw(st.sampled_from([str(meta.get("id")), "h90-generated", "other"]))
    return stem, meta, draw(st.text(max_size=40))
