"""Hypotheses: named, testable ideas about why a run is weak, and what to change.

A hypothesis is a Markdown file with YAML front matter (``hypotheses/*.md``)::

    ---
    id: h01-advantage-scaling
    title: Dividing by a tiny group std inflates advantages
    priority: high                       # high | medium | low
    symptoms: [loss_grad_spikes, advantage_outliers]   # names autorl.judge.diagnose emits
    overrides: {scale_rewards: false, loss_type: dr_grpo}
    search:
      lr: {scale: [0.5, 2.0], log: true}  # incumbent x [0.5, 2]
      eps_clip: {low: 0.1, high: 0.3}     # absolute range
    success:
      confirm: objective improves and advantage_abs_max stays below 5
      refute: no gain, or spikes persist with scale_rewards off
    backends: [embedded]                 # default: every backend
    ---
    Why this might be the problem, what to look at, where it comes from.

The controller asks ``rank`` which hypothesis to test next, builds the trial's
search space with ``resolve_search`` and ``fixed_values``, and reads a
hypothesis's standing with ``status``.

How the controller should map hypotheses onto Optuna
----------------------------------------------------
Three designs were weighed:

1. **One study, hypothesis as a categorical parameter** whose branches suggest
   different keys. TPE models each parameter independently unless
   ``multivariate=True, group=True``; even then the categorical splits the
   history into sub-spaces with a handful of trials each, the relative ranges
   (incumbent x [1, 4]) move whenever the incumbent moves, and a study-level
   "best" mixes hypotheses that change different things. The sampler would
   also choose *which* hypothesis to test, ignoring the diagnosis.
2. **One study with priors via ``enqueue_trial``** (one enqueued point per
   hypothesis). Cheap, but a single enqueued point is all a hypothesis gets:
   after it, TPE samples the recipe's whole space and no longer tests the idea.
3. **One study per hypothesis** (chosen). Each study's space is exactly
   ``resolve_search(h, incumbent, recipe.search)`` with ``fixed_values`` held
   constant, so TPE's model stays coherent and every trial is attributable to
   one idea (the ledger's ``hypothesis`` column). Choosing the next study is
   done by ``rank`` from the latest diagnosis and the verdict history, which is
   the knowledge Optuna lacks. The first trial of each study is
   ``enqueue_trial(probe_params(h, space, incumbent))``: one variable at a
   time, as the seeds ask. The hypothesis' primary lever (its first search key)
   moves to the middle of its range and every other key stays at the incumbent
   (``seed_params``). The smallest change the hypothesis allows is not used as
   the probe: it is often within noise of the incumbent (lr x1.5 on a flat run)
   or the incumbent itself (gens scale [1, 4]), a trial that can neither confirm
   nor refute the idea (measured in benchmarks/strategies.py).
   The study name (``study_name``) includes a digest of the incumbent values
   the ranges were resolved against, so when a validated hypothesis moves the
   incumbent, refining it starts a fresh study around the new point instead of
   mixing two different relative spaces in one TPE history.

Cost: with short trials a hypothesis study gets few trials, so TPE spends its
first ``n_startup_trials`` sampling at random; use a small value (4-5) there.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autorl import loading
from autorl.backends.registry import BACKENDS, BackendName
from autorl.data import shipped
from autorl.errors import UserError, validation_line
from autorl.judge import gains
from autorl.judge.diagnose import Diagnosis, bottleneck_names, bottleneck_symptoms, symptom_names
from autorl.ledger import Trial
from autorl.recipe import Objective, SearchParam, VerdictSettings, params_model
from autorl.states import Confirmation, TrialStatus, Verdict

SHIPPED_DIR = shipped("hypotheses")
"""The library shipped with autorl (one .md per hypothesis)."""

DEMOTE_AFTER = 2
"""A hypothesis tried this many times without an improvement is demoted."""

SCORE: dict[str, Any] = {
    "symptom": 10.0,  # per fired symptom it names that points to the diagnosed bottleneck
    "side_symptom": 5.0,  # per fired symptom it names that points elsewhere (often a consequence)
    "bottleneck": 4.0,  # when it names the diagnosed bottleneck
    "priority": {"high": 3.0, "medium": 2.0, "low": 1.0},
    "exploit": 20.0,  # validated and its latest trials still help
    "demoted": -30.0,  # tried DEMOTE_AFTER times without improvement
}
"""Ranking weights: symptom match dominates priority; history overrides both."""

PRIORITY_ORDER = {"high": 0, "medium": 1, "low": 2}
VERDICTS = tuple(Verdict)  # improved, regressed, flat, crash, pruned


class HypothesisError(UserError):
    """A hypothesis file is malformed, or does not fit the backend or incumbent."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- the model


class HypothesisParam(_Model):
    """A searched key under a hypothesis: absolute range, choices, or a range relative to the incumbent."""

    low: float | None = Field(None, description="Absolute lower bound.")
    high: float | None = Field(None, description="Absolute upper bound.")
    choices: list[Any] | None = Field(None, description="Categorical choices.")
    scale: tuple[float, float] | None = Field(None, description="Relative range: incumbent x [a, b].")
    log: bool = Field(False, description="Sample on a log scale.")
    int: bool = Field(False, description="Integer range (required for integer keys).")

    @model_validator(mode="after")
    def _one_form(self) -> HypothesisParam:
        forms = [self.scale is not None, self.choices is not None, self.low is not None or self.high is not None]
        if sum(forms) != 1:
            raise ValueError("give exactly one of {low, high}, {choices} or {scale: [a, b]}")
        if self.scale is not None:
            a, b = self.scale
            if not (math.isfinite(a) and math.isfinite(b)):
                raise ValueError(f"scale [{a}, {b}]: need finite factors")
            if a < 0 or a > b or (self.log and a <= 0):
                raise ValueError(f"scale [{a}, {b}]: need 0 <= a <= b (a > 0 with log)")
        elif self.choices is None:
            SearchParam(low=self.low, high=self.high, log=self.log, int=self.int)
        return self


class Success(_Model):
    """What result confirms or refutes the hypothesis."""

    confirm: str = Field(description="Result that confirms it (in terms of the objective and metrics).")
    refute: str = Field(description="Result that rules it out.")


class Hypothesis(_Model):
    """One hypothesis: its front matter plus the Markdown body."""

    id: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]*$", description="Unique id, the file's stem, e.g. h01-advantage-scaling."
    )
    title: str = Field(min_length=1, description="One line.")
    priority: Literal["high", "medium", "low"] = Field(description="Prior belief that this is the problem.")
    symptoms: list[str] = Field(
        default_factory=list, description="Diagnosis symptom or bottleneck names that point here."
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Train keys set to fixed values under this hypothesis."
    )
    search: dict[str, HypothesisParam] = Field(
        default_factory=dict, description="Train keys Optuna may vary, and their ranges."
    )
    success: Success = Field(description="What confirms or refutes it.")
    patch: str | None = Field(
        None,
        description="Patch file applied to the trial's worktree, relative to the library's parent folder (e.g. "
        "patches/x.patch).",
    )
    backends: list[BackendName] | None = Field(None, description="Backends it applies to; omitted = all.")
    body: str = Field("", description="The Markdown text below the front matter (set by the loader).")
    source: str | None = Field(None, description="File it was loaded from (set by the loader).")

    @model_validator(mode="after")
    def _check(self) -> Hypothesis:
        known = set(symptom_names()) | set(bottleneck_names())
        unknown = [s for s in self.symptoms if s not in known]
        if unknown:
            hint = difflib.get_close_matches(unknown[0], known, n=1)
            fix = f"did you mean {hint[0]!r}?" if hint else "see docs/hypotheses.md for the names"
            raise ValueError(f"field 'symptoms': unknown name {unknown[0]!r}: {fix}")
        both = set(self.overrides) & set(self.search)
        if both:
            raise ValueError(f"field 'search.{sorted(both)[0]}' is also in overrides: fix it or search it, not both")
        return self

    def applies_to(self, backend: str) -> bool:
        """Whether this hypothesis is meant for ``backend``."""
        return self.backends is None or backend in self.backends

    def actionable(self) -> bool:
        """Whether the controller can run it unattended (it changes a key or applies a patch)."""
        return bool(self.overrides or self.search or self.patch)

    def root(self) -> Path:
        """The library's parent folder, which its patch paths are relative to (and must stay inside)."""
        return Path(self.source).resolve().parent.parent if self.source else Path.cwd().resolve()

    def patch_path(self) -> Path | None:
        """Absolute path of the patch file, if any."""
        return self.root() / self.patch if self.patch else None


class HypothesisStatus(_Model):
    """Where a hypothesis stands after the trials that tested it."""

    status: Literal["pending", "testing", "validated", "invalidated", "inconclusive"] = Field(
        description="Seed 002's status vocabulary."
    )
    confidence: Literal["high", "medium", "low"] = Field(description="How strong the evidence is.")
    counts: dict[str, int] = Field(description="Trials by verdict, plus 'running' and 'tried' (finished).")
    demoted: bool = Field(False, description="Tried DEMOTE_AFTER times without an improvement.")
    exploit: bool = Field(False, description="Validated and the latest trials still improve or are too few to say.")
    detectable: float | None = Field(
        None,
        description="The smallest gain its flat trials could have detected "
        "(the most sensitive of them), None without one.",
    )
    note: str = Field("", description="Why it is not invalidated although nothing improved, when that is so.")


class Ranked(_Model):
    """A hypothesis with its rank score and the reason."""

    hypothesis: Hypothesis = Field(description="The hypothesis.")
    score: float = Field(description="Higher first.")
    why: str = Field(description="One line: matched symptoms, priority and history.")
    status: HypothesisStatus = Field(description="Its standing from the trial history.")


# ---------------------------------------------------------------- loading

MAX_FILES = 1000  # hypothesis files read from one folder


def load_library(dirs: list[Path]) -> list[Hypothesis]:
    """All hypotheses in ``dirs`` (later folders override ids of earlier ones), sorted by id."""
    found: dict[str, Hypothesis] = {}
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise HypothesisError(f"hypotheses folder {d} not found: create it or drop it from the list")
        paths = sorted(d.glob("*.md"))
        if len(paths) > MAX_FILES:
            raise HypothesisError(
                f"hypotheses folder {d} holds {len(paths):,} .md files, more than the {MAX_FILES:,} "
                "autorl reads: keep the hypotheses you mean there"
            )
        for path in paths:
            if path.name.lower() != "readme.md":
                h = load_hypothesis(path)
                found[h.id] = h
    return [found[k] for k in sorted(found)]


def load_hypothesis(path: Path) -> Hypothesis:
    """Parse and validate one hypothesis file."""
    meta, body = _split_front_matter(path)
    for reserved in ("body", "source"):
        if reserved in meta:
            raise HypothesisError(f"{path}: field '{reserved}' is set by the loader: remove it from the front matter")
    try:
        h = Hypothesis.model_validate({**meta, "body": body.strip(), "source": str(path)})
    except ValidationError as exc:
        raise HypothesisError(f"{path}: {_first_error(exc)}") from None
    if h.id != path.stem:
        raise HypothesisError(f"{path}: field 'id' is {h.id!r} but the file is {path.name}: make them match")
    _check_patch(h, path)
    for backend in [*h.backends] if h.backends else list(BACKENDS):
        check_keys(h, backend, path)
    return h


def _split_front_matter(path: Path) -> tuple[dict, str]:
    text = loading.read_text(path, HypothesisError, "hypothesis file").removeprefix("\ufeff").replace("\r\n", "\n")
    m = re.match(r"^---[ \t]*\n(.*?)\n---[ \t]*(?:\n|$)", text, re.S)
    if not m:
        raise HypothesisError(
            f"{path}: no YAML front matter: start the file with a '---' block holding id, title, priority, ..."
        )
    meta = loading.parse(m.group(1), path, HypothesisError, first_line=2, where=" in the front matter")
    if not isinstance(meta, dict):
        raise HypothesisError(f"{path}: front matter must be a YAML mapping of fields")
    return meta, text[m.end() :]


def _first_error(exc: ValidationError) -> str:
    return validation_line(exc, unknown=_unknown_field)


def _unknown_field(loc: tuple) -> str:
    hint = difflib.get_close_matches(str(loc[-1]), Hypothesis.model_fields, n=1)
    return f"did you mean '{hint[0]}'?" if hint and len(loc) == 1 else "see docs/hypotheses.md for the fields"


def _check_patch(h: Hypothesis, path: Path) -> None:
    p = h.patch_path()
    if p is None or h.patch is None:
        return
    folder = h.root()
    if not h.patch.isprintable():  # a NUL or a control byte: no file is named so (realpath refuses a NUL)
        raise HypothesisError(
            f"{path}: field 'patch': {h.patch!r} holds a control character: give a path such as patches/NAME.patch"
        )
    if Path(h.patch).is_absolute() or not Path(os.path.realpath(p)).is_relative_to(folder):
        raise HypothesisError(
            f"{path}: field 'patch': {h.patch} is outside {folder}: give a path inside it, such as patches/NAME.patch"
        )
    if not p.is_file():
        raise HypothesisError(f"{path}: field 'patch': {p} not found: add the patch file or remove the field")


def check_keys(h: Hypothesis, backend: str, where: Path | str | None = None) -> None:
    """Raise HypothesisError if overrides/search use keys or values ``backend`` does not accept.

    Backends whose parameter model is not importable are not checked.
    """
    if not (h.overrides or h.search):
        return
    try:
        model = params_model(backend)
    except (ImportError, AttributeError):
        return
    where = where or h.source or h.id
    for key, value in h.overrides.items():
        _check_value(model, backend, key, value, f"{where}: field 'overrides.{key}'")
    for key, spec in h.search.items():
        _check_search(model, backend, key, spec, f"{where}: field 'search.{key}'")


def _check_value(model: type[BaseModel], backend: str, key: str, value: Any, loc: str) -> None:
    if key not in model.model_fields:
        raise HypothesisError(
            f"{loc}: '{key}' is not a train key of backend {backend}: check the spelling or set backends"
        )
    if isinstance(value, float) and not math.isfinite(value):  # as a recipe's value is refused (recipe._check_number)
        raise HypothesisError(f"{loc}: {value!r} is not a finite number: give a number")
    try:
        model.model_validate({key: value})
    except ValidationError as exc:
        errs = [e for e in exc.errors() if e["loc"] and e["loc"][0] == key]
        if errs:
            raise HypothesisError(f"{loc}: {errs[0]['msg']} (got {value!r})") from None


def _check_search(model: type[BaseModel], backend: str, key: str, spec: HypothesisParam, loc: str) -> None:
    if key not in model.model_fields:
        raise HypothesisError(
            f"{loc}: '{key}' is not a train key of backend {backend}: check the spelling or set backends"
        )
    if spec.choices is not None:
        for choice in spec.choices:
            _check_value(model, backend, key, choice, loc)
        return
    if model.model_fields[key].annotation is int and not spec.int:
        raise HypothesisError(f"{loc}: {key} is an integer: add int: true")
    if spec.low is not None and spec.high is not None:
        for bound in (spec.low, spec.high):
            _check_value(model, backend, key, int(bound) if spec.int else bound, loc)


# ---------------------------------------------------------------- search space


def resolve_search(h: Hypothesis, incumbent: dict, recipe_search: dict[str, SearchParam]) -> dict[str, SearchParam]:
    """The Optuna space under ``h``.

    Only keys in ``h.search`` are searched; every other key stays at the
    incumbent (or at ``h.overrides``; see ``fixed_values``). Relative ranges are
    resolved against the incumbent. Where the recipe also searches a key, its
    range is the user's limit: numeric ranges are clipped to it (collapsing to
    the nearest bound if they miss it entirely) and choices are filtered by it
    when any survive.
    """
    return {
        key: _clip(key, _absolute(h, key, spec, incumbent), recipe_search.get(key)) for key, spec in h.search.items()
    }


def _absolute(h: Hypothesis, key: str, spec: HypothesisParam, incumbent: dict) -> SearchParam:
    if spec.scale is None:
        return SearchParam(low=spec.low, high=spec.high, choices=spec.choices, log=spec.log, int=spec.int)
    base = incumbent.get(key)
    if not isinstance(base, (int, float)) or isinstance(base, bool):
        raise HypothesisError(
            f"{h.id}: search.{key} is relative but the incumbent has no number for {key}: give an absolute range"
        )
    low, high = base * spec.scale[0], base * spec.scale[1]
    if not (math.isfinite(low) and math.isfinite(high)):
        raise HypothesisError(
            f"{h.id}: search.{key} scales the incumbent {key} {base} by {spec.scale[0]:g}-{spec.scale[1]:g}, past "
            "the largest number: give a smaller scale or an absolute range"
        )
    if spec.int:
        low, high = max(1, round(low)), max(1, round(high))
    if spec.log and low <= 0:
        raise HypothesisError(
            f"{h.id}: search.{key} is relative on a log scale but the incumbent {key} is {base}: give an absolute range"
        )
    return SearchParam(low=low, high=high, log=spec.log, int=spec.int)


def _clip(key: str, space: SearchParam, limit: SearchParam | None) -> SearchParam:
    if limit is None:
        return space
    if space.choices is not None:
        kept = [c for c in space.choices if limit.choices is None or c in limit.choices]
        return space.model_copy(update={"choices": kept or space.choices})
    if limit.low is None or limit.high is None:
        return _within_choices(space, limit.choices) if limit.choices else space
    assert space.low is not None and space.high is not None  # a range without choices has both bounds
    low, high = max(space.low, limit.low), min(space.high, limit.high)
    if low > high:
        low = high = limit.high if space.low > limit.high else limit.low
    return space.model_copy(update={"low": low, "high": high})


def _within_choices(space: SearchParam, choices: list) -> SearchParam:
    """A numeric range under a recipe that searches the key as choices: the choices inside the range (the
    nearest one when none is), so a relative range never leaves the user's list (gens x 4 past the largest)."""
    low, high = space.low, space.high
    assert low is not None and high is not None  # a range without choices has both bounds
    inside = [c for c in choices if low <= c <= high]
    if not inside:
        inside = [min(choices, key=lambda c: min(abs(c - low), abs(c - high)))]
    return SearchParam(choices=inside)


def can_change(h: Hypothesis, incumbent: dict, recipe_search: dict[str, SearchParam]) -> bool:
    """Whether a trial under ``h`` can differ from ``incumbent`` at all: it carries a patch, an override that the
    incumbent does not already hold, or a search key with a value other than the incumbent's. Otherwise every
    trial under it would repeat the incumbent and tell nothing (h06's ``lora_rank: 0`` on a recipe that trains
    all parameters)."""
    if h.patch_path() is not None or any(incumbent.get(k) != v for k, v in h.overrides.items()):
        return True
    return any(_varies(p, incumbent.get(k)) for k, p in resolve_search(h, incumbent, recipe_search).items())


def _varies(p: SearchParam, value: Any) -> bool:
    if p.choices is not None:
        return any(c != value for c in p.choices)
    return p.low != p.high or p.low != value


def fixed_values(h: Hypothesis, incumbent: dict) -> dict[str, Any]:
    """Train values every trial under ``h`` starts from: the incumbent with ``h.overrides`` applied."""
    return {**incumbent, **h.overrides}


def seed_params(space: dict[str, SearchParam], incumbent: dict) -> dict[str, Any]:
    """The point to ``enqueue_trial`` first: the incumbent, moved just inside the space."""
    return {key: _nearest(p, incumbent.get(key)) for key, p in space.items()}


def probe_params(h: Hypothesis, space: dict[str, SearchParam], incumbent: dict) -> dict[str, Any]:
    """The first trial under ``h``: its first search key at the middle of its range, the rest at ``seed_params``.

    The middle is geometric on log scales. For choices it is the middle of the
    choices that differ from the incumbent, so the probe always changes the lever.
    """
    point = seed_params(space, incumbent)
    lever = next((k for k in h.search if k in space), None)
    if lever is not None:
        point[lever] = _middle(space[lever], incumbent.get(lever))
    return point


def _middle(p: SearchParam, value: Any) -> Any:
    if p.choices is not None:
        others = [c for c in p.choices if c != value] or p.choices
        return others[(len(others) - 1) // 2]
    assert p.low is not None and p.high is not None  # a range without choices has both bounds
    v = (p.low * p.high) ** 0.5 if p.log else (p.low + p.high) / 2
    return int(round(v)) if p.int else v


def _nearest(p: SearchParam, value: Any) -> Any:
    if p.choices is not None:
        return value if value in p.choices else p.choices[0]
    assert p.low is not None and p.high is not None  # a range without choices has both bounds
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        value = p.low
    v = min(max(float(value), p.low), p.high)
    return int(round(v)) if p.int else v


def study_name(h: Hypothesis, incumbent: dict, prefix: str = "autorl") -> str:
    """Optuna study name for ``h`` around this incumbent: ``<prefix>/<id>/<digest>``."""
    keys = sorted(set(h.search) | set(h.overrides))
    payload = json.dumps({k: incumbent.get(k) for k in keys}, sort_keys=True, default=str)
    return f"{prefix}/{h.id}/{hashlib.sha1(payload.encode()).hexdigest()[:8]}"


# ---------------------------------------------------------------- status


def counted_verdict(t: Trial) -> Verdict | None:
    """A trial's verdict as a hypothesis counts it: an improvement only once confirmed (a candidate is still
    open, a rejected one is flat, and so is a suspect one: the hack gate found its gain not matched by the task);
    ledgers from before confirmation existed keep their verdict."""
    v, state = t.verdict, t.confirmation
    if v != Verdict.IMPROVED or state in (None, Confirmation.CONFIRMED):
        return v
    return Verdict.FLAT if state in (Confirmation.REJECTED, Confirmation.SUSPECT) else None


def _counts(h: Hypothesis, trials: list[Trial], sees: Callable[[Trial], bool]) -> dict[str, int]:
    mine = [t for t in trials if t.hypothesis == h.id and not t.confirms]
    counts: dict[str, int] = {v: sum(counted_verdict(t) == v for t in mine) for v in VERDICTS}
    counts[TrialStatus.RUNNING] = sum(counted_verdict(t) not in VERDICTS for t in mine)
    counts["tried"] = sum(counts[v] for v in VERDICTS)
    counts["sensitive_flat"] = sum(t.verdict == Verdict.FLAT and sees(t) for t in mine)
    return counts


STATUS_RULES: list[tuple[str, str, Callable[[dict[str, int]], bool]]] = [
    ("pending", "low", lambda c: c["tried"] == 0 and c[TrialStatus.RUNNING] == 0),
    ("testing", "low", lambda c: c["tried"] == 0),
    ("validated", "high", lambda c: c[Verdict.IMPROVED] >= 2 and c[Verdict.REGRESSED] == 0),
    ("validated", "medium", lambda c: c[Verdict.IMPROVED] >= 1 and c[Verdict.IMPROVED] > c[Verdict.REGRESSED]),
    ("inconclusive", "medium", lambda c: c[Verdict.IMPROVED] >= 1),
    (
        "invalidated",
        "high",
        lambda c: c[Verdict.REGRESSED] >= DEMOTE_AFTER and c[Verdict.REGRESSED] + c[Verdict.FLAT] >= 3,
    ),
    ("invalidated", "medium", lambda c: c[Verdict.REGRESSED] + c["sensitive_flat"] >= DEMOTE_AFTER),
    ("testing", "low", lambda c: c[TrialStatus.RUNNING] > 0),
    ("inconclusive", "low", lambda c: True),
]
"""First matching row decides (status, confidence) from the verdict counts (keyed by verdict, plus ``running``:
trials not judged yet, ``tried`` and ``sensitive_flat``).

A regressed trial is evidence against the idea; a flat one only when its test could have seen a gain worth having
(``sensitive_flat``: its interval detects ``verdict.meaningful_effect`` 4 times in 5, ``autorl.judge.gains``). Two
flat trials whose intervals are +-0.05 say nothing about a gain of 0.03: the hypothesis stays inconclusive, and
says what its tests could see. Crashes and prunes never validate or invalidate an idea (they say the trial did not
measure it), but they count towards demotion: seed 000's "if the idea keeps failing after a few sensible fixes,
log it as crash and move on".
"""


def status(
    h: Hypothesis, trials: list[Trial], settings: VerdictSettings | None = None, objective: Objective | None = None
) -> HypothesisStatus:
    """The standing of ``h`` from the trials whose ``hypothesis`` is ``h.id``, judged with the study's verdict
    ``settings`` (the recipe's ``verdict:`` block; its defaults when None). With the study's ``objective``, a flat
    trial's detectable gain is held against what the metric's range allows over its parent (``gains.sensitivity``):
    one beyond it is a test that could detect no gain at all, never a gain to state."""
    s = settings or VerdictSettings()
    seen = {
        id(t): gains.sensitivity(t, objective, s.level, s.min_effect)
        for t in trials
        if t.hypothesis == h.id and t.verdict == Verdict.FLAT
    }
    c = _counts(
        h, trials, lambda t: ((seen[id(t)].seen if id(t) in seen else None) or math.inf) <= s.meaningful_effect
    )  # a test that could see no possible gain is no evidence against it
    state, confidence = next((st, conf) for st, conf, rule in STATUS_RULES if rule(c))
    detectable = min((v.seen for v in seen.values() if v.seen is not None), default=None)
    return HypothesisStatus(
        status=state,
        confidence=confidence,
        counts=c,
        demoted=c[Verdict.IMPROVED] == 0 and c["tried"] >= DEMOTE_AFTER,
        exploit=state == "validated" and not _stale(h, trials),
        detectable=detectable,
        note=_note(c, list(seen.values()), detectable, objective, s) if state == "inconclusive" else "",
    )


def _note(
    c: dict[str, int],
    seen: list[gains.Sensitivity],
    detectable: float | None,
    objective: Objective | None,
    s: VerdictSettings,
) -> str:
    """Why an inconclusive hypothesis whose trials are flat, none improved, is not invalidated: what they could
    detect ("" when some trial improved or none is flat)."""
    if not c[Verdict.FLAT] or c[Verdict.IMPROVED] != 0:
        return ""
    if detectable is not None:
        could = f"a gain of +{detectable:.3f} or more"
    elif objective is not None and any(v.blind for v in seen):  # blind needs the objective's range
        could = f"no gain {objective.metric} allows over the parent"
    else:
        could = "no gain it could state"
    return (
        f"{c[Verdict.FLAT]} flat trial(s) could detect {could}, not the {s.meaningful_effect:g} worth finding "
        "(verdict.meaningful_effect)"
    )


def _stale(h: Hypothesis, trials: list[Trial]) -> bool:
    """The latest DEMOTE_AFTER finished trials of h all failed to improve."""
    done = [t.verdict for t in trials if t.hypothesis == h.id and t.verdict in VERDICTS]
    recent = done[-DEMOTE_AFTER:]
    return len(recent) == DEMOTE_AFTER and Verdict.IMPROVED not in recent


# ---------------------------------------------------------------- ranking


def rank(
    hyps: list[Hypothesis], diagnosis: Diagnosis | None, trials: list[Trial], backend: str, advisory: bool = False
) -> list[Ranked]:
    """Hypotheses for ``backend``, best first.

    Score = 10 per symptom of the latest diagnosis the hypothesis names that
    points to the diagnosed bottleneck (5 for other fired symptoms, which are
    often consequences: a collapsed run also has zero-std groups), +4 if it
    names the diagnosed bottleneck, +3/2/1 for priority, +20 while a
    validated hypothesis keeps improving (exploit: refine it around the new
    incumbent), -30 once tried ``DEMOTE_AFTER`` times without improvement.
    Ties: priority, then id. Hypotheses that change nothing a trial can run
    (advisory ones) are left out unless ``advisory``. ``trials`` are in ledger order.
    """
    out = []
    for h in hyps:
        if h.applies_to(backend) and (advisory or h.actionable()):
            out.append(_score(h, diagnosis, status(h, trials)))
    return sorted(out, key=lambda r: (-r.score, PRIORITY_ORDER[r.hypothesis.priority], r.hypothesis.id))


def _score(h: Hypothesis, diagnosis: Diagnosis | None, st: HypothesisStatus) -> Ranked:
    fired = diagnosis.names() if diagnosis else set()
    core = bottleneck_symptoms(diagnosis.bottleneck) if diagnosis else set()
    matched = [s for s in h.symptoms if s in fired]
    on_bottleneck = diagnosis is not None and diagnosis.bottleneck in h.symptoms
    score = sum(SCORE["symptom"] if s in core else SCORE["side_symptom"] for s in matched)
    score += SCORE["bottleneck"] * on_bottleneck + SCORE["priority"][h.priority]
    score += SCORE["exploit"] * st.exploit + SCORE["demoted"] * st.demoted
    return Ranked(hypothesis=h, score=score, why=_why(h, matched, on_bottleneck, diagnosis, st), status=st)


def _why(
    h: Hypothesis, matched: list[str], on_bottleneck: bool, diagnosis: Diagnosis | None, st: HypothesisStatus
) -> str:
    parts = [f"matches {', '.join(matched)}" if matched else "no symptom match"]
    if on_bottleneck and diagnosis is not None:
        parts.append(f"bottleneck {diagnosis.bottleneck}")
    parts.append(f"priority {h.priority}")
    c = st.counts
    history = f"{st.status}" + (f" ({c[Verdict.IMPROVED]} improved of {c['tried']} tried)" if c["tried"] else "")
    if st.exploit:
        history += ", exploit"
    elif st.demoted:
        history += f", demoted after {c['tried']} without improvement"
    parts.append(history)
    return "; ".join(parts)


def describe_space(space: dict[str, SearchParam]) -> str:
    """Compact rendering of a resolved space for logs: ``lr=[1e-05, 0.0001] log, gens={8,16}``."""
    return ", ".join(f"{k}={_fmt_param(p)}" for k, p in space.items())


def _fmt_param(p: SearchParam) -> str:
    if p.choices is not None:
        return "{" + ",".join(str(c) for c in p.choices) + "}"
    assert p.low is not None and p.high is not None  # a range without choices has both bounds
    bounds = f"[{int(p.low)}, {int(p.high)}]" if p.int else f"[{p.low:.3g}, {p.high:.3g}]"
    return bounds + (" log" if p.log else "")
