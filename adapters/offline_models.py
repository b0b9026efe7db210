"""Tiny randomly initialised Qwen2 models built offline, for tests and toy runs without a model hub.

The folder `build_tiny_qwen` writes is a complete Hugging Face checkpoint (config, safetensors weights, generation
config, tokenizer with chat template), so `AutoModelForCausalLM.from_pretrained`, `vllm.LLM(model=...)` and vLLM's
OpenAI server all load the same weights. Heads are 64 wide because vLLM's CPU attention rejects smaller ones.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from retool_env.offline import tiny_tokenizer


def build_tiny_qwen(
    out_dir: str | Path,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    initializer_range: float = 0.2,
    seed: int = 0,
) -> Path:
    """Save a random float32 Qwen2 causal LM plus its tokenizer to `out_dir` and return the folder.

    The same seed gives the same weights. `initializer_range` is ten times Qwen's so the logits are peaked: greedy
    decoding then has clear winners, and two backends agree on the tokens instead of splitting near-ties.
    """
    tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer()
    if hidden_size % num_heads or hidden_size // num_heads != 64:
        raise ValueError(f"head_dim must be 64 for vLLM's CPU attention; got {hidden_size} / {num_heads} heads")
    special_ids = {
        "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=4096,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        torch_dtype="float32",
        **special_ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    # Only the special ids: no sampling defaults, so every backend samples exactly as asked.
    model.generation_config = GenerationConfig(**special_ids)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
