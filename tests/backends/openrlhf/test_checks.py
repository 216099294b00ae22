"""Mistakes in an OpenRLHF recipe are one line before any Ray job starts; trials can share GPUs through the head."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from autorl.backends.openrlhf.backend import OpenRLHFBackend, packed_gpus
from autorl.backends.openrlhf.checks import installed_flags, problem
from autorl.data import shipped
from autorl.errors import RecipeError
from autorl.recipe import load_recipe

SMALL = "/tmp/autorl-openrlhf-small"


@pytest.fixture
def inputs(tmp_path) -> Path:
    """The small recipe's files as the job would find them (a model directory, prompts, probes)."""
    root = tmp_path / "small"
    (root / "model").mkdir(parents=True)
    (root / "model" / "config.json").write_text("{}")
    for name in ("prompts", "probe_id", "probe_ood"):
        (root / f"{name}.jsonl").write_text(json.dumps({"input": "100+200=", "label": "300"}) + "\n")
    return root


def _recipe(inputs: Path, **train):
    text = Path(shipped("recipes/openrlhf-small.yaml")).read_text().replace(SMALL, str(inputs))
    path = inputs / "recipe.yaml"
    path.write_text(text)
    return load_recipe(path).with_train(openrlhf_version="0.10.4", **train)


def test_the_shipped_small_recipe_passes_once_its_inputs_exist(inputs):
    assert problem(_recipe(inputs), inputs) is None


@pytest.mark.parametrize(
    "field,value,expect",
    [
        ("pretrain", "{root}/nope", "train.pretrain: no model directory at"),
        ("prompt_data", "{root}/missing.jsonl", "train.prompt_data:"),
        ("probe_ood", "{root}/gone.jsonl", "train.probe_ood:"),
    ],
)
def test_a_missing_input_is_one_line_naming_the_field(inputs, field, value, expect):
    found = problem(_recipe(inputs, **{field: value.format(root=inputs)}), inputs)
    assert found.startswith(expect) and "\n" not in found


def test_a_probe_file_that_is_not_jsonl_is_one_line(inputs):
    (inputs / "probe_id.jsonl").write_text("100+200=,300\n")
    found = problem(_recipe(inputs), inputs)
    assert found.startswith("train.probe_id:") and "line 1" in found and "\n" not in found


def test_a_hub_model_name_is_left_to_the_job(inputs):
    assert problem(_recipe(inputs, pretrain="Qwen/Qwen2.5-0.5B-Instruct"), inputs) is None


def test_the_backend_refuses_before_any_job_with_a_recipe_error(inputs):
    with pytest.raises(RecipeError, match="train.pretrain"):
        OpenRLHFBackend().check(_recipe(inputs, pretrain=str(inputs / "nope")), inputs)


@pytest.fixture
def installed_cli(tmp_path, monkeypatch):
    """An on-disk ``openrlhf.cli.train_ppo_ray`` source defining a few of 0.10.4's real flags (never imported)."""
    cli = tmp_path / "site" / "openrlhf" / "cli"
    cli.mkdir(parents=True)
    (cli.parent / "__init__.py").write_text("")
    (cli / "__init__.py").write_text("")
    (cli / "train_ppo_ray.py").write_text(
        "raise ImportError('reading the flags must not import the CLI')\n"
        'parser.add_argument("--vllm.enable_sleep", action="store_true")\n'
        "parser.add_argument('--ds.enable_sleep', action='store_true')\n"
        'parser.add_argument(\n    "--vllm.enforce_eager", action="store_true")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [m for m in sys.modules if m == "openrlhf" or m.startswith("openrlhf.")]:
        monkeypatch.delitem(sys.modules, name)
    return cli


def test_a_flag_the_installed_openrlhf_lacks_is_one_line(inputs, installed_cli):
    assert installed_flags("0.10.4", "0.10.4") == {"--vllm.enable_sleep", "--ds.enable_sleep", "--vllm.enforce_eager"}
    recipe = _recipe(inputs)
    assert problem(recipe, inputs, installed="0.10.4") is None
    bad = recipe.with_train(extra_args=[*recipe.params.extra_args, "--packing_samples"])
    found = problem(bad, inputs, installed="0.10.4")
    assert found.startswith("train.extra_args: --packing_samples is not a flag") and "\n" not in found
    assert problem(bad, inputs, installed=None) is None  # nothing installed here to read: the job decides
    assert problem(bad, inputs, installed="0.10.2") is None  # another version than the recipe's


@pytest.mark.parametrize(
    "share,train,expect",
    [
        (0.3, {}, "is not 1/k of a GPU"),
        (0.5, {"colocate_all": False}, "packs trials on one GPU each"),
        (0.5, {"vllm_gpu_memory_utilization": 0.6}, "sum to 1.20"),
        (0.25, {"vllm_gpu_memory_utilization": 0.3}, "at most 0.23"),
    ],
)
def test_a_gpu_share_that_cannot_be_packed_is_one_line(inputs, share, train, expect):
    recipe = _recipe(inputs, **train).model_copy(update={"gpus_per_trial": share})
    found = problem(recipe, inputs)
    assert found and expect in found and "\n" not in found


def test_two_trials_a_gpu_pass_when_their_memory_shares_fit(inputs):
    recipe = _recipe(inputs, vllm_gpu_memory_utilization=0.15).model_copy(update={"gpus_per_trial": 0.5})
    assert problem(recipe, inputs) is None


def test_packed_devices_name_each_card_once_per_trial(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert packed_gpus(2) == ["2", "2", "3", "3"]
    assert packed_gpus(1) is None


@pytest.mark.slow
def test_a_head_with_repeated_devices_hands_each_card_to_two_gpu_tasks(tmp_path, monkeypatch):
    """Ray gives out logical GPUs by their position in the head's device list: four one-GPU tasks on a head given
    0,0,1,1 see cards 0, 0, 1 and 1. This is how gpus_per_trial 0.5 packs two OpenRLHF jobs on each card."""
    from autorl.backends.ray_jobs import LocalRayHead, submit

    script = tmp_path / "gpus.py"
    script.write_text(
        "import os, ray\nray.init()\n@ray.remote(num_gpus=1)\ndef f():\n    import time\n"
        "    time.sleep(1)\n    return os.environ.get('CUDA_VISIBLE_DEVICES')\n"
        "print('SEEN', sorted(ray.get([f.remote() for _ in range(4)])), ray.cluster_resources()['GPU'])\n"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with LocalRayHead(num_cpus=4, visible_gpus=packed_gpus(2)) as head:
        handle = submit(head.address, [sys.executable, str(script)], working_dir=tmp_path, log_path=tmp_path / "j.log")
        deadline = time.time() + 120
        while handle.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert handle.poll() == 0, (tmp_path / "j.log").read_text()[-1500:]
    seen = [line for line in (tmp_path / "j.log").read_text().splitlines() if "SEEN" in line]
    assert seen and seen[-1].endswith("SEEN ['0', '0', '1', '1'] 4.0")


def _bos_tokenizer(target: Path, chat_template: str | None = None) -> Path:
    """A real Hugging Face tokenizer directory whose encode prepends <bos> (as Llama's does)."""
    from tokenizers import processors

    from autorl.backends.openrlhf.tiny import tokenizer

    tok = tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 1)]
    )
    if chat_template:
        tok.chat_template = chat_template
    tok.save_pretrained(target)
    return target


def test_the_small_models_tokenizer_adds_no_token_openrlhf_rollouts_go_without(tmp_path):
    pytest.importorskip("transformers")
    from autorl.backends.openrlhf.checks import prepended_tokens
    from autorl.backends.openrlhf.tiny import tokenizer

    tok = tokenizer()
    assert tok("123+456=")["input_ids"] == tok("123+456=", add_special_tokens=False)["input_ids"]
    tok.save_pretrained(tmp_path / "plain")
    assert prepended_tokens(tmp_path / "plain") == []
    assert prepended_tokens(_bos_tokenizer(tmp_path / "bos")) == ["<bos>"]


@pytest.mark.parametrize(
    "files, expect",
    [
        (
            {
                "tokenizer.json": {
                    "post_processor": {
                        "type": "Sequence",
                        "processors": [
                            {"type": "ByteLevel"},
                            {
                                "type": "TemplateProcessing",
                                "single": [
                                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                ],
                            },
                        ],
                    }
                }
            },
            ["<|begin_of_text|>"],
        ),
        (
            {
                "tokenizer.json": {
                    "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 101], "sep": ["[SEP]", 102]}
                }
            },
            ["[CLS]"],
        ),
        ({"tokenizer_config.json": {"add_bos_token": True, "bos_token": {"content": "<s>"}}}, ["<s>"]),
        (
            {
                "tokenizer.json": {
                    "post_processor": {
                        "type": "TemplateProcessing",
                        "single": [
                            {"Sequence": {"id": "A", "type_id": 0}},
                            {"SpecialToken": {"id": "<eos>", "type_id": 0}},
                        ],
                    }
                }
            },
            [],
        ),
        ({"tokenizer.json": "not json at all {"}, []),
    ],
)
def test_prepended_tokens_are_read_from_the_tokenizer_files(tmp_path, files, expect):
    from autorl.backends.openrlhf.checks import prepended_tokens

    for name, body in files.items():
        (tmp_path / name).write_text(body if isinstance(body, str) else json.dumps(body))
    assert prepended_tokens(tmp_path) == expect


def test_a_tokenizer_that_prepends_bos_is_warned_once_unless_a_chat_template_is_used(inputs):
    pytest.importorskip("transformers")
    _bos_tokenizer(inputs / "model")
    backend = OpenRLHFBackend()
    [line] = backend.warnings(_recipe(inputs), inputs)
    assert "<bos>" in line and "apply_chat_template" in line
    assert backend.warnings(_recipe(inputs, apply_chat_template=True), inputs) == []
    assert OpenRLHFBackend(ray_address="http://127.0.0.1:1").warnings(_recipe(inputs), inputs) == []


def test_a_chat_template_the_tokenizer_lacks_is_one_line_before_any_job(inputs):
    pytest.importorskip("transformers")
    from autorl.backends.openrlhf.tiny import tokenizer

    tokenizer().save_pretrained(inputs / "model")  # no chat template
    found = problem(_recipe(inputs, apply_chat_template=True), inputs)
    assert found.startswith("train.apply_chat_template:") and "no chat template" in found
    _bos_tokenizer(inputs / "model", chat_template="{{ messages[0]['content'] }}")
    assert problem(_recipe(inputs, apply_chat_template=True), inputs) is None
