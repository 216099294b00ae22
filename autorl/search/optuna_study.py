"""Optuna, driven by ask/tell from the controller.

Optuna's study lives in its RDB storage inside ledger.sqlite (its own tables,
beside autorl's ``autorl_*`` tables), so ``optuna-dashboard sqlite:///ledger.sqlite``
opens it. Optuna prunes nothing (``NopPruner``): a trial is stopped early only by
autorl.judge.prune (clearly worse than the incumbent at the same step) or autorl.judge.abort.
A crashed trial is told FAIL — never a fake score — and a pruned one
PRUNED. The baseline is enqueued so that the first trial is the recipe as written.
A ``guard`` (the ledger's ``check``) runs before every write, so that nothing is written once the ledger file was
removed or replaced.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from autorl.recipe import SearchParam
from autorl.states import Word

if TYPE_CHECKING:
    from optuna.samplers import BaseSampler


class Told(Word):
    """What Optuna is told of a trial: COMPLETE with a value, PRUNED, or FAIL (a crash, or never run)."""

    COMPLETE = "complete"
    PRUNED = "pruned"
    FAIL = "fail"


def _optuna() -> ModuleType:
    import optuna  # lazy: optuna is slow to import, and only asking or telling a study needs it

    optuna.logging.set_verbosity(logging.WARNING)
    return optuna


def distributions(space: dict[str, SearchParam]) -> dict[str, Any]:
    """Optuna distributions for a search space."""
    d = _optuna().distributions
    out: dict[str, Any] = {}
    for key, p in space.items():
        if p.choices is not None:
            out[key] = d.CategoricalDistribution(p.choices)
            continue
        assert p.low is not None and p.high is not None  # a range without choices has both bounds
        if p.int:
            out[key] = d.IntDistribution(int(p.low), int(p.high), log=p.log)
        else:
            out[key] = d.FloatDistribution(float(p.low), float(p.high), log=p.log)
    return out


class Search:
    """One Optuna study: ask for values inside a space, tell how they did."""

    def __init__(
        self,
        storage: str | Path,
        name: str,
        direction: str = "maximize",
        sampler: str = "tpe",
        seed: int = 0,
        parallel: bool = False,
        guard: Callable[[], None] | None = None,
    ):
        optuna = _optuna()
        self.name = name
        self.guard = guard or (lambda: None)
        url = storage if str(storage).startswith("sqlite:") else f"sqlite:///{Path(storage).resolve()}"
        self.storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
        self.study = optuna.create_study(
            study_name=name,
            storage=self.storage,
            direction=direction,
            sampler=_sampler(sampler, seed, parallel),
            load_if_exists=True,
            pruner=optuna.pruners.NopPruner(),
        )
        self._open: dict[int, Any] = {}

    def ask(self, space: dict[str, SearchParam], fixed: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """Propose values for ``space`` (``fixed`` values are enqueued exactly)."""
        self.guard()
        if fixed:
            self.study.enqueue_trial(fixed, skip_if_exists=False)
        trial = self.study.ask(distributions(space))
        self._open[trial.number] = trial
        params = {**trial.params, **{k: v for k, v in (fixed or {}).items() if k not in trial.params}}
        return trial.number, params

    def report(self, number: int, value: float, step: int) -> bool:
        """Record an intermediate value (for the dashboard). Never says stop: Optuna's pruners compare
        one noisy number with other trials' numbers; the noise-aware decision is autorl.judge.prune."""
        trial = self._open.get(number)
        if trial is None or value is None or not math.isfinite(value):
            return False
        self.guard()
        trial.report(value, step)
        return False

    def tell(self, number: int, state: Told, value: float | None = None) -> None:
        """COMPLETE with a value, PRUNED, or FAIL. Telling twice is a no-op."""
        optuna = _optuna()
        ts = optuna.trial.TrialState
        st = {Told.COMPLETE: ts.COMPLETE, Told.PRUNED: ts.PRUNED, Told.FAIL: ts.FAIL}[state]
        if st == ts.COMPLETE and (value is None or not math.isfinite(value)):
            st, value = ts.FAIL, None
        self.guard()
        try:
            self.study.tell(number, value if st == ts.COMPLETE else None, state=st, skip_if_finished=True)
        except (ValueError, RuntimeError):
            pass
        self._open.pop(number, None)

    def release(self, number: int, again: bool) -> str:
        """Tell trial ``number`` FAIL (it was asked but never ran) and, when ``again``, enqueue its values so the
        next ask proposes them first; returns the clause that says what was done."""
        trial = next((t for t in self.study.get_trials(deepcopy=False) if t.number == number), None)
        self.tell(number, Told.FAIL)
        if trial is None or not again or not trial.params:
            return f"; Optuna trial {number} of {self.name} told FAIL"
        self.guard()
        self.study.enqueue_trial(dict(trial.params), skip_if_exists=False)
        return f"; Optuna trial {number} of {self.name} told FAIL, its values enqueued for the next ask"

    def fail_running(self) -> int:
        """Mark trials left RUNNING by a killed controller as FAIL; returns how many."""
        ts = _optuna().trial.TrialState
        stale = [t.number for t in self.study.get_trials(deepcopy=False, states=(ts.RUNNING,))]
        for n in stale:
            self.tell(n, Told.FAIL)
        return len(stale)


def study_names(storage: str | Path, prefix: str) -> list[str]:
    """Names of the Optuna studies in ``storage`` that are ``prefix`` or under it (``prefix/...``)."""
    optuna = _optuna()
    url = storage if str(storage).startswith("sqlite:") else f"sqlite:///{Path(storage).resolve()}"
    names = optuna.study.get_all_study_names(storage=url)
    return [n for n in names if n == prefix or n.startswith(prefix + "/")]


def _sampler(kind: str, seed: int, parallel: bool) -> BaseSampler:
    optuna = _optuna()
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    from autorl.search.window import WindowedTPE  # lazy: window imports optuna at its top

    return WindowedTPE(seed=seed, n_startup_trials=4, constant_liar=parallel, multivariate=True)
