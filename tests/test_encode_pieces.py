"""`retool_env.tokens.encode_pieces` (the template's text around tool results, its pieces between added tokens
remembered) gives `encode`'s ids exactly, on Qwen's offline tokenizer and the families' (TRL templates' special
tokens added), and steps aside for a tokenizer whose pieces are not encoded on their own."""

from __future__ import annotations

import random

import pytest

from retool_env.offline import qwen_tokenizer
from retool_env.tokens import _piece_cache, encode, encode_pieces
from tests.test_dialect_parity import NAMES, family_tokenizer

FRAGMENTS = ["\n", "user\n", "assistant\n", " ", "  ", "\n\n", "56088", "print(6 * 7)", "é✓中文", "\t", "{\"a\": 1}",
             "<", "|>", "<|", "im_end", "tool_response", "'s", " 's", "1234567", "x" * 70, "\\n", "\r\n", "ab c"]


def samples(tok, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    added = sorted(set(tok.get_added_vocab()))
    return ["".join(rng.choice(added) if rng.random() < 0.3 else rng.choice(FRAGMENTS)
                    for _ in range(rng.randint(0, 24)))
            for _ in range(n)]


@pytest.mark.parametrize("name", [None, *[n for n in ("qwen3_6_training", "gptoss_training", "llama3_1",
                                                      "glm4moe_training", "deepseekv3") if n in NAMES]])
def test_the_ids_are_encodes(name):
    tok = qwen_tokenizer() if name is None else family_tokenizer(name)
    assert _piece_cache(tok) is not None  # the cached path is the one tested
    for text in samples(tok, 400, seed=hash(name) % 1000):
        assert encode_pieces(tok, text) == encode(tok, text), text
    for text in samples(tok, 50, seed=1):  # again, from the remembered pieces
        assert encode_pieces(tok, text) == encode(tok, text), text


def test_a_tokenizer_whose_pieces_are_not_independent_is_encoded_whole():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"▁a": 0, "a": 1, "<unk>": 2, "<s>": 3}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")  # only the first piece gets "▁"
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>")
    assert _piece_cache(tok) is None
    assert encode_pieces(tok, "a<s>a") == encode(tok, "a<s>a")
