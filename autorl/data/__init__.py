"""Data shipped inside the package: example recipes, the hypothesis library, OpenRLHF patches, rule tables.

Read through ``importlib.resources``, so an installed wheel finds them with no checkout present. The repository's
top-level ``recipes/``, ``hypotheses/`` and ``patches/`` are links to these folders.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def shipped(*parts: str) -> Path:
    """The path of a shipped file or folder, e.g. ``shipped("recipes", "default.yaml")``."""
    node = files(__name__)
    for part in parts:
        node = node.joinpath(part)
    return Path(str(node))
