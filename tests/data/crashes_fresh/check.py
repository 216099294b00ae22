#!/usr/bin/env python3
"""Verify tests/data/crashes_fresh and print its distributions.

Checks: logs and labels match one to one; every root_cause_line is an exact full line of its
log; every split is `fresh`; no thread is used twice here or appears in tests/data/crashes_real;
every log has 5-200 lines. Prints markdown tables by category, library and thread repository.

Usage: python check.py
"""
import collections, pathlib, sys, yaml

HERE = pathlib.Path(__file__).resolve().parent
REAL = HERE.parent / "crashes_real" / "labels.yaml"


def main():
    entries = yaml.safe_load((HERE / "labels.yaml").read_text()) or []
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids)), "duplicate ids"
    logs = {p.stem for p in (HERE / "logs").glob("*.log")}
    assert logs == set(ids), (sorted(logs - set(ids)), sorted(set(ids) - logs))
    threads = [e["thread"].lower() for e in entries]
    assert len(threads) == len(set(threads)), "thread used twice"
    real = {e["thread"].lower() for e in (yaml.safe_load(REAL.read_text()) or [])} if REAL.exists() else set()
    overlap = set(threads) & real
    assert not overlap, f"threads also in crashes_real: {sorted(overlap)}"
    for e in entries:
        lines = (HERE / "logs" / f"{e['id']}.log").read_text().split("\n")
        assert e["root_cause_line"] in lines, e["id"]
        assert e["split"] == "fresh", e["id"]
        n = len(lines) - 1  # file ends with a newline
        assert 5 <= n <= 200, (e["id"], n)
    out = [f"{len(entries)} logs from {len(set(threads))} threads; all checks passed.", ""]
    for key in ("category", "library"):
        c = collections.Counter(e[key] for e in entries)
        out += [f"| {key} | logs |", "|---|---|"]
        out += [f"| {k} | {n} |" for k, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))]
        out += [f"| **total** | **{len(entries)}** |", ""]
    repo = collections.Counter(e["thread"].split("#")[0] for e in entries)
    out += ["| thread repository | logs |", "|---|---|"]
    other = 0
    for k, n in sorted(repo.items(), key=lambda kv: (-kv[1], kv[0].lower())):
        if n >= 2:
            out.append(f"| {k} | {n} |")
        else:
            other += n
    out += [f"| (other repositories, 1 log each) | {other} |", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
