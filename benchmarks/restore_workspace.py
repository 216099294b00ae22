"""Rebuild a study's attempt tags in a new workspace from its ledger, where the repository it ran in is gone.

    python benchmarks/restore_workspace.py LEDGER WS [--study NAME]

A GPU host is lent and given back: what a user keeps of a study is often its ``ledger.sqlite`` alone. Promoting its
best trial needs the recipe each trial ran, which autorl reads from the trial's start tag. The ledger holds the
study's recipe as the study began (``autorl_studies.recipe``) and each trial's changed values (``changed``) and full
train values (``params``). This script makes WS a workspace (``autorl init``), commits the study's recipe at the path
the study used, and for every trial commits that recipe with the trial's changed values written in
(``set_train_values``, as the study wrote them) and tags it with the trial's start tag; branches and end tags are
not made. A full run's changed values are its full-length ones, so its recipe is that of the trial it was promoted
from with them written in. Every restored recipe is loaded back and must give exactly the train values the ledger
recorded for that trial (a full run that never finished recorded none: then its source trial's, but for its own
values), or the script stops with exit 1 naming the trial and the value. The ledger is copied to WS/ledger.sqlite.

What it cannot restore, and so refuses: a trial whose recorded values differ from the study's recipe plus its
changed values (a patch, or a recipe edited by hand between trials), which the check above catches.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autorl.recipe import load_recipe, set_train_values  # noqa: E402
from autorl.workspace import init_workspace  # noqa: E402


def git(ws: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "autorl", "GIT_AUTHOR_EMAIL": "autorl@localhost"}
    env |= {"GIT_COMMITTER_NAME": "autorl", "GIT_COMMITTER_EMAIL": "autorl@localhost", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True, text=True, env=env).stdout


def mismatch(text: str, params: dict, where: Path) -> str | None:
    """The first train value of recipe ``text`` that differs from ``params`` (None: all agree)."""
    where.write_text(text)
    train = load_recipe(where).train
    for key, value in train.items():
        if key in params and params[key] != value:
            return f"{key}: restored {value!r}, recorded {params[key]!r}"
    return None


def restore(ledger: Path, ws: Path, study: str | None) -> int:
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    query = "SELECT id, name, recipe_path, recipe FROM autorl_studies"
    row = db.execute(query + (" WHERE name = ?" if study else " ORDER BY id DESC LIMIT 1"), (study,) if study else ())
    got = row.fetchone()
    if got is None:
        print(f"no study {study or ''} in {ledger}", file=sys.stderr)
        return 2
    study_id, name, rel, text = got
    trials = db.execute(
        "SELECT number, start_tag, changed, params, promoted_from FROM autorl_trials WHERE study_id = ? "
        "ORDER BY number",
        (study_id,),
    ).fetchall()
    db.close()
    ran = {number: params for number, _, _, params, _ in trials}  # the train values each trial ran, as recorded
    restored = []  # every trial's recipe, checked before anything is written
    with tempfile.TemporaryDirectory() as tmp:
        texts: dict[int, str] = {}
        for number, tag, changed, params, source in trials:
            if not tag:
                continue
            # a full run's changed values are its full-length ones, on top of the trial it was promoted from
            base_text = texts.get(source, "") if source is not None else text
            if not base_text:
                print(f"trial {number}: promoted from {source}, whose recipe is not restored", file=sys.stderr)
                return 1
            own = json.loads(changed or "{}")
            trial_text = set_train_values(base_text, own)
            recorded = json.loads(params or "null")
            if recorded is None and source is not None:  # never finished, so never recorded: its source's values
                recorded = {k: v for k, v in json.loads(ran[source] or "{}").items() if k not in own}
            bad = mismatch(trial_text, recorded or {}, Path(tmp) / Path(rel).name)
            if bad:
                print(f"trial {number}: its recipe cannot be restored from the ledger ({bad})", file=sys.stderr)
                return 1
            texts[number] = trial_text
            restored.append((number, tag, trial_text))
    init_workspace(ws)
    (ws / rel).parent.mkdir(parents=True, exist_ok=True)
    (ws / rel).write_text(text)
    git(ws, "add", "-f", rel)
    git(ws, "commit", "-q", "-m", f"study {name}'s recipe, restored from its ledger")
    base = git(ws, "rev-parse", "HEAD").strip()
    branch = git(ws, "rev-parse", "--abbrev-ref", "HEAD").strip()
    for number, tag, trial_text in restored:
        git(ws, "checkout", "-q", "--detach", base)
        (ws / rel).write_text(trial_text)
        git(ws, "commit", "-q", "--allow-empty", "-a", "-m", f"attempt {number:02d}'s recipe, restored")
        git(ws, "tag", "-a", tag, "-m", f"restored from {ledger.name}")
    git(ws, "checkout", "-q", branch)  # back on the workspace's branch, at the study's recipe
    shutil.copyfile(ledger, ws / "ledger.sqlite")
    print(f"{ws}: study {name}, {len(restored)} start tags restored and checked")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ledger", type=Path)
    p.add_argument("ws", type=Path)
    p.add_argument("--study")
    args = p.parse_args()
    return restore(args.ledger.resolve(), args.ws.resolve(), args.study)


if __name__ == "__main__":
    raise SystemExit(main())
