#!/usr/bin/env python3
"""Append real crash logs + labels to a corpus: this one (tests/data/crashes_real) or another.

    python add.py < records                                   # here; split filled later by split.py
    python add.py --corpus ../crashes_fresh --split fresh < records

Input (stdin) is a sequence of records:

=== <id>
category: <cat>
root: <exact full line of the log>
action: <one line>
library: <lib>
versions: <text or null>
source: <url>
exit_code: <int or null>
--- log
<verbatim log lines>
=== <next id> ...

Writes <corpus>/logs/<id>.log and appends one entry to <corpus>/labels.yaml.
Refuses a record whose root line is not an exact full line of its log, whose id exists,
or whose thread is already used by any corpus beside this one (tests/data/crashes*/labels.yaml):
a thread read once must not be scored again in another split.
"""
import argparse, re, sys, pathlib, yaml

HERE = pathlib.Path(__file__).resolve().parent
CATS = {"cuda_oom", "host_oom", "illegal_memory_access", "nan_divergence", "network_unavailable",
        "backend_incompat", "config_error", "user_code_error", "disk_full", "distributed_timeout",
        "hang_timeout", "killed_external", "shared_gpu", "unknown"}


def parse(text):
    recs = []
    for block in re.split(r"^=== ", text, flags=re.M)[1:]:
        head, _, log = block.partition("\n--- log\n")
        lines = head.split("\n")
        rid = lines[0].strip()
        meta = {}
        for ln in lines[1:]:
            if not ln.strip():
                continue
            k, _, v = ln.partition(": ")
            meta[k.strip()] = v
        # keep log text verbatim except trailing whitespace; drop markdown code-fence lines
        kept = [l.rstrip() for l in log.rstrip("\n").split("\n")
                if not re.fullmatch(r"(> )?```[A-Za-z]*\s*", l)]
        while kept and not kept[0]:
            kept.pop(0)
        log = "\n".join(kept) + "\n"
        recs.append((rid, meta, log))
    return recs


def main():
    ap = argparse.ArgumentParser(description="Append real crash logs and labels to a corpus.")
    ap.add_argument("--corpus", type=pathlib.Path, default=HERE, help="the corpus folder (default: this one)")
    ap.add_argument("--split", default=None, help="the split every new entry gets (default: none, for split.py)")
    args = ap.parse_args()
    corpus = args.corpus.resolve()
    existing, threads = set(), set()
    lab = corpus / "labels.yaml"
    if lab.exists():
        existing = {e["id"] for e in yaml.safe_load(lab.read_text()) or []}
    for other in sorted(HERE.parent.glob("crashes*/labels.yaml")):
        for e in yaml.safe_load(other.read_text()) or []:
            if e.get("thread"):
                threads.add(e["thread"].lower())
    out = []
    for rid, m, log in parse(sys.stdin.read()):
        assert re.fullmatch(r"[a-z0-9]+-[a-z0-9-]+_\d\d", rid), rid
        assert rid not in existing, f"dup id {rid}"
        assert m["category"].strip() in CATS, (rid, m["category"])
        root = m["root"].rstrip()
        assert root in log.split("\n"), f"{rid}: root line not an exact line of the log"
        url = m["source"].strip()
        mm = re.match(r"https://github.com/([^/]+/[^/]+)/(?:issues|pull|discussions)/(\d+)", url)
        assert mm, url
        thread = f"{mm.group(1)}#{mm.group(2)}"
        assert thread.lower() not in threads, f"{rid}: thread {thread} already used"
        ec = m.get("exit_code", "null").strip()
        v = m.get("versions", "null").strip()
        entry = {
            "id": rid,
            "category": m["category"].strip(),
            "root_cause_line": root,
            "action": m["action"].strip(),
            "library": m["library"].strip(),
            "versions": None if v in ("null", "") else v,
            "source": url,
            "thread": thread,
            "exit_code": None if ec in ("null", "") else int(ec),
            "split": args.split,
        }
        (corpus / "logs" / f"{rid}.log").write_text(log)
        out.append(entry)
        existing.add(rid)
        threads.add(thread.lower())
    with lab.open("a") as f:
        for e in out:
            f.write(yaml.safe_dump([e], sort_keys=False, width=100000, allow_unicode=True))
    print(f"added {len(out)}; total {len(existing)}")


if __name__ == "__main__":
    main()
