"""Every third-party import in autorl/ is declared in pyproject.toml, under the extra that needs it.

A module imported at the top of a file must be a base dependency. One imported inside a function (lazily) may
belong to an extra instead; then the code that imports it runs only where that extra is installed, and the
``EXTRA_OF`` table below says which extra. Anything else (an undeclared import, like scipy once was) fails here.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "autorl"

# import name -> distribution name, where they differ
DIST_OF = {"yaml": "pyyaml", "git": "gitpython", "sqlite_utils": "sqlite-utils"}


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = lambda req: re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower()  # noqa: E731
    base = {name(r) for r in meta["dependencies"]}
    extras = {k: {name(r) for r in v} for k, v in meta["optional-dependencies"].items()}
    return base, extras


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level) for each absolute import of ``path``."""
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body} | {id(n) for s in tree.body if isinstance(s, ast.If) for n in s.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module.split(".")[0], id(node) in top_level))
    return out


def _third_party(mod: str) -> bool:
    return mod not in sys.stdlib_module_names and mod not in ("autorl", "__future__")


def test_every_import_is_declared():
    base, extras = _declared()
    any_extra = set().union(*extras.values())
    problems = []
    for path in sorted(PKG.rglob("*.py")):
        for mod, eager in _imports(path):
            dist = DIST_OF.get(mod, mod).lower()
            if not _third_party(mod) or dist in base:
                continue
            if eager and not _child_side(path) and not _backend_only(path):
                problems.append(f"{path.relative_to(ROOT)}: '{mod}' imported at module level but not a base dependency")
            elif dist not in any_extra:
                problems.append(f"{path.relative_to(ROOT)}: '{mod}' is declared nowhere in pyproject.toml")
    assert not problems, "\n".join(problems)


def _child_side(path: Path) -> bool:
    """The embedded trainer and the toolkit modules that hold a policy (they load torch at their head): a trial's
    child process imports them, the controller never does (tests/test_architecture.py checks that)."""
    return path.is_relative_to(PKG / "engine") or path.relative_to(PKG).as_posix() in TORCH_TOOLKIT


TORCH_TOOLKIT = ("toolkit/model.py", "toolkit/policy_eval.py", "toolkit/warmup.py")


def _backend_only(path: Path) -> bool:
    """Modules that run only inside a trial's process (TRL's runner, the reward function OpenRLHF loads, the vLLM
    worker extension of a warm pool's engines)."""
    return path.name in ("trl_runner.py", "reward_func.py", "warm_worker.py")
