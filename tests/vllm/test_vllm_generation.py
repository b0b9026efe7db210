"""vLLM backends against HFGenerator on the same tiny model: in-process engines, vLLM's OpenAI server through
OpenAICompletionsGenerator, and TRL's real VLLMClient through TRLVLLMClientGenerator.

Runs only in .venv-vllm (scripts/test_vllm.sh); elsewhere it skips. Every backend gets the same greedy requests
(plain, a stop token id, a stop string that spans two tokens, a short prompt) at once, and must return HF's token
ids, finish reasons and, within 1e-3, HF's logprobs (float32; vLLM's default logprobs_mode "raw_logprobs" matches
HFGenerator's default). The OpenAI server is started first so its start-up overlaps the in-process engines'.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm", reason="needs the vLLM environment: scripts/test_vllm.sh (.venv-vllm)")

from retool_adapters.generators import (
    HFGenerator,
    OpenAICompletionsGenerator,
    TRLVLLMClientGenerator,
    VLLMEngineGenerator,
)
from retool_adapters.offline_models import build_tiny_qwen
from retool_env.rollout import Generation, SamplingParams

# Engine start-up alone took 4 minutes on a loaded 2-core machine: more than pyproject's 300 s default.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

GREEDY = SamplingParams(temperature=0.0)
LOGPROB_TOLERANCE = 1e-3
ENGINE_ARGS = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "gpu_memory_utilization": 0.1}
# On CPU: force the CPU platform, and a small KV cache so two engines and a server fit beside each other.
CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="session", autouse=True)
def cpu_env():
    with pytest.MonkeyPatch.context() as patch:
        for key, value in CPU_ENV.items():
            patch.setenv(key, value)
        yield


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return build_tiny_qwen(tmp_path_factory.mktemp("tiny_qwen"))


@pytest.fixture(scope="session")
def server(model_dir, tmp_path_factory):
    """vLLM's OpenAI server as a subprocess (the `vllm` CLI fails for the vllm-cpu distribution); yields its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = tmp_path_factory.mktemp("server") / "vllm_server.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "512",
               "--enforce-eager", "--gpu-memory-utilization", "0.1"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **CPU_ENV})
    url = f"http://127.0.0.1:{port}"
    yield process, url, log_path
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="session")
def server_url(server):
    """Waits until the server answers /health."""
    process, url, log_path = server
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vLLM server exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return url
        except OSError:
            time.sleep(1)
    pytest.fail(f"vLLM server not healthy after 300 s:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def hf(model_dir):
    return HFGenerator.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def requests_and_reference(hf):
    """Greedy requests covering plain, stop-id, stop-string and short-prompt turns, with HF's answers."""
    tok = hf.tokenizer
    # A random model may emit EOS early: take the first prompt whose greedy turn runs the full 32 tokens.
    for question in ["What is 2 + 2?", "Compute 17 * 23 with code.", "Solve x^2 = 49.", "Hello", "Sum 1 to 100."]:
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]
        free = asyncio.run(hf.generate(prompt, max_tokens=32, sampling=GREEDY)).token_ids
        if len(free) == 32:
            break

    def text(ids):
        return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    k = next(i for i in range(3, len(free) - 2) if text(free[i : i + 1]).isprintable() and text(free[i : i + 1])
             and text(free[i + 1 : i + 2]).isprintable() and len(text(free[i + 1 : i + 2])) >= 2)
    spanning = text(free[k : k + 1])[-1] + text(free[k + 1 : k + 2])[0]
    requests = [
        {"prompt_ids": prompt, "max_tokens": 32},
        {"prompt_ids": prompt, "max_tokens": 32, "stop_token_ids": [free[5]]},
        {"prompt_ids": prompt, "max_tokens": 32, "stop": [spanning]},
        {"prompt_ids": prompt[:6], "max_tokens": 20},
    ]
    reference = asyncio.run(_generate_all(hf, requests))
    assert reference[1].finish_reason == reference[2].finish_reason == "stop"
    return requests, reference


async def _generate_all(generator, requests) -> list[Generation]:
    return await asyncio.gather(*(generator.generate(**r, sampling=GREEDY) for r in requests))


def assert_matches(outputs: list[Generation], reference: list[Generation]) -> None:
    for out, ref in zip(outputs, reference, strict=True):
        assert out.token_ids == ref.token_ids
        assert out.finish_reason == ref.finish_reason
        difference = max(abs(a - b) for a, b in zip(out.logprobs, ref.logprobs, strict=True))
        print(f"{len(out.token_ids)} tokens match HF, max |logprob difference| {difference:.2e}")
        assert difference < LOGPROB_TOLERANCE


def test_async_engine_matches_hf(server, model_dir, requests_and_reference):
    """AsyncLLM: each turn is its own request, batched continuously by vLLM. `server` only starts the server early."""
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    requests, reference = requests_and_reference

    async def main():
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(model_dir), **ENGINE_ARGS))
        try:
            generator = VLLMEngineGenerator(engine)
            outputs = await _generate_all(generator, requests)
            seeded = SamplingParams(temperature=1.0, seed=7)
            draws = await asyncio.gather(*(generator.generate(requests[0]["prompt_ids"], max_tokens=16,
                                                              sampling=seeded) for _ in range(2)))
            return outputs, draws
        finally:
            engine.shutdown()

    outputs, draws = asyncio.run(main())
    assert_matches(outputs, reference)
    assert draws[0].token_ids == draws[1].token_ids and len(draws[0].logprobs) == 16


def test_openai_server_matches_hf(model_dir, server_url, requests_and_reference):
    requests, reference = requests_and_reference
    generator = OpenAICompletionsGenerator(server_url, str(model_dir))
    assert_matches(asyncio.run(_generate_all(generator, requests)), reference)


def test_trl_vllm_client_matches_hf(server_url, requests_and_reference, hf):
    """TRL 1.16's VLLMClient posts to vLLM's own /v1/completions (`trl vllm-serve` only runs vLLM's server now)."""
    from trl.generation.vllm_client import VLLMClient

    requests, reference = requests_and_reference
    client = VLLMClient(base_url=server_url, connection_timeout=60)
    generator = TRLVLLMClientGenerator(client, eos_token_ids=sorted(hf.eos_token_ids))
    assert_matches(asyncio.run(_generate_all(generator, requests)), reference)


def test_llm_engine_matches_hf(model_dir, requests_and_reference):
    """`vllm.LLM`, as TRL's colocate mode holds it: blocking, so concurrent calls are batched in a thread."""
    from vllm import LLM

    requests, reference = requests_and_reference
    llm = LLM(model=str(model_dir), **ENGINE_ARGS)
    try:
        assert_matches(asyncio.run(_generate_all(VLLMEngineGenerator(llm, batch_window_ms=20), requests)), reference)
    finally:
        llm.llm_engine.engine_core.shutdown()
