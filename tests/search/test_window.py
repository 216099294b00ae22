"""TPE over a study's recent history (``autorl.search.window``): exactly TPE until the window fills, then fitted on
the last ``window`` finished trials only."""

from __future__ import annotations

import math

import optuna
import pytest

from autorl.search.window import RecentTrials, WindowedTPE

SPACE = {
    "lr": optuna.distributions.FloatDistribution(1e-7, 1e-3, log=True),
    "eps_clip": optuna.distributions.CategoricalDistribution([0.1, 0.2, 0.3]),
    "gens": optuna.distributions.CategoricalDistribution([4, 8, 16]),
}


def _objective(params: dict) -> float:
    return -abs(math.log10(params["lr"]) + 5) - abs(params["eps_clip"] - 0.2) + 0.01 * params["gens"]


def _run(sampler, n: int, constant_liar: bool = False) -> list[dict]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    out = []
    for _ in range(n):
        trial = study.ask(SPACE)
        out.append(dict(trial.params))
        study.tell(trial, _objective(trial.params))
    return out


@pytest.mark.parametrize("liar", [False, True])
def test_until_the_window_fills_it_proposes_exactly_what_tpe_does(liar):
    kwargs = {"seed": 7, "n_startup_trials": 4, "multivariate": True, "constant_liar": liar}
    assert _run(WindowedTPE(window=40, **kwargs), 40) == _run(optuna.samplers.TPESampler(**kwargs), 40)


def test_after_it_fills_tpe_sees_only_the_last_window_of_finished_trials():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize", sampler=WindowedTPE(seed=1, window=10, n_startup_trials=4, multivariate=True)
    )
    for _ in range(25):
        trial = study.ask(SPACE)
        study.tell(trial, _objective(trial.params))
    running = study.ask(SPACE)
    seen = RecentTrials(study, 10)._get_trials(deepcopy=False)
    finished = [t.number for t in seen if t.state.is_finished()]
    assert finished == list(range(15, 25)) and running.number in [t.number for t in seen]
    assert len(study.trials) == 26  # the study itself keeps everything


def test_past_the_window_its_proposals_part_from_tpes():
    kwargs = {"seed": 3, "n_startup_trials": 4, "multivariate": True}
    windowed, plain = _run(WindowedTPE(window=8, **kwargs), 40), _run(optuna.samplers.TPESampler(**kwargs), 40)
    assert windowed[:9] == plain[:9] and windowed[9:] != plain[9:]
