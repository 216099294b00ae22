"""A run that says nothing is stopped by the watchdog and told apart from a crash; a slow run that is working says
so from inside its loops, and saying so changes nothing it computes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from autorl.toolkit import heartbeat
from tests.conftest import run_cli


def _recipe(tmp_path: Path, code: str, **more) -> Path:
    recipe = {"name": "quiet", "backend": "command", "train": {"argv": [sys.executable, "-c", code]}, **more}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_a_run_the_watchdog_stops_is_said_to_be_stopped_with_the_setting_that_lets_it_go_on(tmp_path):
    path = _recipe(tmp_path, "import time; time.sleep(60)", abort={"silence_s": 2})
    t0 = time.monotonic()
    r = run_cli("-C", str(tmp_path), "train", path.name, timeout=120)
    assert time.monotonic() - t0 < 50, "the silent run was not stopped"
    assert r.returncode == 1, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0].startswith("autorl: error: the run was stopped: no output or metrics for 2 s (watchdog)")
    assert "abort.silence_s" in lines[0] and "exit -15" not in lines[0]


def test_a_run_that_times_out_names_timeout_s(tmp_path):
    code = "import time\nfor i in range(600):\n    print(i, flush=True); time.sleep(0.2)"
    r = run_cli("-C", str(tmp_path), "train", _recipe(tmp_path, code, timeout_s=3).name, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "the run was stopped:" in r.stderr and "timeout_s" in r.stderr


def test_a_run_killed_by_a_signal_exits_as_a_shell_reports_it(tmp_path):
    path = _recipe(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    r = run_cli("-C", str(tmp_path), "train", path.name, timeout=120)
    assert r.returncode == 128 + 9, r.stderr
    assert "the run failed (exit -9" in r.stderr


def test_a_beat_is_said_at_most_once_an_interval(monkeypatch, capsys):
    monkeypatch.setattr(heartbeat, "_last", [time.monotonic()])
    monkeypatch.setattr(heartbeat, "INTERVAL_S", 3600.0)
    heartbeat.beat("decoding")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(heartbeat, "INTERVAL_S", 0.0)
    heartbeat.beat("decoding token 3")
    heartbeat.beat("decoding token 4")
    assert capsys.readouterr().err.splitlines() == ["working: decoding token 3", "working: decoding token 4"]
    monkeypatch.setattr(heartbeat, "INTERVAL_S", 3600.0)
    heartbeat.beat("decoding token 5")  # the last beat was just now
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_heartbeat_inside_generate_changes_nothing_it_returns(tmp_path, monkeypatch, capsys, temperature):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from autorl.toolkit.hf_tiny import save_llama
    from autorl.toolkit.model import HFPolicy

    policy = HFPolicy(str(save_llama(tmp_path / "llama")), torch.device("cpu"))
    ids, mask = policy.encode(["12+34=", "7+8=", "100+1="])
    capsys.readouterr()  # what loading the model printed
    monkeypatch.setattr(heartbeat, "INTERVAL_S", 0.0)
    torch.manual_seed(0)
    with_beats = policy.sample(ids, mask, 6, temperature)
    said = [x for x in capsys.readouterr().err.splitlines() if x.startswith("working: generating")]
    monkeypatch.setattr(heartbeat, "INTERVAL_S", 3600.0)
    torch.manual_seed(0)
    quiet = policy.sample(ids, mask, 6, temperature)
    assert capsys.readouterr().err == ""
    assert all(torch.equal(a, b) for a, b in zip(with_beats, quiet))
    assert said[0] == "working: generating token 1 of 6 for 3 sequences", said  # the first decoding step's beat
    assert all(x.startswith("working: generating token ") and x.endswith("of 6 for 3 sequences") for x in said)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
def test_a_stop_signal_stops_the_run_autorl_train_started_and_says_so(tmp_path, stop):
    """A scheduler's SIGTERM, or the SIGHUP of a closed terminal, to `autorl train` stops its run as Ctrl-C does:
    before, the command died at once and its run went on without it."""
    import signal
    import subprocess

    code = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(300)"
    recipe = {
        "name": "long",
        "backend": "command",
        "train": {"argv": [sys.executable, "-c", code, str(tmp_path / "pid")]},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    proc = subprocess.Popen(
        [sys.executable, "-m", "autorl.cli", "-C", str(tmp_path), "train", "recipe.yaml"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGHUP at its default, as under a terminal (a suite run under nohup hands it down ignored, and autorl
        # rightly leaves an ignored SIGHUP ignored)
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the run did not start"
        time.sleep(0.1)
    run_pid = int((tmp_path / "pid").read_text())
    proc.send_signal(signal.Signals[stop])
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.Signals[stop], err
    assert err.strip().splitlines() == [f"autorl: stopped by {stop}"], err
    deadline = time.monotonic() + 10
    while Path(f"/proc/{run_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    gone = not Path(f"/proc/{run_pid}").exists() or Path(f"/proc/{run_pid}/stat").read_text().split()[2] == "Z"
    assert gone, "the run outlived the command"


def test_the_layer_heartbeat_changes_no_logit_and_no_gradient(tmp_path, monkeypatch, capsys):
    """A real model's forward and backward beat from each layer (one micro-batch can outlast the watchdog), and the
    same model loaded without the hooks computes the same logits and gradients."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from autorl.toolkit.hf_tiny import save_llama
    from autorl.toolkit.model import HFPolicy

    path = save_llama(tmp_path / "llama")
    policy = HFPolicy(str(path), torch.device("cpu"))
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    ids, mask = policy.encode(["12+34=", "7+8="])
    capsys.readouterr()
    monkeypatch.setattr(heartbeat, "INTERVAL_S", 0.0)
    hooked = policy.logits(ids, mask)
    hooked.logsumexp(-1).sum().backward()
    said = [x for x in capsys.readouterr().err.splitlines() if x.startswith("working:")]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    bare = plain(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
    bare.logsumexp(-1).sum().backward()
    assert torch.equal(hooked, bare)
    for (name, a), b in zip(policy.module.named_parameters(), plain.parameters()):
        assert torch.equal(a.grad, b.grad), name
    layers = len(policy.module.model.layers)
    assert f"working: forward through layer {layers} of {layers}" in said
    assert f"working: backward through layer 1 of {layers}" in said
    assert capsys.readouterr().err == ""  # nothing more once the passes are done


def test_autorl_train_builds_the_base_model_before_its_run_and_its_timeout(command_ws, engine_cache):
    """In a fresh workspace the built-in model's warm-up runs first, on its own (the study's `prepare`), and the
    run that follows finds it cached: its log has no warm-up, and its timeout_s covers only the run."""
    import shutil

    cache = command_ws / ".autorl" / "cache"
    shutil.copytree(engine_cache, cache, ignore=shutil.ignore_patterns("base-*.pt"))  # no cached base model
    r = run_cli("-C", str(command_ws), "train", "recipes/default.yaml", "--set", "steps=2", "--set", "eval_every=0")
    assert r.returncode == 0, r.stderr
    (run,) = (command_ws / ".autorl" / "train").iterdir()
    assert "warm-up step" in (run / "prepare" / "prepare.log").read_text()
    assert "warm-up step" not in (run / "train.log").read_text()
    assert list(cache.glob("base-*.pt"))


def test_autorl_train_into_an_existing_metrics_file_reports_this_runs_steps(tmp_path):
    """--metrics-out naming the file of an earlier run: this run's steps, not the earlier run's nor a mix."""
    script = tmp_path / "steps.py"
    script.write_text(
        "import json, sys\n"
        "with open(sys.argv[1], 'a') as fh:\n"
        "    for s in (1, 2, 3):\n"
        "        fh.write(json.dumps({'type': 'step', 'step': s, 'reward_mean': 0.5}) + '\\n')\n"
    )
    train = {"argv": [sys.executable, str(script), "{run_dir}/m.jsonl"], "metrics": "{run_dir}/m.jsonl"}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"name": "m", "backend": "command", "train": train}))
    out = tmp_path / "out.jsonl"
    for _ in range(2):
        r = run_cli("-C", str(tmp_path), "train", "recipe.yaml", "--metrics-out", str(out), timeout=120)
        assert r.returncode == 0, r.stderr
        assert "done: 3 steps" in r.stdout, r.stdout
    assert [json.loads(x)["step"] for x in out.read_text().splitlines()] == [1, 2, 3]
