"""`autorl doctor`: real checks on this machine, and a required tool taken off PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata

import pytest

from autorl.errors import UserError
from autorl.present.doctor import CHECKS, DoctorCheck, all_required_ok, doctor, format_checks
from tests.conftest import run_cli

REQUIRED = {"python", "git", "disk", "package:optuna", "package:sqlite-utils", "package:pydantic", "package:rich"}


def test_every_check_runs_and_explains_failures(tmp_path):
    checks = doctor(tmp_path)
    assert [c.name for c in checks] == [s.name for s in CHECKS]
    assert REQUIRED <= {c.name for c in checks if c.required}
    for c in checks:
        assert isinstance(c, DoctorCheck) and c.detail
        assert bool(c.fix) == (not c.ok), c
    by_name = {c.name: c for c in checks}
    assert by_name["git"].ok == (shutil.which("git") is not None)
    assert metadata.version("optuna") in by_name["package:optuna"].detail
    assert by_name["gnu patch"].ok == _is_gnu_patch()


def test_torch_is_probed_in_a_child_process():
    code = (
        "import sys; from autorl.present.doctor import doctor; c = doctor('.', ['package:torch'])[0]; "
        "print(c.ok, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout.split()
    has_torch = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
    assert out == [str(has_torch), "False"]


def test_cli_json_and_exit_code_agree(tmp_path):
    r = run_cli("-C", str(tmp_path), "doctor", "--json", timeout=300)
    rows = json.loads(r.stdout)
    checks = [DoctorCheck.model_validate(x) for x in rows]
    assert r.returncode == (0 if all_required_ok(checks) else 1)
    text = format_checks(checks)
    assert text.count("\n") + 1 == len(checks) + sum(1 for c in checks if not c.ok)


def test_path_without_git_fails_with_what_to_do(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    r = run_cli(
        "-C",
        str(tmp_path),
        "doctor",
        "--json",
        "--check",
        "git",
        "--check",
        "disk",
        env={**os.environ, "PATH": str(empty)},
    )
    rows = {x["name"]: x for x in json.loads(r.stdout)}
    assert r.returncode == 1
    assert rows["git"]["ok"] is False and rows["git"]["required"] is True
    assert "install git" in rows["git"]["fix"]
    assert rows["disk"]["ok"] is True


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to put on the reduced PATH")
def test_missing_optional_tool_warns_but_exits_zero(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("git"), bin_dir / "git")
    r = run_cli(
        "-C",
        str(tmp_path),
        "doctor",
        "--check",
        "git",
        "--check",
        "gnu patch",
        env={**os.environ, "PATH": str(bin_dir)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok   git:" in r.stdout
    assert "warn gnu patch:" in r.stdout and "apt-get install patch" in r.stdout


def test_unknown_check_name_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no check named bogus"):
        doctor(tmp_path, ["bogus"])
    r = run_cli("-C", str(tmp_path), "doctor", "--check", "bogus")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _is_gnu_patch() -> bool:
    exe = shutil.which("patch")
    if exe is None:
        return False
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    return out.startswith("GNU patch")


def test_check_model_forbids_unknown_fields():
    with pytest.raises(ValueError):
        DoctorCheck(name="x", ok=True, required=False, detail="d", extra_field=1)


def test_the_openrlhf_extra_pins_the_stack_that_was_run_for_real():
    from autorl.present.doctor import tested_stack

    assert tested_stack() == {"openrlhf": "0.10.4", "vllm": "0.22.1", "deepspeed": "0.19.1", "ray": "2.55.0"}


def test_each_stack_package_is_one_line_saying_missing_or_which_version():
    from importlib import metadata

    from autorl.present.doctor import doctor

    checks = {c.name: c for c in doctor(".", ["stack:vllm", "stack:ray"])}
    vllm, ray = checks["stack:vllm"], checks["stack:ray"]
    try:
        have = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        have = None
    if have is None:
        assert not vllm.ok and vllm.detail == "vllm not installed (tested: 0.22.1)" and "autorl[openrlhf]" in vllm.fix
    ray_have = metadata.version("ray")
    assert ray.ok == (ray_have == "2.55.0")
    if not ray.ok:
        assert ray.detail == f"ray {ray_have}; autorl ran the OpenRLHF stack with 2.55.0" and "ray==2.55.0" in ray.fix
    assert not ray.required and "\n" not in ray.detail
