"""Non-hermes tool-call dialects through every entry point: a call written in the model's dialect is parsed and run,
and each adapter hands its trainer exactly the tokens, mask, logprobs and reward of the environment stepped by hand.

Dialects: qwen3_coder (Qwen3.6's XML calls), llama3_json (Llama 3.1's JSON with `parameters`), glm45 (GLM-4.5's
`<arg_key>` form) and openai (gpt-oss harmony), each with the family's TRL template copied under
`tests/fixtures/chat_templates/trl/` (so the framework venv, which has no TRL, runs them too) on Qwen's offline
vocabulary plus the special tokens the template spells, as `tests/test_dialect_parity.py` builds them. Each episode
is one call turn as the template renders it from an assistant message with `tool_calls`, then the right answer as
the template renders a plain assistant message. The framework stand-ins are those of the hermes adapter tests
(`tests/test_adapter_*.py`), each named there; TRL's rollout_func gets a trainer stand-in holding the fields it reads
(the real GRPOTrainer path runs in tests/test_trl.py).
"""

from __future__ import annotations

import asyncio
import copy
import functools
from pathlib import Path
from types import SimpleNamespace

import pytest

from retool_env import ToolEnvironment
from retool_env.dialects import get_dialect
from retool_env.formats import encode
from retool_env.rollout import run_episode

from .test_adapter_scripted import LOGPROB, PROBLEM, Record, ScriptedEngine
from .test_dialect_parity import _EOS, _SPECIAL, render, scripted_call

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates" / "trl"
# dialect -> the TRL 1.16 template that teaches it (the prefix-preserving training version where TRL has one)
DIALECT_TEMPLATES = {"qwen3_coder": "qwen3_6_training", "llama3_json": "llama3_1", "glm45": "glm4moe_training",
                     "openai": "gptoss_training"}
DIALECTS = sorted(DIALECT_TEMPLATES)
ANSWER = "The product is \\boxed{56088}."


@functools.cache
def dialect_tokenizer(dialect: str):
    """Qwen's offline vocabulary with the template's special tokens and end token, rendering with the template."""
    from retool_env.offline import qwen_tokenizer

    template = (TEMPLATES / f"{DIALECT_TEMPLATES[dialect]}.jinja").read_text(encoding="utf-8")
    tok = copy.deepcopy(qwen_tokenizer())
    known = set(tok.get_added_vocab())
    extra = sorted({t for t in _SPECIAL.findall(template) if t not in known})
    if extra:
        tok.add_special_tokens({"additional_special_tokens": extra})
    tok.eos_token = next(t for t in _EOS if t in template or t in known)
    tok.chat_template = template
    return tok


def make_env(tok, **kwargs) -> ToolEnvironment:
    return ToolEnvironment(tok, [PROBLEM], tool_timeout=10.0, **kwargs)  # tool_format="auto": the template's dialect


@functools.cache
def actions(dialect: str) -> tuple[tuple[int, ...], ...]:
    """The episode's turns as the model writes them: a call running `print(123 * 456)`, then the answer."""
    tok = dialect_tokenizer(dialect)
    env = make_env(tok)
    env.reset(options={"problem": PROBLEM})
    _, call = scripted_call(env, "print(123 * 456)")
    env.step(call)
    messages = env._conversation.messages
    prompt = render(tok, messages)
    full = render(tok, [*messages, {"role": "assistant", "content": ANSWER}], add_generation_prompt=False)
    assert full.startswith(prompt)
    answer = encode(tok, full[len(prompt):])
    answer = answer[: next(i for i, t in enumerate(answer) if t in env.format.end_token_ids) + 1]
    env.close()
    return tuple(call), tuple(answer)


def engine(dialect: str) -> ScriptedEngine:
    return ScriptedEngine(actions(dialect))


@functools.cache
def reference(dialect: str, **env_kwargs) -> Record:
    """The episode stepped by hand on a local environment: what every adapter must hand its trainer."""
    tok = dialect_tokenizer(dialect)
    env = make_env(tok, **env_kwargs)
    env.reset(options={"problem": PROBLEM})
    assert env.format.name == dialect
    for ids in actions(dialect):
        *_, terminated, truncated, info = env.step({"token_ids": list(ids), "logprobs": [LOGPROB] * len(ids)})
    traj = env.trajectory
    env.close()
    assert terminated and not truncated and traj.reward == 1.0
    (call,) = traj.tool_calls
    assert call.status == "ok" and call.output.strip() == "56088" and call.code.strip() == "print(123 * 456)"
    # The model's tokens are its two turns exactly, mask 1; everything the environment inserted is mask 0
    model = [t for t, m in zip(traj.completion_ids, traj.env_mask, strict=True) if m == 1]
    assert model == [t for turn in actions(dialect) for t in turn]
    assert "56088" in tok.decode([t for t, m in zip(traj.completion_ids, traj.env_mask, strict=True) if m == 0])
    return Record(traj.prompt_ids, traj.completion_ids, traj.env_mask, traj.logprobs, traj.reward)


def record(traj) -> Record:
    return Record(traj.prompt_ids, traj.completion_ids, traj.env_mask, traj.logprobs, traj.reward)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_call_is_written_in_the_dialect_and_the_rollout_driver_plays_it(dialect):
    """`ToolEnvironment` under `run_episode` (the driver of TRL's rollout_func and the async worker)."""
    tok = dialect_tokenizer(dialect)
    call_text = tok.decode(actions(dialect)[0])
    marker = {"qwen3_coder": "<function=code_interpreter>", "llama3_json": '"parameters": ',
              "glm45": "<arg_key>code</arg_key>", "openai": "to=functions.code_interpreter"}[dialect]
    assert marker in call_text and "<tool_call>\n{" not in call_text  # not hermes
    assert get_dialect(dialect).parse(call_text).calls[0].arguments == {"code": "print(123 * 456)"}
    traj = asyncio.run(run_episode(make_env(tok), engine(dialect), problem=PROBLEM))
    assert record(traj) == reference(dialect)


# --------------------------------------------------------------------------------------------------------- TRL
def trainer_stand_in(tok, max_completion_length: int = 2048):
    """The fields ReToolRollout reads from a GRPOTrainer (the real trainer runs in tests/test_trl.py)."""
    from collections import defaultdict

    metrics = defaultdict(list)
    args = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, seed=42,
                           max_completion_length=max_completion_length, chat_template_kwargs=None, use_vllm=False)
    return SimpleNamespace(args=args, accelerator=SimpleNamespace(process_index=0), processing_class=tok,
                           eos_token_ids=[tok.eos_token_id], state=SimpleNamespace(global_step=0),
                           model=SimpleNamespace(training=True), metrics=metrics,
                           _log_metric=lambda name, value: metrics[name].append(value))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_trl_rollout_func(dialect):
    pytest.importorskip("trl", reason="TRL is not installed in this venv")
    from retool_adapters.trl import ReToolRollout

    tok = dialect_tokenizer(dialect)
    rollout = ReToolRollout([PROBLEM], tokenizer=tok, generator=engine(dialect), tool_timeout=10.0)
    trainer = trainer_stand_in(tok)
    out = rollout([[{"role": "user", "content": PROBLEM.question}]], trainer)
    ref = reference(dialect, max_completion_tokens=2048)
    n = len(ref.completion_ids)
    completion, mask, logprobs = out["completion_ids"][0], out["env_mask"][0], out["logprobs"][0]
    assert Record(out["prompt_ids"][0], completion[:n], mask[:n], logprobs[:n], out["env_reward"][0]) == ref
    # At most TRL's end token after it (see TRLEndTokens), never trained on
    assert completion[n:] in ([], [tok.eos_token_id]) and set(mask[n:]) <= {0}
    assert out["num_tool_calls"] == [1] and out["correct"] == [True] and not out["aborted"][0]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_trl_async_rollout_worker(dialect):
    pytest.importorskip("trl.experimental.async_grpo", reason="TRL's async GRPO is not installed in this venv")
    from retool_adapters.trl.async_worker import ReToolRolloutWorker

    tok = dialect_tokenizer(dialect)
    worker = ReToolRolloutWorker([PROBLEM], tok, engine(dialect), num_generations=1, tool_timeout=10.0)
    asyncio.run(worker._play_group(PROBLEM, group_id=0))
    sample = worker.rollout_buffer.get_nowait()
    ref = reference(dialect)
    prompt = len(ref.prompt_ids)
    assert sample.input_ids.tolist() == ref.prompt_ids + ref.completion_ids
    assert sample.completion_mask.tolist() == [0] * prompt + ref.env_mask
    assert sample.old_log_probs.tolist() == [0.0] * prompt + ref.logprobs
    assert sample.metrics["reward"] == ref.reward


# ------------------------------------------------------------------------------------------------------- verl
@pytest.mark.parametrize("dialect", DIALECTS)
def test_verl_agent_loop(dialect):
    from .test_adapter_verl import ROW, ServerManager, make_agent_loop
    from .test_adapter_verl import record as verl_record

    tok = dialect_tokenizer(dialect)
    manager = ServerManager(engine(dialect))
    loop = make_agent_loop(tok, manager, tool_timeout=10.0)  # skips without verl
    output = asyncio.run(loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **ROW))
    assert verl_record(output.model_dump()) == reference(dialect, max_completion_tokens=2048)
    assert output.extra_fields["reward_extra_info"]["acc"] == 1.0
    # The dialect's stops reach verl's server (gpt-oss's <|call|> is a stop token of its own)
    stops = manager.calls[0]["sampling_params"]["stop_token_ids"]
    assert actions(dialect)[0][-1] in stops


# ------------------------------------------------------------------------------------------------------ slime
@pytest.mark.parametrize("backend", ["sglang", "vllm"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_slime_generate(dialect, backend, tmp_path):
    from retool_adapters import slime

    from .slime_standin import Sample
    from .test_adapter_slime import Engine

    tok = dialect_tokenizer(dialect)
    tok.save_pretrained(tmp_path)  # slime loads the tokenizer from --hf-checkpoint
    server = Engine(backend, [list(a) for a in actions(dialect)])
    args = SimpleNamespace(hf_checkpoint=str(tmp_path), rollout_max_response_len=2048, retool_router_url=server.url,
                           retool_backend=backend, retool_env={"tool_timeout": 10.0})
    sample = Sample(index=0, prompt=PROBLEM.question, label=PROBLEM.answer)
    params = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_new_tokens": 2048, "no_stop_trim": True}
    try:
        sample = asyncio.run(slime.generate(args, sample, params))
    finally:
        server.close()
    ref = reference(dialect)
    n = len(ref.prompt_ids)
    assert Record(sample.tokens[:n], sample.tokens[n:], sample.loss_mask, sample.rollout_log_probs,
                  sample.reward) == ref


# ------------------------------------------------------------------------------------------------------ SkyRL
# SkyRL tokenizes observation messages itself, by rendering them after a fixed base conversation: a template whose
# tool turn needs the call message before it (gpt-oss harmony), or whose base ends in text that merges with the tool
# turn's first token (GLM-4.5: "user." + "\n" is one token), cannot come out as the template's own tokens that way.
SKYRL_FIXED_BASE_FAILS = "SkyRL's fixed-base rule cannot render this template's tool turn exactly (see above)"


@pytest.mark.parametrize("dialect", [
    d if d in ("qwen3_coder", "llama3_json") else
    pytest.param(d, marks=pytest.mark.xfail(strict=True, reason=SKYRL_FIXED_BASE_FAILS))
    for d in DIALECTS])
def test_skyrl_text_env(dialect):
    """SkyRL's generator as tests/test_adapter_skyrl.py replays it (the chat-template path, fixed-base rule)."""
    skyrl_gym = pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed here")
    from retool_adapters.skyrl import CHAT_TEMPLATE_KWARGS, ENV_ID

    from .test_adapter_skyrl import BASE

    tok = dialect_tokenizer(dialect)
    env = skyrl_gym.make(ENV_ID, env_config={"tokenizer": tok, "tool_timeout": 10.0},
                         extras={"reward_spec": {"method": "rule", "ground_truth": PROBLEM.answer}, "max_turns": 8})
    chat_history, _ = env.init([{"role": "user", "content": PROBLEM.question}])
    prompt_ids = tok.apply_chat_template(chat_history, add_generation_prompt=True, tokenize=True, return_dict=False,
                                         **CHAT_TEMPLATE_KWARGS)
    base_ids = tok.apply_chat_template(BASE, add_generation_prompt=False, tokenize=True, return_dict=False,
                                       **CHAT_TEMPLATE_KWARGS)
    if tok.eos_token_id in base_ids:
        base_ids = base_ids[: len(base_ids) - base_ids[::-1].index(tok.eos_token_id)]
    response_ids, loss_mask = [], []
    for output_ids in actions(dialect):
        step = env.step(tok.decode(output_ids))
        obs_ids = []
        if step["observations"]:
            obs_ids = tok.apply_chat_template([*BASE, *step["observations"]], add_generation_prompt=not step["done"],
                                              tokenize=True, return_dict=False, **CHAT_TEMPLATE_KWARGS)[len(base_ids):]
        response_ids += list(output_ids) + obs_ids
        loss_mask += [1] * len(output_ids) + [0] * len(obs_ids)
        if step["done"]:
            break
    env.close()
    ref = reference(dialect)
    assert Record(list(prompt_ids), response_ids, loss_mask, None, step["reward"]) == Record(
        ref.prompt_ids, ref.completion_ids, ref.env_mask, None, ref.reward)


# ---------------------------------------------------------------------------------------------------- OpenEnv
@pytest.mark.parametrize("dialect", DIALECTS)
def test_openenv_remote_environment(dialect):
    pytest.importorskip("openenv.core", reason="openenv-core is not installed here")
    from retool_adapters.openenv import RemoteToolEnvironment, create_app

    from .test_adapter_openenv import Server

    tok = dialect_tokenizer(dialect)
    server = Server(create_app(lambda: make_env(tok), max_concurrent_envs=2))
    env = RemoteToolEnvironment(server.url)
    try:
        traj = asyncio.run(run_episode(env, engine(dialect), problem=PROBLEM))
    finally:
        env.close()
        server.stop()
    assert record(traj) == reference(dialect)
    assert [(c.status, c.output.strip()) for c in traj.tool_calls] == [("ok", "56088")]


# ---------------------------------------------------------------------------------------------- cold-start SFT
@pytest.mark.parametrize("dialect", DIALECTS)
def test_coldstart_sft_rows_are_rendered_in_the_dialect(dialect):
    """training/sft_trl.py's data path (tool_format="auto"): every replayed solution calls the tool in the model's
    dialect, and its tokens are exactly the template's rendering of the whole conversation, the mask on the
    model's turns only."""
    pytest.importorskip("trl", reason="training/sft_trl.py needs TRL")
    from retool_env.coldstart import arith_solutions, replay, sft_features
    from retool_env.data import arith_split
    from training import sft_trl

    tok = dialect_tokenizer(dialect)
    args = sft_trl.DataArguments(dataset="arith", dataset_limit=3, levels=["modpow"], text_share=0.0,
                                 self_correct_share=0.5, tool_timeout=10.0)
    rows = sft_trl.coldstart_rows(args, tok)
    assert len(rows) == 3 and {row["kind"] for row in rows} == {"code", "self_correct"}
    solutions = arith_solutions(arith_split("train", 3, ["modpow"]), seed=0, text_share=0.0, self_correct_share=0.5)
    env = make_env(tok, max_completion_tokens=16384)
    for row, solution in zip(rows, solutions, strict=True):
        traj = replay(env, solution)
        assert sft_features(traj) == {"input_ids": row["input_ids"], "assistant_masks": row["assistant_masks"]}
        ids, mask = row["input_ids"], row["assistant_masks"]
        model_text = tok.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
        assert "<tool_call>\n{" not in model_text  # not hermes
        calls = [call for turn in traj.turns for call in env.format.parse(
            traj.completion_ids[turn.start:turn.end]).tool_calls]
        assert all(call.code for call in calls) and len(calls) == row["num_tool_calls"] == len(traj.tool_calls) >= 1
        assert traj.rewritten_turns == 0 and traj.reward == 1.0
        # The context before the answer turn (the prompt, every call turn and tool turn) is the template's own
        # rendering of the conversation (each model turn tokenized on its own, as a policy samples it), then the
        # answer turn, all trained
        text, context = tok.decode(ids), env._conversation.text
        assert text.startswith(context) and mask[: len(traj.prompt_ids)] == [0] * len(traj.prompt_ids)
        answer = next(s.content for s in solution.segments if s.kind == "answer")
        assert answer in text[len(context):]
        for turn in traj.turns:  # each model turn mask 1, what the environment inserted after it mask 0
            offset = len(traj.prompt_ids)
            assert set(mask[offset + turn.start: offset + turn.end]) == {1}
            assert set(mask[offset + turn.end: offset + turn.env_end]) <= {0}
    env.close()


# ------------------------------------------------------------------------- TRL's environment_factory parser
# With `environment_factory` (CodeInterpreterEnvironment), TRL 1.16 parses the calls itself: GRPOTrainer calls
# `add_response_schema`, which knows a template only by its exact text, then `parse_response`. One template per
# family, with what TRL's parser reads from a call the template itself renders.
TRL_PARSES = {"qwen3": True, "qwen3_6": True, "nemotron_3_nano": True, "llama3_1": True, "glm4moe": True,
              "gptoss": True, "gemma4": True,
              "lfm2_v2": False,  # TRL's LFM2 response template misreads the quoted argument ("'print(6 * 7")
              "deepseek_r1_distill": False,  # a response template, but no call read from the content
              "deepseekv3": None, "lfm2": None, "muse_glimmer": None}  # None: add_response_schema refuses it


@pytest.mark.parametrize("name", sorted(TRL_PARSES))
def test_which_templates_trls_own_tool_call_parser_reads(name):
    pytest.importorskip("trl", reason="TRL is not installed in this venv")
    from trl.chat_template_utils import add_response_schema, parse_response

    from retool_env.chat import chat_template_names
    from retool_env.formats import CODE_INTERPRETER_TOOL

    from .test_chat_templates import PROBLEM as TEMPLATE_PROBLEM
    from .test_dialect_parity import family_tokenizer

    if name not in chat_template_names():
        pytest.skip(f"TRL ships no {name} template")
    tok = copy.deepcopy(family_tokenizer(name))
    if TRL_PARSES[name] is None:
        with pytest.raises(ValueError, match="Unrecognized chat template"):
            add_response_schema(tok)
        return
    add_response_schema(tok)
    env = ToolEnvironment(tok, [TEMPLATE_PROBLEM])
    prompt, _ = env.reset(options={"problem": TEMPLATE_PROBLEM})
    _, ids = scripted_call(env, "print(6 * 7)")
    parsed = parse_response(tok, ids, prefix=prompt.tolist(), tools=[CODE_INTERPRETER_TOOL])
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.get("tool_calls") or []]
    assert (calls == [("code_interpreter", {"code": "print(6 * 7)"})]) is TRL_PARSES[name]
    # The environment's own dialect reads the same tokens exactly, whatever TRL does
    assert [c.code for c in env.format.parse(ids).tool_calls] == ["print(6 * 7)"]
