"""Shared fixtures: offline tokenizers (a tiny one and a real Qwen one)."""

from __future__ import annotations

import pytest

from retool_env.offline import qwen_tokenizer, tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tok():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def qwen_tok():
    return qwen_tokenizer()


@pytest.fixture(scope="session", params=["tiny", "qwen"])
def any_tok(request):
    """Both tokenizers: every environment test runs with the tiny one and with Qwen's real one."""
    return tiny_tokenizer() if request.param == "tiny" else qwen_tokenizer()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Two busy cores: one intra-op thread avoids oversubscription that makes tiny-model generation 10x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
