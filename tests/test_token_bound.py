"""`retool_env.tokens.tokens_per_byte`: the bound that lets `clip_tokens` return a short output without encoding it.

The bound must hold for every text, hostile ones included (added tokens' texts, characters NFC expands, control
characters, lone surrogates are refused by the tokenizer either way), and be refused (None) for tokenizers whose
tokens may cover no byte or whose pre-tokenizers add text. `clip_tokens` with the bound gives what it gives without.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import normalizers, pre_tokenizers

from retool_env import tokens
from retool_env.offline import qwen_tokenizer
from retool_env.tokens import clip_tokens, encode_text, tokens_per_byte

NFC_GROWS = ["\u0958", "\U0001d160", "\ufb2c", "\u0344", "\u1f82", "\u2126", "\u212b"]  # NFC makes these longer
HOSTILE = ["<|im_end|>", "<tool_call>", "</tool_response>", "<|endoftext|>", "\x00", "\n", " " * 7, "é", "✓", "🙂"]


@pytest.fixture(scope="module")
def qwen():
    return qwen_tokenizer()


@pytest.fixture(scope="module")
def qwen_nfc(qwen):
    tok = copy.deepcopy(qwen)
    tok.backend_tokenizer.normalizer = normalizers.NFC()
    return tok


texts = st.lists(st.one_of(st.sampled_from(NFC_GROWS + HOSTILE), st.text(max_size=8)), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=texts)
def test_the_bound_holds_for_any_text(qwen, qwen_nfc, text):
    for tok in (qwen, qwen_nfc):
        per_byte = tokens_per_byte(tok)
        assert per_byte is not None
        assert len(encode_text(tok, text)) <= per_byte * len(text.encode("utf-8", "surrogatepass"))


def test_nfc_counts_three_per_byte_and_its_worst_characters_fit(qwen, qwen_nfc):
    assert tokens_per_byte(qwen) == 1 and tokens_per_byte(qwen_nfc) == 3
    for char in NFC_GROWS:
        text = char * 50
        assert len(encode_text(qwen_nfc, text)) <= 3 * len(text.encode())


def test_tokenizers_without_a_known_bound_get_none(qwen):
    prefixed = copy.deepcopy(qwen)
    prefixed.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    metaspace = copy.deepcopy(qwen)
    metaspace.backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    nfkc = copy.deepcopy(qwen)
    nfkc.backend_tokenizer.normalizer = normalizers.NFKC()  # U+FDFA becomes 18 characters
    for tok in (prefixed, metaspace, nfkc, object()):
        assert tokens_per_byte(tok) is None


@settings(max_examples=200, deadline=None)
@given(text=texts, budget=st.integers(1, 120))
def test_clip_tokens_gives_what_it_gives_without_the_bound(qwen, qwen_nfc, text, budget):
    for tok in (qwen, qwen_nfc):
        with_bound = clip_tokens(text, tok, budget)
        saved = tokens._byte_bounds.get(tok)
        tokens._byte_bounds[tok] = None  # no bound: always encoded
        try:
            assert clip_tokens(text, tok, budget) == with_bound
        finally:
            tokens._byte_bounds[tok] = saved
        assert len(encode_text(tok, with_bound)) <= budget or with_bound == ""
