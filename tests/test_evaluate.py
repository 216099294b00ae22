"""The shared per-item evaluator: pass@1 items, pass@k, refusals, and the CLI on a real tiny checkpoint."""

from __future__ import annotations

import json

import pytest

from autorl import evaluate as ev
from autorl.toolkit import peritem


def _generator(answers: dict[str, list[str]]):
    calls = {p: 0 for p in answers}

    def generate(prompts, temperature):
        out = []
        for p in prompts:
            seq = answers[p]
            out.append((seq[0] if temperature == 0 else seq[min(calls[p], len(seq) - 1)], False))
            calls[p] += temperature > 0
        return out

    return generate


def test_greedy_items_and_pass_at_k():
    gen = _generator({"1+1=": ["2"], "2+2=": ["5", "3", "4"]})
    judge = ev.make_judge("builtin:exact_match")
    out = peritem.evaluate_split(gen, "id", ["1+1=", "2+2="], ["2", "4"], judge, k=3, temperature=1.0)
    assert out["eval/id/items"] == [1, 0] and out["eval/id/greedy_pass@1"] == 0.5
    assert out["eval/id/sampling_pass@3"] == 1.0


def test_k_above_one_at_temperature_zero_is_refused():
    with pytest.raises(ValueError):
        ev.ProbeSettings(probe_id="x.jsonl", probe_k=4, probe_temperature=0.0)
    assert ev.main(["--model", "m", "--id", "x", "--metrics-out", "o", "--max-new-tokens", "2"]) == 2


def test_cli_on_a_real_checkpoint(tmp_path):
    pytest.importorskip("transformers")
    from autorl.backends.openrlhf.tiny import write_inputs

    root = write_inputs(tmp_path / "tiny")
    out = tmp_path / "eval.jsonl"
    rc = ev.main(
        [
            "--model",
            str(root / "model"),
            "--id",
            str(root / "probe_id.jsonl"),
            "--ood",
            str(root / "probe_ood.jsonl"),
            "--metrics-out",
            str(out),
            "--max-new-tokens",
            "4",
            "--k",
            "2",
            "--engine",
            "hf",
            "--step",
            "4",
        ]
    )
    rec = json.loads(out.read_text().splitlines()[-1])
    assert rc == 0 and rec["type"] == "eval" and rec["step"] == 4
    assert len(rec["eval/id/items"]) == 32 and len(rec["eval/ood/items"]) == 32
    assert "eval/ood/sampling_pass@2" in rec
    assert rec["checkpoint"] == str((root / "model").resolve())  # what a full run keeps as its weights


def test_probe_prompts_are_encoded_as_the_rollouts_encode_them(tmp_path):
    """Without the special tokens the tokenizer would add (OpenRLHF rolls out without them) when asked, and with
    --chat-template one user turn in the tokenizer's chat template."""
    pytest.importorskip("transformers")
    from tokenizers import processors

    from autorl.backends.openrlhf.tiny import tokenizer

    tok = tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 1)]
    )
    tok.chat_template = (
        "{% for m in messages %}={{ m['content'] }}{% endfor %}{% if add_generation_prompt %}+{% endif %}"
    )
    assert ev.prompt_text(tok, "1+2=", chat=False) == "1+2="
    assert ev.prompt_text(tok, "1+2=", chat=True) == "=1+2=+"
    seen = []

    class Model:  # records the ids generate is given, then answers "3<eos>"
        device = "cpu"

        def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
            import torch

            seen.append(input_ids.tolist())
            answer = torch.tensor([[tok.convert_tokens_to_ids("3"), tok.eos_token_id]] * input_ids.shape[0])
            return torch.cat([input_ids, answer], dim=1)

    tok.padding_side = "left"
    out = ev._hf_generate(Model(), tok, ["1+2="], 0.0, 2, special=False)
    assert out == [("3", False)] and seen[0][0][0] != tok.bos_token_id
    assert seen[0][0] == tok("1+2=", add_special_tokens=False)["input_ids"]
    ev._hf_generate(Model(), tok, ["1+2="], 0.0, 2)  # the tokenizer's own encoding (TRL's for plain prompts)
    assert seen[1][0][0] == tok.bos_token_id


def test_eval_argv_passes_the_chat_template_and_plain_prompts_only_when_asked():
    probe = ev.ProbeSettings(probe_id="id.jsonl")
    assert "--chat-template" not in ev.eval_argv("python", "m", "o", probe, 4)
    argv = ev.eval_argv("python", "m", "o", probe, 4, chat=True, special=False)
    args = ev.parse_args(argv[3:])
    assert args.chat_template and not args.special and ev.parse_args(ev.eval_argv("p", "m", "o", probe, 4)[3:]).special
