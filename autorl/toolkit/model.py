"""The policies the engine trains, behind one small interface.

``builtin:*`` names build a small pure-torch Llama-like decoder (RMSNorm, rotary
positions, SwiGLU, causal attention through ``F.scaled_dot_product_attention``,
tied embeddings) that samples with a KV cache. It does not import transformers,
whose import alone costs seconds. A local Hugging Face directory is loaded with
``AutoModelForCausalLM``/``AutoTokenizer`` (imported lazily) and samples with
``model.generate`` on left-padded prompts.

Both expose the same methods to the trainer: ``encode`` (strings -> padded
tensors), ``logits`` (a teacher-forced forward), ``sample`` (temperature 0 =
greedy) and ``decode``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autorl.errors import UserError
from autorl.toolkit import heartbeat

BUILTIN_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4},  # 132,352 params with the 15-symbol vocabulary
    "small": {"hidden": 256, "layers": 4, "heads": 4},  # 3.15 M params
    "gpu": {"hidden": 512, "layers": 16, "heads": 8},  # 50.3 M params
}
MAX_POSITIONS = 64  # prompt + completion tokens the rotary table covers


class ModelError(UserError):
    """The model name or directory cannot be used."""


# ---------------------------------------------------------------------------
# The built-in decoder
# ---------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned gain."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).type_as(x) * self.weight


def rotary_table(head_dim: int, positions: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (positions, head_dim) for rotate-half rotary embeddings."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(positions).float(), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Multi-head causal self-attention with an optional (k, v) cache."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, cos, sin, cache=None):
        b, s, h = x.shape
        split = lambda t: t.view(b, s, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None or s > 1)
        return self.o(out.transpose(1, 2).reshape(b, s, h)), (k, v)


class Block(nn.Module):
    """Pre-norm transformer block: attention then a SwiGLU MLP (4x hidden)."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.gate = nn.Linear(hidden, 4 * hidden, bias=False)
        self.up = nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x, cos, sin, cache=None):
        a, cache = self.attn(self.attn_norm(x), cos, sin, cache)
        x = x + a
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h)), cache


class TinyDecoder(nn.Module):
    """A Llama-like decoder with tied input/output embeddings."""

    cos: torch.Tensor  # the rotary tables, registered as buffers
    sin: torch.Tensor

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        cos, sin = rotary_table(hidden // heads, MAX_POSITIONS)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        for name, p in self.named_parameters():
            if p.dim() == 2 and name != "embed.weight":
                nn.init.normal_(
                    p, std=0.02 / math.sqrt(2 * layers) if name.endswith(("o.weight", "down.weight")) else 0.02
                )

    def forward(self, ids: torch.Tensor, start: int = 0, caches: list | None = None):
        """Logits (B, S, V) for ``ids`` at positions start.., and the updated caches."""
        x = self.embed(ids)
        cos, sin = self.cos[start : start + ids.shape[1]], self.sin[start : start + ids.shape[1]]
        new = []
        for i, block in enumerate(self.blocks):
            x, c = block(x, cos, sin, None if caches is None else caches[i])
            new.append(c)
        return F.linear(self.norm(x), self.embed.weight), new


def _pick(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if not torch.isfinite(probs).all():
        raise FloatingPointError("non-finite sampling probabilities (the weights have diverged)")
    return torch.multinomial(probs, 1).squeeze(-1)


def finish_completions(tokens: torch.Tensor, eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad everything after the first EOS; return (tokens, mask up to and including that EOS)."""
    is_eos = tokens == eos_id
    after = (is_eos.cumsum(-1) - is_eos.long()) > 0
    mask = ~after
    return tokens.masked_fill(after, pad_id), mask


class BuiltinPolicy:
    """A TinyDecoder plus the task's character tokenizer. Prompts in a batch share one length."""

    kind = "builtin"

    def __init__(self, size: str, tokenizer, device: torch.device):
        self.tokenizer = tokenizer
        self.module = TinyDecoder(tokenizer.vocab_size, **BUILTIN_SIZES[size]).to(device)
        self.device = device

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.tokenizer.encode(p) for p in prompts]
        if len({len(r) for r in rows}) != 1:
            raise ModelError(
                "built-in models need prompts of one length per batch: use builtin:addition or a Hugging Face model"
            )
        ids = torch.tensor(rows, device=self.device)
        return ids, torch.ones_like(ids, dtype=torch.bool)

    def logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.module(ids)[0]

    @torch.no_grad()
    def sample(self, ids, mask, max_new_tokens: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Completions (B, max_new_tokens), padded after EOS, and their masks."""
        eos = self.tokenizer.eos_id
        logits, caches = self.module(ids)
        out, done, pos = [], torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device), ids.shape[1]
        for t in range(max_new_tokens):
            heartbeat.beat(f"generating token {t + 1} of {max_new_tokens} for {ids.shape[0]} sequences")
            tok = _pick(logits[:, -1], temperature)
            out.append(tok)
            done |= tok == eos
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            logits, caches = self.module(tok[:, None], pos, caches)
            pos += 1
        tokens = torch.stack(out, 1)
        tokens = F.pad(tokens, (0, max_new_tokens - tokens.shape[1]), value=self.tokenizer.pad_id)
        return finish_completions(tokens, eos, self.tokenizer.pad_id)

    def decode(self, tokens: torch.Tensor) -> list[str]:
        return [self.tokenizer.decode(row) for row in tokens.tolist()]


# ---------------------------------------------------------------------------
# Local Hugging Face models
# ---------------------------------------------------------------------------


class HFPolicy:
    """AutoModelForCausalLM + AutoTokenizer from a local directory, prompts left-padded. With ``chat``, a prompt is
    one user turn of the tokenizer's chat template (with the generation prompt), encoded without special tokens: as
    OpenRLHF's ``--data.apply_chat_template`` rollouts and autorl's ``--chat-template`` evaluation see it."""

    kind = "hf"

    def __init__(self, path: str, device: torch.device, chat: bool = False):
        # lazy: transformers is slow to import, and the built-in model does not need it
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok: Any = AutoTokenizer.from_pretrained(path)
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        loaded: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.module = loaded.to(device)
        beat_through_layers(self.module)
        self.device = device
        self.eos_id, self.pad_id = self.tok.eos_token_id, self.tok.pad_token_id
        self.chat = chat
        if chat and not self.tok.chat_template:
            raise ModelError(f"chat_template: the tokenizer at {path} has no chat template: turn chat_template off")

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.chat:
            turns = [[{"role": "user", "content": p}] for p in prompts]
            text = [self.tok.apply_chat_template(t, tokenize=False, add_generation_prompt=True) for t in turns]
            enc = self.tok(text, return_tensors="pt", padding=True, add_special_tokens=False)
            return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device).bool()
        enc = self.tok(prompts, return_tensors="pt", padding=True)
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device).bool()

    def answer_ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"] + [self.eos_id]

    def logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return self.module(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits

    @torch.no_grad()
    def sample(self, ids, mask, max_new_tokens: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        opts = (
            {"do_sample": False}
            if temperature == 0
            else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        )
        out = self.module.generate(
            input_ids=ids,
            attention_mask=mask.long(),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            stopping_criteria=beating(ids.shape[1], max_new_tokens),
            **opts,
        )
        tokens = out[:, ids.shape[1] :]
        tokens = F.pad(tokens, (0, max_new_tokens - tokens.shape[1]), value=self.pad_id)
        return finish_completions(tokens, self.eos_id, self.pad_id)

    def decode(self, tokens: torch.Tensor) -> list[str]:
        rows = [[t for t in row if t != self.pad_id] for row in tokens.tolist()]
        return [self.tok.decode(r, skip_special_tokens=True) for r in rows]


def beat_through_layers(module: nn.Module) -> None:
    """A heartbeat as each block of the model's layer stack runs forward and as its gradient comes back: one
    forward or backward pass of a micro-batch through a real model on a CPU can outlast the silence watchdog (64
    sequences of SmolLM2-135M took over 120 s on a busy two-core machine). The hooks read the clock and change
    nothing (the gradient hook returns None)."""
    layers = next((m for m in module.modules() if isinstance(m, nn.ModuleList) and len(m) > 1), None)
    for i, layer in enumerate(layers or []):
        layer.register_forward_hook(_layer_beat(i + 1, len(layers or [])))


def _layer_beat(i: int, n: int):
    def hook(_module, _args, out) -> None:
        heartbeat.beat(f"forward through layer {i} of {n}")
        first = out[0] if isinstance(out, tuple) else out
        if isinstance(first, torch.Tensor) and first.requires_grad:
            first.register_hook(lambda _grad: heartbeat.beat(f"backward through layer {i} of {n}"))

    return hook


def beating(prompt_len: int, max_new_tokens: int):
    """A stopping criterion for ``generate`` that never stops it: a heartbeat at each decoding step."""
    from transformers import StoppingCriteria, StoppingCriteriaList  # lazy, as in HFPolicy

    class Beat(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            made, rows = input_ids.shape[1] - prompt_len, input_ids.shape[0]
            heartbeat.beat(f"generating token {made} of {max_new_tokens} for {rows} sequences")
            return torch.zeros(rows, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([Beat()])


def load_policy(name: str, tokenizer, device: torch.device, chat: bool = False):
    """The policy for ``name``: 'builtin:<size>' (needs the task's tokenizer) or a model directory (``chat``: its
    prompts through the chat template)."""
    if name.startswith("builtin:"):
        size = name.split(":", 1)[1]
        if size not in BUILTIN_SIZES:
            raise ModelError(
                f"unknown built-in model '{name}': use one of " + ", ".join(f"builtin:{s}" for s in BUILTIN_SIZES)
            )
        if tokenizer is None:
            raise ModelError(
                f"{name} only trains on builtin:addition: use a Hugging Face model directory for JSONL tasks"
            )
        return BuiltinPolicy(size, tokenizer, device)
    if not (Path(name) / "config.json").is_file():
        raise ModelError(
            f"model '{name}' is neither builtin:tiny/small/gpu nor a directory with config.json: fix the model path"
        )
    return HFPolicy(name, device, chat=chat)
