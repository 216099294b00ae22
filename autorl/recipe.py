"""Recipes: the YAML file that says what to train, what to search and how to judge.

A recipe is validated once, here, into a :class:`Recipe`. Its ``train`` block is
validated by the backend's own parameter model (``autorl.backends.registry``), so a typo in
``train.lr`` or a negative value fails before anything launches; ``Recipe.params`` is that typed
model and ``Recipe.train`` the same values as plain data.

``--set key=value`` is parsed once (``parse_overrides``; ``3e-4`` is a number, as everywhere
``autorl.loading`` reads YAML). ``recipe_and_text`` applies the values and writes each on its own line
of the recipe text (``set_values``: every other line, comments included, kept), which is what a
study commits and what each trial's recipe is written from.

    name: addition-default
    backend: embedded
    train: {lr: 1.0e-4, eps_clip: 0.2, kl_coef: 0.0, gens: 8, ...}
    search:
      lr: {low: 1.0e-6, high: 1.0e-2, log: true}
      gens: {choices: [4, 8, 16]}
    objective: {metric: eval/id/greedy_pass@1, direction: maximize, reduction: last}
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from autorl import loading
from autorl.backends.registry import BACKENDS, BackendName
from autorl.errors import RecipeError, UserError, short, short_repr, validation_line
from autorl.metrics import items_key


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchParam(_Model):
    """One searched key: a float/int range, or a list of choices."""

    low: float | None = Field(None, description="Lower bound (inclusive).")
    high: float | None = Field(None, description="Upper bound (inclusive).")
    log: bool = Field(False, description="Sample on a log scale (low must be > 0).")
    int: bool = Field(False, description="Integer range.")
    choices: list[Any] | None = Field(
        None,
        description="Categorical choices (instead of low/high): each a value the train key takes (a number, text, "
        "true/false or null), the recipe's own value among them. A range's bounds, and the values between them, must "
        "be ones the train key takes too (int: true for a whole-number key); all is checked before a study starts.",
    )

    @model_validator(mode="after")
    def _check(self) -> SearchParam:
        if self.choices is not None:
            if not self.choices:
                raise ValueError("choices is empty: list at least one value")
            bad = [c for c in self.choices if isinstance(c, float) and not math.isfinite(c)]
            if bad:
                raise ValueError(f"choice {bad[0]} is not a finite number: list finite values")
            return self
        if self.low is None or self.high is None:
            raise ValueError("give low and high, or choices")
        for name, value in (("low", self.low), ("high", self.high)):
            if not math.isfinite(value):
                raise ValueError(f"{name} {value} is not a finite number: give a finite bound")
        if not math.isfinite(self.high - self.low):
            raise ValueError(f"the range {self.low:g}..{self.high:g} is wider than a float holds: narrow it")
        if self.int and not (self.low.is_integer() and self.high.is_integer()):
            raise ValueError(
                f"an int range needs whole-number bounds (got {self.low:g}..{self.high:g}): drop "
                "int: true for a float key, or round the bounds"
            )
        if self.low > self.high:
            raise ValueError(f"low {self.low} > high {self.high}: swap them")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0 (got {self.low})")
        return self


class Objective(_Model):
    """What a trial is scored on."""

    metric: str = Field("eval/id/greedy_pass@1", description="Metric key from the run's eval lines (or step lines).")
    direction: Literal["maximize", "minimize"] = Field("maximize", description="Whether larger is better.")
    reduction: Literal["last", "best", "mean_last_k"] = Field(
        "last",
        description="How the metric's series becomes one "
        "value; best only for a greedy pass@1 eval metric "
        "(its per-item results).",
    )
    k: int = Field(3, ge=1, description="Window for mean_last_k.")

    @model_validator(mode="after")
    def _best_needs_items(self) -> Objective:
        if self.reduction == "best" and items_key(self.metric) is None:
            raise ValueError(
                f"reduction 'best' needs per-item results, which only eval/<split>/greedy_pass@1 has, "
                f"not {self.metric}: the best of a noisy series favours the noisier recipe (a trial "
                "no better than its parent, with half its generations, was called improved 22% of the "
                "time); use last or mean_last_k"
            )
        return self


class VerdictSettings(_Model):
    """How a trial is judged against its parent, and how a candidate is confirmed (docs/triage.md)."""

    min_effect: float = Field(
        0.0, ge=0, description="A trial is 'improved' only if the lower end of its interval for the gain exceeds this."
    )
    meaningful_effect: float = Field(
        0.03,
        gt=0,
        description="The smallest gain worth finding, in objective "
        "units: flat trials invalidate a hypothesis only when "
        "each could have detected a gain this large (4 times "
        "in 5); otherwise it stays inconclusive.",
    )
    baseline_repeats: int = Field(
        5,
        ge=1,
        le=100,
        description="Times the baseline runs (different seeds) to measure seed "
        "noise; below 3 the verdict says what it cannot see.",
    )
    level: float = Field(0.95, gt=0.5, lt=1, description="Two-sided confidence level of a trial's interval.")
    run_sd_prior: float = Field(
        0.02, ge=0, description="Prior run-level sd (a whole run's shift from its seed) before replicates are seen."
    )
    run_sd_prior_df: float = Field(
        1.0, ge=0, description="Pseudo degrees of freedom of that prior: how many replicate df it weighs."
    )
    confirm_runs: int = Field(
        3,
        ge=0,
        le=100,
        description="Fresh-seed re-runs of an 'improved' candidate; 0 = candidates are never confirmed.",
    )
    confirm_level: float = Field(
        0.975, gt=0.5, lt=1, description="Two-sided level of the confirmation test on the fresh runs alone."
    )
    prune_level: float = Field(
        0.99,
        gt=0.5,
        lt=1,
        description="Two-sided level at which an intermediate eval is "
        "'clearly worse' than its parent's or the incumbent's.",
    )
    bootstrap: int = Field(
        2000,
        ge=100,
        description="Unused since the interval became analytic (t with Satterthwaite df); kept so older recipes load.",
    )


class GateSettings(_Model):
    """The hack gate's bounds for this recipe (docs/triage.md, "The hack gate"); the rest of its thresholds are
    the rules table ``autorl/data/rules/hack_gate.yaml``."""

    enabled: bool = Field(
        True,
        description="Check a candidate before it is confirmed, and before promote, against "
        "the held-out task and its completions' health.",
    )
    kl_max: float | None = Field(
        None,
        gt=0,
        description="Mean KL to the reference over the last steps above this "
        "makes a candidate suspect (None: KL is not checked).",
    )
    entropy_min: float | None = Field(
        None,
        ge=0,
        description="Mean entropy over the last steps below this makes a "
        "candidate suspect (besides the table's share of the "
        "parent's).",
    )
    truncation_max: float | None = Field(
        None, ge=0, le=1, description="Share of eval completions cut at the length limit allowed (None: the table's)."
    )


class AbortRules(_Model):
    """Early-abort thresholds (seed 004 smoke tests). A trial that trips one is PRUNED."""

    enabled: bool = Field(True, description="Check live metrics and stop doomed trials.")
    window: int = Field(8, ge=1, description="Steps a condition must hold from the start before it trips.")
    reward_stuck_eps: float = Field(1e-9, ge=0, description="reward_mean within this of 0 or 1 counts as stuck.")
    grad_norm_factor: float = Field(
        100.0, gt=0, description="grad_norm >= factor * max_grad_norm trips 'grad explosion'."
    )
    truncated_rate: float = Field(0.5, ge=0, le=1, description="truncated_rate above this over the window trips.")
    clip_ratio: float = Field(0.4, ge=0, le=1, description="clip_ratio above this from the start trips.")
    collapse_window: int = Field(
        3,
        ge=1,
        description="Consecutive steps with reward_mean at 0, after a step 1 at or "
        "above collapse_from, that trip 'reward collapse'.",
    )
    collapse_from: float = Field(
        0.2,
        gt=0,
        description="Step 1's reward_mean must reach this for a fall to 0 to count "
        "as a collapse (a sparse reward's zero batches do not).",
    )
    pruner: bool = Field(
        True,
        description="Stop a trial whose intermediate eval is clearly worse than its parent's, "
        "or the confirmed incumbent's, at the same step.",
    )
    silence_s: float = Field(
        120.0,
        gt=0,
        description="No new output or metric for this long = hang (watchdog); a "
        "Ray job waiting for GPUs other jobs hold is not one, and the embedded engine and the per-item eval "
        "write a 'working:' line every 30 s while they generate or update.",
    )


class Recipe(_Model):
    """A validated recipe."""

    name: str = Field("recipe", description="Short name, used in slugs.")
    description: str = Field("", description="Free text.")
    backend: BackendName = Field("embedded", description="Which backend runs the trials.")
    train: dict[str, Any] = Field(
        default_factory=dict,
        description="Backend parameters (see the backend's parameter model; ``params`` is this block typed).",
    )
    search: dict[str, SearchParam] = Field(default_factory=dict, description="Keys of train that the search may vary.")
    objective: Objective = Field(default_factory=Objective, description="What a trial is scored on.")
    verdict: VerdictSettings = Field(
        default_factory=VerdictSettings, description="How a trial is judged against the baseline."
    )
    abort: AbortRules = Field(default_factory=AbortRules, description="Early-abort thresholds and the hang watchdog.")
    gate: GateSettings = Field(
        default_factory=GateSettings, description="The hack gate's bounds (KL, entropy, truncation)."
    )
    timeout_s: float = Field(
        300.0,
        gt=0,
        le=30 * 86400,
        description="Per-trial wall-clock limit for the recipe as written; a trial whose size keys (the backend's "
        "work_keys: gens, steps, ...) multiply its work by k gets k times it. The time a Ray job waits for GPUs "
        "other jobs hold is not counted.",
    )
    cpus_per_trial: float = Field(1.0, gt=0, description="CPUs a trial asks Ray for (with --ray-address).")
    gpus_per_trial: float = Field(0.0, ge=0, description="GPUs a trial asks Ray for (with --ray-address).")
    full: dict[str, Any] = Field(default_factory=dict, description="train overrides for a promoted full run.")
    _params: BaseModel = PrivateAttr()

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        model = params_model(self.backend)
        self._params = _typed_params(model, self.train, "train")
        self.train = self._params.model_dump(mode="json")
        if self.full:  # a promoted run's values are checked with the recipe, not when its full run starts
            _typed_params(model, {**self.train, **self.full}, "full")
        for key, param in self.search.items():
            if key not in self.train and key not in model.model_fields:
                raise ValueError(
                    f"search names '{key}', which train does not have: add it to train or remove it from search"
                )
            _check_space(model, self.train, key, param)
        return self

    @property
    def params(self) -> BaseModel:
        """The train block as the backend's typed model (``backends.registry``), validated once, with the recipe.

        ``train`` holds the same values as plain data (what the search merges and the ledger stores)."""
        return self._params

    def with_train(self, **values: Any) -> Recipe:
        """A copy with train keys replaced (validated)."""
        return self.model_copy(update={"train": {**self.train, **values}})

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Recipe:
        """A copy; one with fields updated is validated again, so that ``params`` always says what ``train`` says."""
        if not update:
            return super().model_copy(deep=deep)
        return validate_recipe({**self.model_dump(), **update}, source=self.name)


def _check_inside(key: str, value: Any, p: SearchParam) -> None:
    """A base value searched over choices must be one of them (the baseline is that point of the space).

    A base outside a numeric range is allowed: searching a region away from where the recipe starts is a
    deliberate design (Optuna records the baseline's point as it is).
    """
    if value is not None and p.choices is not None and value not in p.choices:
        raise ValueError(
            f"train.{key} is {value!r}, which is not among search.{key} choices {p.choices}: "
            f"add it to the choices or change train.{key}"
        )


OPTUNA_CHOICE = (type(None), bool, int, float, str)  # what an Optuna categorical choice may be (it stores them)


def _check_space(model: type[BaseModel], train: dict, key: str, p: SearchParam) -> None:
    """Every value the search may give ``train.key`` is one the backend's train block takes: each choice, and a
    range's bounds and a point between them (a float range on an int key, a range on a text or yes/no key, a
    choice of another type are refused here, not when a trial is made of them mid-study)."""
    base = train.get(key)
    if p.choices is not None:
        odd = [c for c in p.choices if not isinstance(c, OPTUNA_CHOICE)]
        if odd:
            raise ValueError(
                f"search.{key} choice {short_repr(odd[0])} is not a number, text, true/false or null: list only "
                "such values"
            )
        points = [("choice {}", c) for c in p.choices]
    else:
        assert p.low is not None and p.high is not None  # a range without choices has both bounds
        if base is not None and (isinstance(base, bool) or not isinstance(base, (int, float))):
            raise ValueError(
                f"search.{key} is a range, but train.{key} is {short_repr(base)}, not a number: search it with "
                "choices, or remove it from search"
            )
        mid = int((p.low + p.high) // 2) if p.int else (p.low + p.high) / 2
        points = [("low {}", int(p.low) if p.int else p.low), ("high {}", int(p.high) if p.int else p.high)]
        points.append(("value {} (between low and high)", mid))
    for what, value in points:
        try:
            _typed_params(model, {**train, key: value}, "train")
        except ValueError as exc:
            hint = " (int: true for a whole-number key)" if what.startswith("value") and not p.int else ""
            raise ValueError(
                f"search.{key}: its {what.format(short_repr(value))} is not a value train.{key} takes ({exc}): give "
                f"search.{key} only values train.{key} takes{hint}"
            ) from None


def check_log_base(key: str, value: Any, p: SearchParam) -> None:
    """A base value searched on a log scale is above zero: Optuna takes the log of every point it has seen."""
    if p.log and p.choices is None and isinstance(value, (int, float)) and value <= 0:
        raise ValueError(
            f"train.{key} is {value!r}, but search.{key} is on a log scale, which holds only values above 0: "
            f"give train.{key} a value above 0, or drop log: true"
        )


def train_keys(backend: str) -> list[dict[str, Any]]:
    """The ``train`` keys of ``backend``: name, default and description (what `autorl recipe keys` prints)."""
    out = []
    for name, f in params_model(backend).model_fields.items():
        default = None if f.is_required() else f.get_default(call_default_factory=True)
        out.append({"key": name, "default": default, "required": f.is_required(), "description": f.description or ""})
    return out


def params_model(backend: str) -> type[BaseModel]:
    """The pydantic model that validates ``train`` for ``backend``."""
    module, _, attr = BACKENDS[backend].params.partition(":")
    return getattr(importlib.import_module(module), attr)


def _typed_params(model: type[BaseModel], train: dict, where: str) -> BaseModel:
    """``train`` validated by the backend's model; no value may be infinite or NaN, and none of the model's
    ``run_length_keys`` (steps, episodes: a run of zero trains nothing) may be below 1."""
    try:
        typed = model.model_validate(train)
    except ValidationError as exc:
        raise ValueError(validation_line(exc, where, unknown=_unknown_key)) from None
    # every backend's train model declares run_length_keys (tests/backends/test_contract.py checks it)
    lengths = model.run_length_keys  # type: ignore[attr-defined]
    for key in train:
        _check_number(f"{where}.{key}", key, getattr(typed, key, None), lengths)
        if isinstance(train[key], bool) and not isinstance(getattr(typed, key, None), bool):
            raise ValueError(  # pydantic reads true as 1 where a number is wanted: `steps: true` is a slip
                f"{where}.{key} is {str(train[key]).lower()}, where a number is wanted: give a number"
            )
    return typed


def _check_number(loc: str, key: str, value: Any, run_length_keys: tuple[str, ...]) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{loc} is {value}: give a finite number (e.g. 1e-4)")
    if key in run_length_keys and isinstance(value, (int, float)) and value <= 0:
        raise ValueError(f"{loc} is {value}: a run needs at least 1 (e.g. {key}: 40)")


def _unknown_key(loc: tuple) -> str:
    return "check the spelling (`autorl recipe keys` lists them)"


def validate_recipe(data: Any, source: str = "recipe") -> Recipe:
    """Validate a recipe dict, raising RecipeError with one line naming the field."""
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe is a YAML mapping, got {type(data).__name__}")
    odd = _key_not_text(data, ())
    if odd is not None:
        where, key = odd
        raise RecipeError(
            f"{source}: {'.'.join(where) or 'the top level'} has the key {key!r}, which is not text (YAML 1.1 reads "
            "yes/no/on/off as true/false and bare numbers as numbers): quote it"
        )
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(f"{source}: {validation_line(exc, unknown=_unknown_key)}") from None


def _key_not_text(data: Any, where: tuple[str, ...]) -> tuple[tuple[str, ...], Any] | None:
    """The first mapping key in a recipe that is not a string, and where it is (every key a recipe takes is text)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if not isinstance(key, str):
                return where, key
            found = _key_not_text(value, (*where, key))
            if found is not None:
                return found
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found = _key_not_text(value, (*where, str(i)))
            if found is not None:
                return found
    return None


def load_recipe(path: str | Path, overrides: Overrides | Iterable[str] | None = None) -> Recipe:
    """Read, override and validate a recipe file (``overrides``: parsed, or ``key=value`` strings)."""
    return recipe_from_text(read_recipe_text(path), path, overrides)


def recipe_from_text(text: str, source: str | Path, overrides: Overrides | Iterable[str] | None = None) -> Recipe:
    """Parse, override and validate a recipe's text, already read from ``source`` (named in errors)."""
    return recipe_and_text(text, source, overrides)[0]


def recipe_and_text(
    text: str, source: str | Path, overrides: Overrides | Iterable[str] | None = None
) -> tuple[Recipe, str]:
    """The validated recipe of ``text`` with ``overrides`` applied, and the text that says exactly that: each
    override written in place, every other line (comments too) kept. Where the in-place edit cannot say the same
    (a layout it does not follow), the text is written out again from the recipe's data instead."""
    overrides = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    data = parse_recipe_text(text, source)
    for path, value in overrides.items():
        _put(data, path, value)
    if overrides:
        text = _edited(text, overrides, data)
    return validate_recipe(data, source=str(source)), text


def _edited(text: str, overrides: Overrides, data: dict) -> str:
    """The recipe's text with ``--set`` values edited in place (comments and layout kept) when the edit reads back
    as ``data``, else ``data`` written out afresh: an edit of a layout the line editor does not know (a quoted
    ``"train":`` key, a flow mapping over several lines) is autorl's own text, whose errors the user never wrote."""
    try:
        edited = set_values(text, overrides)
        if loading.parse(edited) == data:
            return edited
    except (UserError, IndexError, ValueError):
        pass
    return loading.dump(data)


def check_base(recipe: Recipe, source: str | Path) -> None:
    """A study's base recipe: each value searched over choices is one of them (the baseline is that point).

    Trials may leave the recipe's space (a hypothesis' fixed values); the base may not leave its choices.
    """
    for key, param in recipe.search.items():
        try:
            _check_inside(key, recipe.train.get(key), param)
            check_log_base(key, recipe.train.get(key), param)
        except ValueError as exc:
            raise RecipeError(f"{source}: {exc}") from None


def read_recipe_text(path: str | Path) -> str:
    """A recipe file's text: the one read of it, from which its model and its committed text both come."""
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"recipe file {short(p, 200)} not found: pass the path of a .yaml recipe (see recipes/)")
    return loading.read_text(p, RecipeError, "recipe file")


def parse_recipe_text(text: str, source: str | Path) -> dict:
    """The raw YAML mapping of a recipe's text; ``source`` names it in errors."""
    data = loading.parse(text, source, RecipeError)
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe is a YAML mapping of keys to values")
    return data


def dump_values(values: dict[str, Any]) -> str:
    """Render values compactly for commit messages and tables."""
    return ", ".join(f"{k}={_fmt(v)}" for k, v in values.items())


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


# ---- overrides: ``--set key=value``, parsed once ---------------------------------------------------------------
Overrides = dict[tuple[str, ...], Any]  # a recipe path ('train', 'lr') -> its new value


_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def parse_overrides(items: Iterable[str]) -> Overrides:
    """``--set key=value`` items, each parsed once (``autorl.loading``: 3e-4 is a number); a bare key is a train key.

    A key given twice keeps its last value."""
    out: Overrides = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"--set {short(repr(item), 80)}: write key=value, e.g. --set lr=3e-4")
        path = tuple(key.strip().split("."))
        if len(path) > 6 or not all(_KEY.fullmatch(part) for part in path):
            raise RecipeError(
                f"--set {short(repr(key), 80)}: a key is up to 6 names joined by '.', each letters, "
                "digits, '_' or '-' (e.g. lr, verdict.min_effect): see `autorl recipe keys`"
            )
        try:
            value = loading.parse_value(raw)
        except loading.Refused as exc:
            raise RecipeError(f"--set {short(key.strip(), 60)}: {exc.problem}") from None
        out[("train", *path) if len(path) == 1 and path[0] not in Recipe.model_fields else path] = value
    return out


def _put(data: dict, path: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at ``path`` in parsed recipe data, making the sections on the way."""
    node = data
    for part in path[:-1]:
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            raise RecipeError(f"--set {'.'.join(path)}: '{part}' is not a section")
    node[path[-1]] = value


# ---- the recipe's text, edited in place --------------------------------------------------------------------------
def set_train_values(text: str, values: dict[str, Any]) -> str:
    """Rewrite ``train:`` values in recipe YAML text in place (``set_values`` under ``train``)."""
    return set_values(text, {("train", key): value for key, value in values.items()})


def set_values(text: str, values: dict[tuple[str, ...], Any]) -> str:
    """Rewrite the values at recipe paths in YAML text in place, keeping every other line byte for byte.

    A key that is there gets its value replaced (its comment kept); a missing one is added at the end of its
    section, a missing section with it; a section written in flow style (``abort: {window: 4}``) is rewritten as
    one flow mapping on its own line. So ``git diff`` between two attempts shows exactly the values under test.
    """
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    for path, value in values.items():
        _set_path(lines, path, value)
    return "".join(lines)


def _set_path(lines: list[str], path: tuple[str, ...], value: Any) -> None:
    lo, hi, indent = 0, len(lines), ""
    for depth, key in enumerate(path):
        i = _key_line(lines, lo, hi, indent, key)
        if i is None:
            at = _content_end(lines, lo, hi)
            lines[at:at] = _nested(path[depth:], value, indent)
            return
        rest, comment = _value_text(lines[i], indent, key)
        if depth == len(path) - 1:
            lines[i : _block_end(lines, i, hi, indent)] = [f"{indent}{key}: {loading.render(value)}{comment}\n"]
            return
        if rest:  # a flow mapping on the key's line: rewritten as one
            inner = loading.parse(rest)
            if not isinstance(inner, dict):
                raise RecipeError(f"'{key}' is not a section")
            _put(inner, path[depth + 1 :], value)
            lines[i] = f"{indent}{key}: {loading.render(inner)}{comment}\n"
            return
        lo, hi = i + 1, _block_end(lines, i, hi, indent)
        indent = _child_indent(lines, lo, hi) or indent + "  "


def _key_line(lines: list[str], lo: int, hi: int, indent: str, key: str) -> int | None:
    pat = re.compile(rf"^{re.escape(indent)}{re.escape(key)}\s*:(\s|$)")
    return next((i for i in range(lo, hi) if pat.match(lines[i])), None)


def _value_text(line: str, indent: str, key: str) -> tuple[str, str]:
    """(the value written after ``key:``, the line's trailing comment with its spaces)."""
    m = re.match(rf"^{re.escape(indent)}{re.escape(key)}\s*:(.*?)(\s+#.*)?$", line.rstrip("\n"))
    assert m is not None, "the line is the key's (_key_line found it)"
    return m.group(1).strip(), m.group(2) or ""


def _block_end(lines: list[str], i: int, hi: int, indent: str) -> int:
    """The index after the last line of the block under the key on line ``i`` (trailing comments excluded)."""
    end = i + 1
    for j in range(i + 1, hi):
        line = lines[j]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        inner = line[len(indent) :] if line.startswith(indent) else ""
        if inner[:1] in (" ", "\t") or inner.startswith("- ") or inner.rstrip() == "-":
            end = j + 1
            continue
        break
    return end


def _content_end(lines: list[str], lo: int, hi: int) -> int:
    """The index after the last line in [lo, hi) that is neither blank nor a comment (``lo`` when none is)."""
    return next(
        (j + 1 for j in range(hi - 1, lo - 1, -1) if lines[j].strip() and not lines[j].lstrip().startswith("#")), lo
    )


def _child_indent(lines: list[str], lo: int, hi: int) -> str | None:
    line = next((x for x in lines[lo:hi] if x.strip() and not x.lstrip().startswith("#")), None)
    return line[: len(line) - len(line.lstrip())] if line is not None else None


def _nested(path: tuple[str, ...], value: Any, indent: str) -> list[str]:
    """The lines of ``a:\\n  b: value`` for path ('a', 'b') at ``indent``."""
    if len(path) == 1:
        return [f"{indent}{path[0]}: {loading.render(value)}\n"]
    return [f"{indent}{path[0]}:\n", *_nested(path[1:], value, indent + "  ")]


def editable_text(text: str, source: str | Path = "") -> str:
    """The recipe text with ``train`` as an indented block, so trials edit one line per value.

    A recipe whose ``train`` is a block (or absent) is returned unchanged, comments kept; a flow-style
    ``train: {...}`` one is rewritten once, from its parsed form, before the study commits it.
    """
    lines = text.splitlines(keepends=True)
    at = _key_line(lines, 0, len(lines), "", "train")
    if at is None or not _value_text(lines[at], "", "train")[0]:
        return text
    return loading.dump(loading.parse(text, source, RecipeError) or {})
