from retool_env.offline import QWEN_ADDED_TOKENS


def test_qwen_tokenizer_reproduces_published_ids(qwen_tok):
    assert qwen_tok.encode("Hello, AI!") == [9707, 11, 15235, 0]
    assert len(qwen_tok) == 151643 + len(QWEN_ADDED_TOKENS) == 151669
    ids = qwen_tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                                          "<tool_response>", "</tool_response>", "<think>", "</think>"])
    assert ids == [151643, 151644, 151645, 151657, 151658, 151665, 151666, 151667, 151668]
    chat = qwen_tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    assert chat == [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]


def test_tiny_tokenizer_keeps_tags_whole(tiny_tok):
    for tag in ["<tool_call>", "</tool_call>", "<code>", "</code>", "<|im_end|>"]:
        assert len(tiny_tok.encode(tag)) == 1, tag
    text = "print(2 ** 10)\n<tool_call>"
    assert tiny_tok.decode(tiny_tok.encode(text)) == text
