"""A training script that saves a real Hugging Face checkpoint: a tiny Llama whose greedy answer is ``--answer``.

The model is built, not trained: one layer whose attention and MLP outputs are zero, so each position's logits
depend on its own token only (a bigram table written into the embeddings and the LM head). After ``=`` it
writes the digits of ``--answer`` and then ``<eos>``; on any probe item it answers that number, so its per-item
results are known in advance. Logs ``--steps`` step lines to ``--metrics`` first; ``--no-save`` skips the save
(a script that forgets its checkpoint).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autorl.backends.openrlhf.tiny import SYMBOLS, tokenizer

HIDDEN = 32  # >= len(SYMBOLS): every token gets its own embedding axis


def bigram_model(answer: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(SYMBOLS), hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config)
    index = {s: i for i, s in enumerate(SYMBOLS)}
    chain = ["="] + list(answer) + ["<eos>"]
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(len(SYMBOLS), HIDDEN))
        head = torch.zeros(len(SYMBOLS), HIDDEN)
        for current, following in zip(chain, chain[1:]):
            head[index[following], index[current]] = 10.0
        model.lm_head.weight.copy_(head)
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--answer", required=True)
    p.add_argument("--out", required=True, help="checkpoint directory")
    p.add_argument("--metrics", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
    with open(args.metrics, "a") as fh:
        for step in range(1, args.steps + 1):
            fh.write(json.dumps({"step": step, "reward_mean": 0.1 * step, "loss": 1.0 / step}) + "\n")
    if not args.no_save:
        bigram_model(args.answer).save_pretrained(args.out)
        tokenizer().save_pretrained(args.out)
    print(f"trained {args.steps} steps; answer {args.answer}", flush=True)


if __name__ == "__main__":
    main()
