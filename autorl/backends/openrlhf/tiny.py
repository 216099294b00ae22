"""The inputs of the tiny OpenRLHF recipe, made offline: a random-init Llama, prompts and probe sets.

``python -m autorl.backends.openrlhf.tiny DIR`` writes ``DIR/model`` (a 3 M-parameter Llama with a 15-symbol
character tokenizer, head_dim 64 so vLLM's flash-attention kernels take it), ``DIR/prompts.jsonl`` (two-digit
additions, operands 10-49), ``DIR/probe_id.jsonl`` (held-out items of the same range) and
``DIR/probe_ood.jsonl`` (operands 50-89: three-digit sums the prompts never show). Needs torch, transformers
and tokenizers; no network. Nothing is rewritten when ``DIR/model`` exists.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

SYMBOLS = ["<pad>", "<bos>", "<eos>", *"0123456789", "+", "="]
SIZES = {"prompts": 64, "probe_id": 32, "probe_ood": 32}


def tokenizer():
    """A fast character tokenizer that adds no special token on encode.

    OpenRLHF 0.10.x tokenizes rollout prompts with ``add_special_tokens=False``, so a tokenizer that
    prepends ``<bos>`` gives the policy one prompt in supervised warm-up and evaluation and another in every GRPO
    rollout: a warmed-up model that sampled right 35 % of the time with ``<bos>`` scored 4 % in its rollouts.
    Without it, warm-up, rollouts and the per-item eval all see the same ids."""
    # lazy: small.py imports SYMBOLS at start-up
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast  # lazy: small.py imports SYMBOLS at start-up

    tok = Tokenizer(models.WordLevel({s: i for i, s in enumerate(SYMBOLS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def write_model(target: Path) -> None:
    """Random-init Llama (4 layers, hidden 256) in bf16 with its tokenizer."""
    import torch  # lazy: small.py imports SYMBOLS at start-up
    from transformers import LlamaConfig, LlamaForCausalLM  # lazy: small.py imports SYMBOLS at start-up

    config = LlamaConfig(
        vocab_size=len(SYMBOLS),
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(target)
    tokenizer().save_pretrained(target)


def additions(n: int, low: int, high: int, rng: random.Random, skip: set[str]) -> list[dict[str, str]]:
    """``n`` distinct items {"input": "a+b=", "label": "a+b"} not in ``skip``."""
    out: list[dict[str, str]] = []
    while len(out) < n:
        a, b = rng.randint(low, high), rng.randint(low, high)
        text = f"{a}+{b}="
        if text not in skip:
            skip.add(text)
            out.append({"input": text, "label": str(a + b)})
    return out


def write_inputs(root: Path) -> Path:
    """Model, prompts and probe sets under ``root`` (kept when already there)."""
    root.mkdir(parents=True, exist_ok=True)
    rng, seen = random.Random(0), set[str]()
    sets = {
        "prompts": additions(SIZES["prompts"], 10, 49, rng, seen),
        "probe_id": additions(SIZES["probe_id"], 10, 49, rng, seen),
        "probe_ood": additions(SIZES["probe_ood"], 50, 89, rng, seen),
    }
    for name, rows in sets.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if not (root / "model" / "config.json").is_file():
        write_model(root / "model")
    return root


if __name__ == "__main__":
    print(write_inputs(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/autorl-openrlhf-tiny")))
