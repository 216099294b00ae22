"""Test helpers for the OpenRLHF backend: real wheels from the package registry.

``openrlhf`` cannot be installed on a CPU box, but its wheels are plain zips.
These helpers download the wheel of a version (cached in ``$AUTORL_WHEEL_CACHE``
or a session temp dir), extract it, and rebuild the ``train_ppo_ray`` argparse
parser from its ``add_argument`` calls with ``ast``, so autorl's argv can be
parsed by the real flag definitions without importing ray, vllm or deepspeed.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

OLD_VERSION = "0.9.3"
NEW_VERSION = "0.11.2"
_TYPES = {"int": int, "float": float, "str": str}


def wheel_cache(tmp_root: Path) -> Path:
    """The wheel cache directory: $AUTORL_WHEEL_CACHE or a dir under ``tmp_root``."""
    path = Path(os.environ.get("AUTORL_WHEEL_CACHE") or tmp_root / "wheels")
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_wheel(version: str, cache: Path) -> Path:
    """Path of the openrlhf ``version`` wheel, downloading it once; skip if the registry is unreachable."""
    found = sorted(cache.glob(f"openrlhf-{version}-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"openrlhf=={version}", "-d", str(cache)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    found = sorted(cache.glob(f"openrlhf-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        pytest.skip(f"cannot download openrlhf=={version} from the package registry: {proc.stderr.strip()[-200:]}")
    return found[0]


def extract_site(version: str, cache: Path) -> Path:
    """A fresh-or-cached directory holding the wheel's ``openrlhf`` package (like site-packages)."""
    site = cache / f"site-{version}"
    if (site / "openrlhf").is_dir():
        return site
    tmp = cache / f"unzip-{version}"
    with zipfile.ZipFile(fetch_wheel(version, cache)) as zf:
        zf.extractall(tmp)
    pkg = next(tmp.glob("openrlhf-*.data/purelib/openrlhf"), None) or tmp / "openrlhf"
    site.mkdir(parents=True, exist_ok=True)
    pkg.rename(site / "openrlhf")
    return site


def parser_from_source(path: Path) -> argparse.ArgumentParser:
    """An argparse parser with every ``add_argument`` call found in ``path`` (loops unrolled)."""
    parser = argparse.ArgumentParser(prog=path.name, add_help=False, exit_on_error=False)
    for args, kwargs in _calls(ast.parse(path.read_text()).body, {}):
        parser.add_argument(*args, **kwargs)
    return parser


def _calls(body: list[ast.stmt], env: dict):
    for stmt in body:
        if isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name):
            for value in ast.literal_eval(stmt.iter):
                yield from _calls(stmt.body, {**env, stmt.target.id: value})
        elif hasattr(stmt, "body") and isinstance(stmt.body, list):
            yield from _calls(stmt.body + getattr(stmt, "orelse", []), env)
        else:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                    yield _argument(node, env)


def _argument(call: ast.Call, env: dict) -> tuple[list[str], dict]:
    args = [_value(a, env) for a in call.args]
    kwargs = {}
    for kw in call.keywords:
        if kw.arg == "type":
            kwargs["type"] = _TYPES.get(getattr(kw.value, "id", ""), str)
        elif kw.arg in ("action", "nargs", "choices", "dest"):
            kwargs[kw.arg] = _value(kw.value, env)
    return args, kwargs


def _value(node: ast.expr, env: dict):
    if isinstance(node, ast.JoinedStr):
        return "".join(str(_value(v.value if isinstance(v, ast.FormattedValue) else v, env)) for v in node.values)
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    return ast.literal_eval(node)


@pytest.fixture(scope="session")
def wheel_dir(tmp_path_factory) -> Path:
    return wheel_cache(tmp_path_factory.mktemp("openrlhf"))


@pytest.fixture(scope="session")
def site_093(wheel_dir) -> Path:
    return extract_site(OLD_VERSION, wheel_dir)


@pytest.fixture(scope="session")
def site_new(wheel_dir) -> Path:
    return extract_site(NEW_VERSION, wheel_dir)
