"""`retool_env.tokens.Tokenizer` names only what real tokenizers have: the offline Qwen and tiny tokenizers (Hugging
Face fast tokenizers) satisfy it, and an object missing a member does not."""

from __future__ import annotations

import pytest

from retool_env.offline import qwen_tokenizer, tiny_tokenizer
from retool_env.tokens import Tokenizer, decode, encode


@pytest.mark.parametrize("make", [tiny_tokenizer, qwen_tokenizer])
def test_hugging_face_tokenizers_are_tokenizers(make):
    tok = make()
    assert isinstance(tok, Tokenizer)
    ids = encode(tok, "print(6 * 7)<|im_end|>")
    assert decode(tok, ids) == "print(6 * 7)<|im_end|>"
    assert isinstance(tok.eos_token_id, int) and isinstance(tok.get_added_vocab(), dict) and len(tok) > 0


def test_an_object_without_a_chat_template_renderer_is_not_a_tokenizer():
    class Half:
        chat_template = None
        eos_token_id = unk_token_id = None
        all_special_tokens: list[str] = []  # noqa: RUF012

        def encode(self, text, *args, **kwargs):
            return []

        def decode(self, token_ids, *args, **kwargs):
            return ""

        def __len__(self):
            return 0

    assert not isinstance(Half(), Tokenizer)
