"""Crash triage on the corpus of real failure logs (tests/data/crashes_real): dev half, blind half and all.

Runs ``autorl.judge.triage.classify`` on every log in ``tests/data/crashes_real/logs/`` with the label's
``exit_code`` (what the controller would pass) and prints, for the blind half, the dev half and all:

- category: the predicted category equals the label's;
- line: the predicted root-cause line equals the label's line exactly (trailing whitespace ignored);
- precision: of the calls that are not ``unknown``, the share whose category is right (a wrong confident call
  is acted on; ``unknown`` is not);
- unknown rate: of the logs whose label names a cause (not ``unknown``), the share called ``unknown``;

then the same per library (the label's ``library``) and per true category, and a confusion table (rows: true
category, columns: predicted). ``--misses`` lists the dev logs that were wrong; blind logs are never listed or
printed one by one (the blind half is scored, not read, while rules are written).

Targets on the blind half (issue 47): precision >= 97 %, category >= 92 %, line >= 88 %, unknown <= 10 %.

    python benchmarks/triage_corpus.py [--split blind|dev|all] [--misses] [--json]
    python benchmarks/triage_corpus.py --corpus tests/data/crashes_fresh --split fresh [--misses]

``--corpus`` scores another corpus of the same layout: ``tests/data/crashes_fresh`` (65 logs from threads in neither
half, gathered and labelled on 2026-11-29 after the second round of rules; every log is split ``fresh``). It was
read while the third round's rules were written, so it is a development set now, like the dev half; ``--misses``
lists its misses with ``--split fresh``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import triage_heldout as heldout  # beside this file: the one way a labelled log is classified and scored
import yaml

from autorl.states import CrashCategory

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "crashes_real"
SPLITS = ("blind", "dev", "all")
FRESH = "fresh"  # the split of every log in tests/data/crashes_fresh
TARGETS = {"precision_pct": 97.0, "category_pct": 92.0, "line_pct": 88.0, "unknown_pct": 10.0}


def load_labels(corpus: Path = CORPUS) -> list[dict[str, Any]]:
    """The corpus labels, one dict per log."""
    labels: list[dict[str, Any]] = yaml.safe_load((corpus / "labels.yaml").read_text())
    return labels


def run_one(label: dict[str, Any], corpus: Path = CORPUS) -> dict[str, Any]:
    """One log classified against its label (as ``triage_heldout.run_one`` does), with the library that printed it."""
    return {**heldout.run_one(label, corpus), "library": label.get("library") or "?"}


def score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and percentages of one set of results."""
    n = len(rows)
    cat, line = sum(r["cat_ok"] for r in rows), sum(r["line_ok"] for r in rows)
    called = [r for r in rows if r["pred"] != CrashCategory.UNKNOWN]
    right = sum(r["cat_ok"] for r in called)
    known = [r for r in rows if r["true"] != CrashCategory.UNKNOWN]
    unknown = sum(r["pred"] == CrashCategory.UNKNOWN for r in known)
    return {
        "n": n,
        "category": cat,
        "line": line,
        "called": len(called),
        "called_right": right,
        "known": len(known),
        "known_called_unknown": unknown,
        "category_pct": _pct(cat, n),
        "line_pct": _pct(line, n),
        "precision_pct": _pct(right, len(called)),
        "unknown_pct": _pct(unknown, len(known)),
    }


def _pct(part: int, whole: int) -> float:
    return round(100 * part / whole, 1) if whole else 0.0


def in_split(results: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    return results if split == "all" else [r for r in results if r["split"] == split]


def by(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    """Scores per value of ``key`` ('library' or 'true'), largest group first."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[str(r[key])].append(r)
    return {k: score(v) for k, v in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))}


def confusion(rows: list[dict[str, Any]]) -> str:
    """A markdown table, rows = true category, columns = predicted category."""
    counts = Counter((str(r["true"]), str(r["pred"])) for r in rows)
    trues = sorted({str(r["true"]) for r in rows})
    preds = sorted({str(r["pred"]) for r in rows} | set(trues))
    head = "| true \\ predicted | " + " | ".join(preds) + " |"
    sep = "|---|" + "---|" * len(preds)
    body = ["| " + t + " | " + " | ".join(str(counts.get((t, p), "")) for p in preds) + " |" for t in trues]
    return "\n".join([head, sep, *body])


def line(name: str, s: dict[str, Any]) -> str:
    return (
        f"{name:28} n={s['n']:3}  category {s['category_pct']:5.1f}%  line {s['line_pct']:5.1f}%  "
        f"precision {s['precision_pct']:5.1f}% ({s['called_right']}/{s['called']})  "
        f"unknown {s['unknown_pct']:5.1f}% ({s['known_called_unknown']}/{s['known']})"
    )


def report(results: list[dict[str, Any]], split: str) -> str:
    rows = in_split(results, split)
    out = [f"== {split} ==", line("overall", score(rows)), "", "per library:"]
    out += ["  " + line(k, s) for k, s in by(rows, "library").items()]
    out += ["", "per category (true):"]
    out += ["  " + line(k, s) for k, s in by(rows, "true").items()]
    out += ["", "confusion (rows: true, columns: predicted):", confusion(rows), ""]
    return "\n".join(out)


def targets(results: list[dict[str, Any]]) -> str:
    s = score(in_split(results, "blind"))
    out = ["targets on the blind half:"]
    for key, goal in TARGETS.items():
        met = s[key] <= goal if key == "unknown_pct" else s[key] >= goal
        sign = "<=" if key == "unknown_pct" else ">="
        out.append(f"  {key[:-4]:9} {s[key]:5.1f}% (target {sign} {goal:g}%): {'met' if met else 'NOT MET'}")
    return "\n".join(out)


def print_misses(results: list[dict[str, Any]], split: str = "dev") -> None:
    for r in in_split(results, split):
        if not (r["cat_ok"] and r["line_ok"]):
            print(f"\n[{split}] {r['id']}: true {r['true']}, predicted {r['pred']}")
            if not r["line_ok"]:
                print(f"   want: {r['true_line']}\n   got:  {r['pred_line']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--split", choices=(*SPLITS, FRESH), action="append", help="Only these splits (default: all three)."
    )
    ap.add_argument("--misses", action="store_true", help="List the dev (or fresh) logs that were wrong (never blind).")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="A corpus folder of the same layout.")
    ap.add_argument("--json", action="store_true", help="Machine-readable scores.")
    args = ap.parse_args()
    splits = args.split or list(SPLITS)
    results = [run_one(label, args.corpus) for label in load_labels(args.corpus)]
    if args.json:
        out = {
            s: {
                "overall": score(in_split(results, s)),
                "library": by(in_split(results, s), "library"),
                "category": by(in_split(results, s), "true"),
                "confusion": confusion(in_split(results, s)),
            }
            for s in splits
        }
        print(json.dumps(out, indent=1))
        return
    print("\n".join(line(s, score(in_split(results, s))) for s in splits) + "\n")
    for s in splits:
        print(report(results, s))
    if "blind" in splits:
        print(targets(results))
    if args.misses:
        print_misses(results, FRESH if FRESH in splits else "dev")


if __name__ == "__main__":
    main()
