"""Crash triage on the labelled crash corpus: does it generalise to logs it was not written against?

Runs ``autorl.judge.triage.classify`` on every log in ``tests/data/crashes/logs/`` with the
label's ``exit_code``, ``watchdog`` and ``metrics_nonfinite`` (what the controller would pass),
and prints, separately for the ``dev`` half (the rules were written against it) and the
``heldout`` half (never read while writing rules):

- category accuracy: the predicted category equals the label's;
- root-cause accuracy: the predicted root-cause line equals the label's line exactly;

and the share of the calls that are not ``unknown`` that are right (a wrong call is worse than
``unknown``); then a confusion table (true category x predicted) for heldout, and with ``--misses``
the logs that were wrong (dev only unless ``--show-heldout``: heldout logs are not for reading).

``--blind`` scores the blind corpus in ``tests/data/crashes_blind/`` instead: logs written before
the rules were changed and never used to tune them. It is meant to be run once, after the rules
are final; without the flag nothing of that corpus is read or printed.

    python benchmarks/triage_heldout.py [--misses] [--json]
    python benchmarks/triage_heldout.py --blind [--misses]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import yaml

from autorl.judge.triage import classify
from autorl.states import CrashCategory

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "crashes"
BLIND = CORPUS.parent / "crashes_blind"


def load_labels(corpus: Path = CORPUS) -> list[dict]:
    """The corpus labels, one dict per log."""
    return yaml.safe_load((corpus / "labels.yaml").read_text())


def run_one(label: dict, corpus: Path = CORPUS) -> dict:
    """One log classified against its label."""
    text = (corpus / "logs" / f"{label['id']}.log").read_text(errors="replace")
    report = classify(
        text,
        exit_code=label.get("exit_code"),
        watchdog=label.get("watchdog"),
        metrics_nonfinite=label.get("metrics_nonfinite"),
    )
    true = CrashCategory(label["category"])  # a label naming no category fails here
    return {
        "id": label["id"],
        "split": label["split"],
        "true": true,
        "pred": report.category,
        "cat_ok": report.category == true,
        "line_ok": report.root_cause_line.rstrip() == label["root_cause_line"].rstrip(),
        "pred_line": report.root_cause_line,
        "true_line": label["root_cause_line"],
    }


def score(results: list[dict], split: str) -> dict:
    """Counts and accuracies for one split."""
    rows = [r for r in results if r["split"] == split]
    cat, line = sum(r["cat_ok"] for r in rows), sum(r["line_ok"] for r in rows)
    called = [r for r in rows if r["pred"] != CrashCategory.UNKNOWN]
    right = sum(r["cat_ok"] for r in called)
    n = len(rows)
    return {
        "split": split,
        "n": n,
        "category": cat,
        "root_cause": line,
        "called": len(called),
        "called_right": right,
        "category_pct": _pct(cat, n),
        "root_cause_pct": _pct(line, n),
        "called_right_pct": _pct(right, len(called)),
    }


def _pct(part: int, whole: int) -> float:
    return round(100 * part / whole, 1) if whole else 0.0


def confusion(results: list[dict], split: str = "heldout") -> str:
    """A markdown table, rows = true category, columns = predicted category."""
    rows = [r for r in results if r["split"] == split]
    counts = Counter((r["true"], r["pred"]) for r in rows)
    trues = sorted({r["true"] for r in rows})
    preds = sorted({r["pred"] for r in rows} | set(trues))
    head = "| true \\ predicted | " + " | ".join(preds) + " |"
    sep = "|---|" + "---|" * len(preds)
    body = ["| " + t + " | " + " | ".join(str(counts.get((t, p), "")) for p in preds) + " |" for t in trues]
    return "\n".join([head, sep, *body])


def print_misses(results: list[dict], splits: set[str]) -> None:
    for r in results:
        if r["split"] in splits and not (r["cat_ok"] and r["line_ok"]):
            print(f"\n[{r['split']}] {r['id']}: true {r['true']}, predicted {r['pred']}")
            if not r["line_ok"]:
                print(f"   want: {r['true_line']}\n   got:  {r['pred_line']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--misses", action="store_true", help="List the dev logs that were wrong.")
    ap.add_argument("--show-heldout", action="store_true", help="Also list heldout misses (after rules are final).")
    ap.add_argument("--json", action="store_true", help="Machine-readable scores.")
    ap.add_argument("--blind", action="store_true", help="Score the blind corpus (once, after the rules are final).")
    args = ap.parse_args()
    corpus, splits = (BLIND, ("blind",)) if args.blind else (CORPUS, ("dev", "heldout"))
    results = [run_one(label, corpus) for label in load_labels(corpus)]
    scores = [score(results, s) for s in splits]
    shown = splits[-1]
    if args.json:
        print(json.dumps({"scores": scores, f"confusion_{shown}": confusion(results, shown)}, indent=1))
        return
    for s in scores:
        print(
            f"{s['split']:8} n={s['n']:3}  category {s['category']}/{s['n']} ({s['category_pct']}%)  "
            f"root-cause line {s['root_cause']}/{s['n']} ({s['root_cause_pct']}%)  "
            f"not-unknown calls right {s['called_right']}/{s['called']} ({s['called_right_pct']}%)"
        )
    print(f"\n{shown} confusion (rows: true, columns: predicted)\n" + confusion(results, shown))
    if args.misses:
        print_misses(results, {"blind"} if args.blind else {"dev", "heldout"} if args.show_heldout else {"dev"})


if __name__ == "__main__":
    main()
