"""What must hold of an OpenRLHF recipe before any Ray job starts, each failure one line.

A job that finds a missing model directory, an unreadable probe file or a flag its OpenRLHF version lacks dies
after its runtime env, the driver's imports and Ray's start (20 s or more on a GPU host), and a study would
triage each trial's crash in turn. ``problem(recipe, root)`` finds those mistakes first:

- ``pretrain``, ``prompt_data`` (on a local head) and the probe sets, where they are local paths (a Hugging Face hub
name such
  as ``org/model`` is left to the job): the model directory has a ``config.json``, the files exist, the probe
  files are JSONL of ``{"input", "label"}``;
- ``extra_args``: every ``--flag`` is one the installed ``train_ppo_ray`` defines (read from its source, without
  importing it; skipped when OpenRLHF is not installed here or is another version than the recipe's);
- ``gpus_per_trial`` below 1 (trials sharing a GPU): one colocated GPU per trial, a whole number of trials per
  GPU, and vLLM memory shares that leave room for each other.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path

from autorl.backends.openrlhf.params import OpenRLHFParams
from autorl.evaluate import EvalError, read_probe

FLAG = re.compile(r"""add_argument\(\s*["'](--[\w.\-]+)["']""")
PACKED_MEMORY_MAX = 0.9  # the vLLM memory shares of the trials that share one GPU may sum to at most this


def problem(recipe, root: Path, installed: str | None = None, on_cluster: bool = False) -> str | None:
    """The first mistake of an OpenRLHF recipe as one line naming the fix, or None. ``on_cluster``: the job runs on
    a Ray cluster whose nodes have files of their own, so the model and prompt paths are not looked up here (the
    per-item evaluation, and so the probe sets, run on this machine)."""
    params: OpenRLHFParams = recipe.params
    for check in (_probes,) if on_cluster else (_model, _files, _probes):
        found = check(params, root)
        if found:
            return found
    return _flags(params, installed) or _packing(recipe)


def local_path(value: str, root: Path) -> Path | None:
    """The path ``value`` names when it is a local one (absolute, ./ or ../, or present under ``root``)."""
    path = Path(value).expanduser()
    if path.is_absolute() or value.startswith((".", "~")) or (root / path).exists():
        return path if path.is_absolute() else root / path
    return None


def local_files(params: OpenRLHFParams, root: Path, fields: tuple[str, ...]) -> dict[str, str]:
    """The ``fields`` of ``params`` that name local files, as absolute paths (hub names, URLs and ``builtin:``
    rewards are left out)."""
    out = {}
    for field in fields:
        value = getattr(params, field)
        path = local_path(value, root) if value and not value.startswith(("builtin:", "http://", "https://")) else None
        if path is not None:
            out[field] = str(path.resolve())
    return out


def _model(params: OpenRLHFParams, root: Path) -> str | None:
    path = local_path(params.pretrain, root)
    if path is not None and not (path / "config.json").is_file():
        return (
            f"train.pretrain: no model directory at {path} (no config.json): make it (for the small recipe: "
            f"python -m autorl.backends.openrlhf.small DIR) or fix the path"
        )
    if path is not None and params.apply_chat_template and not has_chat_template(path):
        return (
            f"train.apply_chat_template: the tokenizer at {path} has no chat template, so every rollout and "
            "the per-item eval would fail: turn apply_chat_template off or use a model that has one"
        )
    return None


def has_chat_template(model_dir: Path) -> bool:
    """Whether the Hugging Face tokenizer in ``model_dir`` has a chat template (in tokenizer_config.json, or the
    chat_template.jinja / chat_template.json files newer versions write)."""
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    return bool(_json(model_dir / "tokenizer_config.json").get("chat_template"))


def _files(params: OpenRLHFParams, root: Path) -> str | None:
    path = local_path(params.prompt_data, root)
    if path is not None and not path.exists():
        return f"train.prompt_data: {path} not found: give the prompt JSONL file (or a hub dataset name)"
    return None


def _probes(params: OpenRLHFParams, root: Path) -> str | None:
    for field, value in (("probe_id", params.probe_id), ("probe_ood", params.probe_ood)):
        if not value:
            continue
        path = Path(value).expanduser()
        try:
            read_probe(path if path.is_absolute() else root / path)
        except EvalError as exc:
            return f"train.{field}: {exc}"
    return None


def _flags(params: OpenRLHFParams, installed: str | None) -> str | None:
    if not params.extra_args:
        return None
    known = installed_flags(params.openrlhf_version, installed)
    if known is None:
        return None
    for word in params.extra_args:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            return (
                f"train.extra_args: {flag} is not a flag of the installed openrlhf's train_ppo_ray: "
                f"remove it or check its name (`python -m openrlhf.cli.train_ppo_ray --help`)"
            )
    return None


def installed_flags(version: str | None, installed: str | None) -> set[str] | None:
    """The flags the installed ``train_ppo_ray`` defines, when it is the version the recipe targets; else None."""
    if installed is None or (version and version != installed):
        return None
    try:
        spec = importlib.util.find_spec("openrlhf.cli.train_ppo_ray")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return flags_in_source(Path(spec.origin).read_text(errors="replace"))


def flags_in_source(text: str) -> set[str]:
    """Every flag an ``add_argument`` call of this source defines, read with ``ast``: a flag written as an f-string
    inside a ``for NAME in (literal, ...)`` loop (0.10.x defines ``--actor.adam.lr`` and ``--critic.adam.lr`` so) is
    read once per value; a regex over the text saw only the literal ones. Falls back to the regex on a source that
    does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set(FLAG.findall(text))
    return set(_defined_flags(tree.body, {}))


def _defined_flags(body: list[ast.stmt], env: dict[str, str]) -> Iterator[str]:
    for stmt in body:
        if isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name):
            try:
                values = ast.literal_eval(stmt.iter)
            except ValueError:
                values = ()
            for value in values if isinstance(values, (tuple, list)) else ():
                yield from _defined_flags(stmt.body, {**env, stmt.target.id: str(value)})
        elif isinstance(getattr(stmt, "body", None), list):  # a function, an if, a with: read inside it
            inner = [*stmt.body, *getattr(stmt, "orelse", []), *getattr(stmt, "finalbody", [])]  # type: ignore[attr-defined]
            yield from _defined_flags(inner, env)
        else:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                    yield from (f for f in (_text(a, env) for a in node.args) if f and f.startswith("--"))


def _text(node: ast.expr, env: dict[str, str]) -> str | None:
    """A string literal, or an f-string whose names are loop variables in ``env``; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in env:
                parts.append(env[v.value.id])
            else:
                return None
        return "".join(parts)
    return None


def _packing(recipe) -> str | None:
    share = recipe.gpus_per_trial
    if not 0 < share < 1:
        return None
    params: OpenRLHFParams = recipe.params
    per_gpu = round(1 / share)
    if abs(per_gpu * share - 1) > 1e-6:
        return f"gpus_per_trial: {share:g} is not 1/k of a GPU: use 0.5 (two trials a GPU), 0.25 (four) or 1"
    if not params.colocate_all or params.gpus_needed() != 1:
        return (
            "gpus_per_trial below 1 packs trials on one GPU each: set train.colocate_all with one actor GPU "
            "and one vLLM engine of TP 1, or use gpus_per_trial 0 (whole GPUs)"
        )
    memory = params.vllm_gpu_memory_utilization or 0.9  # OpenRLHF's default
    if memory * per_gpu > PACKED_MEMORY_MAX:
        return (
            f"gpus_per_trial {share:g}: {per_gpu} trials share a GPU, and their vLLM memory shares sum to "
            f"{memory * per_gpu:.2f} (> {PACKED_MEMORY_MAX}): set train.vllm_gpu_memory_utilization to at most "
            f"{PACKED_MEMORY_MAX / per_gpu:.2f}"
        )
    return None


TOKENIZER_JSON_MAX = 64 * 1024 * 1024  # the largest tokenizer.json read for the prompt-token check


def warnings(params: OpenRLHFParams, root: Path) -> list[str]:
    """What may make a recipe learn less than it could, each one line (the study still runs)."""
    path = local_path(params.pretrain, root)
    if path is None or params.apply_chat_template:
        return []
    added = prepended_tokens(path)
    if not added:
        return []
    return [
        f"the tokenizer of {params.pretrain} puts {', '.join(added)} before every text it encodes, but OpenRLHF "
        "tokenizes rollout prompts without special tokens (when train.apply_chat_template is off): the policy "
        "sees its prompts without them in every rollout; if it was trained with them, put them in the prompt "
        "text or use a chat template"
    ]


def prepended_tokens(model_dir: Path) -> list[str]:
    """The special tokens the Hugging Face tokenizer in ``model_dir`` puts before a single text on encode, read from
    its tokenizer.json (TemplateProcessing, also inside a Sequence; Bert/Roberta processors) and
    tokenizer_config.json (``add_bos_token``). Nothing is imported: this runs on the controller."""
    found: list[str] = []
    post = _json(model_dir / "tokenizer.json").get("post_processor")
    for node in _processors(post):
        if node.get("type") == "TemplateProcessing":
            for piece in node.get("single") or []:
                if not isinstance(piece, dict) or "SpecialToken" not in piece:
                    break
                found.append(str(piece["SpecialToken"].get("id")))
        elif node.get("type") in ("BertProcessing", "RobertaProcessing") and isinstance(node.get("cls"), list):
            found.append(str(node["cls"][0]))
    config = _json(model_dir / "tokenizer_config.json")
    bos = config.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    if config.get("add_bos_token") is True and isinstance(bos, str) and bos not in found:
        found.append(bos)
    return found


def _processors(node) -> list[dict]:
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [p for child in node.get("processors") or [] for p in _processors(child)]
    return [node]


def _json(path: Path) -> dict:
    try:
        if path.stat().st_size > TOKENIZER_JSON_MAX:
            return {}
        data = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
