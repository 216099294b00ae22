"""A real OpenRLHF trial on a GPU: autorl launches it as a Ray job, reads its step lines, evaluates the saved model
per item and judges it. Runs only where openrlhf, vllm, ray and a CUDA GPU are all present (``pytest -m gpu``)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autorl.data import shipped
from autorl.ledger import Ledger
from autorl.states import Proposer, TrialStatus, Verdict


def _ready() -> bool:
    if not all(importlib.util.find_spec(m) for m in ("openrlhf", "vllm", "ray", "deepspeed")):
        return False
    return shutil.which("nvidia-smi") is not None


def _gpus() -> int:
    from autorl.backends.base import gpu_count

    return gpu_count()


def _cards() -> list[str]:
    """The cards the placement tests may use (AUTORL_GPU_TEST_CARDS, default "0,1"): other tenants of a shared host
    may hold the rest, so only these are watched."""
    import os

    return [c.strip() for c in os.environ.get("AUTORL_GPU_TEST_CARDS", "0,1").split(",") if c.strip()]


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not _ready(), reason="needs openrlhf, vllm, ray, deepspeed and a CUDA GPU"),
]


def _autorl(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autorl.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """The small recipe's inputs (a warm-started 34 M Llama, prompts, probes), made once on the GPU."""
    root = tmp_path_factory.mktemp("small")
    out = subprocess.run(
        [sys.executable, "-m", "autorl.backends.openrlhf.small", str(root)], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return root


def _workspace(tmp_path: Path, small: Path) -> Path:
    ws = tmp_path / "ws"
    assert _autorl("init", str(ws)).returncode == 0
    for key, value in (("user.email", "gpu@example.invalid"), ("user.name", "gpu")):
        subprocess.run(["git", "-C", str(ws), "config", key, value], check=True)
    text = Path(shipped("recipes/openrlhf-small.yaml")).read_text().replace("/tmp/autorl-openrlhf-small", str(small))
    (ws / "recipes" / "small.yaml").write_text(text)
    return ws


def test_one_real_openrlhf_trial_is_judged_on_per_item_evals(tmp_path, small):
    ws = _workspace(tmp_path, small)
    run = _autorl("-C", str(ws), "run", "recipes/small.yaml", "--max-trials", "1", "--budget", "10m", "--study", "gpu")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    trial = Ledger(ws / "ledger.sqlite").trials()[0]
    assert trial.status == TrialStatus.COMPLETE, trial
    assert trial.objective is not None and 0.0 <= trial.objective <= 1.0
    run_dir = Path(trial.log_path).parent
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]
    assert evals and len(evals[-1]["eval/id/items"]) == 500 and len(evals[-1]["eval/ood/items"]) == 500
    log = (run_dir / "train.log").read_text(errors="replace")
    assert "Global step 16" in log and "policy_loss" in log
    assert (run_dir / "model" / "config.json").is_file()
    assert (run_dir / "train.log.times").is_file()


def test_a_study_reaches_a_verdict_on_a_trial_that_learns(tmp_path, small):
    """The recipe's baseline runs (the seed noise), then the search's first move: a trial that trains with a
    learning rate that moves the policy, judged per item against the baseline."""
    from autorl.recipe import load_recipe

    ws = _workspace(tmp_path, small)
    repeats = load_recipe(ws / "recipes" / "small.yaml").verdict.baseline_repeats
    run = _autorl(
        "-C",
        str(ws),
        "run",
        "recipes/small.yaml",
        "--max-trials",
        str(repeats + 1),
        "--budget",
        "25m",
        "--study",
        "learn",
        timeout=2400,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    trials = Ledger(ws / "ledger.sqlite").trials()
    assert [t.proposer for t in trials[:repeats]] == [Proposer.BASELINE] * repeats
    moved = trials[repeats]
    assert moved.status == TrialStatus.COMPLETE, moved
    assert moved.verdict in (Verdict.IMPROVED, Verdict.REGRESSED, Verdict.FLAT), moved
    assert moved.changed, "the first trial after the baseline changed nothing"
    assert moved.ci_low is not None and moved.ci_high is not None and moved.n_items == 500


class _GpuSampler:
    """Memory in use on every card, every 2 s, while a study runs: which cards its trials were placed on."""

    def __init__(self):
        import threading

        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            sample = {}
            for line in out.splitlines():
                index, _, used = line.partition(",")
                if used.strip().replace(".", "", 1).isdigit():
                    sample[index.strip()] = float(used)
            self.samples.append(sample)

    def __enter__(self) -> _GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def moments_together(self, cards: list[str], mib: float = 1024) -> int:
        """How many samples had every card in ``cards`` holding more than ``mib``."""
        return sum(all(s.get(c, 0.0) > mib for c in cards) for s in self.samples)

    def busy_together(self, cards: list[str], mib: float = 1024) -> bool:
        """Whether every card in ``cards`` held more than ``mib`` at one moment."""
        return self.moments_together(cards, mib) > 0

    def ever_used(self, mib: float = 1024) -> set[str]:
        return {c for s in self.samples for c, m in s.items() if m > mib}


def _two_at_once(ws: Path, env: dict[str, str], *sets: str) -> list[dict]:
    import os

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "autorl.cli",
            "-C",
            str(ws),
            "run",
            "recipes/small.yaml",
            "--parallel",
            "2",
            "--max-trials",
            "2",
            "--budget",
            "15m",
            "--study",
            "placed",
            *sets,
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, **env},
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    trials = [t for t in Ledger(ws / "ledger.sqlite").trials() if t.status == TrialStatus.COMPLETE]
    assert len(trials) >= 2, [(t.attempt, t.status, t.crash_category) for t in trials]
    a, b = trials[:2]
    assert a.started < b.finished and b.started < a.finished, "the two trials did not run at once"
    return trials


def test_two_packed_trials_share_one_card(tmp_path, small):
    """`gpus_per_trial: 0.5` with `--parallel 2`: two trials at once, both on the one card the study was given."""
    ws, cards = _workspace(tmp_path, small), _cards()
    with _GpuSampler() as gpus:
        _two_at_once(ws, {"CUDA_VISIBLE_DEVICES": cards[0]}, "--set", "gpus_per_trial=0.5")
    assert gpus.ever_used() & set(cards) == {cards[0]}


@pytest.mark.skipif(not _ready() or _gpus() < 2 or len(_cards()) < 2, reason="needs two GPUs")
def test_parallel_trials_get_a_card_each(tmp_path, small):
    """`--parallel 2` on two cards, one trial a card: both cards busy at the same moment."""
    ws, cards = _workspace(tmp_path, small), _cards()[:2]
    with _GpuSampler() as gpus:
        _two_at_once(ws, {"CUDA_VISIBLE_DEVICES": ",".join(cards)})
    assert gpus.busy_together(cards)
