"""The one list of backends: where each one's class and its ``train:`` parameters model live.

Plain data, so that recipe validation, the hypothesis library and the CLI can name the backends without importing
any of them. Add a backend here (and nowhere else) after writing its module.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args


class Entry(NamedTuple):
    backend: str  # "module:Class" of the Backend
    params: str  # "module:Model" validating the recipe's train: block


BACKENDS: dict[str, Entry] = {
    "embedded": Entry("autorl.backends.embedded:EmbeddedBackend", "autorl.engine.config:EngineConfig"),
    "command": Entry("autorl.backends.command:CommandBackend", "autorl.backends.command:CommandParams"),
    "openrlhf": Entry(
        "autorl.backends.openrlhf.backend:OpenRLHFBackend", "autorl.backends.openrlhf.params:OpenRLHFParams"
    ),
    "trl": Entry("autorl.backends.trl:TRLBackend", "autorl.backends.trl:TRLParams"),
}

BackendName = Literal["embedded", "command", "openrlhf", "trl"]
assert set(get_args(BackendName)) == set(BACKENDS)  # one list: the Literal is for pydantic field types
