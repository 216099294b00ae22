"""Writes a Hugging Face Llama directory of a built-in size with the addition task's characters.

Used to run the engine's Hugging Face path (and TRL) on exactly the built-in
architecture: same hidden size, layers, heads, 4x SwiGLU MLP, tied embeddings
and the same 15-symbol vocabulary (a ``tokenizers`` WordLevel model that splits
every character, prepends ``<bos>`` and decodes by joining).
"""

from __future__ import annotations

from pathlib import Path

from autorl.toolkit.model import BUILTIN_SIZES, MAX_POSITIONS
from autorl.toolkit.task import CharTokenizer


def char_tokenizer_fast():
    """A PreTrainedTokenizerFast equivalent to CharTokenizer (ids identical)."""
    # lazy: tokenizers and transformers are the hf extra's (tests/test_imports.py: not at this module's top)
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast  # lazy: the hf extra's, as above

    symbols = CharTokenizer.SYMBOLS
    tok = Tokenizer(models.WordLevel({s: i for i, s in enumerate(symbols)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def save_llama(path: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Save a randomly initialised LlamaForCausalLM of built-in ``size`` plus its tokenizer to ``path``."""
    import torch  # lazy: the engine extra's (tests/test_imports.py: not at this module's top)
    from transformers import LlamaConfig, LlamaForCausalLM  # lazy: the hf extra's, as above

    dims = BUILTIN_SIZES[size]
    config = LlamaConfig(
        vocab_size=len(CharTokenizer.SYMBOLS),
        hidden_size=dims["hidden"],
        intermediate_size=4 * dims["hidden"],
        num_hidden_layers=dims["layers"],
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["heads"],
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    path = Path(path)
    model.save_pretrained(path)
    char_tokenizer_fast().save_pretrained(path)
    return path
