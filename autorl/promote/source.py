"""The recipe a trial ran, read back from its start commit in the workspace's repository."""

from __future__ import annotations

import tempfile
from pathlib import Path

from autorl import gitops
from autorl.errors import NotFoundError
from autorl.ledger import Ledger, Trial
from autorl.recipe import Recipe, load_recipe
from autorl.states import Kind
from autorl.workspace import Workspace


def trial_recipe(ws: Workspace, ledger: Ledger, row: Trial) -> tuple[Recipe, str, str]:
    """The recipe a trial ran (from its start commit), its text and path in the repo."""
    rel = ledger.study(study_id=row.study_id).recipe_path
    assert rel is not None and row.start_tag is not None  # a study is made with its recipe, a trial with its tag
    text = gitops.show_file(ws.root, row.start_tag, rel)
    if text is None:
        tags = [t.start_tag for t in ledger.trials(row.study_id, kind=Kind.TRIAL) if t.start_tag][:50]
        if tags and not any(gitops.ref_exists(ws.root, tag) for tag in tags):
            raise NotFoundError(
                f"none of study {ledger.study(study_id=row.study_id).name}'s attempt tags is in {ws.root}: the ledger "
                "comes from another repository; run autorl in the workspace it came from (-C DIR), or restore its tags"
            )
        raise NotFoundError(
            f"{row.start_tag} has no {rel}: the trial's refs were removed (`git tag -l 'attempt-*'` lists what is left)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(rel).name
        path.write_text(text)
        return load_recipe(path), text, rel
