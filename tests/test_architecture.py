"""The shape the architecture page promises (docs/architecture.md), checked on the source itself.

- no import cycle between autorl's modules (imports at module level; lazy imports inside functions are exempt);
- no SQL outside autorl/ledger.py;
- no ``hasattr`` probe of a backend: every hook is declared on ``autorl.backends.base.Backend``;
- functions stay short (none over 40 lines, docstrings excluded).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "autorl"
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|PRAGMA)\b|\b(WHERE|IS NULL|IS NOT NULL)\b")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _eager_imports(path: Path) -> set[str]:
    """autorl modules imported at module level (also under ``if``), resolved to module names."""
    out = set()
    tree = ast.parse(path.read_text())
    nodes = [n for s in tree.body for n in ([s] + (s.body if isinstance(s, ast.If) else []))]
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autorl"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("autorl"))
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in _eager_imports(p) if i in files and i != m} for m, p in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle():
    graph = _graph()
    assert len(graph) > 50  # the walk found the package
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _sql_strings(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}" for line, text in _strings(path)
            if SQL.search(text) and len(text) < 400 and "`" not in text]


def test_no_sql_outside_the_ledger():
    assert len(_sql_strings(PKG / "ledger.py")) > 5  # the detector sees the ledger's own SQL
    found = [hit for p in PKG.rglob("*.py") if p.name != "ledger.py" for hit in _sql_strings(p)]
    assert not found, "\n".join(found)


def test_no_hasattr_probe_of_a_backend():
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in PKG.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"hasattr\((self\.)?\w*backend", line)]
    assert not hits, hits


def test_functions_stay_short():
    long = []
    for p in PKG.rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = n.body[1:] if ast.get_docstring(n) is not None else n.body
                if body and body[-1].end_lineno - body[0].lineno + 1 > 40:
                    long.append(f"{p.relative_to(ROOT)}:{n.lineno} {n.name}")
    assert not long, long
