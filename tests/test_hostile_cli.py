"""Hostile arguments to the real command: a trial number past what SQLite holds, a path that is a symbolic link
loop, a name the system refuses, a folder that cannot be written, a bare repository. Each is one line on stderr
naming what is wrong and what to do, exit 2, no traceback, and nothing written."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import git, refused, run_cli
from tests.study_ledger import write_study

ROOT = Path(__file__).resolve().parents[1]

HUGE = "99999999999999999999999"


def _loop(folder: Path) -> Path:
    """Two links pointing at each other; returns one of them."""
    folder.mkdir(exist_ok=True)
    os.symlink(folder / "lb", folder / "la")
    os.symlink(folder / "la", folder / "lb")
    return folder / "la"


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    "args",
    [
        ["show", HUGE],
        ["diagnose", HUGE],
        ["triage", "trial", HUGE],
        ["triage", HUGE],
        ["promote", HUGE],
        ["promote", "--dry-run", HUGE],
        ["promote", "0"],
        ["promote", "--dry-run", "0"],
        ["show", "0"],
        ["show", "--", "-3"],
    ],
)
def test_a_trial_number_out_of_range_is_one_line(command_ws, args):
    write_study(command_ws)
    refused(run_cli("-C", str(command_ws), *args), "trial numbers start at 1")


def test_a_count_past_any_study_is_one_line(command_ws):
    refused(run_cli("-C", str(command_ws), "promote", "--dry-run", "--steps", HUGE), "--steps")
    refused(run_cli("-C", str(command_ws), "run", "--max-trials", HUGE, "--budget", "1s"), "--max-trials")


@pytest.mark.parametrize(
    "args, flag",
    [(["--episodes", "2"], "--episodes"), (["--repeats", "3"], "--repeats"), (["--dry-run", "--force"], "--dry-run")],
)
def test_promote_resume_refuses_what_would_shape_a_new_promotion(command_ws, args, flag):
    write_study(command_ws)
    before = (command_ws / "ledger.sqlite").read_bytes()
    refused(run_cli("-C", str(command_ws), "promote", "--resume", *args), "--resume starts a lost full run", flag)
    assert (command_ws / "ledger.sqlite").read_bytes() == before


def test_promote_resume_with_no_lost_full_run_is_one_line(command_ws):
    write_study(command_ws)
    refused(run_cli("-C", str(command_ws), "promote", "--resume"), "nothing to resume")


@pytest.mark.parametrize(
    "args", [["status"], ["ledger"], ["show", "1"], ["report"], ["run", "--budget", "1s"], ["hypotheses"]]
)
def test_a_ledger_that_is_a_symbolic_link_loop_is_one_line(command_ws, tmp_path, args):
    loop = _loop(tmp_path / "L")
    r = run_cli("-C", str(command_ws), "--ledger", str(loop), *args)
    refused(r, "is a symbolic link loop: point --ledger at your ledger file")
    refused(run_cli("-C", str(command_ws), "--ledger", str(loop / "ledger.sqlite"), *args), "symbolic link loop")


def test_a_workspace_path_that_is_a_loop_or_too_long_is_one_line(command_ws, tmp_path):
    refused(run_cli("-C", str(_loop(tmp_path / "L")), "status"), "is a symbolic link loop: pass an existing")
    refused(run_cli("-C", "x" * 300, "status"), "File name too long")
    refused(run_cli("--ledger", "x" * 300, "status", cwd=command_ws), "File name too long")


@pytest.mark.parametrize(
    "args",
    [
        ["run", "x" * 300, "--budget", "1s"],
        ["train", "x" * 300],
        ["triage", "classify", "x" * 300],
        ["preflight", "x" * 300],
    ],
)
def test_a_file_name_the_system_refuses_is_one_line(command_ws, args):
    refused(run_cli("-C", str(command_ws), *args), "File name too long")


def test_init_on_a_target_that_cannot_be_a_workspace_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    refused(run_cli("init", str(afile)), "is a file, not a folder")
    refused(run_cli("init", str(afile / "sub")), "Not a directory")
    refused(run_cli("init", str(tmp_path / ("x" * 300))), "File name too long")
    refused(run_cli("init", str(_loop(tmp_path / "L"))), "is a symbolic link loop")
    assert afile.read_text() == "keep\n" and _listing(tmp_path) == ["L", "L/la", "L/lb", "afile"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, where no folder can be made")
def test_init_where_no_folder_can_be_made_is_one_line():
    refused(run_cli("init", "/proc/autorl-nope"), "cannot make a workspace at /proc/autorl-nope: No such file")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, where no folder can be made")
def test_report_where_it_cannot_be_written_is_one_line(command_ws, tmp_path):
    write_study(command_ws)
    r = run_cli("-C", str(command_ws), "report", "--out", "/proc/autorl-nope")
    refused(r, "cannot write the report to /proc/autorl-nope: No such file or directory; pass another --out")
    refused(run_cli("-C", str(command_ws), "report", "--out", str(_loop(tmp_path / "L"))), "symbolic link loop")
    assert not (command_ws / ".autorl" / "report").exists()


def test_a_bare_repository_is_refused_and_left_as_it_is(tmp_path):
    bare = tmp_path / "bare.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    before = _listing(bare)
    refused(run_cli("-C", str(bare), "run", "--budget", "1s"), "is a bare git repository (no working tree): clone")
    refused(run_cli("init", str(bare)), "is a bare git repository (no working tree): clone it and run autorl")
    refused(run_cli("init", str(bare / "hooks" / "new")), "is a bare git repository")
    assert _listing(bare) == before
    assert git(bare, "rev-parse", "--is-bare-repository") == "true"


def test_a_metrics_out_that_cannot_be_written_is_refused_before_anything_trains(tmp_path):
    """It trained first, then ended with a traceback's last line and exit 1."""
    for target, needle in (
        (tmp_path, "is a folder"),
        (tmp_path / "none" / "m.jsonl", "cannot be written"),
        (Path("/proc/m.jsonl"), "cannot be written"),
    ):
        r = run_cli("train", "recipes/default.yaml", "--metrics-out", str(target), "--set", "steps=1", cwd=ROOT)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "none").exists()


def test_patches_check_against_a_folder_that_does_not_exist_is_one_line_not_a_conflict(tmp_path):
    r = run_cli("patches", "check", "--site-packages", str(tmp_path / "none"), cwd=ROOT)
    assert r.returncode == 2 and "does not exist" in r.stderr and "conflict" not in r.stdout + r.stderr


@pytest.mark.parametrize(
    "command", [["ledger"], ["status"], ["report"], ["clean", "--dry-run"], ["promote", "--dry-run"]]
)
def test_a_study_name_that_is_not_text_is_one_line_on_every_command(command_ws, command):
    """Bytes that are not UTF-8 reached SQLite from every review command (`run` checked its own name)."""
    write_study(command_ws)
    before = _listing(command_ws)
    r = subprocess.run(
        [
            os.sys.executable,
            "-m",
            "autorl.cli",
            "-C",
            str(command_ws),
            *command,
            "--study",
            b"\xff".decode(errors="surrogateescape"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    refused(r, "no study is named so")
    assert _listing(command_ws) == before


@pytest.mark.parametrize(
    "args, needle",
    [
        (["show", "abc"], "trial numbers start at 1"),
        (["show", "1.5"], "trial numbers start at 1"),
        (["triage", "abc"], "`autorl triage --help`"),
        (["nosuch"], "`autorl --help`"),
        (["ledger", "--last", "abc"], "`autorl ledger --help`"),
        (["run", "--budget", ""], "is not a duration"),
    ],
)
def test_a_mistyped_argument_says_what_the_command_takes(command_ws, args, needle):
    write_study(command_ws)
    refused(run_cli("-C", str(command_ws), *args, timeout=120), needle)


@pytest.mark.parametrize("kind", ["folder", "device", "pipe"])
def test_a_ledger_that_is_not_a_file_is_named_so_on_review_commands(command_ws, tmp_path, kind):
    """Not "no ledger: run a study first", which is wrong advice for a folder, /dev/null or a pipe given as --ledger."""
    path = {"folder": tmp_path, "device": Path("/dev/null"), "pipe": tmp_path / "fifo"}[kind]
    if kind == "pipe":
        os.mkfifo(path)
    for args in (["ledger"], ["status"], ["show", "1"]):
        refused(run_cli("-C", str(command_ws), "--ledger", str(path), *args, timeout=60), "is not a file")


def test_set_on_a_recipe_laid_out_unusually_is_taken_not_blamed_on_text_the_user_never_wrote(command_ws):
    """A quoted "train": key and a flow mapping over two lines are valid YAML; --set used to edit them line by line
    and report its own text's errors."""
    text = (ROOT / "recipes" / "default.yaml").read_text()
    (command_ws / "recipes" / "quoted.yaml").write_text(text.replace("\ntrain:", '\n"train":', 1))
    (command_ws / "recipes" / "flow.yaml").write_text(
        "name: flow\nbackend: embedded\ntrain: {lr: 1.0e-3,\n        steps: 40}\n"
    )
    for name, value in (("quoted", "lr=1e-3"), ("flow", "lr=2e-3")):
        r = run_cli("-C", str(command_ws), "train", f"recipes/{name}.yaml", "--dry-run", "--set", value, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr and "argv:" in r.stdout, r.stdout


@pytest.mark.parametrize("kind", ["folder", "device", "pipe"])
def test_triage_classify_of_something_that_is_not_a_file_names_what_it_is(tmp_path, kind):
    path = {"folder": tmp_path, "device": Path("/dev/null"), "pipe": tmp_path / "fifo"}[kind]
    if kind == "pipe":
        os.mkfifo(path)
    what = {"folder": "is a folder", "device": "is a device", "pipe": "is a FIFO"}[kind]
    refused(run_cli("triage", "classify", str(path), timeout=60), what)


def test_preflight_of_another_backends_recipe_says_what_checks_it(command_ws):
    refused(run_cli("-C", str(command_ws), "preflight", "recipes/default.yaml", timeout=60), "--dry-run` checks it")


def test_promote_from_a_ledger_of_another_repository_says_so(command_ws):
    """A real study's ledger copied into a fresh workspace: none of its attempt tags are here, which is what to say,
    not that the trial's refs were removed."""
    shutil.copy(
        ROOT / "tests/data/openrlhf-0.10.4/smollm2/h200-warm-seed1/study-ledger.sqlite", command_ws / "ledger.sqlite"
    )
    refused(run_cli("-C", str(command_ws), "promote", "--dry-run", "5", timeout=120), "comes from another repository")
