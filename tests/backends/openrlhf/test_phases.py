"""Where a real OpenRLHF trial's time went, read back from its log and the log's arrival-time sidecar."""

from __future__ import annotations

from pathlib import Path

from autorl.backends.openrlhf.phases import ORDER, marks, phases, read_times, start_up, table

DATA = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "small"
STARTED = 1795755733.0  # the trial's start on the benchmark's clock (2026-11-27 05:02:13 UTC); it took 200 s


def _real():
    return (DATA / "lr1e-5-train.log").read_text(), read_times(DATA / "lr1e-5-train.log.times")


def test_a_real_trial_is_cut_into_its_phases_in_order():
    text, times = _real()
    found = marks(text, times)
    assert list(found) == ["driver", "vllm", "actor", "training", "save"]
    assert list(found.values()) == sorted(found.values())
    got = phases(text, times, STARTED, STARTED + 200)
    assert list(got) == ORDER and abs(sum(got.values()) - 200) < 0.5
    # what the log's own timestamps say (05:02:27 env set-up, 05:02:55 driver connected, 05:04:16 first wake-up,
    # 05:05:07 last step), within the sidecar's one-second resolution and its few seconds of copy lag
    assert 20 <= got["driver"] <= 30
    assert 45 <= got["training"] <= 56
    assert 100 <= got["submit"] + got["driver"] + got["vllm"] + got["actor"] <= 130


def test_a_log_without_a_sidecar_is_not_split():
    text, _ = _real()
    assert phases(text, [], STARTED, STARTED + 200) == {} and marks(text, []) == {}


def test_a_job_that_died_in_its_driver_stops_at_the_driver_phase():
    text, times = _real()
    cut = text.index("Connected to Ray cluster")
    early = [t for t in times if t[0] < cut]
    got = phases(text[:cut], early, STARTED, early[-1][1] + 5)
    assert got["vllm"] == got["actor"] == got["training"] == 0 and got["eval"] == 0 and got["stopped"] == 5
    assert start_up(got) is None  # it never reached a step: its seconds are not a start-up


def test_a_trial_stopped_while_starting_has_no_start_up_and_no_eval_in_the_table():
    """A confirmation run killed with its controller 128 s in, its vLLM engines built, its actor not yet begun
    (tests/data/openrlhf-0.10.4/smollm2/h200x2-seed1-resumed): the table said start-up 93 s, eval 31 s and a
    training share of 24 %; none of that ran."""
    run = DATA.parent / "smollm2" / "h200x2-seed1-resumed" / "runs" / "attempt-09-confirm-08-s1080"
    times = read_times(run / "train.log.times")
    got = phases((run / "train.log").read_text(errors="replace"), times, times[0][1] - 3.5, times[-1][1] + 31)
    assert got["driver"] > 15 and got["vllm"] > 60 and got["actor"] == got["training"] == got["eval"] == 0
    assert got["stopped"] == 31 and start_up(got) is None
    out = table({"09": got, "lr 1e-5": phases(*_real(), STARTED, STARTED + 200)})
    assert "| stopped | 31 s | 0 s |" in out and "| start-up (submit to first step) | no step | " in out
    assert "| training + eval share | - | 38% |" in out


def test_the_table_states_start_up_and_the_training_share():
    text, times = _real()
    out = table({"lr 1e-5": phases(text, times, STARTED, STARTED + 200)})
    assert "| start-up (submit to first step) |" in out and "| training + eval share | 38% |" in out
