"""Every module path and dotted name the docs give exists: a reader who opens `autorl/judge/triage.py` or looks up
`autorl.judge.gains.detectable` finds it (the controller's split moved modules, and the docs kept the old names)."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "benchmarks" / "README.md"])
TOP = "autorl|tests|benchmarks|scripts|recipes|hypotheses|patches|docs"
WINGS = "search|judge|trial|present|backends|engine"
FILE = re.compile(rf"(?<![\w./-])(?:{TOP})/[\w./-]*\w")  # autorl/judge/triage.py, tests/judge/, autorl/data/rules
WING = re.compile(rf"(?<![\w./-])(?:{WINGS})/[\w/]*\.py\b")  # search/view.py: a module of autorl/
# Paths the docs name that are not ours to ship: what a benchmark writes, and the files an example says a team
# provides in its own workspace.
NOT_SHIPPED = {
    "benchmarks/out": "benchmark output",
    "scripts/train_musique.py": "a team's script (docs/backends.md)",
    "patches/terse-prompt.patch": "a workspace's own patch (docs/hypotheses.md)",
}
DOTTED = re.compile(r"(?<![\w./-])autorl(?:\.[A-Za-z_]\w*)+")  # autorl.judge.gains.detectable


def _named(pattern: re.Pattern) -> list[tuple[str, str]]:
    return sorted(
        {(doc.relative_to(ROOT).as_posix(), m.group(0)) for doc in DOCS for m in pattern.finditer(doc.read_text())}
    )


@pytest.mark.parametrize("doc, path", _named(FILE))
def test_every_file_path_in_the_docs_exists(doc, path):
    if any(path == p or path.startswith(p + "/") or path.startswith(p + "-") for p in NOT_SHIPPED):
        return
    assert (ROOT / path).exists(), f"{doc} names {path}, which does not exist"


@pytest.mark.parametrize("doc, path", _named(WING))
def test_every_module_named_by_its_wing_exists(doc, path):
    assert (ROOT / "autorl" / path).exists(), f"{doc} names {path}, which is not a module of autorl/"


@pytest.mark.parametrize("doc, name", _named(DOTTED))
def test_every_dotted_name_in_the_docs_resolves(doc, name):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if not _is_module(module):
            continue
        obj = importlib.import_module(module)
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"{doc} names {name}: {module} has no {'.'.join(parts[cut:])}"
            obj = getattr(obj, attr)
        return
    pytest.fail(f"{doc} names {name}, which is no module")


def _is_module(module: str) -> bool:
    """Whether ``module`` is a module or package of autorl (its parent must be a package for ``find_spec``)."""
    parent = module.rpartition(".")[0]
    try:
        if parent and not hasattr(importlib.import_module(parent), "__path__"):
            return False
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def test_the_patterns_see_what_they_must():
    assert FILE.findall("see `autorl/judge/gains.py` and autorl/data/rules/") == [
        "autorl/judge/gains.py",
        "autorl/data/rules",
    ]
    assert WING.findall("`search/view.py`, openrlhf's trainer/ray/ppo_actor.py") == ["search/view.py"]
    assert DOTTED.findall("(`autorl.judge.gains.detectable`), not my.autorl.x") == ["autorl.judge.gains.detectable"]
