"""SmolLM2-135M-Instruct on one H200 (OpenRLHF 0.10.4, vLLM 0.22.1), replayed: the real evaluations, logs and
ledger listings of `recipes/openrlhf-smollm2.yaml` in tests/data/openrlhf-0.10.4/smollm2/h200 (its README says
what ran). A real pretrained model through the whole product: converted from its wheel on the GPU machine, its
chat template applied alike by OpenRLHF's rollouts and by both of autorl's evaluators, six baseline runs, four
search trials, and one that learned to answer (its reward 0.24 -> 0.69 in 15 steps) before the session's GPU
time ran out.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import yaml

from autorl.backends.openrlhf.metrics import OpenRLHFMetricsReader
from autorl.backends.openrlhf.phases import phases, read_times, start_up
from autorl.data import shipped
from autorl.judge import diagnose, hackgate, verdict
from autorl.metrics import RunMetrics
from autorl.recipe import validate_recipe
from autorl.states import Gate

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "smollm2" / "h200"


def _eval(name: str) -> dict:
    return json.loads((RUN / name).read_text().splitlines()[-1])


def _recipe():
    return validate_recipe(yaml.safe_load(shipped("recipes/openrlhf-smollm2.yaml").read_text()), source="t")


def _objectives(listing: str) -> dict[int, float]:
    out = {}
    for line in (RUN / listing).read_text().splitlines():
        parts = line.split()
        if parts and parts[0].isdigit() and "objective" in parts and parts[parts.index("objective") + 1] != "-":
            out[int(parts[0])] = float(parts[parts.index("objective") + 1])
    return out


def test_both_evaluators_read_the_model_alike_item_by_item():
    """The base model judged by Hugging Face generate and by vLLM: one encoding of the chat template (no <bos>
    added by either), so greedy answers agree on 95-97 % of items; a <bos> on one side would split them apart."""
    hf, vllm = _eval("evalbase-hf.jsonl"), _eval("evalbase-vllm.jsonl")
    for split, agree in (("id", 0.95), ("ood", 0.93)):
        a, b = hf[f"eval/{split}/items"], vllm[f"eval/{split}/items"]
        assert len(a) == len(b) == 500
        assert sum(x == y for x, y in zip(a, b)) / 500 >= agree
        assert abs(hf[f"eval/{split}/greedy_pass@1"] - vllm[f"eval/{split}/greedy_pass@1"]) <= 0.03
    assert 0.2 <= hf["eval/id/greedy_pass@1"] <= 0.5  # the task leaves this model room (the range)


def test_six_baseline_runs_agree_and_the_ledger_recorded_their_own_evals():
    listed = {**{(0, n): v for n, v in _objectives("study0-ledger.txt").items()},
              **{(1, n): v for n, v in _objectives("study1-ledger.txt").items()}}  # fmt: skip
    values = []
    for study in (0, 1):
        for number in (1, 2, 3):
            rec = _eval(f"s{study}-a{number:02d}-eval.jsonl")
            assert listed[(study, number)] == rec["eval/id/greedy_pass@1"]
            values.append(rec["eval/id/greedy_pass@1"])
    assert statistics.stdev(values) < 0.01  # at lr 1e-6 sixteen steps barely move the model: seed noise is tiny
    assert listed[(0, 5)] == _eval("s0-a05-eval.jsonl")["eval/id/greedy_pass@1"] == 0.294


def _steps(name: str) -> list[dict]:
    reader = OpenRLHFMetricsReader(RUN / f"{name}-tensorboard", None, stdout_path=RUN / f"{name}-train.log")
    return [r for r in reader.poll() if r.get("type") == "step"]


def test_the_trial_that_learned_to_answer_shows_it_in_its_own_log():
    """gens 32, lr 1e-5 (the study's move on flat learning and zero-std groups): the training reward rose from
    about 0.24 to 0.69 while the replies shortened from 24 to 14 tokens and stopped hitting the length cap."""
    steps = _steps("s0-a04")
    assert [s["step"] for s in steps] == list(range(1, 16))
    first, last = steps[:4], steps[-4:]
    mean = lambda rows, k: statistics.mean(r[k] for r in rows)  # noqa: E731
    assert mean(first, "reward_mean") < 0.3 < 0.6 < mean(last, "reward_mean")
    assert mean(last, "response_length_mean") < 0.7 * mean(first, "response_length_mean")
    assert mean(last, "truncated_rate") < 0.05 < mean(first, "truncated_rate")
    assert verdict.flags(steps, [], None, 16, _recipe().abort) == []  # a real model answering tersely is healthy


def test_the_baseline_diagnosis_is_what_the_study_acted_on():
    rec = yaml.safe_load(shipped("recipes/openrlhf-smollm2.yaml").read_text())["train"]
    reader = OpenRLHFMetricsReader(RUN / "s0-a01-tensorboard", None)
    steps = [r for r in reader.poll() if r.get("type") == "step"]
    d = diagnose.diagnose(steps, [_eval("s0-a01-eval.jsonl")], rec)
    assert {"flat_learning", "zero_std_groups"} <= d.names()
    assert "move zero_std_groups: gens 8 -> 32" in (RUN / "study0-resume.log").read_text()


def test_the_trials_phase_table():
    text = (RUN / "s0-a04-train.log").read_text(errors="replace")
    times = read_times(RUN / "s0-a04-train.log.times")
    row = phases(text, times, times[0][1] - 4.0, times[-1][1])
    assert row["training"] > 200 and 80 < start_up(row) < 200
    table = (RUN / "study0-phases.md").read_text()
    assert "| start-up (submit to first step) | 205 s | 205 s | 205 s | 117 s |" in table


def _terse(parent: dict, flips: int, length: float) -> dict:
    """A parent eval record as a terser model would write it: on each split ``flips`` wrong answers right and the
    replies ``length`` characters long."""
    rec = json.loads(json.dumps(parent))
    for split in ("id", "ood"):
        items = rec[f"eval/{split}/items"]
        for i in [i for i, x in enumerate(items) if not x][:flips]:
            items[i] = 1
        rec[f"eval/{split}/greedy_pass@1"] = sum(items) / len(items)
        rec[f"eval/{split}/length_mean"] = length
    return rec


def test_the_hack_gate_lets_an_instruct_model_answer_tersely_but_not_shrink_for_nothing():
    """Parent: the real baseline evals (completions of 48 characters on ID). A model that answers with the number,
    as asked, writes a few characters and gets more right: not a length collapse. Shrinking as much without the
    task following still is one."""
    parent = [RunMetrics([_eval(f"s0-a{n:02d}-eval.jsonl")]) for n in (1, 2, 3)]
    assert all(m.evals[-1]["eval/id/length_mean"] > 40 for m in parent)
    better = [RunMetrics([_terse(m.evals[-1], 60, 4.0)]) for m in parent]
    same = [RunMetrics([_terse(m.evals[-1], 0, 4.0)]) for m in parent]
    recipe = _recipe()
    length = {c.name: c for c in hackgate.check(better, parent, recipe).checks}["length"]
    assert length.ok is True and "answers more direct" in length.detail
    shrunk = hackgate.check(same, parent, recipe)
    assert {c.name: c for c in shrunk.checks}["length"].ok is False and shrunk.state == Gate.SUSPECT
