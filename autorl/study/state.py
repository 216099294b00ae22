"""What the parts of a running study share: its workspace and ledger rows, its base recipe, its one backend.

The study loop (``autorl.study.controller``) opens it (``autorl.study.opening``) and hands it to the modules that
each do one thing with a trial: ``attempts`` (prepare, launch, close), ``monitor`` (while it runs), ``judging``
(its result and a candidate's confirmation), ``crash`` (triage's action), ``carry`` (what a reduced baseline retry
changes for every later trial) and ``recovery`` (what a stop leaves, what a resume picks up). A trial on its way
is a ``TrialContext``; what ``autorl run`` was asked to do is its ``RunOptions``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autorl.backends.base import Backend
from autorl.judge.evidence import Evidence
from autorl.ledger import Ledger, Study, StudyRecords
from autorl.locks import Lock
from autorl.present.live import PlainView
from autorl.recipe import Overrides, Recipe
from autorl.runs.lifecycle import Attempt
from autorl.runs.watch import Watch
from autorl.search.proposal import Proposal
from autorl.search.proposer import Proposer
from autorl.workspace import Workspace


@dataclass
class RunOptions:
    """What `autorl run` was asked to do."""

    recipe_path: Path | None = None
    overrides: Overrides = field(default_factory=dict)  # parsed --set values (autorl.recipe.parse_overrides)
    budget_s: float = 3600.0
    max_trials: int | None = None
    strategy: str | None = None  # None: hypotheses for a new study, the study's own on --resume
    resume: bool = False
    study_name: str | None = None
    allow_overrun: bool = False
    seed: int = 0
    parallel: int = 1
    ray_address: str | None = None


@dataclass
class StudyState:
    """One running study.

    ``base`` is the recipe as written plus what a completed reduced retry of the baseline changed (``carry``);
    ``base_text`` is its committed text, from which every trial's recipe is written; ``recipe_rel`` is where that
    text lives in the repository."""

    ws: Workspace
    opts: RunOptions
    view: PlainView
    ledger: Ledger
    row: Study  # the study's autorl_studies row
    base: Recipe
    base_text: str
    recipe_rel: str
    backend: Backend
    proposer: Proposer
    records: StudyRecords
    evidence: Evidence
    lock: Lock | None = None  # the study's lock, held while the controller runs it

    @property
    def id(self) -> int:
        return self.row.id

    def rebase(self, base: Recipe, text: str) -> None:
        """Build trials from ``base`` (written as ``text``) from now on; the proposer proposes from it too."""
        self.base, self.base_text = base, text
        self.proposer.rebase(base)


@dataclass
class TrialContext:
    """A prepared trial: the proposal, its opened attempt and its recipe (None, with the error, if invalid)."""

    proposal: Proposal
    attempt: Attempt
    recipe: Recipe | None
    error: str | None = None


Running = dict[int, tuple[TrialContext, Watch]]  # slot -> the trial in flight there
