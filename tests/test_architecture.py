"""The shape the architecture page promises (docs/architecture.md), checked on the source itself.

- every import between autorl's modules, at module level, inside a function or under an ``if`` (``TYPE_CHECKING``
  too), runs down a declared layer order (``LAYERS``) or stays in its layer, and the graph of them has no cycle;
- no SQL outside the ledger package (autorl/ledger/);
- no ``hasattr`` probe of a backend: every hook is declared on ``autorl.backends.base.Backend``;
- functions stay short (none over 50 lines once formatted, docstrings excluded), classes small (none over 25 methods), and no
  file of study/, runs/ or promote/ over 350 lines.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "autorl"
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|PRAGMA)\b|\b(WHERE|IS NULL|IS NOT NULL)\b")

# Lowest first. A module may import its own layer's modules or any below it, never one above. Within a layer the
# no-cycle rule alone holds. A package prefix covers its modules; the longest matching prefix places a module.
LAYERS: list[tuple[str, ...]] = [
    (
        "autorl",
        "autorl.errors",
        "autorl.states",
        "autorl.data",
        "autorl.metrics",
        "autorl.budget",
    ),  # what everything shares
    ("autorl.loading", "autorl.locks", "autorl.ledger", "autorl.gitops", "autorl.workspace"),  # files, locks, SQL, git
    ("autorl.toolkit",),  # the GRPO toolkit every engine shares: task, reward, model, per-item eval
    ("autorl.engine",),  # the embedded trainer
    ("autorl.evaluate",),  # the per-item evaluator of a saved checkpoint
    ("autorl.backends",),  # how a run is started somewhere
    ("autorl.recipe",),  # the recipe, its train block typed by the backend's model
    ("autorl.judge",),  # what a run means
    ("autorl.search",),  # what to try next
    ("autorl.present",),  # what a person reads
    ("autorl.runs",),  # one run: opened, launched, watched, closed; slots for runs side by side
    ("autorl.promote",),  # the best recipe re-validated, then its full run
    ("autorl.study",),  # the study loop and its parts
    ("autorl.cli",),  # the command line
    ("autorl.docs",),  # the generated reference pages
]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> dict[str, int]:
    """autorl modules imported anywhere in the file (module level, in functions, under ``if``), with a line each.
    A type-only import counts too: a cycle of types is still two modules that cannot be read apart."""
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autorl"):
            for name in [node.module, *(f"{node.module}.{a.name}" for a in node.names)]:
                out.setdefault(name, node.lineno)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("autorl"):
                    out.setdefault(a.name, node.lineno)
    return out


def _graph() -> dict[str, dict[str, int]]:
    """Module -> {imported autorl module: line}, function-level imports included."""
    files = {_module(p): p for p in PKG.rglob("*.py")}
    return {m: {i: line for i, line in _imports(p).items() if i in files and i != m} for m, p in files.items()}


def _layer(module: str) -> int | None:
    found = [
        (len(prefix), i)
        for i, layer in enumerate(LAYERS)
        for prefix in layer
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(found)[1] if found else None


def _upward(graph: dict[str, dict[str, int]]) -> list[str]:
    return [
        f"{m} (layer {_layer(m)}) -> {i} (layer {_layer(i)}), line {line}"
        for m, targets in sorted(graph.items())
        for i, line in sorted(targets.items())
        if _layer(i) is not None and _layer(m) is not None and _layer(i) > _layer(m)
    ]


def _cycle(graph: dict[str, dict[str, int]] | dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle_function_level_imports_included():
    graph = _graph()
    assert len(graph) > 50  # the walk found the package
    assert "autorl.engine.grpo" in graph["autorl.engine.__main__"]  # an import inside a function is followed
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_every_module_has_a_layer_and_no_import_runs_up():
    graph = _graph()
    assert not [m for m in graph if _layer(m) is None], "place these modules in LAYERS"
    up = _upward(graph)
    assert not up, "\n".join(up)


def test_the_checks_find_a_planted_cycle_an_upward_arrow_and_imports_in_functions(tmp_path):
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _upward({"autorl.judge.x": {"autorl.study.y": 3}}) == [
        "autorl.judge.x (layer 7) -> autorl.study.y (layer 12), line 3"
    ]
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autorl.study import a\n"
        "def f():\n    from autorl.cli import main\n"
    )
    assert set(_imports(src)) == {"autorl.study", "autorl.study.a", "autorl.cli", "autorl.cli.main"}


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _sql_strings(path: Path) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}"
        for line, text in _strings(path)
        if SQL.search(text) and len(text) < 400 and "`" not in text
    ]


def test_no_sql_outside_the_ledger():
    assert len(_sql_strings(PKG / "ledger" / "store.py")) > 5  # the detector sees the ledger's own SQL
    found = [hit for p in PKG.rglob("*.py") if not p.is_relative_to(PKG / "ledger") for hit in _sql_strings(p)]
    assert not found, "\n".join(found)


def test_no_hasattr_probe_of_a_backend():
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in PKG.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"hasattr\((self\.)?\w*backend", line)
    ]
    assert not hits, hits


def test_functions_stay_short():
    long = []
    for p in PKG.rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = n.body[1:] if ast.get_docstring(n) is not None else n.body
                if body and body[-1].end_lineno - body[0].lineno + 1 > 50:
                    long.append(f"{p.relative_to(ROOT)}:{n.lineno} {n.name}")
    assert not long, long


def test_classes_stay_small_and_loop_files_short():
    big = []
    for p in PKG.rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ClassDef):
                methods = [x for x in n.body if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if len(methods) > 25:
                    big.append(f"{p.relative_to(ROOT)}:{n.lineno} {n.name}: {len(methods)} methods")
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for room in ("study", "runs", "promote")
        for p in (PKG / room).glob("*.py")
        if (n := len(p.read_text().splitlines())) > 350
    ]
    assert not big and not long, big + long


def _state_words() -> set[str]:
    from autorl import states

    enums = [
        v for v in vars(states).values() if isinstance(v, type) and issubclass(v, states.Word) and v is not states.Word
    ]
    # "ok" (a quick_check's answer, a run summary's status) and "random" (a sampler) name other things too
    return {m.value for e in enums for m in e} - {"ok", "random"}


def _compared_words(path: Path, words: set[str]) -> list[str]:
    """String literals naming a state that a comparison uses (``x == "improved"``, ``x in ("crash", ...)``)."""
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Compare):
            for c in [n.left, *n.comparators]:
                elts = c.elts if isinstance(c, (ast.Tuple, ast.List, ast.Set)) else [c]
                out += [f"{path.relative_to(ROOT)}:{n.lineno} {e.value!r}" for e in elts
                        if isinstance(e, ast.Constant) and e.value in words]  # fmt: skip
    return out


def test_states_are_compared_as_enum_members_never_as_words():
    """A trial's status, verdict, confirmation, gate, kind, proposer and crash category are ``autorl.states`` enums:
    comparing them with a string literal would let a misspelt word pass review."""
    words = _state_words()
    assert {"improved", "early-stopped", "cuda_oom", "retry_once"} <= words  # the detector knows the vocabulary
    planted = ROOT / "tests" / "data" / "architecture_planted_state.py"
    assert _compared_words(planted, words) == [f"{planted.relative_to(ROOT)}:2 'improved'"]
    found = [hit for p in PKG.rglob("*.py") for hit in _compared_words(p, words)]
    assert not found, "\n".join(found)


def test_ledger_rows_have_no_mapping_face():
    """Rows are read by attribute: ``row["verdict"]`` or ``row.get("verdict")`` on a ledger row fails."""
    from autorl.ledger import Trial

    row = Trial(verdict="improved")
    assert not hasattr(row, "get") and not hasattr(row, "__getitem__")


def _unexplained_lazy_imports(path: Path) -> list[str]:
    """Imports inside a function with no comment on their line (or the line above) saying why they are lazy."""
    lines = path.read_text().splitlines()
    out = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                if isinstance(n, (ast.Import, ast.ImportFrom)):
                    said = [lines[n.lineno - 1], lines[n.end_lineno - 1], lines[n.lineno - 2] if n.lineno > 1 else ""]
                    if not any("#" in line for line in said):
                        out.append(f"{path.relative_to(ROOT)}:{n.lineno}")
    return out


def test_imports_sit_at_the_top_unless_a_comment_says_why():
    planted = ROOT / "tests" / "data" / "architecture_planted_state.py"
    assert _unexplained_lazy_imports(planted) == [f"{planted.relative_to(ROOT)}:4"]
    found = [hit for p in PKG.rglob("*.py") for hit in _unexplained_lazy_imports(p)]
    assert not found, "\n".join(found)
