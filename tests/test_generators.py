"""Generation backends that run in the main venv: HFGenerator on a real tiny model, the OpenAI completions client
against a real HTTP server speaking vLLM's schema, and TRL's client path.

TRL's real `VLLMClient` cannot be constructed here (its `__init__` needs `vllm` importable), so its generator is
tested with a stub returning `VLLMClient.generate`'s shape, plus the real `VLLMClient.generate` method bound to a
hand-made instance that talks to the fake server. tests/vllm runs the real client against a real vLLM server.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch

from retool_adapters.generators import (
    HFGenerator,
    LogprobsMismatchError,
    OpenAICompletionsGenerator,
    TRLVLLMClientGenerator,
)
from retool_adapters.generators.hf import keyed_gumbel
from retool_adapters.offline_models import build_tiny_qwen
from retool_env.rollout import Generation, Generator, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_qwen(tmp_path_factory.mktemp("tiny_qwen"))


@pytest.fixture(scope="module")
def hf(model_dir):
    return HFGenerator.from_pretrained(model_dir, batch_window_ms=20)


@pytest.fixture(scope="module")
def prompt_and_free_run(hf) -> tuple[list[int], Generation]:
    """A chat prompt and its greedy 40-token turn, the reference the stop tests cut. A random model may emit EOS
    early, so take the first prompt whose turn runs the full length."""
    for question in ["What is 2 + 2?", "Compute 17 * 23 with code.", "Solve x^2 = 49.", "Hello", "Sum 1 to 100."]:
        prompt = hf.tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        free_run = run(hf.generate(prompt, max_tokens=40, sampling=GREEDY))
        if len(free_run.token_ids) == 40:
            return prompt, free_run
    raise AssertionError("every candidate prompt hit EOS early")


@pytest.fixture(scope="module")
def prompt(prompt_and_free_run):
    return prompt_and_free_run[0]


@pytest.fixture(scope="module")
def free_run(prompt_and_free_run):
    return prompt_and_free_run[1]


def teacher_forced_logprobs(model, prompt, tokens, temperature=1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(tokens)])).logits[0, len(prompt) - 1 : -1]
    return (logits / temperature).log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def first_index(ids, predicate) -> int:
    return next(i for i in range(len(ids)) if predicate(i))


# --- build_tiny_qwen ---


def test_tiny_qwen_is_deterministic_and_loads_with_head_dim_64(tmp_path, model_dir, hf):
    again = build_tiny_qwen(tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    other = build_tiny_qwen(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (model_dir / "model.safetensors").read_bytes()
    config = hf.model.config
    assert config.hidden_size // config.num_attention_heads == 64
    assert hf.model.dtype == torch.float32
    assert hf.model.lm_head.weight.data_ptr() == hf.model.model.embed_tokens.weight.data_ptr()
    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_qwen(tmp_path / "bad", hidden_size=64)


# --- HFGenerator ---


def test_hf_generator_satisfies_the_protocol(hf):
    assert isinstance(hf, Generator)


def test_greedy_tokens_and_logprobs_match_a_teacher_forced_forward_pass(hf, prompt, free_run):
    assert len(free_run.token_ids) == len(free_run.logprobs) > 10
    with torch.no_grad():
        logits = hf.model(torch.tensor([prompt + free_run.token_ids])).logits[0, len(prompt) - 1 : -1]
    assert logits.argmax(-1).tolist() == free_run.token_ids
    expected = teacher_forced_logprobs(hf.model, prompt, free_run.token_ids)
    assert torch.allclose(torch.tensor(free_run.logprobs), expected, atol=1e-4)


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_sampled_logprobs_follow_the_logprobs_mode(model_dir, hf, prompt, mode):
    """raw: log-softmax of the logits (vLLM's default); processed: of logits / temperature, the sampled distribution."""
    gen = HFGenerator(hf.model, hf.tokenizer, logprobs_mode=mode)
    sampling = SamplingParams(temperature=0.7, seed=11)
    out = run(gen.generate(prompt, max_tokens=12, sampling=sampling))
    temperature = 1.0 if mode == "raw_logprobs" else 0.7
    expected = teacher_forced_logprobs(hf.model, prompt, out.token_ids, temperature)
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)


def test_processed_logprobs_renormalise_over_top_k(hf, prompt):
    gen = HFGenerator(hf.model, hf.tokenizer, logprobs_mode="processed_logprobs")
    out = run(gen.generate(prompt, max_tokens=12, sampling=SamplingParams(temperature=1.0, top_k=3, seed=5)))
    with torch.no_grad():
        logits = hf.model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    top = logits.topk(3, -1)
    for step, token in enumerate(out.token_ids):
        assert token in top.indices[step].tolist()
        expected = top.values[step].log_softmax(-1)[top.indices[step].tolist().index(token)]
        assert out.logprobs[step] == pytest.approx(expected.item(), abs=1e-4)


def test_seeded_sampling_is_reproducible(hf, prompt):
    def sample(seed):
        return run(hf.generate(prompt, max_tokens=24, sampling=SamplingParams(temperature=1.0, seed=seed))).token_ids

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)


def test_max_tokens_ends_with_length(hf, prompt, free_run):
    out = run(hf.generate(prompt, max_tokens=5, sampling=GREEDY))
    assert out == Generation(free_run.token_ids[:5], out.logprobs, "length")
    assert run(hf.generate(prompt, max_tokens=0)) == Generation([], [], "length")


def test_stop_token_id_ends_the_turn_and_is_kept(hf, prompt, free_run):
    stop_id = free_run.token_ids[6]
    cut = free_run.token_ids.index(stop_id) + 1
    out = run(hf.generate(prompt, max_tokens=40, stop_token_ids=[stop_id], sampling=GREEDY))
    assert out.token_ids == free_run.token_ids[:cut]
    assert out.finish_reason == "stop"
    assert out.logprobs == pytest.approx(free_run.logprobs[:cut], abs=1e-5)


def test_model_eos_ends_each_row_of_a_batch(model_dir, hf, prompt, free_run):
    model = HFGenerator.from_pretrained(model_dir).model
    eos = free_run.token_ids[4]
    model.generation_config.eos_token_id = eos
    gen = HFGenerator(model, hf.tokenizer, max_batch_size=2)
    prompts = [prompt, prompt[4:], prompt[9:]]
    singles = [run(gen.generate(p, max_tokens=40, sampling=GREEDY)) for p in prompts]

    async def together():
        return await asyncio.gather(*(gen.generate(p, max_tokens=40, sampling=GREEDY) for p in prompts))

    # In batches of at most 2; rows that ended early carry no padding.
    for both, single in zip(run(together()), singles, strict=True):
        assert (both.token_ids, both.finish_reason) == (single.token_ids, single.finish_reason)
        assert both.logprobs == pytest.approx(single.logprobs, abs=1e-4)
    assert singles[0] == Generation(free_run.token_ids[: free_run.token_ids.index(eos) + 1], singles[0].logprobs,
                                    "stop")
    assert gen.eos_token_ids == {eos, hf.tokenizer.eos_token_id}  # the model's EOS and the tokenizer's
    for out in singles:
        assert not gen.eos_token_ids & set(out.token_ids[:-1])
        assert (out.token_ids[-1] in gen.eos_token_ids) == (out.finish_reason == "stop")


def _decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_stop_string_across_tokens_cuts_after_the_completing_token(hf, prompt, free_run):
    tok, ids = hf.tokenizer, free_run.token_ids
    # The stop string ends one character into token k+1, so token k+1 completes it.
    k = first_index(ids, lambda i: 3 <= i < len(ids) - 2 and _decode(tok, ids[i : i + 1]).isprintable()
                    and len(_decode(tok, ids[i + 1 : i + 2])) >= 2 and _decode(tok, ids[i + 1 : i + 2]).isprintable())
    stop = _decode(tok, ids[k : k + 1])[-1] + _decode(tok, ids[k + 1 : k + 2])[0]
    expected_end = first_index(ids, lambda i: stop in _decode(tok, ids[: i + 1])) + 1
    assert expected_end <= k + 2
    out = run(hf.generate(prompt, max_tokens=40, stop=[stop, "never appears"], sampling=GREEDY))
    assert out.token_ids == ids[:expected_end]
    assert stop in _decode(tok, out.token_ids) and out.finish_reason == "stop"
    assert len(out.logprobs) == expected_end


def test_stop_string_inside_one_token_keeps_the_whole_token(hf, prompt, free_run):
    tok, ids = hf.tokenizer, free_run.token_ids
    k = first_index(ids, lambda i: i >= 2 and len(_decode(tok, ids[i : i + 1]).strip()) >= 2)
    stop = _decode(tok, ids[k : k + 1]).strip()[0]
    expected_end = first_index(ids, lambda i: stop in _decode(tok, ids[: i + 1])) + 1
    out = run(hf.generate(prompt, max_tokens=40, stop=[stop], sampling=GREEDY))
    assert out.token_ids == ids[:expected_end]
    assert out.finish_reason == "stop"


def test_concurrent_calls_are_batched_and_match_single_calls(hf, prompt, free_run, monkeypatch):
    requests = [
        {"prompt_ids": prompt, "max_tokens": 16},
        {"prompt_ids": prompt[5:], "max_tokens": 9},
        {"prompt_ids": prompt[:7], "max_tokens": 16, "stop_token_ids": []},
        {"prompt_ids": prompt, "max_tokens": 30, "stop_token_ids": [free_run.token_ids[2]]},  # ends early
    ]
    singles = [run(hf.generate(**r, sampling=GREEDY)) for r in requests]
    calls = []
    real_generate = hf.model.generate
    monkeypatch.setattr(hf.model, "generate", lambda **kw: calls.append(kw["input_ids"].shape) or real_generate(**kw))

    async def together():
        return await asyncio.gather(*(hf.generate(**r, sampling=GREEDY) for r in requests))

    batched = run(together())
    assert calls == [(4, len(prompt))]  # one left-padded batch
    for single, both in zip(singles, batched, strict=True):
        assert both.token_ids == single.token_ids
        assert both.finish_reason == single.finish_reason
        assert both.logprobs == pytest.approx(single.logprobs, abs=1e-4)
    assert batched[3].token_ids == free_run.token_ids[:3] and batched[3].finish_reason == "stop"
    assert len(batched[1].token_ids) == 9 and batched[1].finish_reason == "length"


def test_different_sampling_settings_run_in_separate_batches(hf, prompt, monkeypatch):
    calls = []
    real_generate = hf.model.generate
    monkeypatch.setattr(hf.model, "generate", lambda **kw: calls.append(kw["generation_config"].do_sample)
                        or real_generate(**kw))

    async def mixed():
        return await asyncio.gather(
            hf.generate(prompt, max_tokens=4, sampling=GREEDY),
            hf.generate(prompt, max_tokens=4, sampling=GREEDY),
            hf.generate(prompt, max_tokens=4, sampling=SamplingParams(temperature=0.9)),
            hf.generate(prompt, max_tokens=4, sampling=SamplingParams(temperature=0.9, seed=1)),
        )

    assert len(run(mixed())) == 4
    assert sorted(calls) == [False, False, True]  # greedy, seeded (keyed noise, then argmax), sampled


def test_keyed_gumbel_samples_the_softmax_and_is_a_function_of_seed_and_position():
    logits = torch.tensor([0.0, 1.0, 2.0, -math.inf])
    seeds = torch.arange(20_000, dtype=torch.int64)
    noise = keyed_gumbel(seeds, torch.full_like(seeds, 5), 4)
    counts = torch.bincount((logits + noise).argmax(-1), minlength=4) / len(seeds)
    assert torch.allclose(counts, logits.softmax(-1), atol=0.015) and counts[3] == 0
    assert torch.equal(keyed_gumbel(seeds[7:9], torch.tensor([5, 5]), 4), noise[7:9])  # rows alone = in a batch
    assert not torch.equal(keyed_gumbel(seeds[:2], torch.tensor([6, 6]), 4), noise[:2])  # next position: new noise


def test_seeded_requests_do_not_depend_on_their_batch(hf, prompt, monkeypatch):
    """Seeded requests batch together, and each gets the same tokens and bit-identical logprobs alone, in any
    grouping and in any order: the noise is keyed by (seed, position) and every batch has the same shapes."""
    prompts = [prompt[: 3 + 5 * i] for i in range(6)]

    def seeded(i):
        return hf.generate(prompts[i], max_tokens=16, sampling=SamplingParams(temperature=1.0, seed=100 + i))

    async def grouped(groups):
        out = {}
        for group in groups:
            out.update(zip(group, await asyncio.gather(*(seeded(i) for i in group)), strict=True))
        return [out[i] for i in range(len(prompts))]

    calls = []
    real_generate = hf.model.generate
    monkeypatch.setattr(hf.model, "generate", lambda **kw: calls.append(len(kw["input_ids"])) or real_generate(**kw))
    together = run(grouped([range(6)]))
    assert len(calls) == 1  # one batch (every prompt is under 64 tokens: one padded width)
    for groups in ([[i] for i in range(6)], [[5, 1], [3, 0, 4], [2]]):
        assert [(g.token_ids, g.logprobs) for g in run(grouped(groups))] == \
            [(g.token_ids, g.logprobs) for g in together]
    assert len({tuple(g.token_ids) for g in together}) > 1


def test_generation_leaves_the_event_loop_free(hf, prompt):
    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.002)
                ticks += 1

        ticker = asyncio.create_task(tick())
        start = time.perf_counter()
        await hf.generate(prompt, max_tokens=60, sampling=GREEDY)
        elapsed = time.perf_counter() - start
        ticker.cancel()
        return ticks, elapsed

    ticks, elapsed = run(main())
    assert ticks >= min(5, elapsed / 0.01)


# --- OpenAICompletionsGenerator against a real HTTP server speaking vLLM's schema ---


def vllm_completion(token_ids, logprobs, *, finish_reason="stop", with_token_ids=True, prompt_ids=(1, 2)):
    """A `/v1/completions` response body exactly as vLLM 0.32 shapes it (entrypoints/openai/completion/protocol.py)."""
    tokens = [f"token_id:{t}" for t in token_ids]
    return {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": 1764400000,
        "model": "tiny",
        "choices": [{
            "index": 0,
            "text": "decoded text",
            "logprobs": None if logprobs is None else {
                "text_offset": list(range(len(token_ids))),
                "token_logprobs": logprobs,
                "tokens": tokens,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=False)],
            },
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": list(token_ids) if with_token_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": list(prompt_ids),
        }],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + len(token_ids),
                  "completion_tokens": len(token_ids), "prompt_tokens_details": None},
        "kv_transfer_params": None,
    }


class FakeCompletionsServer:
    """A stdlib HTTP server on 127.0.0.1 answering POST /v1/completions from a queue of (status, body) replies."""

    def __init__(self):
        self.replies: list[tuple[int, dict]] = []
        self.requests: list[dict] = []
        self.hold = None  # called in the request's thread before it answers: to hold requests open
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                server.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                if server.hold is not None:
                    server.hold()
                status, body = server.replies.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # /v1/models and /health, for TRL's client
                data = json.dumps({"data": [{"id": "tiny"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # the default backlog of 5 resets connections when 40 arrive on a busy machine

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    fake = FakeCompletionsServer()
    yield fake
    fake.httpd.shutdown()


def test_openai_generator_sends_token_ids_and_parses_vllm_schema(server):
    server.replies.append((200, vllm_completion([7, 8, 9], [-0.5, -1.25, -0.0625], finish_reason="stop")))
    gen = OpenAICompletionsGenerator(server.url, "tiny")
    assert isinstance(gen, Generator)
    sampling = SamplingParams(temperature=0.6, top_p=0.9, top_k=20, seed=4)
    out = run(gen.generate([1, 2, 3], max_tokens=32, stop=["</code>"], stop_token_ids=[5], sampling=sampling))
    assert out == Generation([7, 8, 9], [-0.5, -1.25, -0.0625], "stop")
    sent = server.requests[0]
    assert sent["prompt"] == [1, 2, 3] and sent["model"] == "tiny" and sent["max_tokens"] == 32
    assert sent["stop"] == ["</code>"] and sent["stop_token_ids"] == [5]
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["seed"]) == (0.6, 0.9, 20, 4)
    assert sent["return_token_ids"] is sent["return_tokens_as_token_ids"] is sent["include_stop_str_in_output"] is True
    assert sent["skip_special_tokens"] is False and sent["logprobs"] == 0


def test_openai_generator_reads_ids_from_logprob_tokens_when_token_ids_are_absent(server):
    server.replies.append((200, vllm_completion([4, 6], [-1.0, -2.0], finish_reason="length", with_token_ids=False)))
    out = run(OpenAICompletionsGenerator(server.url + "/v1", "tiny").generate([1], max_tokens=2))
    assert out == Generation([4, 6], [-1.0, -2.0], "length")


@pytest.mark.parametrize("logprobs", [None, [-1.0], [-1.0, None, -2.0]], ids=["missing", "short", "null-entry"])
def test_openai_generator_raises_on_missing_or_mismatched_logprobs(server, logprobs):
    server.replies.append((200, vllm_completion([4, 6, 8], logprobs)))
    with pytest.raises(LogprobsMismatchError):
        run(OpenAICompletionsGenerator(server.url, "tiny").generate([1], max_tokens=3))


def test_openai_generator_raises_when_logprobs_belong_to_other_tokens(server):
    body = vllm_completion([4, 6], [-1.0, -2.0])
    body["choices"][0]["logprobs"]["tokens"] = ["token_id:4", "token_id:99"]
    server.replies.append((200, body))
    with pytest.raises(LogprobsMismatchError, match="other tokens"):
        run(OpenAICompletionsGenerator(server.url, "tiny").generate([1], max_tokens=3))


def test_openai_generator_retries_server_errors_but_not_client_errors(server):
    server.replies += [(503, {"error": "busy"}), (200, vllm_completion([3], [-0.1]))]
    out = run(OpenAICompletionsGenerator(server.url, "tiny", max_retries=2).generate([1], max_tokens=1))
    assert out.token_ids == [3] and len(server.requests) == 2
    server.replies.append((400, {"error": "bad request"}))
    with pytest.raises(httpx.HTTPStatusError):
        run(OpenAICompletionsGenerator(server.url, "tiny", max_retries=2).generate([1], max_tokens=1))
    assert len(server.requests) == 3


def test_openai_generator_serves_concurrent_calls_across_event_loops(server):
    gen = OpenAICompletionsGenerator(server.url, "tiny")
    for loop_round in range(2):  # one client per event loop: a second asyncio.run must not reuse dead connections
        server.replies += [(200, vllm_completion([i], [-float(i)])) for i in range(1, 6)]

        async def many(prompt):
            outs = await asyncio.gather(*(gen.generate(prompt, max_tokens=1) for _ in range(5)))
            await gen.aclose()
            return outs

        assert sorted(o.token_ids[0] for o in run(many([loop_round]))) == [1, 2, 3, 4, 5]


# --- TRLVLLMClientGenerator ---


class StubVLLMClient:
    """Returns what `trl.generation.vllm_client.VLLMClient.generate` returns: nested top-k logprob lists."""

    def __init__(self, completion, positions):
        self.completion, self.positions, self.calls = completion, positions, []

    def generate(self, prompts, n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=16, logprobs=0,
                 generation_kwargs=None, **_):
        self.calls.append({"prompts": prompts, "temperature": temperature, "top_k": top_k, "max_tokens": max_tokens,
                           "logprobs": logprobs, **(generation_kwargs or {})})
        if self.positions is None:
            return {"prompt_ids": prompts, "completion_ids": [self.completion], "logprobs": None,
                    "logprob_token_ids": None}
        return {"prompt_ids": prompts, "completion_ids": [self.completion],
                "logprobs": [[[lp for _, lp in pos] for pos in self.positions]],
                "logprob_token_ids": [[[t for t, _ in pos] for pos in self.positions]]}


def test_trl_generator_takes_the_sampled_tokens_logprob_and_passes_stops():
    # Sorted by probability, as the client returns them: the sampled token 9 is not first at step 2.
    client = StubVLLMClient([5, 9, 2], [[(5, -0.1)], [(4, -0.3), (9, -1.7)], [(2, -0.2)]])
    gen = TRLVLLMClientGenerator(client, eos_token_ids=[2])
    assert isinstance(gen, Generator)
    out = run(gen.generate([1, 1], max_tokens=3, stop=["</code>"], stop_token_ids=[7],
                           sampling=SamplingParams(temperature=0.0, seed=3)))
    assert out == Generation([5, 9, 2], [-0.1, -1.7, -0.2], "stop")
    call = client.calls[0]
    assert call["prompts"] == [[1, 1]] and call["top_k"] == 0 and call["logprobs"] == 0 and call["seed"] == 3
    assert call["stop"] == ["</code>"] and call["stop_token_ids"] == [7] and call["include_stop_str_in_output"]


def test_trl_generator_finish_reason_and_missing_logprobs():
    full = StubVLLMClient([5, 6], [[(5, -0.1)], [(6, -0.2)]])
    assert run(TRLVLLMClientGenerator(full).generate([1], max_tokens=2)).finish_reason == "length"
    assert run(TRLVLLMClientGenerator(full).generate([1], max_tokens=3)).finish_reason == "stop"
    with pytest.raises(LogprobsMismatchError):
        run(TRLVLLMClientGenerator(StubVLLMClient([5, 6], None)).generate([1], max_tokens=2))
    with pytest.raises(LogprobsMismatchError):
        run(TRLVLLMClientGenerator(StubVLLMClient([5, 6], [[(5, -0.1)], [(8, -0.2)]])).generate([1], max_tokens=2))


def test_trl_generator_with_the_real_client_generate_against_the_fake_server(server):
    """The real `VLLMClient.generate` and its logprob parsing, on an instance made without the vllm-only __init__."""
    vllm_client = pytest.importorskip("trl.generation.vllm_client")
    requests = pytest.importorskip("requests")
    client = object.__new__(vllm_client.VLLMClient)
    client.session, client.base_url, client.model = requests.Session(), server.url, "tiny"
    server.replies.append((200, vllm_completion([11, 12], [-0.25, -0.5], prompt_ids=[1, 2])))
    out = run(TRLVLLMClientGenerator(client).generate([1, 2], max_tokens=8, stop=["x"]))
    assert out == Generation([11, 12], [-0.25, -0.5], "stop")
    sent = server.requests[0]
    assert sent["prompt"] == [[1, 2]] and sent["stop"] == ["x"] and sent["return_token_ids"] is True


def real_trl_client(url):
    """TRL's real `VLLMClient`, made without its vllm-only `__init__`, pointed at the fake server."""
    vllm_client = pytest.importorskip("trl.generation.vllm_client")
    requests = pytest.importorskip("requests")
    client = object.__new__(vllm_client.VLLMClient)
    client.session, client.base_url, client.model = requests.Session(), url, "tiny"
    return client


def test_trl_generator_keeps_its_concurrency_in_flight(server):
    """asyncio's default pool would hold the turns in flight to min(32, cores + 4); the generator's own pool to its
    `concurrency`: all 40 requests reach the server before any is answered."""
    n, lock, arrived = 40, threading.Lock(), threading.Event()
    state = {"in_flight": 0, "most": 0}

    def hold():
        with lock:
            state["in_flight"] += 1
            state["most"] = max(state["most"], state["in_flight"])
            if state["in_flight"] == n:
                arrived.set()
        arrived.wait(timeout=15)
        with lock:
            state["in_flight"] -= 1

    server.hold = hold
    server.replies.extend((200, vllm_completion([11], [-0.5], prompt_ids=[1])) for _ in range(n))
    gen = TRLVLLMClientGenerator(real_trl_client(server.url), concurrency=n)

    async def many():
        return await asyncio.gather(*(gen.generate([1], max_tokens=4) for _ in range(n)))

    try:
        outs = run(many())
    finally:
        gen.close()
    assert state["most"] == n and all(o == Generation([11], [-0.5], "stop") for o in outs)


def test_trl_generator_gives_up_on_a_stuck_server(server):
    release = threading.Event()
    server.hold = lambda: release.wait(timeout=10)
    server.replies.append((200, vllm_completion([11], [-0.5], prompt_ids=[1])))
    gen = TRLVLLMClientGenerator(real_trl_client(server.url), timeout_s=0.3)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"no answer in 0\.3 s"):
            run(gen.generate([1], max_tokens=4))
        assert time.monotonic() - started < 5
    finally:
        release.set()
        gen.close()
