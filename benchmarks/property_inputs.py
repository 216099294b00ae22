"""The large profile of the property-based input suite (tests/property): generated recipes, search blocks, `--set`
values, hypothesis files, review-command arguments and edited rules tables, each property with its own example
count, run as pytest runs them (the suite's fast profile runs 20 of each).

    python benchmarks/property_inputs.py                      # 13,000 examples in all (the recorded figure)
    python benchmarks/property_inputs.py --scale 0.1          # a tenth of each count: a quick check
    python benchmarks/property_inputs.py --jobs 4             # properties run four at a time

Prints, per property: examples run (passing, failing, invalid as Hypothesis counts them), whether it held, and its
wall time; then the totals, as JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTS = {  # examples per property: the cheap ones most, the one that starts the CLI in-process least
    "test_any_recipe_and_set_values_run_or_are_one_line": 3500,
    "test_a_valid_recipe_and_set_values_start_a_study": 2000,
    "test_any_hypothesis_file_loads_or_is_one_line": 2500,
    "test_any_arguments_to_a_review_command_answer_or_are_one_line": 1000,
    "test_train_dry_run_on_any_recipe_prints_a_plan_or_one_line": 1000,
    "test_an_edited_rules_table_loads_or_is_refused_in_one_line": 1500,
    "test_a_rules_table_cut_short_loads_or_is_refused_in_one_line": 500,
    "test_an_edited_workspace_families_file_triages_or_is_refused_in_one_line": 1000,
}
MODULE = {name: "test_rule_tables.py" for name in COUNTS if "rules_table" in name or "families_file" in name}
STATS = re.compile(r"(\d+) passing, (\d+) failing, and (\d+) invalid")


def run(name: str, examples: int) -> dict:
    env = {**os.environ, "AUTORL_PROPERTY_PROFILE": "large", "AUTORL_PROPERTY_EXAMPLES": str(examples)}
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics", "-W",
         "ignore::UserWarning", f"tests/property/{MODULE.get(name, 'test_inputs.py')}::{name}"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    found = [tuple(int(x) for x in m) for m in STATS.findall(r.stdout)]
    passing, failing, invalid = (sum(col) for col in zip(*found)) if found else (0, 0, 0)
    return {
        "property": name,
        "asked": examples,
        "passing": passing,
        "failing": failing,
        "invalid": invalid,
        "held": r.returncode == 0,
        "wall_s": round(time.monotonic() - t0, 1),
        "tail": "" if r.returncode == 0 else r.stdout[-3000:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="Multiply every property's example count.")
    ap.add_argument("--jobs", type=int, default=2, help="Properties run at once.")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda kv: run(kv[0], max(1, round(kv[1] * args.scale))), COUNTS.items()))
    total = {
        "examples": sum(r["passing"] + r["failing"] for r in rows),
        "invalid": sum(r["invalid"] for r in rows),
        "failures": sum(not r["held"] for r in rows),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    if args.json:
        print(json.dumps({"rows": rows, "total": total}, indent=1))
    else:
        for r in rows:
            print(
                f"{r['property']:64} {r['passing'] + r['failing']:6} examples ({r['invalid']} invalid) "
                f"{'held' if r['held'] else 'FAILED'} in {r['wall_s']:.0f} s"
            )
            if r["tail"]:
                print(r["tail"])
        print(
            f"total: {total['examples']} examples, {total['failures']} properties failed, {total['wall_s']:.0f} s wall"
        )
    return 1 if total["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
