"""The served model: a random-weight Llama written as a Hugging Face folder, and its prompts.

Weights cannot be downloaded here and need not be trained: step times depend on shapes only. The
tokenizer is word level (``w3`` ... ``w4095``, each one token, Metaspace-marked so a streamed token
decodes to `` wN``), so a prompt of n words is exactly n tokens and every streamed chunk carries
whole tokens the client can count.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hardware_db.schema import ModelSpec

from ..microbench.ceilings import TORCH_DTYPES

FIRST_WORD = 3  # ids 0-2: <unk>, <s>, </s>

ENGINE_MODEL = ModelSpec(
    id="engine-llama-tiny", name="engine-llama-tiny (random weights)", family="llama", num_layers=4,
    hidden_size=512, vocab_size=4096, num_attention_heads=8, num_kv_heads=2, head_dim=64, intermediate_size=1408,
    max_position_embeddings=2048, checkpoint_dtype="bf16",
    sources=("calculator.enginebench: random-weight model served by the engine under test",),
)
"""Small enough that a 2-core CPU serves it at tens of requests per second, so a load sweep of a few
hundred requests per point takes seconds; decode steps are dominated by the engine's per-step work,
as they are for small models on real engines."""


def write_model(out_dir: Path, spec: ModelSpec = ENGINE_MODEL, seed: int = 0, dtype: str = "bf16") -> Path:
    """Write config, random weights in ``dtype`` (bf16 or fp32) and the word-level tokenizer of ``spec`` under
    ``out_dir`` (needs torch, transformers and tokenizers: the ``bench`` extra)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"\u2581w{i}": i for i in range(FIRST_WORD, spec.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
    fast.save_pretrained(out_dir)
    config = transformers.LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=spec.tie_word_embeddings, rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(getattr(torch, TORCH_DTYPES[dtype]))
    transformers.utils.logging.disable_progress_bar()  # the CLI draws its own; keep stderr to it
    try:
        model.save_pretrained(out_dir)
    finally:
        transformers.utils.logging.enable_progress_bar()
    (out_dir / "pdplan_model.json").write_text(json.dumps(spec.model_dump(mode="json"), indent=1) + "\n",
                                               encoding="utf-8")
    return out_dir


def prompt(tokens: int, rng: np.random.Generator, vocab_size: int = ENGINE_MODEL.vocab_size) -> str:
    """``tokens`` random words: exactly that many tokens, and (random) never a prefix-cache hit."""
    ids = rng.integers(FIRST_WORD, vocab_size, size=tokens)
    return " ".join(f"w{i}" for i in ids)


def count_tokens(text: str) -> int:
    """Tokens in a streamed piece of text (each decodes to one word)."""
    return len(text.split())
