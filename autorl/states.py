"""The words a trial's and a study's state columns hold, as enums: what a run did, what its verdict was, where its
confirmation stands, what the hack gate said, who proposed it, what triage filed its crash as and what it did.

Each member is its own value wherever a string goes (``Verdict.IMPROVED == "improved"``, ``f"{v}"`` prints
``improved``, JSON and SQLite store ``improved``), so the ledger's columns, ``--json`` output and the rule tables
keep their words; code compares members, never literals, and a misspelt state fails where it is written.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

W = TypeVar("W", bound="Word")


class Word(str, Enum):
    """A state word: compares, hashes, prints and serialises as its value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def read(cls: type[W], value: object) -> W | None:
        """The member named by ``value`` (None for None); a word no member has raises ValueError."""
        return None if value is None else cls(value)


class TrialStatus(Word):
    """How a run ended (``running`` while it runs)."""

    RUNNING = "running"
    COMPLETE = "complete"
    PRUNED = "pruned"
    CRASH = "crash"
    TIMEOUT = "timeout"
    HANG = "hang"
    BUDGET_CUT = "budget-cut"
    INTERRUPTED = "interrupted"
    CONFIG_ERROR = "config-error"
    EARLY_STOPPED = "early-stopped"  # a full run its OOD early stop ended at its best checkpoint


# A run the controller stopped (Ctrl-C, a kill recovered on resume, the budget's end) did not reach its own end: a
# confirmation or retry stopped that way is run again on resume.
STOPPED_EARLY = (TrialStatus.INTERRUPTED, TrialStatus.BUDGET_CUT)


class Verdict(Word):
    """What a finished trial means against its parent."""

    IMPROVED = "improved"
    REGRESSED = "regressed"
    FLAT = "flat"
    CRASH = "crash"
    PRUNED = "pruned"


class Confirmation(Word):
    """Where an improved trial's fresh-seed confirmation stands."""

    CANDIDATE = "candidate"
    CONFIRMED = "confirmed"
    REJECTED = "rejected"
    SUSPECT = "suspect"  # confirmed, but the hack gate failed


class Gate(Word):
    """The hack gate's answer on a confirmed gain."""

    OK = "ok"
    SUSPECT = "suspect"
    BLIND = "blind"  # no held-out task metric to check against


class Kind(Word):
    """A short trial of a study, or a promoted full run."""

    TRIAL = "trial"
    FULL = "full"


class Proposer(Word):
    """Who proposed a trial."""

    BASELINE = "baseline"
    OPTUNA = "optuna"
    RANDOM = "random"
    HYPOTHESIS = "hypothesis"
    MOVE = "move"
    CONFIRM = "confirm"
    RETRY = "retry"
    PROMOTE = "promote"


class CrashCategory(Word):
    """What triage filed a crash as (docs/triage.md defines each)."""

    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"
    NAN_DIVERGENCE = "nan_divergence"
    DISTRIBUTED_TIMEOUT = "distributed_timeout"
    BACKEND_INCOMPAT = "backend_incompat"
    CONFIG_ERROR = "config_error"
    USER_CODE_ERROR = "user_code_error"
    DISK_FULL = "disk_full"
    HANG_TIMEOUT = "hang_timeout"
    ILLEGAL_MEMORY_ACCESS = "illegal_memory_access"
    NETWORK_UNAVAILABLE = "network_unavailable"
    KILLED_EXTERNAL = "killed_external"
    SHARED_GPU = "shared_gpu"
    UNKNOWN = "unknown"
    OUTPUT_COLLAPSE = "output_collapse"
    NO_TRAINING = "no_training"
    REWARD_CONSTANT = "reward_constant"


class CrashAction(Word):
    """What triage did about a crash."""

    RETRY_REDUCED = "retry_reduced"
    RETRY_ONCE = "retry_once"
    RECORD = "record"
    STOP = "stop"


class StudyStatus(Word):
    """Whether a study's controller runs it."""

    RUNNING = "running"
    STOPPED = "stopped"
