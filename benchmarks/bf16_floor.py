"""How much of a short run's update survives in bf16 weights: the learning-rate floor of a bf16 trial.

    python benchmarks/bf16_floor.py MODEL_DIR [--steps 16] [--lrs 1e-6,1e-5,1e-4] [--batch 8] [--eval N]

OpenRLHF with ``param_dtype: bf16`` keeps fp32 master weights in DeepSpeed's optimizer, but its vLLM engine samples
and the saved model are bf16: an update smaller than half the bf16 spacing of a weight (2^-8 of its magnitude)
rounds away. For each learning rate this runs ``--steps`` real AdamW steps (fp32 master weights, linear warm-up 3 %
then cosine to 0.1 x lr, as OpenRLHF 0.10.4 schedules them) of next-token loss on the model's own probe items (the
answer after the chat-templated prompt), then counts the weights whose bf16 value differs from the base model's
bf16 value, and the size of the bf16 change against the fp32 one. CPU is enough (a 135 M model: a few seconds a
step). The model folder is the one ``python -m autorl.toolkit.pretrained smollm2 DIR --dtype fp32`` writes.

With ``--eval N``: greedy pass@1 on N held-out probe items (items after the training ones; the answer read by
autorl's reward rule, ``toolkit.reward``) of the base weights, the trained fp32 weights and the same weights rounded
to bf16, so that what the rounding keeps of the update shows in the model's answers, not only in its weights.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from autorl.toolkit.reward import answers_match, extract_answer


def batches(model_dir: Path, tokenizer, n: int, steps: int) -> list[dict[str, torch.Tensor]]:
    """``steps`` batches of ``n`` chat-templated probe items with their answers (loss on the answer only)."""
    rows = probe_rows(model_dir)
    out = []
    for s in range(steps):
        chunk = [rows[(s * n + i) % len(rows)] for i in range(n)]
        texts, prompts = [], []
        for r in chunk:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": r["input"]}], tokenize=False, add_generation_prompt=True
            )
            prompts.append(len(tokenizer(prompt, add_special_tokens=False)["input_ids"]))
            texts.append(prompt + str(r["label"]))
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = -100
        for i, p in enumerate(prompts):
            labels[i, :p] = -100
        out.append({**enc, "labels": labels})
    return out


def schedule(step: int, steps: int, warmup_ratio: float = 0.03, min_ratio: float = 0.1) -> float:
    warm = math.ceil(steps * warmup_ratio)
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, steps - warm)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def probe_rows(model_dir: Path) -> list[dict]:
    probe = next(p for p in (model_dir / "probe_id.jsonl", model_dir.parent / "probe_id.jsonl") if p.is_file())
    return [json.loads(line) for line in probe.read_text().splitlines() if line.strip()]


@torch.no_grad()
def greedy_pass(model, tokenizer, rows: list[dict], max_new: int = 24, batch: int = 16) -> float:
    """Greedy pass@1 of ``model`` on ``rows`` (chat template, left padding, the answer by autorl's reward rule)."""
    tokenizer.padding_side = "left"
    right = 0
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": r["input"]}], tokenize=False, add_generation_prompt=True
            )
            for r in chunk
        ]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        for r, ids in zip(chunk, out[:, enc["input_ids"].shape[1] :]):
            answer, _ = extract_answer(tokenizer.decode(ids, skip_special_tokens=True))
            right += int(answer is not None and answers_match(answer, str(r["label"])))
    tokenizer.padding_side = "right"
    return right / len(rows)


def one(
    model_dir: Path, lr: float, steps: int, data: list[dict[str, torch.Tensor]], held: list[dict], tokenizer
) -> dict[str, float]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base = {n: p.detach().to(torch.bfloat16).clone() for n, p in model.named_parameters()}
    base32 = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: schedule(s, steps))
    t = time.time()
    for batch in data:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    changed = total = 0
    d32 = d16 = 0.0
    for n, p in model.named_parameters():
        w = p.detach()
        now16 = w.to(torch.bfloat16)
        changed += int((now16 != base[n]).sum())
        total += w.numel()
        d32 += float(((w - base32[n]) ** 2).sum())
        d16 += float(((now16.float() - base[n].float()) ** 2).sum())
    scores = {}
    if held:
        model.eval()
        scores["eval_fp32"] = greedy_pass(model, tokenizer, held)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())  # the weights a bf16 engine samples with
        scores["eval_bf16"] = greedy_pass(model, tokenizer, held)
    return {
        **scores,
        "lr": lr,
        "steps": steps,
        "weights_changed_in_bf16": changed / total,
        "fp32_update_norm": math.sqrt(d32),
        "bf16_update_norm": math.sqrt(d16),
        "last_loss": float(loss),
        "seconds": round(time.time() - t, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--lrs", default="1e-6,1e-5,1e-4")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--eval", type=int, default=0, help="greedy pass@1 on this many held-out probe items")
    args = p.parse_args()
    model_dir = Path(args.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    data = batches(model_dir, tokenizer, args.batch, args.steps)
    rows = probe_rows(model_dir)
    held = rows[args.batch * args.steps : args.batch * args.steps + args.eval] if args.eval else []
    if held:
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        print(json.dumps({"base_fp32": greedy_pass(base, tokenizer, held), "items": len(held)}), flush=True)
        with torch.no_grad():
            for q in base.parameters():
                q.copy_(q.to(torch.bfloat16).float())
        print(json.dumps({"base_bf16": greedy_pass(base, tokenizer, held)}), flush=True)
    for lr in (float(x) for x in args.lrs.split(",")):
        print(json.dumps(one(model_dir, lr, args.steps, data, held, tokenizer)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
