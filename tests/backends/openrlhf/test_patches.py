"""patches/*.patch against the real openrlhf 0.9.3 wheel: check, apply, conflicts, and the patched code runs; the
0.10.4 patch beside them is left alone there (its own tests against the 0.10.4 wheel: test_gpt_oss_recipes.py)."""

from __future__ import annotations

import ast
import importlib
import json
import shutil
import sys
import types
from pathlib import Path

import pytest
from conftest_openrlhf import site_093, wheel_dir  # noqa: F401

from autorl.backends.openrlhf.patches import PatchError, applies_to, apply, check, needed_for, touched_files

SHIPPED = Path(__file__).resolve().parents[3] / "patches"
EXPECTED = {
    "experience_maker.patch",
    "metrics_actor.patch",
    "metrics_trainer.patch",
    "offload_cli.patch",
    "ratio_logging_loss.patch",
}
FOR_0104 = {"offload_cli_0.10.4.patch"}


@pytest.fixture(scope="module")
def PATCHES(tmp_path_factory) -> Path:
    """The shipped patches written for 0.9.3 (the 0.10.4 one is tested on its own wheel)."""
    folder = tmp_path_factory.mktemp("patches-093")
    for path in sorted(SHIPPED.glob("*.patch")):
        if applies_to(path, "0.9.3"):
            shutil.copy(path, folder / path.name)
    return folder


@pytest.fixture()
def site(site_093, tmp_path) -> Path:
    shutil.copytree(site_093 / "openrlhf", tmp_path / "site" / "openrlhf")
    return tmp_path / "site"


@pytest.fixture(scope="module")
def patched(site_093, tmp_path_factory, PATCHES) -> Path:
    root = tmp_path_factory.mktemp("patched") / "site"
    shutil.copytree(site_093 / "openrlhf", root / "openrlhf")
    apply(PATCHES, root)
    return root


def test_the_shipped_patches_are_those_for_093_and_one_for_0104(PATCHES):
    assert {p.name for p in PATCHES.glob("*.patch")} == EXPECTED
    assert {p.name for p in SHIPPED.glob("*.patch")} == EXPECTED | FOR_0104


def test_check_apply_and_idempotence(site, PATCHES):
    before = check(PATCHES, site)
    assert {s.name for s in before} >= EXPECTED
    assert {s.state for s in before} == {"not applied"}
    after = apply(PATCHES, site)
    assert {s.state for s in after} == {"applied"}
    assert {s.state for s in apply(PATCHES, site)} == {"applied"}
    assert not list(site.rglob("*.orig")) and not list(site.rglob("*.rej"))


def test_conflict_is_reported_and_blocks_apply(site, PATCHES):
    target = site / "openrlhf/trainer/ppo_utils/experience_maker.py"
    target.write_text(target.read_text().replace("info[key] = torch.tensor([value])", "info[key] = value"))
    states = {s.name: s for s in check(PATCHES, site)}
    assert states["experience_maker.patch"].state == "conflicts"
    assert states["metrics_trainer.patch"].state == "not applied"
    with pytest.raises(PatchError, match="experience_maker.patch"):
        apply(PATCHES, site)
    assert {s.state for s in check(PATCHES, site) if s.name != "experience_maker.patch"} == {"not applied"}


def test_touched_files():
    for name in ("offload_cli.patch", "offload_cli_0.10.4.patch"):
        assert touched_files(SHIPPED / name) == [
            "openrlhf/cli/train_ppo_ray.py",
            "openrlhf/utils/deepspeed/deepspeed.py",
        ]


def test_missing_dir_is_a_user_error(tmp_path):
    with pytest.raises(PatchError, match="not found"):
        check(tmp_path / "nope", tmp_path)


def _load_models_package(site: Path):
    """Import openrlhf.models.loss from ``site`` without running openrlhf/__init__ (which needs deepspeed)."""
    for name in ("openrlhf", "openrlhf.models"):
        module = types.ModuleType(name)
        module.__path__ = [str(site / name.replace(".", "/"))]
        sys.modules[name] = module
    try:
        return importlib.import_module("openrlhf.models.loss")
    finally:
        for name in ("openrlhf.models.loss", "openrlhf.models.utils", "openrlhf.models", "openrlhf"):
            sys.modules.pop(name, None)


def _function(path: Path, name: str, namespace: dict):
    """One top-level function of a patched file, compiled on its own (its module imports ray/deepspeed)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def test_patched_policy_loss_records_ratio_tail_and_clamps(patched):
    torch = pytest.importorskip("torch")
    loss = _load_models_package(patched).PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2)
    log_probs = torch.tensor([[0.0, -1.0, 30.0, 0.5]])
    mask = torch.tensor([[1, 1, 1, 0]])
    out = loss(log_probs, torch.zeros(1, 4), torch.ones(1, 4), action_mask=mask)
    tail = loss.ratio_tail
    assert tail["log_ratio_raw_max"] == 30.0 and tail["log_ratio_max"] == 20.0 and tail["log_ratio_min"] == -1.0
    assert tail["tokens_in_batch"] == 3.0 and tail["log_ratio_abs_p99"] == 20.0
    assert tail["ratio_max"] == pytest.approx(float(torch.tensor(20.0).exp()), rel=1e-4)
    assert torch.isfinite(out[0])


def test_patched_actor_stats(patched):
    torch = pytest.importorskip("torch")
    import math

    stats = _function(
        patched / "openrlhf/trainer/ray/ppo_actor.py", "_masked_stats", {"torch": torch, "math": math, "Dict": dict}
    )
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    got = stats("entropy", values, torch.tensor([[1, 1, 1, 0]]), quantiles=True)
    assert got["entropy_mean"] == pytest.approx(2.0) and got["entropy_max"] == 3.0 and got["entropy_min"] == 1.0
    assert got["entropy_p10"] == 1.0 and got["entropy_p90"] == 3.0


def test_patched_trainer_writes_metrics_jsonl(patched, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import os
    import time

    write = _function(
        patched / "openrlhf/trainer/ppo_trainer.py",
        "append_metrics_jsonl",
        {"torch": torch, "os": os, "time": time, "json": json, "Dict": dict},
    )
    monkeypatch.setenv("METRICS_LOG_DIR", str(tmp_path / "m"))
    write(3, {"reward": 0.5, "grad_norm": torch.tensor(2.0), "generated_samples": ["text", 1.0], "flag": True})
    row = json.loads((tmp_path / "m/training_metrics.jsonl").read_text())
    assert row["step"] == 3 and row["type"] == "step" and row["reward"] == 0.5 and row["grad_norm"] == 2.0
    assert "generated_samples" not in row and "flag" not in row


def _dist_info(site: Path, version: str) -> None:
    info = site / f"openrlhf-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: openrlhf\nVersion: {version}\n")


def test_patches_for_another_version_are_neither_checked_nor_applied(site, PATCHES):
    _dist_info(site, "0.10.4")
    before = {p: p.read_bytes() for p in (site / "openrlhf").rglob("*.py")}
    states = apply(PATCHES, site)
    assert {s.state for s in states} == {"other version"}
    assert all("< 0.10.2" in s.detail and "0.10.4" in s.detail for s in states)
    assert {p: p.read_bytes() for p in (site / "openrlhf").rglob("*.py")} == before


def test_patches_for_the_installed_version_are_checked(site, PATCHES):
    _dist_info(site, "0.9.3")
    assert {s.state for s in check(PATCHES, site)} == {"not applied"}


def test_the_0104_patch_is_never_applied_to_093_nor_on_a_guess(site):
    """A patch written for one release: left alone where another is installed, and where none is known (no
    dist-info), so the 0.9.3 patches beside it still apply."""
    states = {s.name: s for s in apply(SHIPPED, site)}  # no dist-info: the version is unknown
    assert states["offload_cli_0.10.4.patch"].state == "other version"
    assert "unknown" in states["offload_cli_0.10.4.patch"].detail
    assert {s.state for n, s in states.items() if n not in FOR_0104} == {"applied"}
    _dist_info(site, "0.9.3")
    assert {s.name: s.state for s in check(SHIPPED, site)}["offload_cli_0.10.4.patch"] == "other version"
    assert applies_to(SHIPPED / "offload_cli_0.10.4.patch", "0.10.4")
    assert not applies_to(SHIPPED / "offload_cli_0.10.4.patch", "0.10.3")
    assert applies_to(SHIPPED / "offload_cli.patch", None)  # an upper bound: applied where the version is unknown


def test_the_offload_patches_are_needed_only_by_recipes_that_offload():
    assert needed_for(SHIPPED / "offload_cli.patch") == "offload"
    assert needed_for(SHIPPED / "offload_cli_0.10.4.patch") == "offload"
    assert {needed_for(SHIPPED / n) for n in EXPECTED - {"offload_cli.patch"}} == {None}


def test_a_conflict_names_the_installed_version(site, PATCHES):
    _dist_info(site, "0.9.3")
    target = site / "openrlhf/trainer/ppo_utils/experience_maker.py"
    target.write_text(target.read_text().replace("info[key] = torch.tensor([value])", "info[key] = value"))
    with pytest.raises(PatchError, match=r"experience_maker.patch conflict with .*: reinstall openrlhf 0\.9\.3 "):
        apply(PATCHES, site)
