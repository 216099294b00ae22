"""Generated edits of every rules table: what a person editing a table (the shipped ones, or the workspace's own
crash families that ``autorl triage label`` writes) can do to it. Property: the table loads and is then usable, or
loading says in one line which table and file is wrong and to fix it (``RulesError``); never another exception.

Edits are made from the tables themselves: a key removed, a value replaced by one of another type or an extreme
one, an unknown key added, a list entry duplicated or emptied, the text cut short.
"""

from __future__ import annotations

import copy
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from autorl import loading
from autorl.data import shipped
from autorl.errors import RulesError
from autorl.judge import abort, diagnose, hackgate, silent, triage
from autorl.runs import plan
from autorl.search import moves, revisit
from tests.property import profiles  # noqa: F401 - registers and loads the hypothesis profiles first

# file, model, what, doc, check, includes: as each module loads its table
TABLES: dict[str, tuple[Any, str, str, Any, str | None]] = {
    "abort.yaml": (abort._Table, "abort rules", "docs/triage.md", abort._unknown_threshold, None),
    "diagnosis.yaml": (diagnose.DiagnosisRules, "diagnosis rules", "docs/hypotheses.md", diagnose._unknown_names, None),
    "hack_gate.yaml": (hackgate.GateRules, "hack gate rules", "docs/triage.md", None, None),
    "silent.yaml": (silent.SilentRules, "silent-failure rules", "docs/triage.md", None, None),
    "crash_rules.yaml": (triage.CrashRules, "crash rules", "docs/triage.md", triage._bad_pattern, "families_from"),
    "crash_families.yaml": (triage.CrashRules, "crash rules", "docs/triage.md", triage._bad_pattern, "families_from"),
    "moves.yaml": (moves.MoveTable, "move rules", "docs/hypotheses.md", None, None),
    "revisit.yaml": (revisit.RevisitTable, "revisit rules", "docs/hypotheses.md", None, None),
    "plan.yaml": (plan.PlanRules, "planning rules", "docs/architecture.md", None, None),
}
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["(", "[a-", "*", "(?P<x", "\\", "a" * 5000, "((a+)+)+$"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
LOG = "Traceback (most recent call last):\n  File 'train.py', line 3\ntorch.OutOfMemoryError: CUDA out of memory.\n"


def _paths(node: Any, at: tuple = ()) -> list[tuple]:
    """Every place in a parsed table: dict keys and list indexes, depth first."""
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:6]):
            out += _paths(v, (*at, i))
    return out


def _get(node: Any, path: tuple) -> Any:
    for part in path:
        node = node[part]
    return node


@st.composite
def edits(draw, data: Any) -> tuple[str, Any]:
    """One edit of ``data``: (what was done, the edited data)."""
    data = copy.deepcopy(data)
    places = [p for p in _paths(data) if p]
    if not places:
        return "unchanged", data
    where = draw(st.sampled_from(places))
    parent, last = _get(data, where[:-1]), where[-1]
    kind = draw(st.sampled_from(["remove", "replace", "unknown key", "duplicate", "empty"]))
    if kind == "remove":
        del parent[last]
    elif kind == "replace":
        parent[last] = draw(ODD_VALUES)
    elif kind == "unknown key" and isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=12))] = draw(ODD_VALUES)
    elif kind == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[last]))
    elif kind == "empty":
        value = parent[last]
        parent[last] = type(value)() if isinstance(value, (list, dict, str)) else None
    return f"{kind} at {'/'.join(map(str, where))}", data


def _check(name: str, folder: Path, what: str) -> None:
    model, label, doc, check, includes = TABLES[name]
    main = folder / ("crash_rules.yaml" if name == "crash_families.yaml" else name)
    try:
        loaded = loading.load_table(main, model, label, doc, check, includes=includes)
    except RulesError as exc:
        text = str(exc)
        assert "\n" not in text and text.startswith(label), (what, text)
        assert re.search(r": (fix|restore) the file \(see docs/", text), (what, text)
        return
    if model is triage.CrashRules:  # a table that loads must also work on a log
        lines = LOG.splitlines()
        triage.detect_engine(lines, loaded)
        list(triage._hits(lines, loaded))


def _folder_with(name: str, text: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="autorl-rules-"))
    for other in ("crash_rules.yaml", "crash_families.yaml"):
        shutil.copy(shipped("rules", other), folder / other)
    (folder / name).write_text(text)
    return folder


@given(st.sampled_from(sorted(TABLES)), st.data())
def test_an_edited_rules_table_loads_or_is_refused_in_one_line(name, data):
    original = yaml.safe_load(shipped("rules", name).read_text())
    what, edited = data.draw(edits(original))
    folder = _folder_with(name, yaml.safe_dump(edited, sort_keys=False))
    try:
        _check(name, folder, what)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@given(st.sampled_from(sorted(TABLES)), st.floats(min_value=0.0, max_value=1.0))
def test_a_rules_table_cut_short_loads_or_is_refused_in_one_line(name, fraction):
    text = shipped("rules", name).read_text()
    folder = _folder_with(name, text[: int(len(text) * fraction)])
    try:
        _check(name, folder, f"cut at {fraction:.3f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@given(st.data())
def test_an_edited_workspace_families_file_triages_or_is_refused_in_one_line(data):
    """The workspace's own families (``.autorl/triage/families.yaml``), the table a user is most likely to edit by
    hand: made from shipped families, then edited; ``classify`` reads it on every crash."""
    shipped_families = yaml.safe_load(shipped("rules", "crash_families.yaml").read_text())["families"][:3]
    what, edited = data.draw(edits({"families": shipped_families}))
    folder = Path(tempfile.mkdtemp(prefix="autorl-local-"))
    path = folder / "families.yaml"
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    try:
        report = triage.classify(LOG, 1, local=path)
        assert report.category, what
    except RulesError as exc:
        text = str(exc)
        assert "\n" not in text and text.startswith("local crash families"), (what, text)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
