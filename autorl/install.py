"""How to install autorl's extras from where this autorl came from: its checkout, or the wheel built from it.

PyPI's project named ``autorl`` is someone else's (an unrelated, empty 0.0.1 release), so no advice autorl gives
names it: every install line points at this checkout or wheel (``pip install -e '/path/to/autorl[openrlhf]'``).
"""

from __future__ import annotations

import json
import re
import shlex
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

CHECKOUT = Path(__file__).resolve().parents[1]  # the checkout's root when autorl runs from one
PYPI_NOTE = "whose project named autorl is an unrelated, empty package"


def install_source() -> tuple[str, bool] | None:
    """Where this autorl was installed from, as pip takes it: (a checkout's folder or a wheel file, editable), from
    the install's ``direct_url.json``, or the checkout it runs from; None when neither is known."""
    try:
        raw = metadata.distribution("autorl").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        raw = None
    try:
        info = json.loads(raw) if raw else {}
    except ValueError:
        info = {}
    url = str(info.get("url", "")) if isinstance(info, dict) else ""
    if url.startswith("file://") and Path(unquote(urlparse(url).path)).exists():
        return unquote(urlparse(url).path), bool((info.get("dir_info") or {}).get("editable"))
    pyproject = CHECKOUT / "pyproject.toml"
    if pyproject.is_file() and re.search(r'^name\s*=\s*"autorl"', pyproject.read_text(), re.MULTILINE):
        return str(CHECKOUT), True
    return None


def install_command(extra: str) -> str:
    """The pip command that adds autorl's ``extra`` from where this autorl came from; ``.`` (the checkout) when
    that is not known."""
    path, editable = install_source() or (".", True)
    return f"pip install {'-e ' if editable else ''}{shlex.quote(f'{path}[{extra}]')}"


def install_advice(extra: str, where: str = "") -> str:
    """A fix line that installs autorl's ``extra``: the command in backticks, and why not by name from PyPI."""
    source = install_source()
    origin = "its wheel" if source and source[0].endswith(".whl") else "its checkout"
    here = "" if source else " in your autorl checkout"
    return f"`{install_command(extra)}`{here}{where}: autorl[{extra}] from {origin}, not from PyPI ({PYPI_NOTE})"
