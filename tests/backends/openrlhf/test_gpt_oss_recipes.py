"""The 8-GPU gpt-oss recipes against the OpenRLHF 0.10.4 autorl pins: every word of `autorl train RECIPE --dry-run`
parsed by 0.10.4's own ``train_ppo_ray`` parser, and the 120b recipe's CPU offload carried to 0.10.4 by a patch.

Two sources of that parser:

- ``tests/data/openrlhf-0.10.4/parser/`` (always here): the arguments of ``train_ppo_ray`` read out of the released
  0.10.4 wheel, as released and after ``autorl patches apply`` (the README there says how they were made);
- the wheel itself, downloaded from the package registry (skipped where the registry cannot be reached): the stored
  files must be exactly what it gives, and its real ``__main__`` block (hierarchize and every check it makes before
  ``train(args)``) takes the dry run's argv; the patched DeepSpeed strategy then builds a ZeRO config that offloads
  the parameters.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import types
from abc import ABC
from collections import defaultdict
from pathlib import Path
from typing import Optional

import pytest
from conftest_openrlhf import (  # noqa: F401
    OLD_VERSION,
    extract_site,
    parser_from_source,
    site_093,
    wheel_cache,
    wheel_dir,
)

from autorl.backends.openrlhf.backend import build_argv
from autorl.backends.openrlhf.patches import apply, check
from autorl.backends.openrlhf.preflight import check_gpus, check_patches, preflight
from autorl.data import shipped
from autorl.recipe import load_recipe
from tests.conftest import run_cli

VERSION = "0.10.4"
ROOT = Path(__file__).resolve().parents[3]
CLI = "openrlhf/cli/train_ppo_ray.py"
DATA = ROOT / "tests" / "data" / "openrlhf-0.10.4" / "parser"
RELEASED, PATCHED = DATA / "train_ppo_ray.json", DATA / "train_ppo_ray-patched.json"
RECIPES = ("gpt-oss-20b", "gpt-oss-120b")
OFFLOAD_FLAG = "--ds.param_offload"
ACTIONS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false"}
TYPES = {"int": int, "float": float, "str": str}


# ---- the parser as data -------------------------------------------------------------------------
def argument_spec(parser: argparse.ArgumentParser) -> list[dict]:
    """Every argument of ``parser`` as plain data: flags, dest, action, type, nargs, choices."""
    out = []
    for action in parser._actions:
        row = {"flags": action.option_strings, "dest": action.dest, "action": ACTIONS[type(action).__name__]}
        if row["action"] == "store":
            row.update(
                type=getattr(action.type, "__name__", None),
                nargs=action.nargs,
                choices=list(action.choices) if action.choices else None,
            )
        out.append(row)
    return out


def parser_from_spec(spec: list[dict]) -> argparse.ArgumentParser:
    """An argparse parser with exactly the arguments of ``spec`` (``argument_spec``'s output)."""
    parser = argparse.ArgumentParser(prog="train_ppo_ray", add_help=False, exit_on_error=False)
    for row in spec:
        kwargs: dict = {"dest": row["dest"], "action": row["action"]}
        if row["action"] == "store":
            kwargs.update(
                {k: v for k, v in (("nargs", row["nargs"]), ("choices", row["choices"])) if v is not None},
                type=TYPES.get(row["type"] or "str", str),
            )
        parser.add_argument(*row["flags"], **kwargs)
    return parser


def stored(path: Path) -> argparse.ArgumentParser:
    return parser_from_spec(json.loads(path.read_text()))


def _strict_parse(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    ns, unknown = parser.parse_known_args(words)
    assert not unknown, f"not flags of openrlhf {VERSION}'s train_ppo_ray: {unknown}"
    return ns


# ---- the dry run, as a user runs it -----------------------------------------------------------
@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, list[str]]:
    """``autorl train recipes/NAME.yaml --dry-run --json`` in a workspace made by ``autorl init``: the argv words
    after ``python -m openrlhf.cli.train_ppo_ray``."""
    ws = tmp_path_factory.mktemp("gpu-ws") / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    out = {}
    for name in RECIPES:
        shutil.copy(shipped("recipes", f"{name}.yaml"), ws / "recipes" / f"{name}.yaml")
        r = run_cli("-C", str(ws), "train", f"recipes/{name}.yaml", "--dry-run", "--json")
        assert r.returncode == 0, r.stderr
        argv = json.loads(r.stdout)["argv"]
        assert argv[1:3] == ["-m", "openrlhf.cli.train_ppo_ray"]
        out[name] = argv[3:]
    assert not (ws / ".autorl").exists() and not (ws / "ledger.sqlite").exists()  # a dry run writes nothing
    return out


def test_the_recipes_target_the_pinned_openrlhf_and_its_dotted_flags(dry_runs):
    pins = [r for r in (ROOT / "pyproject.toml").read_text().splitlines() if r.startswith("openrlhf = [")]
    assert f'"openrlhf=={VERSION}"' in pins[0]
    for name in RECIPES:
        recipe = load_recipe(shipped("recipes", f"{name}.yaml"))
        assert recipe.params.openrlhf_version == VERSION
        flags = [w for w in dry_runs[name] if w.startswith("--")]
        assert flags and all("." in f for f in flags), name  # 0.10.2 on: every flag is dotted


@pytest.mark.parametrize("name", RECIPES)
def test_every_word_of_the_dry_run_parses_with_openrlhf_0104(dry_runs, name):
    words = dry_runs[name]
    offload = OFFLOAD_FLAG in words
    assert offload == (name == "gpt-oss-120b")
    if offload:  # released 0.10.4 has no parameter offload: only the patched CLI takes the recipe
        assert stored(RELEASED).parse_known_args(words)[1] == [OFFLOAD_FLAG]
        ns = vars(_strict_parse(stored(RELEASED), [w for w in words if w != OFFLOAD_FLAG]))
        assert vars(_strict_parse(stored(PATCHED), words))["ds.param_offload"] is True
    else:
        ns = vars(_strict_parse(stored(RELEASED), words))
    recipe = load_recipe(shipped("recipes", f"{name}.yaml")).params
    assert ns["actor.model_name_or_path"] == recipe.pretrain and ns["actor.adam.lr"] == pytest.approx(recipe.lr)
    assert ns["algo.advantage.estimator"] == "dr_grpo" and ns["ds.zero_stage"] == 3
    assert ns["actor.num_gpus_per_node"] == 4 and ns["vllm.num_engines"] == 2 and ns["vllm.tensor_parallel_size"] == 2
    assert ns["ds.lora.target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert ns["data.max_len"] == recipe.max_len and ns["rollout.max_new_tokens"] == recipe.max_new_tokens
    assert ns["reward.remote_url"].endswith("autorl/backends/openrlhf/reward_func.py")
    assert ns["ds.attn_implementation"] == "eager" and ns["data.apply_chat_template"]


def test_the_layout_takes_one_eight_gpu_node():
    for name in RECIPES:
        params = load_recipe(shipped("recipes", f"{name}.yaml")).params
        assert params.gpus_needed() == 8, name
        assert check_gpus(params, 8).ok and check_gpus(params, 4).ok is False


def test_offload_on_an_unpatched_dotted_release_is_one_line_naming_the_patch(tmp_path):
    r = run_cli(
        "-C", str(tmp_path), "train", str(shipped("recipes", "gpt-oss-120b.yaml")), "--dry-run",
        "--set", "openrlhf_version=0.11.2",
    )  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "train.offload is not supported by openrlhf 0.11.2" in r.stderr
    assert "patches/offload_cli_0.10.4.patch" in r.stderr and not list(tmp_path.iterdir())


@pytest.mark.parametrize("size", ["20b", "120b"])
def test_the_093_recipes_are_kept_for_clusters_pinned_there(site_093, tmp_path, size):
    path = shipped("recipes", f"gpt-oss-{size}-openrlhf-0.9.3.yaml")
    params = load_recipe(path).params
    assert params.openrlhf_version == OLD_VERSION and "0.9.3" in path.read_text().splitlines()[0]
    site = tmp_path / "site"
    shutil.copytree(site_093 / "openrlhf", site / "openrlhf")
    apply(shipped("patches"), site)  # a site with no dist-info: the 0.9.3 patches, never the 0.10.4 one
    ns = vars(parser_from_source(site / CLI).parse_args(build_argv(params, "run", "/tb")[3:]))
    assert ns["actor_learning_rate"] == pytest.approx(params.lr) and ns["offload"] is (size == "120b")


# ---- the real wheel ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def site_0104(wheel_dir) -> Path:  # noqa: F811
    return extract_site(VERSION, wheel_dir)


@pytest.fixture()
def patched_0104(site_0104, tmp_path) -> Path:
    site = tmp_path / "site"
    shutil.copytree(site_0104 / "openrlhf", site / "openrlhf")
    _dist_info(site, VERSION)
    states = {s.name: s.state for s in apply(shipped("patches"), site)}
    assert states["offload_cli_0.10.4.patch"] == "applied"
    assert {v for k, v in states.items() if k != "offload_cli_0.10.4.patch"} == {"other version"}
    return site


def _dist_info(site: Path, version: str) -> None:
    info = site / f"openrlhf-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: openrlhf\nVersion: {version}\n")


def test_the_stored_parsers_are_the_wheels(site_0104, patched_0104):
    assert argument_spec(parser_from_source(site_0104 / CLI)) == json.loads(RELEASED.read_text())
    assert argument_spec(parser_from_source(patched_0104 / CLI)) == json.loads(PATCHED.read_text())
    released = {f for row in json.loads(RELEASED.read_text()) for f in row["flags"]}
    patched = {f for row in json.loads(PATCHED.read_text()) for f in row["flags"]}
    assert patched - released == {OFFLOAD_FLAG}


@pytest.mark.parametrize("name", RECIPES)
def test_the_real_main_block_of_0104_takes_the_dry_run(dry_runs, patched_0104, name, monkeypatch):
    args = run_main_block(patched_0104, dry_runs[name], monkeypatch)
    assert args.actor.adam.lr == pytest.approx(load_recipe(shipped("recipes", f"{name}.yaml")).params.lr)
    assert args.reward.remote_url[0].endswith("reward_func.py") and args.critic.model_name_or_path is None
    if args.algo.kl.init_coef > 0 and args.train.colocate_actor_ref:  # train()'s own check, before any Ray call
        assert (args.actor.num_nodes, args.actor.num_gpus_per_node) == (args.ref.num_nodes, args.ref.num_gpus_per_node)
    assert args.ds.param_offload is (name == "gpt-oss-120b")


def test_the_patched_strategy_offloads_the_parameters(site_0104, patched_0104, dry_runs, monkeypatch):
    args = run_main_block(patched_0104, dry_runs["gpt-oss-120b"], monkeypatch)
    zero = ds_train_config(patched_0104, args)["zero_optimization"]
    assert zero["offload_param"]["device"] == "cpu" and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["stage"] == 3
    assert ds_train_config(site_0104, args)["zero_optimization"]["offload_param"]["device"] == "none"  # unpatched
    args.ds.param_offload = False
    assert ds_train_config(patched_0104, args)["zero_optimization"]["offload_param"]["device"] == "none"


def run_main_block(site: Path, words: list[str], monkeypatch) -> types.SimpleNamespace:
    """The ``if __name__ == "__main__"`` block of ``site``'s train_ppo_ray, run on ``words`` up to ``train(args)``
    (which needs Ray and GPUs): its parser, ``hierarchize`` and every check it makes; the args it would train with."""
    tree = ast.parse((site / CLI).read_text())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    assert ast.unparse(main.body[-1]) == "train(args)"
    captured: list = []
    namespace = {"argparse": argparse, "datetime": datetime.datetime, "os": os, "train": captured.append}
    monkeypatch.setattr(sys, "argv", ["train_ppo_ray.py", *words])
    with _openrlhf_utils_config(site):
        exec(compile(ast.Module(body=main.body, type_ignores=[]), str(site / CLI), "exec"), namespace)
    return captured[0]


class _openrlhf_utils_config:
    """``openrlhf.utils.config`` importable from ``site`` without ``openrlhf/utils/__init__`` (torch, deepspeed)."""

    NAMES = ("openrlhf", "openrlhf.utils", "openrlhf.utils.config")

    def __init__(self, site: Path):
        self.site = site

    def __enter__(self):
        for name in self.NAMES[:2]:
            module = types.ModuleType(name)
            module.__path__ = [str(self.site / name.replace(".", "/"))]
            sys.modules[name] = module
        spec = importlib.util.spec_from_file_location(self.NAMES[2], self.site / "openrlhf/utils/config.py")
        assert spec is not None and spec.loader is not None
        sys.modules[self.NAMES[2]] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

    def __exit__(self, *exc):
        for name in self.NAMES:
            sys.modules.pop(name, None)


def ds_train_config(site: Path, args) -> dict:
    """The ZeRO config ``site``'s DeepspeedStrategy builds for the actor from ``args``: its real ``__init__`` and
    ``get_ds_train_config`` over the real ``get_train_ds_config`` (compiled on their own: their modules import
    deepspeed and torch)."""
    utils = ast.parse((site / "openrlhf/utils/deepspeed/deepspeed_utils.py").read_text())
    strategy = ast.parse((site / "openrlhf/utils/deepspeed/deepspeed.py").read_text())
    cls = next(n for n in strategy.body if isinstance(n, ast.ClassDef) and n.name == "DeepspeedStrategy")
    cls.body = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in ("__init__", "get_ds_train_config")]
    build = next(n for n in utils.body if isinstance(n, ast.FunctionDef) and n.name == "get_train_ds_config")
    namespace: dict = {"ABC": ABC, "defaultdict": defaultdict, "Optional": Optional}
    exec(compile(ast.Module(body=[build, cls], type_ignores=[]), "deepspeed_strategy", "exec"), namespace)
    strategy_obj = namespace["DeepspeedStrategy"](
        zero_stage=args.ds.zero_stage,
        train_batch_size=args.train.batch_size,
        micro_train_batch_size=args.train.micro_batch_size,
        args=args,
    )
    return strategy_obj.get_ds_train_config(is_actor=True)


def test_the_shipped_param_offload_patch_is_checked_by_preflight_only_where_needed(site_0104, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(site_0104 / "openrlhf", site / "openrlhf")
    _dist_info(site, VERSION)
    big = load_recipe(shipped("recipes", "gpt-oss-120b.yaml")).params
    small = load_recipe(shipped("recipes", "gpt-oss-20b.yaml")).params
    assert {s.name: s.state for s in check(shipped("patches"), site)}["offload_cli_0.10.4.patch"] == "not applied"
    assert check_patches(shipped("patches"), site, small).ok is None  # 20b needs no patch on 0.10.4
    needed = check_patches(shipped("patches"), site, big)
    assert needed.ok is False and "offload_cli_0.10.4.patch (not applied)" in needed.detail
    assert "autorl patches apply" in needed.detail
    apply(shipped("patches"), site)
    assert check_patches(shipped("patches"), site, big).ok is True


def test_preflight_in_a_new_workspace_asks_for_the_offload_patch(site_0104, tmp_path):
    """`autorl init` makes an empty patches/ folder: preflight then checks the shipped patches, so an unpatched
    0.10.4 is caught before the job dies on `unrecognized arguments: --ds.param_offload`."""
    ws = tmp_path / "ws"
    assert run_cli("init", str(ws)).returncode == 0 and (ws / "patches").is_dir()
    site = tmp_path / "site"
    shutil.copytree(site_0104 / "openrlhf", site / "openrlhf")
    _dist_info(site, VERSION)
    recipe = load_recipe(shipped("recipes", "gpt-oss-120b.yaml"))
    found = {c.name: c for c in preflight(recipe, worktree=ws, site_packages=site, visible=8)}["patches"]
    assert found.ok is False and "offload_cli_0.10.4.patch (not applied)" in found.detail


def _regenerate() -> None:  # pragma: no cover - by hand: PYTHONPATH=.:tests python THIS_FILE
    """Write the two stored parsers from the released wheel (downloaded into a temp folder)."""
    cache = wheel_cache(Path(tempfile.mkdtemp()))
    site = extract_site(VERSION, cache)
    RELEASED.write_text(_rows(argument_spec(parser_from_source(site / CLI))))
    patched = Path(tempfile.mkdtemp()) / "site"
    shutil.copytree(site / "openrlhf", patched / "openrlhf")
    _dist_info(patched, VERSION)
    apply(shipped("patches"), patched)
    PATCHED.write_text(_rows(argument_spec(parser_from_source(patched / CLI))))


def _rows(spec: list[dict]) -> str:
    return "[\n" + ",\n".join(json.dumps(row) for row in spec) + "\n]\n"


if __name__ == "__main__":  # pragma: no cover
    _regenerate()


def test_the_installed_parsers_flags_are_read_as_the_wheel_defines_them(site_0104, patched_0104):
    """autorl's check of an installed OpenRLHF's flags (``checks.flags_in_source``) reads the flags 0.10.4 defines
    inside its ``for prefix in (...)`` loop too (``--actor.adam.lr``): a regex over the text saw only the literal
    ones, and refused those words in a recipe's extra_args on a machine where they work."""
    from autorl.backends.openrlhf.checks import FLAG, flags_in_source

    text = (site_0104 / CLI).read_text()
    stored_flags = {f for row in json.loads(RELEASED.read_text()) for f in row["flags"] if f.startswith("--")}
    assert flags_in_source(text) == stored_flags
    assert {"--actor.adam.lr", "--critic.adam.lr"} <= stored_flags - set(FLAG.findall(text))
    patched = {f for row in json.loads(PATCHED.read_text()) for f in row["flags"] if f.startswith("--")}
    assert flags_in_source((patched_0104 / CLI).read_text()) == patched
