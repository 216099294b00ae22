"""Crash triage: a failed run's log becomes one category, one line, one remedy and a signature.

``classify`` reads the log text of any engine (OpenRLHF, Ray, vLLM, DeepSpeed, NCCL,
TRL/transformers, PyTorch) against the rules table in ``autorl/data/rules/crash_rules.yaml``:

1. Each line is cleaned (ANSI colours, Ray ``(Actor pid=N)`` and ``[rankN]:`` prefixes
   removed) and matched against every rule. Lines that look like warnings are skipped
   unless the rule allows them, so a harmless "high memory pressure" warning earlier in the
   log cannot decide the category.
2. The root cause is the matching line of highest rule priority; ties go to exception lines,
   then to the later line. Priority says which error is the cause when one wraps another:
   a CUDA OOM outranks the NCCL error it triggers on the same rank.
3. With no matching line, the innermost exception (the last one that is not a Ray/elastic
   wrapper) is reported as ``unknown``; with no exception at all, the exit code decides
   (a SIGKILL, 137 or -9, with no memory evidence in the log is an external kill, not an OOM).
4. The controller's own observations come first: ``watchdog`` ('silence', 'timeout') means
   a hang unless a real cause (priority >= ``watchdog_yields_to``) is in the log, and
   ``metrics_nonfinite`` (a NaN loss or grad norm) means ``nan_divergence`` even with exit 0.

The signature hashes the category with the root line stripped of numbers, addresses,
paths and timestamps, so the same failure in two trials groups together.
Pure: no subprocess, no torch; ``autorl triage classify LOGFILE --json`` prints
``classify(...).model_dump()``.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import shutil
from bisect import bisect_right
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, overload

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from autorl import loading
from autorl.data import shipped
from autorl.errors import RulesError  # noqa: F401  (raised by load_rules; callers catch it from here)
from autorl.states import CrashAction, CrashCategory

if TYPE_CHECKING:  # annotations only: `autorl triage classify` starts without the ledger and its SQLite library
    from autorl.ledger import Trial

RULES_PATH = shipped("rules", "crash_rules.yaml")
MAX_LINES = 50_000  # only the log's tail is read: the cause of a crash is near its end
MAX_LINE_CHARS = 4_000  # of each line, the head: some patterns take time quadratic in a line's length
TAIL_BYTES = 16 << 20  # of a log file, the tail read (a run printing without end fills a disk, not memory)


def log_lines(log_text: str) -> list[str]:
    """The lines triage reads: the last ``MAX_LINES``, each cut to its first ``MAX_LINE_CHARS`` characters (a
    200 kB line of one letter took over a minute to classify)."""
    return [line[:MAX_LINE_CHARS] for line in log_text.splitlines()[-MAX_LINES:]]


def read_tail(path: Path) -> str:
    """The last ``TAIL_BYTES`` of a log file as text (undecodable bytes replaced); ``OSError`` when it cannot be
    read, a folder, a FIFO or a device included (never opened to wait on, never read without end)."""
    return loading.tail_bytes(path, TAIL_BYTES).decode("utf-8", errors="replace")


# Decided from a completed run's metrics by judge/silent.py, never from a log line.
SILENT_CATEGORIES = (CrashCategory.OUTPUT_COLLAPSE, CrashCategory.NO_TRAINING, CrashCategory.REWARD_CONSTANT)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Model):
    """One error message as a library prints it, and where it comes from."""

    re: str = Field(description="Python regex searched in one cleaned log line.")
    lib: str = Field("", description="The library (or system component) that prints it.")
    ver: str = Field("", description="The version it was read in.")
    at: str = Field("", description="The file or function that prints it.")

    def source(self) -> str:
        """'lib ver (at)', or a note that the source was not recorded."""
        where = " ".join(x for x in (self.lib, self.ver) if x)
        return f"{where} ({self.at})" if where and self.at else where or "source not recorded"


class Family(_Model):
    """One failure class as the libraries word it: any of its messages on a line means this category."""

    id: str = Field(description="Short stable name of the family.")
    category: CrashCategory = Field(description="The failure class the family's lines mean.")
    priority: int = Field(description="Higher wins; causes rank above the errors they trigger.")
    remedy: str = Field(description="One line: what to do about it.")
    messages: list[Message] = Field(default_factory=list, description="The messages, each with its source.")
    patterns: list[str] = Field(default_factory=list, description="Bare regexes (no recorded source).")
    in_warnings: bool = Field(False, description="Also match lines that look like warnings.")
    echo: bool = Field(
        False, description="Its lines usually report another process's failure: a rank's own error wins."
    )
    engines: list[str] = Field(
        default_factory=list,
        description="Only in logs of these engines (the engines table's "
        "names); empty: any. For a message whose cause depends on the engine that printed it.",
    )
    raised_in: Literal["any", "library", "user"] = Field(
        "any",
        description="library: only an exception raised in a library's file (the traceback frame above it); user: "
        "only one raised in the run's own code; any: wherever. For a message whose meaning depends on who raised it.",
    )
    confidence: float = Field(
        0.9,
        ge=0,
        le=1,
        description="How sure a call from this family alone is; below the rules' min_confidence it is an "
        "'unknown' that names this family as a candidate (for a line that several causes print).",
    )
    resolved: str = Field(
        "",
        description="Regex of a later line saying the failure passed (a retry loop that recovered): a line of this "
        "family followed by one is no cause. Empty: never.",
    )
    own_module: bool = Field(
        False,
        description="Only for a line naming a module (module 'pkg.mod') of the raising file's own source tree: the "
        "raising frame's file lies outside the libraries in a folder named after the module's top package.",
    )

    def all_messages(self) -> list[Message]:
        """The messages, bare patterns included (as messages without a source)."""
        return [*self.messages, *(Message(re=p) for p in self.patterns)]

    def printed_by(self) -> str:
        """Which libraries, at which versions, print this family's messages: 'torch 2.13.0; vllm 0.33.0'."""
        seen = dict.fromkeys(" ".join(x for x in (m.lib, m.ver) if x and x != "-") for m in self.messages)
        return "; ".join(x for x in seen if x) or "source not recorded"


CrashRule = Family  # the older name of a family


class Ruling(_Model):
    """A category and remedy decided by something other than a log line."""

    category: CrashCategory = Field(description="The failure class.")
    remedy: str = Field(description="One line: what to do about it.")
    confidence: float = Field(0.7, ge=0, le=1, description="How sure the call is (see CrashRules.min_confidence).")


class Silence(_Model):
    """A kill (SIGTERM, time limit) after this long without log output means the run hung."""

    seconds: int = Field(1800, ge=1, description="Gap between the last timestamp and the kill.")
    max_seconds: int = Field(604_800, ge=1, description="A longer gap means the timestamps are not comparable.")
    exempt_rules: list[str] = Field(default_factory=list, description="Rules whose kill has a stated other reason.")
    unmeasured: list[str] = Field(
        default_factory=list,
        description="Rules whose kill is a hang also when the log shows nothing moving before it (no progress line, "
        "no timestamps from another clock), the silence being unmeasurable.",
    )
    progress: list[str] = Field(
        default_factory=list, description="Untimestamped progress lines; one after the last stamp: gap unknown."
    )
    applies_to: list[CrashCategory] = Field(
        default_factory=lambda: [CrashCategory.KILLED_EXTERNAL], description="Categories reread."
    )
    category: CrashCategory = Field(CrashCategory.HANG_TIMEOUT, description="What they become.")
    remedy: str = Field(
        "The run went silent long before it was killed: a hang; retry once, then debug the stall.",
        description="One line: what to do about it.",
    )


class Accounting(_Model):
    """A memory line read by its own figures (the card's total, what is free, what others hold): which families'
    lines are read, and what a line whose figures pass the subclass's threshold becomes."""

    families: list[str] = Field(default_factory=list, description="Families whose line is read for its numbers.")
    category: CrashCategory = Field(description="What such a line becomes.")
    confidence: float = Field(ge=0, le=1, description="Score of that call.")
    remedy: str = Field(description="One line: what to do about it.")


class OomAccounting(Accounting):
    """A device OOM whose own message shows that other processes held most of the card is a shared GPU."""

    others_share: float = Field(
        0.5, gt=0, le=1, description="Share of the card held by other processes at the OOM that makes it shared_gpu."
    )
    estimated_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The share needed when the message gives only PyTorch's own figures for the failing process (not "
        "'this process has') and names no other process: the process's memory outside PyTorch's allocator (a CUDA "
        "context, NCCL, an inference engine's own allocator) then counts as the others'.",
    )
    category: CrashCategory = CrashCategory.SHARED_GPU
    confidence: float = Field(0.7, ge=0, le=1)
    remedy: str = (
        "GPU memory ran out while other processes held most of the card (the OOM message's own accounting): free "
        "the card or give the run its own GPU; the trial's values did not take that memory."
    )


class ActionRule(_Model):
    """What the controller does with one category of crash."""

    kind: CrashAction = Field(description="retry_reduced, retry_once, record or stop.")
    retries: int = Field(0, ge=0, description="Retries of one trial before the crash is only recorded.")
    on_baseline: CrashAction | None = Field(None, description="The kind instead when the baseline crashed this way.")
    avoid: bool = Field(
        True,
        description="Repeats put the region off limits; false when the trial's values "
        "cannot cause the crash (another process on its GPU).",
    )


class StartupAccounting(Accounting):
    """vLLM's start-up check read by its own figures: a card that other processes hold little of and still has less
    free than the run asked for means the run asked for too much (``gpu_memory_utilization``), not a shared GPU."""

    others_below: float = Field(
        0.25, gt=0, le=1, description="Share of the card in use at start-up below which the setting is the cause."
    )
    category: CrashCategory = CrashCategory.CONFIG_ERROR
    confidence: float = Field(0.8, ge=0, le=1)
    remedy: str = (
        "vLLM asked for more of the card than is free although other processes hold little of it: lower "
        "gpu_memory_utilization (vllm_gpu_memory_utilization) below the card's free share; the same value fails again."
    )


class CrashRules(_Model):
    """The whole crash-rules table (see autorl/data/rules/crash_rules.yaml)."""

    families: list[Family] = Field(default_factory=list, description="Error families, in any order (priority decides).")
    families_from: list[str] = Field(default_factory=list, description="Files (next to this one) with more families.")
    wrappers: list[str] = Field(default_factory=list, description="Exception names that only wrap a cause.")
    wrapper_messages: list[str] = Field(
        default_factory=list, description="Regexes of exception lines that only point at a cause printed elsewhere."
    )
    config_raisers: str = Field(
        "(?!)",
        description="Regex of library files that validate settings: an unmatched "
        "exception raised there is a config error.",
    )
    exit_codes: dict[int, Ruling] = Field(
        default_factory=dict, description="Category by exit code when the log says nothing."
    )
    watchdog: dict[str, Ruling] = Field(default_factory=dict, description="Category by controller watchdog reason.")
    watchdog_yields_to: int = Field(75, description="A log line of this priority or more beats the watchdog.")
    nonfinite_remedy: str = Field(description="Remedy when the metrics turned NaN/inf.")
    unknown_remedy: str = Field(description="Remedy when nothing matched.")
    actions: dict[CrashCategory, ActionRule] = Field(
        default_factory=dict, description="What the controller does per category."
    )
    repeat_limit: int = Field(2, ge=1, description="Same signature this often in a study: stop sampling that region.")
    silence: Silence = Field(default_factory=lambda: Silence(), description="A kill after a long silence is a hang.")
    oom_accounting: OomAccounting = Field(
        default_factory=lambda: OomAccounting(), description="An OOM while other processes held the card."
    )
    startup_accounting: StartupAccounting = Field(
        default_factory=lambda: StartupAccounting(),
        description="vLLM's start-up memory check while other processes held little of the card.",
    )
    engines: dict[str, list[str]] = Field(default_factory=dict, description="Engine -> log markers, first match wins.")
    library_paths: str = Field(
        r"site-packages|dist-packages|/lib/python\d|<frozen", description="Regex of library files."
    )
    user_code_remedy: str = Field(
        "An exception raised in the run's own code: fix the code; no retry.",
        description="Remedy when an unmatched exception was raised outside the libraries.",
    )
    config_raiser_remedy: str = Field(
        "A library rejected a setting while validating it: correct the value the line "
        "names; the same values fail again.",
        description="Remedy when an unmatched exception was raised in a config module.",
    )
    high_confidence_priority: int = Field(30, description="A rule of at least this priority gives confidence 'high'.")
    min_confidence: float = Field(
        0.6, ge=0, le=1, description="A call scored below this is 'unknown', with the likeliest lines as candidates."
    )
    user_code_confidence: float = Field(
        0.7, ge=0, le=1, description="Score of an unmatched exception raised outside the libraries."
    )
    config_raiser_confidence: float = Field(
        0.7, ge=0, le=1, description="Score of an unmatched exception raised where a library validates settings."
    )
    wrapper_penalty: float = Field(
        0.15, ge=0, le=1, description="Taken off a family's score when its line only wraps a cause printed elsewhere."
    )
    candidates: int = Field(3, ge=1, description="Lines an 'unknown' names as the likeliest root causes.")
    _compiled: list[tuple[Family, Message, re.Pattern]] | None = PrivateAttr(None)

    @property
    def rules(self) -> list[Family]:
        """The families (the older name)."""
        return self.families

    def compiled(self) -> list[tuple[Family, Message, re.Pattern]]:
        """(family, message, regex) for every message, compiled once. Messages stay separate: a
        pattern that starts with a literal is scanned for that literal first, which an
        alternation of all of them would prevent."""
        if self._compiled is None:
            self._compiled = [(f, m, re.compile(m.re, re.M)) for f in self.families for m in f.all_messages()]
        return self._compiled


Confidence = Literal["high", "medium", "low"]


class Candidate(_Model):
    """One line an 'unknown' verdict names as a likely root cause, and the family it came closest to."""

    line: str = Field(description="The log line, verbatim.")
    family: str = Field(description="The family whose message matched it ('' for an exception no family knows).")
    category: CrashCategory = Field(description="What that family means.")
    printed_by: str = Field(description="The libraries and versions that print the family's messages.")
    score: float = Field(description="How sure a call from this line alone would be (0 to 1).")


class CrashReport(_Model):
    """The verdict on one crashed run."""

    category: CrashCategory = Field(description="The failure class.")
    root_cause_line: str = Field(description="The log line a person would point at, verbatim.")
    remedy: str = Field(description="One line: what to do about it.")
    signature: str = Field(description="category-hash of the normalised root line; equal for repeats of one failure.")
    engine: str = Field("unknown", description="Which engine printed the log (from the rules' engines table).")
    confidence: Confidence = Field(
        "high", description="high: a specific error line; medium: inferred (exit code, silence); low: unknown."
    )
    score: float = Field(1.0, ge=0, le=1, description="How sure the call is; below the rules' min_confidence: unknown.")
    candidates: list[Candidate] = Field(
        default_factory=list, description="For 'unknown': the likeliest root-cause lines and their closest families."
    )


# ---------------------------------------------------------------------------- loading rules


def load_rules(path: str | Path | None = None) -> CrashRules:
    """The crash rules at ``path`` (default: the packaged table), validated (``autorl.loading``)."""
    return loading.load_table(
        path or RULES_PATH, CrashRules, "crash rules", "docs/triage.md", _bad_pattern, includes="families_from"
    )


class LocalFamilies(_Model):
    """A workspace's own families (``autorl triage label`` writes them): checked before the shipped ones."""

    families: list[Family] = Field(default_factory=list, description="Families made from the user's labels.")


LOCAL_FAMILIES = Path("triage") / "families.yaml"  # under the workspace's run folder (.autorl/)


def load_local(path: Path) -> list[Family]:
    """The families of a workspace's local table (none when the file is not there), validated like the shipped
    ones."""
    if not path.is_file():
        return []
    table = loading.load_table(path, LocalFamilies, "local crash families", "docs/triage.md", _bad_local)
    return table.families


def _bad_local(table: LocalFamilies) -> str | None:
    """The first pattern of a workspace's own families that triage must not run, said in one line: one that does
    not compile, one that matches any line (an empty pattern files every crash as its category), or one that can
    backtrack without end (``backtracking``), which would hang ``autorl triage classify`` and a study's crash
    classification. The shipped families are reviewed with the code; these are typed or generated in a workspace.

    The work per pattern is otherwise bounded: triage matches every family, local ones included, only against
    ``log_lines`` (the last ``MAX_LINES`` lines, each cut to ``MAX_LINE_CHARS``), so a pattern linear in a line's
    length stays cheap however long the log's lines are."""
    for family in table.families:
        for pattern in [m.re for m in family.all_messages()] + ([family.resolved] if family.resolved else []):
            problem = local_pattern_problem(pattern)
            if problem:
                return f"family '{family.id}' pattern {pattern!r} {problem}"
    return None


_ANY_LINE = ("", "x", "step 1 loss 0.5")  # unrelated lines: a pattern matching all of them matches any line


def local_pattern_problem(pattern: str) -> str | None:
    """What is wrong with ``pattern`` as a workspace family's regex (the end of a sentence naming it and saying
    what to do), or None when triage can run it."""
    try:
        rx = re.compile(pattern, re.M)
    except re.error as exc:
        return f"is not a valid regex ({exc})"
    why = backtracking(pattern)
    if why:
        return f"can take unbounded time to match ({why}): rewrite it so no run of characters matches in many ways"
    if all(rx.search(line) for line in _ANY_LINE):
        return "matches any line (it would file every crash as its category): make it name the error's text"
    return None


def _sre() -> Any:
    """Python's own regex parser (``re._parser``; ``sre_parse`` before 3.11)."""
    try:
        return importlib.import_module("re._parser")
    except ImportError:  # Python 3.10
        return importlib.import_module("sre_parse")


def backtracking(pattern: str) -> str | None:
    """Why ``pattern`` can backtrack exponentially (or, for two unbounded runs in a row, to a high power of a
    line's length), or None. A static check on Python's own parse of the pattern (``re._parser``), so nothing is
    matched to find out:

    - a repetition (``+``, ``*``, ``{m,n}`` with n > 1) whose body holds another repetition that can match a
      varying number of times (``(a+)+``, ``(\\w*)*``, ``(a?a?)+``): a run of n characters splits between the
      inner and outer loops in exponentially many ways, and a failing match tries them all;
    - a repetition whose body holds an alternation with an empty branch or two branches that may start with the
      same character (``(a|aa)+``, ``(x|)*``, ``(\\w|\\d)+``): each character can be taken by either branch;
    - two unbounded repetitions in a row, with only optional items between, of the same item or where one is
      ``.`` (``.*.*x``, ``\\w+\\w+``): a failing search tries every split of every run, a cube of the line's
      length (a minute on one 4,000-character line).

    Possessive repetitions and atomic groups do not backtrack and pass. A fixed count (``{3}``) is not a
    repetition here. The check refuses some harmless patterns (``(?:ab?)+``); those can be rewritten."""
    sre = _sre()
    try:
        parsed = sre.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None  # compile() says what is wrong with it
    return _backtracks(list(parsed), sre)


def _repeat(op: Any, av: Any, sre: Any) -> tuple[int, int, list] | None:
    """(min, max, body) of a repetition that backtracks (not possessive, not a fixed count), else None."""
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
        low, high, body = av
        return (low, high, list(body)) if low != high else None
    return None


def _children(op: Any, av: Any, sre: Any) -> list[list]:
    """The sub-patterns under one node, each as a list of its items."""
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT)):
        return [list(av[2])]
    if op == sre.SUBPATTERN:
        return [list(av[-1])]
    if op == sre.BRANCH:
        return [list(b) for b in av[1]]
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return [list(av[1])]
    if op == getattr(sre, "ATOMIC_GROUP", None):
        return [list(av)]
    if op == sre.GROUPREF_EXISTS:
        return [list(b) for b in av[1:] if b is not None]
    return []


def _backtracks(items: list, sre: Any) -> str | None:
    for op, av in items:
        rep = _repeat(op, av, sre)
        inner = _inner_problem(rep[2], sre) if rep is not None and rep[1] > 1 else None
        found = inner or next(filter(None, (_backtracks(c, sre) for c in _children(op, av, sre))), None)
        if found:
            return found
    return _adjacent_runs(items, sre)


def _inner_problem(body: list, sre: Any) -> str | None:
    """What, inside a repetition's body, lets it split a run of characters in many ways."""
    for op, av in body:
        if _repeat(op, av, sre) is not None:
            return "a repetition inside a repetition"
        if op == getattr(sre, "POSSESSIVE_REPEAT", None):
            continue  # takes what it can and never gives back: one split only
        if op == sre.BRANCH:
            firsts = [_first(list(b), sre) for b in av[1]]
            if any(f is None for f in firsts) or len(set(firsts)) < len(firsts):
                return "alternatives inside a repetition that can match the same text"
        found = next(filter(None, (_inner_problem(c, sre) for c in _children(op, av, sre))), None)
        if found:
            return found
    return None


def _first(branch: list, sre: Any) -> int | None:
    """The literal character a branch must start with, or None (empty, or starting with anything else)."""
    while branch:
        op, av = branch[0]
        if op == sre.LITERAL:
            return int(av)
        if op == sre.SUBPATTERN:
            branch = list(av[-1]) + branch[1:]
            continue
        return None
    return None


def _adjacent_runs(items: list, sre: Any) -> str | None:
    """Two unbounded repetitions of one sequence, only optional items between, that can take the same
    characters (the same single item, or one of them ``.``)."""
    last = None  # the item the previous unbounded run repeats, while only optional items follow it
    for op, av in items:
        rep = _repeat(op, av, sre)
        if rep is not None and rep[1] == sre.MAXREPEAT and len(rep[2]) == 1:
            item = rep[2][0]
            if last is not None and (item == last or sre.ANY in (item[0], last[0])):
                return "two unbounded repetitions in a row that can match the same characters"
            last = item
        elif rep is not None and rep[0] == 0:
            continue  # optional: the runs around it still meet
        elif op != sre.AT:
            last = None
    return None


def with_local(rules: CrashRules, path: Path | None) -> CrashRules:
    """The rules with a workspace's local families added (they outrank the shipped ones by their priority)."""
    local = load_local(path) if path is not None else []
    if not local:
        return rules
    merged = rules.model_copy(update={"families": [*local, *rules.families]})
    merged._compiled = None
    return merged


def _bad_pattern(rules: CrashRules) -> str | None:
    """A family without messages or naming an engine the engines table lacks, or the first pattern that is not a
    valid regex, said in one line."""
    for family in rules.families:
        if not family.all_messages():
            return f"family '{family.id}' has no messages: give it at least one"
        unknown = sorted(set(family.engines) - set(rules.engines))
        if unknown:
            return (
                f"family '{family.id}' names engine(s) {', '.join(unknown)} that the engines table lacks: "
                "add or fix them"
            )
    named = [(f.id, m.re) for f in rules.families for m in f.all_messages()]
    named += [(f.id, f.resolved) for f in rules.families if f.resolved]
    named += [("crash rules", p) for p in [*rules.silence.progress, *rules.wrapper_messages, rules.config_raisers]]
    for rule_id, pattern in named:
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"rule '{rule_id}' pattern {pattern!r} is not a valid regex ({exc})"
    return None


# ---------------------------------------------------------------------------- reading lines

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PREFIX = re.compile(
    r"^\s*(?:\((?:[\w.]+ )?pid=\d+[^)]*\)\s*|\(raylet[^)]*\)\s*|\[rank\d+\]:\s*"
    # vLLM's and OpenRLHF's logger: "ERROR 03-14 09:31:29 [core.py:708] " (warnings keep theirs: they are skipped)
    r"|(?:DEBUG|INFO|ERROR|CRITICAL) \d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)? (?:\[[\w./-]+:\d+\]|[\w./-]+:\d+\])\s*)+"
)
_WARNING = re.compile(r"\b(?:WARN|WARNING|Warning|warning)\b|\w+Warning:|^\[?W\d{4} |\[W(?:\d{4}| )", re.M)
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*_?(?:[A-Z]\w*)?(?:Error|Exception|Exit|Interrupt|Failure)\b(?:\([\w.]*\))?(?::|\s*$)"
    # the socket module's classes keep their lowercase names (socket.timeout before 3.10, socket.gaierror, herror)
    r"|^socket\.(?:timeout|gaierror|herror|error)(?::|\s*$)"
)


def _clean(line: str) -> str:
    return _PREFIX.sub("", _ANSI.sub("", line)).strip()


def clean(line: str) -> str:
    """A log line as the families' messages are matched against it: colours and Ray/rank/logger prefixes gone."""
    return _clean(line)


def _exception_name(cleaned: str) -> str | None:
    m = _EXCEPTION.match(cleaned)
    return m.group(0).rstrip(":").strip() if m else None


@dataclass(frozen=True)
class _Hit:
    family: Family
    message: Message
    index: int
    line: str
    is_exception: bool
    is_wrapper: bool

    @property
    def rule(self) -> Family:
        """The family (the older name)."""
        return self.family

    def key(self) -> tuple[int, bool, bool, int]:
        """Highest priority; then a real error over a wrapper re-reporting it; then an exception
        over a log message; then the first line (the first rank to fail, before others echo it)."""
        return (self.family.priority, not self.is_wrapper, self.is_exception, -self.index)


def _is_wrapper(name: str | None, wrappers: list[str]) -> bool:
    if not name:
        return False
    return any(re.search(w, name) for w in wrappers)


def _wraps(cleaned: str, rules: CrashRules) -> bool:
    """An exception line that only wraps or points at a cause printed elsewhere."""
    name = _exception_name(cleaned)
    return (
        _is_wrapper(name, rules.wrappers) or bool(name) and any(re.search(w, cleaned) for w in rules.wrapper_messages)
    )


def _hits(lines: list[str], rules: CrashRules) -> list[_Hit]:
    """Every (family, line) match, with the first message of the family that matched the line;
    each message is run once over the whole cleaned text (fast on big logs)."""
    cleaned = [_clean(raw) for raw in lines]
    text = "\n".join(cleaned)
    starts = list(accumulate((len(c) + 1 for c in cleaned), initial=0))
    warnings = _matching_lines(_WARNING, text, starts)
    found: dict[tuple[int, int], tuple[Family, Message]] = {}
    for family, message, rx in rules.compiled():
        for i in _matching_lines(rx, text, starts):
            found.setdefault((i, id(family)), (family, message))
    code = {i + 1 for i, c in enumerate(cleaned) if _FRAME.match(c)}  # source lines under traceback frames
    recovered: dict[str, int] = {}  # per ``resolved`` regex, the last line that matches it (-1: none)
    hits = []
    for (i, _), (family, message) in sorted(found.items(), key=lambda kv: kv[0][0]):
        name = _exception_name(cleaned[i])
        if i in code and not name:
            continue
        if not _raised_where(family, lines, i, rules) or (family.own_module and not _own_module(lines, i, rules)):
            continue
        if family.resolved and i < _last_match(family.resolved, text, starts, recovered):
            continue  # the library said later that it recovered: a passing failure, not the cause
        if family.in_warnings or name or i not in warnings:
            hits.append(_Hit(family, message, i, lines[i].rstrip(), bool(name), _wraps(cleaned[i], rules)))
    return hits


def _raised_where(family: Family, lines: list[str], index: int, rules: CrashRules) -> bool:
    """Whether the line at ``index`` was raised where the family says (``raised_in``): the file of the traceback
    frame above it is a library's or the run's own; a line with no frame above it passes only 'any'."""
    if family.raised_in == "any":
        return True
    path = _raising_file(lines, (index, lines[index]))
    if path is None:
        return False
    return bool(re.search(rules.library_paths, path)) == (family.raised_in == "library")


def _last_match(pattern: str, text: str, starts: list[int], seen: dict[str, int]) -> int:
    """The index of the last cleaned line that ``pattern`` matches (-1: none), computed once per pattern."""
    if pattern not in seen:
        seen[pattern] = max(_matching_lines(re.compile(pattern, re.M), text, starts), default=-1)
    return seen[pattern]


_MODULE_NAMED = re.compile(r"module '([A-Za-z_]\w*)[\w.]*'")


def _own_module(lines: list[str], index: int, rules: CrashRules) -> bool:
    """Whether the module the line at ``index`` names (module 'pkg.mod') belongs to the raising file's own source
    tree: that file is outside the libraries and lies in a folder named after the module's top package."""
    m = _MODULE_NAMED.search(_clean(lines[index]))
    path = _raising_file(lines, (index, lines[index]))
    if m is None or path is None or re.search(rules.library_paths, path):
        return False
    return f"/{m.group(1)}/" in path.replace("\\", "/")


def _matching_lines(rx: re.Pattern, text: str, starts: list[int]) -> set[int]:
    return {bisect_right(starts, m.start()) - 1 for m in rx.finditer(text)}


_CHAINED = re.compile(
    r"^(The above exception was the direct cause of the following exception|"
    r"During handling of the above exception, another exception occurred):"
)


def _innermost_exception(
    lines: list[str], rules: CrashRules, skip: Collection[int] = frozenset()
) -> tuple[int, str] | None:
    """(index, line) of the innermost exception: the last one that is not a wrapper (else the last
    wrapper), walked back to the first exception of its chain ("The above exception was the direct
    cause of ..."), reported at its first occurrence (the rank or actor that raised it, before Ray
    or the launcher printed it again). Lines in ``skip`` are not candidates."""
    cleaned = [_clean(raw) for raw in lines]
    found = [(i, _wraps(c, rules)) for i, c in enumerate(cleaned) if _exception_name(c) and i not in skip]
    if not found:
        return None
    real = [i for i, wrapped in found if not wrapped]
    chosen = _chain_start((real or [i for i, _ in found])[-1], real, cleaned)
    same = normalise(lines[chosen])
    first = next(i for i, _ in found if normalise(lines[i]) == same)
    return first, lines[first].rstrip()


def _chain_start(index: int, candidates: list[int], cleaned: list[str]) -> int:
    """The first exception of the chain that ends at ``index``: while a chaining line separates it
    from the exception before, step back to that one."""
    while True:
        before = [i for i in candidates if i < index]
        if not before or not any(_CHAINED.match(c) for c in cleaned[before[-1] : index]):
            return index
        index = before[-1]


_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')


def _raising_file(lines: list[str], exc: tuple[int, str]) -> str | None:
    """The file of the traceback frame just above the exception, if any."""
    for raw in reversed(lines[max(0, exc[0] - 12) : exc[0]]):
        m = _FRAME.match(_clean(raw))
        if m:
            return m.group(1)
    return None


def _raised_in_user_code(lines: list[str], exc: tuple[int, str], rules: CrashRules) -> bool:
    """True when the traceback frame just above the exception is a file outside the libraries."""
    path = _raising_file(lines, exc)
    return path is not None and not re.search(rules.library_paths, path)


# ---------------------------------------------------------------------------- time, engine

_STAMPS = [  # (regex, has_year): the timestamp formats engines print
    (re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2})"), True),
    (re.compile(r"\b[IWEF](\d{1,2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.\d+"), False),  # glog, torch's c10 log
    (re.compile(r"\b(?:INFO|WARNING|ERROR|DEBUG) (\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})\b"), False),
]


def _timestamp(line: str, year: int | None) -> datetime | None:
    """The first timestamp on a line; a format without a year borrows ``year``."""
    for rx, has_year in _STAMPS:
        m = rx.search(line)
        if m is None or not (has_year or year):
            continue
        parts = [int(g) for g in m.groups()]
        y, mo, d, h, mi, s = parts if has_year else [year or 0, *parts]  # a format without a year: ``year`` is set
        try:
            return datetime(y, mo, d, h, mi, s)
        except ValueError:
            return None
    return None


def _timeline(lines: list[str]) -> list[datetime | None]:
    out: list[datetime | None] = []
    year = None
    for raw in lines:
        t = _timestamp(raw, year)
        year = t.year if t else year
        out.append(t)
    return out


def silence_before(lines: list[str], index: int, rules: CrashRules) -> float | None:
    """Seconds between the last timestamped line before ``index`` and the kill at ``index`` (its own
    timestamp, else the next one after it); None when the log does not say."""
    times = _timeline(lines)
    kill = next((t for t in times[index:] if t), None)
    at = next((i for i in range(index - 1, -1, -1) if times[i]), None)
    last = times[at] if at is not None else None
    if kill is None or at is None or last is None or _moved_after(lines[at + 1 : index], rules):
        return None
    gap = (kill - last).total_seconds()
    return gap if 0 <= gap <= rules.silence.max_seconds else None


def _nothing_moved(lines: list[str], index: int, rules: CrashRules) -> bool:
    """No progress line before the kill at ``index``, and no timestamps that only another clock could explain."""
    if _moved_after(lines[:index], rules):
        return False
    times = _timeline(lines)
    before = next((t for t in reversed(times[:index]) if t), None)
    kill = next((t for t in times[index:] if t), None)
    return not (before and kill and (kill - before).total_seconds() > rules.silence.max_seconds)


def _moved_after(lines: list[str], rules: CrashRules) -> bool:
    """True when a progress line (tqdm bar, step or metric line) is among ``lines``."""
    return any(re.search(p, _clean(raw)) for raw in lines for p in rules.silence.progress)


def detect_engine(lines: list[str], rules: CrashRules) -> str:
    """The first engine in the rules' ``engines`` table with a marker in the log, else 'unknown'."""
    text = "\n".join(lines)
    for engine, patterns in rules.engines.items():
        if any(re.search(p, text, re.M) for p in patterns):
            return engine
    return "unknown"


def _last_line(lines: list[str]) -> str:
    return next((raw.rstrip() for raw in reversed(lines) if raw.strip()), "")


# ---------------------------------------------------------------------------- classify


def classify(
    log_text: str,
    exit_code: int | None = None,
    watchdog: str | None = None,
    metrics_nonfinite: str | None = None,
    local: Path | None = None,
) -> CrashReport:
    """Diagnose one failed run from its log text and what the controller observed.

    ``watchdog`` is the controller's reason for killing it ('silence' or 'timeout');
    ``metrics_nonfinite`` names the first NaN/inf metric ('loss@12'), see RunMetrics.has_nonfinite;
    ``local`` is a workspace's own families file (``local_families_path``; the user's labels), read if it exists.
    """
    return _decide(log_text, exit_code, watchdog, metrics_nonfinite, local)[0]


def explain(
    log_text: str,
    exit_code: int | None = None,
    watchdog: str | None = None,
    metrics_nonfinite: str | None = None,
    local: Path | None = None,
) -> list[str]:
    """How ``classify`` reached its verdict: which rule fired on which line, what was skipped."""
    return _decide(log_text, exit_code, watchdog, metrics_nonfinite, local)[1]


def _decide(
    log_text: str, exit_code: int | None, watchdog: str | None, nonfinite: str | None, local: Path | None = None
) -> tuple[CrashReport, list[str]]:
    rules = with_local(load_rules(), local)
    lines = log_lines(log_text)
    engine = detect_engine(lines, rules)
    hits = [h for h in _hits(lines, rules) if not h.family.engines or engine in h.family.engines]
    best, echo = _best(hits)
    own = _own_error(lines, hits, rules) if best and best.family.echo else None
    trace = _trace_hits(lines, hits, best, rules) + ([echo] if echo else [])
    if nonfinite:
        d, why = _nonfinite(lines, hits, nonfinite, rules)
    elif watchdog and watchdog in rules.watchdog and not (best and best.family.priority >= rules.watchdog_yields_to):
        d, why = _watchdog(lines, best, watchdog, rules)
    elif own and best:
        d, why = _from_exception(lines, own, rules)
        why = f"{why}; it beats {best.family.id} on line {best.index + 1}, which only echoes another process's failure"
    elif best:
        d, why = _from_hit(lines, best, rules)
    else:
        d, why = _unmatched(lines, exit_code, rules)
    d, note = _thresholded(d, lines, hits, rules)
    return d.model_copy(update={"engine": engine}), [*trace, why, *note, f"engine: {engine}"]


def _thresholded(
    d: CrashReport, lines: list[str], hits: list[_Hit], rules: CrashRules
) -> tuple[CrashReport, list[str]]:
    """A call scored below ``min_confidence`` becomes 'unknown' (its line kept); an 'unknown' names the likeliest
    root-cause lines and the families they came closest to."""
    note = []
    was: Candidate | None = None
    if d.category != CrashCategory.UNKNOWN and d.score < rules.min_confidence:
        note.append(f"score {d.score:.2f} < min_confidence {rules.min_confidence:.2f}: {d.category} becomes unknown")
        was = Candidate(line=d.root_cause_line, family="", category=d.category, printed_by="-", score=d.score)
        d = _diagnosis(CrashCategory.UNKNOWN, d.root_cause_line, rules.unknown_remedy, confidence="low", score=d.score)
    if d.category != CrashCategory.UNKNOWN:
        return d, note
    found = _candidates(lines, hits, d.root_cause_line, rules)
    if was is not None and all(c.category != was.category for c in found):  # decided by no family: an exit code
        found = [was, *(c for c in found if normalise(c.line) != normalise(was.line))][: rules.candidates]
    note += [f"candidate: {c.family or '(no family)'} ({c.category}, {c.score:.2f}): {c.line.strip()}" for c in found]
    return d.model_copy(update={"candidates": found}), note


def _hit_score(hit: _Hit, rules: CrashRules) -> float:
    """A family's confidence, less the wrapper penalty when its line only wraps a cause printed elsewhere."""
    return max(0.0, hit.family.confidence - (rules.wrapper_penalty if hit.is_wrapper else 0.0))


def _candidates(lines: list[str], hits: list[_Hit], chosen: str, rules: CrashRules) -> list[Candidate]:
    """The likeliest root-cause lines: the chosen line, then the matched lines by score, priority and order (a
    process's own error before an echo of it), then the innermost exception no family knows."""
    deciding: dict[int, _Hit] = {}  # per line, the family that would decide it (the highest priority)
    for h in hits:
        if h.index not in deciding or h.key() > deciding[h.index].key():
            deciding[h.index] = h
    mine = [h for h in deciding.values() if h.line.rstrip() == chosen.rstrip()]
    rest = (h for h in deciding.values() if h.line.rstrip() != chosen.rstrip())
    ranked = mine + sorted(rest, key=lambda h: (not h.family.echo, _hit_score(h, rules), *h.key()), reverse=True)
    out: list[Candidate] = []
    seen: set[str] = set()

    def add(line: str, family: Family | None, score: float) -> None:
        key = normalise(line)
        if line.strip() and key not in seen and len(out) < rules.candidates:
            seen.add(key)
            category = family.category if family else CrashCategory.UNKNOWN
            by = family.printed_by() if family else "-"
            out.append(
                Candidate(
                    line=line,
                    family=family.id if family else "",
                    category=category,
                    printed_by=by,
                    score=round(score, 2),
                )
            )

    for hit in ranked:
        add(hit.line, hit.family, _hit_score(hit, rules))
    exc = _innermost_exception(lines, rules)
    if exc is not None:
        add(exc[1], None, 0.0)
    add(chosen, None, 0.0)
    return out


def _best(hits: list[_Hit]) -> tuple[_Hit | None, str | None]:
    """The root-cause hit: the highest key, except that a process's own error (any family that is not
    an echo) beats an echo family's line whatever their priorities. Returns the hit and a note."""
    if not hits:
        return None, None
    best = max(hits, key=_Hit.key)
    own = [h for h in hits if not h.family.echo]
    if not best.family.echo or not own:
        return best, None
    mine = max(own, key=_Hit.key)
    return mine, (
        f"{best.family.id} on line {best.index + 1} only echoes another process's failure: "
        f"{mine.family.id} on line {mine.index + 1} is that process's own error"
    )


def _own_error(lines: list[str], hits: list[_Hit], rules: CrashRules) -> tuple[int, str] | None:
    """A process's own exception that no family knows (not a wrapper), when the best line is only a
    collective's echo (an NCCL error, a timeout waiting on a peer): the rank that failed said why."""
    matched = {h.index for h in hits}
    exc = _innermost_exception(lines, rules, skip=matched)
    if exc is None or _wraps(_clean(exc[1]), rules) or exc[0] in matched:
        return None
    return exc


def _trace_hits(lines: list[str], hits: list[_Hit], best: _Hit | None, rules: CrashRules) -> list[str]:
    """Wrapper lines skipped, later copies of the chosen line, and families that matched but lost."""
    out = [f"skipped wrapper line {i + 1}: {raw.strip()}" for i, raw in enumerate(lines) if _wraps(_clean(raw), rules)]
    if best:
        same = normalise(best.line)
        out += [
            f"skipped later copy on line {h.index + 1}"
            for h in hits
            if h.index > best.index and normalise(h.line) == same
        ]
    others = sorted(
        {(h.family.priority, h.family.id) for h in hits if best and h.family.id != best.family.id}, reverse=True
    )
    out += [f"outranked: family {fid} (priority {prio})" for prio, fid in others]
    return out


def _fired(hit: _Hit) -> str:
    return (
        f"family {hit.family.id} ({hit.family.category}, priority {hit.family.priority}) matched line "
        f"{hit.index + 1} by a message from {hit.message.source()}: {hit.line.strip()}"
    )


def _from_hit(lines: list[str], best: _Hit, rules: CrashRules) -> tuple[CrashReport, str]:
    """A matched family; an external kill after a long silence in the log is a hang instead."""
    why = _fired(best)
    if best.family.category in rules.silence.applies_to and best.family.id not in rules.silence.exempt_rules:
        gap = silence_before(lines, best.index, rules)
        stalled = (
            gap is None and best.family.id in rules.silence.unmeasured and _nothing_moved(lines, best.index, rules)
        )
        if stalled or gap is not None and gap >= rules.silence.seconds:
            note = (
                "; nothing in the log moved before it, so a stall the limit ended"
                if stalled
                else f"; {(gap or 0) / 60:.0f} min without output before it, so a hang, not an external kill"
            )
            d = _diagnosis(
                rules.silence.category,
                best.line,
                rules.silence.remedy,
                confidence="medium",
                score=_hit_score(best, rules),
            )
            return d, why + note
    used = _startup_in_use(best, rules)
    if used is not None:
        ask = rules.startup_accounting
        note = f"; other processes held only {used:.0%} of the card when vLLM started: the run asked for too much"
        return _diagnosis(ask.category, best.line, ask.remedy, confidence="high", score=ask.confidence), why + note
    share = _oom_elsewhere(best, rules)
    if share is not None:
        rule = rules.oom_accounting
        note = f"; other processes held {share:.0%} of the card at the OOM"
        return _diagnosis(rule.category, best.line, rule.remedy, confidence="high", score=rule.confidence), why + note
    d = _diagnosis(
        best.family.category,
        best.line,
        best.family.remedy,
        confidence=_confidence(best, rules),
        score=_hit_score(best, rules),
    )
    return d, why


_SIZE = r"([\d.]+) ([KMGT]?i?B)"
_OOM_NEW = re.compile(rf"total capacity of {_SIZE} of which {_SIZE} is free")
_OOM_OWN = re.compile(rf"this process has {_SIZE} memory in use")
_OOM_TORCH = re.compile(
    rf"Of the allocated memory {_SIZE} is allocated by PyTorch(?:, with [^,]*)?, and {_SIZE} is reserved"
)
_OOM_OLD = re.compile(
    rf"{_SIZE} total capacity; {_SIZE} already allocated; {_SIZE} free; {_SIZE} reserved in total by PyTorch"
)
_UNITS = {
    "B": 1,
    "KB": 1e3,
    "KIB": 1024,
    "MB": 1e6,
    "MIB": 1024**2,
    "GB": 1e9,
    "GIB": 1024**3,
    "TB": 1e12,
    "TIB": 1024**4,
}


def others_share(line: str) -> float | None:
    """The share of the card that processes other than the failing one held, from PyTorch's OOM message (its
    total, free and own figures: 'this process has', else what PyTorch allocated and reserved); None when the
    line does not give them all."""

    def size(num: str, unit: str) -> float:
        return float(num) * _UNITS.get(unit.upper(), 1)

    old = _OOM_OLD.search(line)
    if old:
        g = old.groups()
        total, free, own = size(g[0], g[1]), size(g[4], g[5]), size(g[6], g[7])
    else:
        new, mine, torch_own = _OOM_NEW.search(line), _OOM_OWN.search(line), _OOM_TORCH.search(line)
        if new is None:
            return None
        total, free = size(*new.groups()[:2]), size(*new.groups()[2:])
        if mine is not None:
            own = size(*mine.groups())
        elif torch_own is not None:
            own = size(*torch_own.groups()[:2]) + size(*torch_own.groups()[2:])
        else:
            return None
    return max(0.0, total - free - own) / total if total > 0 else None


_OOM_OTHER_PROCESS = re.compile(rf"Process \d+ has {_SIZE} memory in use")


def _oom_elsewhere(best: _Hit, rules: CrashRules) -> float | None:
    """The others' share of the card when ``best`` is an OOM the accounting rule reads and it reaches the rule's
    share; else None. A share estimated from PyTorch's own figures alone (torch 2.1+ without 'this process has' and
    without other processes named) must reach the stricter ``estimated_share``: the failing process's memory outside
    PyTorch's allocator is in it."""
    rule = rules.oom_accounting
    if best.family.id not in rule.families:
        return None
    share = others_share(best.line)
    estimated = bool(_OOM_NEW.search(best.line)) and not (
        _OOM_OWN.search(best.line) or _OOM_OTHER_PROCESS.search(best.line)
    )
    needed = max(rule.others_share, rule.estimated_share) if estimated else rule.others_share
    return share if share is not None and share >= needed else None


_STARTUP_FREE = re.compile(r"Free memory on device(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less than")


def startup_in_use(line: str) -> float | None:
    """The share of the card in use when vLLM started (1 - free/total), from its start-up check's message; None when
    the line does not give both figures."""
    m = _STARTUP_FREE.search(line)
    if m is None:
        return None
    free, total = float(m.group(1)), float(m.group(2))
    return max(0.0, total - free) / total if total > 0 else None


def _startup_in_use(best: _Hit, rules: CrashRules) -> float | None:
    """The card's share in use at vLLM's start-up when ``best`` is a start-up line the accounting rule reads and that
    share is below the rule's bound (the run asked for too much); else None."""
    rule = rules.startup_accounting
    if best.family.id not in rule.families:
        return None
    used = startup_in_use(best.line)
    return used if used is not None and used < rule.others_below else None


def _confidence(hit: _Hit, rules: CrashRules) -> Confidence:
    if hit.rule.category == CrashCategory.UNKNOWN:
        return "low"
    return "high" if hit.rule.priority >= rules.high_confidence_priority and not hit.is_wrapper else "medium"


def _watchdog(lines: list[str], best: _Hit | None, watchdog: str, rules: CrashRules) -> tuple[CrashReport, str]:
    outcome = rules.watchdog[watchdog]
    line = best.line if best else _last_line(lines)
    why = f"watchdog '{watchdog}' decides (no log line of priority >= {rules.watchdog_yields_to})"
    return _diagnosis(outcome.category, line, outcome.remedy, confidence="high", score=outcome.confidence), why


def _nonfinite(lines: list[str], hits: list[_Hit], key: str, rules: CrashRules) -> tuple[CrashReport, str]:
    """NaN metrics: the engine's own NaN error line, else the first line showing the key as nan/inf."""
    nan_hits = [h for h in hits if h.rule.category == CrashCategory.NAN_DIVERGENCE]
    line = max(nan_hits, key=_Hit.key).line if nan_hits else _first_nonfinite_line(lines, key)
    why = f"metrics turned non-finite ({key}); root line is the first showing it"
    return _diagnosis(CrashCategory.NAN_DIVERGENCE, line, rules.nonfinite_remedy, confidence="high", score=1.0), why


_NONFINITE_VALUE = re.compile(r"(?i)[=:\s'\"](?:nan|-?inf)\b")


def _first_nonfinite_line(lines: list[str], key: str) -> str:
    name = key.split("@")[0]
    for raw in lines:
        if name in raw and _NONFINITE_VALUE.search(raw):
            return raw.rstrip()
    return f"non-finite metric: {key}"


def _unmatched(lines: list[str], exit_code: int | None, rules: CrashRules) -> tuple[CrashReport, str]:
    exc = _innermost_exception(lines, rules)
    if exc is None and exit_code in rules.exit_codes:
        outcome = rules.exit_codes[exit_code]
        line = _last_line(lines) or f"exit code {exit_code}"
        d = _diagnosis(
            outcome.category,
            line,
            outcome.remedy,
            basis=f"exit code {exit_code}",
            confidence="medium",
            score=outcome.confidence,
        )
        return d, f"no family matched and no exception: exit code {exit_code} decides"
    if exc is not None:
        return _from_exception(lines, exc, rules)
    report = _error_report(lines)
    line = (report or _last_line(lines)) or (f"exit code {exit_code}" if exit_code is not None else "")
    d = _diagnosis(CrashCategory.UNKNOWN, line, rules.unknown_remedy, confidence="low", score=0.0)
    where = "the first line of its last error-level report" if report else "the log's last line"
    return d, f"no family matched, no exception: {where}"


# a line a logger printed at error level: vLLM's and Python's logging ("ERROR 05-16 03:38:10 [core.py:398]", "[ERROR]",
# "- ERROR -", "ERROR:root:"), glog and torch's C++ log ("E0502 13:00:02", "[E ProcessGroupNCCL.cpp:1537]",
# "[E1225 12:58:32.7 ..."), Ray's C++ log ("[2025-04-08 10:01:52,986 E 118633 120395]")
_ERROR_LEVEL = re.compile(
    r"\b(?:ERROR|CRITICAL|FATAL)\b|^\[?[EF]\d{4} \d{2}:\d{2}|\[[EF](?:\d{4})? |\d{2}:\d{2}:\d{2}[,.]\d+ [EF] \d+ "
)
_TRACEBACK_HEAD = re.compile(r"^Traceback \(most recent call last\)")


def _error_report(lines: list[str]) -> str | None:
    """The first line of the log's last block of error-level lines, skipping a traceback's header, frames and source
    lines: the message a logger opened its last error report with (vLLM's "EngineCore encountered a fatal error."
    before the traceback it logs line by line). None when no line was logged at error level. A log cut mid-line ends
    in a fragment of that report ("ERROR 05-16 03:38:10 [core.py:398]     return next(s"), never the line to read."""
    level = [bool(_ERROR_LEVEL.search(_ANSI.sub("", raw))) for raw in lines]
    last = next((i for i in range(len(lines) - 1, -1, -1) if level[i]), None)
    if last is None:
        return None
    first = last
    while first > 0 and (level[first - 1] or not lines[first - 1].strip()):
        first -= 1
    cleaned = [_clean(raw) for raw in lines[first : last + 1]]
    for k, c in enumerate(cleaned):
        frame_above = k > 0 and bool(_FRAME.match(cleaned[k - 1]))
        if c and level[first + k] and not (_FRAME.match(c) or _TRACEBACK_HEAD.match(c) or frame_above):
            return lines[first + k].rstrip()
    return None


def _from_exception(lines: list[str], exc: tuple[int, str], rules: CrashRules) -> tuple[CrashReport, str]:
    """An exception no family knows: raised in the run's own code, in a library's settings
    validation (``config_raisers``), or else unknown."""
    path = _raising_file(lines, exc)
    where = f"innermost exception on line {exc[0] + 1}"
    if _wraps(_clean(exc[1]), rules):
        d = _diagnosis(CrashCategory.UNKNOWN, exc[1], rules.unknown_remedy, confidence="low", score=0.0)
        return d, f"no family matched; the {where} only points at a cause the log does not show"
    if path is not None and not re.search(rules.library_paths, path):
        d = _diagnosis(
            CrashCategory.USER_CODE_ERROR,
            exc[1],
            rules.user_code_remedy,
            confidence="medium",
            score=rules.user_code_confidence,
        )
        return d, f"no family matched; the {where} was raised in the run's own code ({path})"
    if path is not None and re.search(rules.config_raisers, path):
        d = _diagnosis(
            CrashCategory.CONFIG_ERROR,
            exc[1],
            rules.config_raiser_remedy,
            confidence="medium",
            score=rules.config_raiser_confidence,
        )
        return d, f"no family matched; the {where} was raised where a library validates its settings ({path})"
    d = _diagnosis(CrashCategory.UNKNOWN, exc[1], rules.unknown_remedy, confidence="low", score=0.0)
    return d, f"no family matched; {where}"


def _diagnosis(
    category: CrashCategory,
    line: str,
    remedy: str,
    basis: str | None = None,
    confidence: Confidence = "high",
    score: float = 1.0,
) -> CrashReport:
    """``basis`` replaces the line in the signature when the line is incidental (exit-code cases)."""
    sig = signature(category, basis if basis is not None else line)
    return CrashReport(
        category=category, root_cause_line=line, remedy=remedy, signature=sig, confidence=confidence, score=score
    )


# ---------------------------------------------------------------------------- signature, excerpt

_NORMALISE = [
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"), "<time>"),
    (re.compile(r"\b\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?"), "<time>"),
    (re.compile(r"\b[IWEF]\d{3,4} \d{2}:\d{2}:\d{2}\.\d+"), "<time>"),
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"\b[0-9a-fA-F]{12,}\b"), "<id>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:[\w.\-~]*/)+[\w.\-]+"), "<path>"),
    (re.compile(r"\d+(?:\.\d+)?"), "#"),
    (re.compile(r"\s+"), " "),
]


def normalise(line: str) -> str:
    """The root line with numbers, addresses, ids, paths, pids and timestamps stripped."""
    text = _clean(line)
    for rx, repl in _NORMALISE:
        text = rx.sub(repl, text)
    return text.strip()


def signature(category: CrashCategory, line: str) -> str:
    """Stable short id of one failure: '<category>-<10 hex of the normalised line>'."""
    digest = hashlib.sha1(f"{category}|{normalise(line)}".encode()).hexdigest()[:10]
    return f"{category}-{digest}"


def excerpt(log_text: str, root_cause_line: str, context: int = 8) -> str:
    """``context`` lines either side of the root line's last occurrence, the root marked '>> ' (colours shown as
    plain text)."""
    lines = log_lines(log_text)
    target = root_cause_line.rstrip()
    idx = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].rstrip() == target), None)
    if idx is None:
        return "\n".join("   " + shown(ln) for ln in lines[-(2 * context + 1) :])
    lo, hi = max(0, idx - context), min(len(lines), idx + context + 1)
    return "\n".join((">> " if i == idx else "   ") + shown(lines[i]) for i in range(lo, hi))


@overload
def shown(line: str) -> str: ...
@overload
def shown(line: None) -> None: ...
def shown(line: str | None) -> str | None:
    """A log line as a person reads it, without terminal colour codes (a root cause is stored as its log has it,
    so that it can be found there again); None stays None."""
    return None if line is None else _ANSI.sub("", line)


# ---------------------------------------------------------------------------- policy


def crash_action(category: CrashCategory | None) -> CrashAction:
    """What the controller does with a crash of this category (see ``actions`` in the rules)."""
    rule = _action_rule(category)
    return rule.kind if rule else CrashAction.RECORD


def _action_rule(category: CrashCategory | None) -> ActionRule | None:
    """The rules' ``actions`` row of a category (None: no row, or no category)."""
    return None if category is None else load_rules().actions.get(category)


def repeat_limit() -> int:
    """Times one crash signature may occur in a study before its neighbourhood is avoided."""
    return load_rules().repeat_limit


def says_nothing_of_the_values(category: CrashCategory | None) -> bool:
    """Whether a crash of this category is one the trial's values cannot cause (``avoid: false``) or one that is
    often transient (retried unchanged): a fresh-seed run that ends so is no evidence against its recipe."""
    rule = _action_rule(category)
    return rule is not None and (not rule.avoid or rule.kind == CrashAction.RETRY_ONCE)


def avoids(category: CrashCategory | None) -> bool:
    """Whether repeats of this category put their region off limits (not for what the values cannot cause)."""
    rule = _action_rule(category)
    return rule is None or rule.avoid


class Action(_Model):
    """What the controller does about one crashed trial, and why (one line)."""

    kind: CrashAction = Field(description="retry_reduced, retry_once, record or stop.")
    reason: str = Field(description="One line: what is done and why.")
    avoid_region: bool = Field(False, description="The signature reached repeat_limit: stop proposing near it.")
    path: str | None = Field(None, description="disk_full: the directory whose volume is full.")
    free_bytes: int | None = Field(None, description="disk_full: free bytes on that volume when checked.")


def decide_action(
    diagnosis: CrashReport,
    *,
    is_baseline: bool,
    retries_so_far: int,
    signature_count: int,
    run_dir: str | Path,
    log_text: str = "",
) -> Action:
    """The action for one crash: the category's row of ``actions``, then the baseline, retry and
    repeat limits. ``signature_count`` counts this crash too. For a full disk the volume checked is
    the one of the path the failing line names, else the last path the log named before it
    ('Saving model checkpoint to /ckpt/...'), else ``run_dir``. Pure apart from one disk_usage call."""
    rules = load_rules()
    rule = rules.actions.get(diagnosis.category, ActionRule(kind=CrashAction.RECORD))
    avoid = rule.avoid and signature_count >= rules.repeat_limit
    if rule.kind == CrashAction.STOP or (is_baseline and rule.on_baseline == CrashAction.STOP):
        return _stop(diagnosis, is_baseline, _full_volume_path(diagnosis, log_text, Path(run_dir)), avoid)
    kind = rule.on_baseline if is_baseline and rule.on_baseline else rule.kind
    if kind in (CrashAction.RETRY_REDUCED, CrashAction.RETRY_ONCE) and retries_so_far >= rule.retries:
        again = f"{diagnosis.category} again after {retries_so_far} retry: recorded as a crash"
        return Action(kind=CrashAction.RECORD, avoid_region=avoid, reason=again + _avoid(avoid, signature_count))
    return Action(kind=kind, avoid_region=avoid, reason=_reason(kind, diagnosis) + _avoid(avoid, signature_count))


_REASONS = {
    CrashAction.RETRY_REDUCED: "{c}: retrying once with the most recent memory-expanding change reduced",
    CrashAction.RETRY_ONCE: "{c}: retrying once unchanged (often transient)",
    CrashAction.RECORD: "{c}: recorded as a crash",
}


def _reason(kind: CrashAction, d: CrashReport) -> str:
    return _REASONS[kind].format(c=d.category)


def _avoid(avoid: bool, count: int) -> str:
    return f"; signature seen {count} times: no more proposals near it" if avoid else ""


def _stop(d: CrashReport, is_baseline: bool, run_dir: Path, avoid: bool) -> Action:
    if d.category == CrashCategory.DISK_FULL:
        where = _existing(run_dir)
        free = shutil.disk_usage(where).free
        return Action(
            kind=CrashAction.STOP,
            avoid_region=avoid,
            path=str(where),
            free_bytes=free,
            reason=f"disk_full: {where} has {_human(free)} free; free space there, then resume the study",
        )
    scope = "the baseline (the recipe as written)" if is_baseline else "this environment"
    why = f"{d.category} in {scope}: every trial would fail the same way; fix it, then resume ({d.remedy})"
    return Action(kind=CrashAction.STOP, avoid_region=avoid, reason=why)


_ABS_PATH = re.compile(r"""(?<![\w.~])(/[\w.\-/]*[\w\-])""")
PATH_LOOKBACK = 20  # lines before the failing line searched for the path being written


def _full_volume_path(d: CrashReport, log_text: str, run_dir: Path) -> Path:
    """Where the failing write went: its volume is the full one, which need not be the run dir's."""
    if d.category != CrashCategory.DISK_FULL:
        return run_dir
    lines = log_lines(log_text)
    idx = max((i for i, ln in enumerate(lines) if ln.rstrip() == d.root_cause_line.rstrip()), default=len(lines))
    for line in [d.root_cause_line, *reversed(lines[max(0, idx - PATH_LOOKBACK) : idx])]:
        found = [] if _FRAME.match(_clean(line)) else _ABS_PATH.findall(line)  # code files are not the target
        if found:
            return Path(found[-1])
    return run_dir


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (a run dir may not have been created)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path.parent if path.is_file() else path


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def group_crashes(rows: Sequence[Trial | dict[str, Any]]) -> list[dict[str, Any]]:
    """Crashed trials grouped by signature, most frequent first.

    Reads ledger rows (``Trial``: crash_signature, crash_category, root_cause, remedy) or CrashReport dumps
    ('signature', 'category', 'root_cause_line'; a dict with a ledger row's keys is read too); rows without a
    signature are skipped. Trials are named by their attempt, number or id ('trial' too in a dict). A group whose
    ``repeated`` is true reached the rules' repeat_limit: stop sampling that region.
    """
    limit = load_rules().repeat_limit
    groups: dict[str, dict[str, Any]] = {}
    for crash in map(_crash, rows):
        if not crash.signature:
            continue
        group = groups.setdefault(crash.signature, _new_group(crash.signature, crash))
        group["count"] += 1
        if crash.trial is not None:
            group["trials"].append(crash.trial)
    out = sorted(groups.values(), key=lambda g: -g["count"])
    for group in out:
        category = group["category"]
        group["repeated"] = group["count"] >= limit and avoids(
            category if isinstance(category, CrashCategory) else None
        )
    return out


class _Crash(NamedTuple):
    """What grouping reads of one crashed trial."""

    signature: str | None
    category: CrashCategory | str | None  # a word no member has (another autorl's) is kept as it is
    trial: str | int | None
    root_cause_line: str | None
    remedy: str | None


def _crash(row: Trial | dict[str, Any]) -> _Crash:
    """A ledger row's crash columns, or a dict's fields (a CrashReport dump, or a row as JSON)."""
    if not isinstance(row, dict):
        trial = next((v for v in (row.attempt, row.number, row.id) if v is not None), None)
        return _Crash(row.crash_signature, row.crash_category, trial, row.root_cause, row.remedy)
    return _Crash(
        _field(row, "crash_signature", "signature"),
        _word(_field(row, "crash_category", "category")),
        _field(row, "attempt", "number", "trial", "id"),
        _field(row, "root_cause", "root_cause_line"),
        row.get("remedy"),
    )


def _field(row: dict[str, Any], *keys: str) -> Any:
    return next((row[k] for k in keys if row.get(k) is not None), None)


def _word(category: str | None) -> CrashCategory | str | None:
    """A category as its member (a word no member has is kept as it is)."""
    try:
        return CrashCategory.read(category)
    except ValueError:
        return category


def _new_group(sig: str, crash: _Crash) -> dict[str, Any]:
    return {
        "signature": sig,
        "category": crash.category or _word(sig.rsplit("-", 1)[0]),
        "count": 0,
        "trials": [],
        "root_cause_line": crash.root_cause_line,
        "remedy": crash.remedy,
    }
