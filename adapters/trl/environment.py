"""TRL's `environment_factory` path: ReTool-Env's sandbox as the `code_interpreter` tool of TRL's own tool loop.

TRL parses the tool calls and renders the tool turns; every call then follows the episode rules `ToolEnvironment`
follows (`retool_env.tool_runner.ToolRunner`: budget, sandbox, observation text, records), and the reward takes the
same `EpisodeStats`. `from retool_adapters.trl import CodeInterpreterEnvironment` imports it too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from retool_env.config import EnvConfig
from retool_env.formats import (
    CODE_INTERPRETER_TOOL,
    ToolCall,
    resolve_tool_format,
    strip_code_fences,
)
from retool_env.grading import Grade, grade
from retool_env.rewards import EpisodeStats, count_tool_rounds, get_reward_fn
from retool_env.sandbox import Sandbox
from retool_env.tokens import load_tokenizer
from retool_env.tool_runner import ToolRunner
from retool_env.trajectory import ToolCallRecord, ToolStatus

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, even where an event loop already runs (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


# The dialects TRL 1.16's own parser (`add_response_schema`, `parse_response`) reads correctly from a call its own
# template renders (tests/test_dialect_entry_points.py); it misreads LFM2's and reads no call from DeepSeek's.
TRL_PARSED_DIALECTS = ("hermes", "qwen3_coder", "llama3_json", "glm45", "openai", "gemma4")


class CodeInterpreterEnvironment:
    """TRL's `environment_factory` environment: ReTool-Env's sandbox as a `code_interpreter` tool.

    ```python
    factory = functools.partial(CodeInterpreterEnvironment, tokenizer, max_tool_calls=4, reward="retool")
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=GRPOConfig(..., reward_weights=[0.0]),
        train_dataset=problems_to_dataset(problems, prompt="slime"),   # chat messages, plus `answer`
        reward_funcs=[grade_final_answers],   # grades in each rollout's environment; weight 0: accuracy in the logs
        environment_factory=factory,          # or {"name": factory, ...} with an `environment` column
    )
    ```

    TRL makes one instance per rollout, calls `reset(**row)` with its dataset row (which carries `answer`), offers
    `code_interpreter` as a tool (it parses `<tool_call>`, renders the tool turn with the chat template and masks its
    tokens out of the loss), and adds `get_reward()` as a reward column of weight 1. A tool call runs as a step of
    `ToolEnvironment` runs it: the same shared sandbox, `tool_timeout`, echo of a trailing expression, a sandbox
    session per episode when `stateful`, output clipped to `max_observation_tokens` tokens (head and tail), and
    calls past `max_tool_calls` refused. `get_reward()` applies the same reward scheme to the same grade and tool
    counts, so a scripted episode earns what it earns in `ToolEnvironment`. The environment never sees the model's
    text, so `grade_final_answers` (a reward function, which TRL runs before the environment's column) hands each
    environment its rollout's final answer.

    What this path cannot do that `ReToolRollout` (`rollout_func`) can: the paper's `retool` format (TRL parses only
    the chat template's own tool calls); observation tokens exactly as the environment renders them (TRL renders the
    tool turn its own way; the prompt, tool schema included, is the same); ending an episode at `max_tool_calls`
    (TRL keeps generating, so the model is told to answer instead); a per-turn budget
    (`max_turn_tokens`; the episode's budget is GRPOConfig's `max_completion_length`); episodes that never wait for
    each other (TRL's tool rounds are lockstep). Picklable, as AsyncGRPOTrainer requires, when its arguments are.
    TRL offers every public method as a tool, so the helpers are private.
    """

    def __init__(self, tokenizer: Any, **config: Any) -> None:
        self.config = EnvConfig(**config)
        self.tokenizer = load_tokenizer(tokenizer)
        tool_format = resolve_tool_format(self.config.tool_format, self.tokenizer)
        if tool_format not in TRL_PARSED_DIALECTS:
            raise ValueError(f"TRL's tool loop parses the chat template's own tool calls, and reads them correctly in "
                             f"{', '.join(TRL_PARSED_DIALECTS)}; the {tool_format!r} format needs ReToolRollout "
                             f"(rollout_func), which parses every dialect")
        if self.config.max_turn_tokens is not None:
            raise ValueError("TRL's tool loop has no per-turn budget; unset max_turn_tokens, or use ReToolRollout")
        if self.config.on_timeout != "feedback":
            raise ValueError("TRL's tool loop cannot end an episode at a tool timeout; keep on_timeout='feedback', "
                             "or use ReToolRollout")
        self.tools = ToolRunner(self.config, self.tokenizer)  # the rules ToolEnvironment's calls follow
        self.reward_fn = get_reward_fn(self.config.reward, **self.config.reward_options)
        self.answer: str | None = None
        self.tool_calls: list[ToolCallRecord] = []
        self.grade: Grade | None = None  # the final answer's, from grade_final_answers
        self.num_turns = 0
        self.num_tool_rounds: int | None = None
        self._session: str | None = None

    @property
    def sandbox(self) -> Sandbox:
        return self.tools.sandbox

    def reset(self, **row: Any) -> None:
        """A new episode for the dataset row, which must carry the gold `answer`; the prompt stays the row's."""
        if "answer" not in row:
            raise KeyError("CodeInterpreterEnvironment needs the gold answer in the dataset's `answer` column; build "
                           "the dataset with problems_to_dataset(problems, prompt=...)")
        self._end_session()
        self.answer, self.tool_calls, self.grade, self.num_turns = str(row["answer"]), [], None, 0
        self.num_tool_rounds = None
        self._session = f"trl-episode-{next(_trl_episodes)}" if self.config.stateful else None

    def code_interpreter(self, code: str):  # no return annotation: TRL would add it to the tool's schema
        code = strip_code_fences(code) if isinstance(code, str) else ""
        if self.tools.calls_left(self.tool_calls) <= 0:  # TRL keeps generating: tell the model to answer instead
            record = self.tools.refused(code)
        else:
            call = ToolCall(code) if code.strip() else ToolCall(None, "the code is empty.")
            record = run_sync(self.tools.run(call, session=self._session, code=code))
        self.tool_calls.append(record)
        return record.output

    # TRL builds the tool's schema from this docstring: make it the schema ToolEnvironment's prompts advertise.
    code_interpreter.__doc__ = "{description}\n\nArgs:\n    code: {code}\n".format(
        description=CODE_INTERPRETER_TOOL["function"]["description"],
        code=CODE_INTERPRETER_TOOL["function"]["parameters"]["properties"]["code"]["description"])

    def get_reward(self) -> float:
        """The reward scheme's value for the graded final answer and the episode's tool calls."""
        if self.grade is None:
            raise RuntimeError("CodeInterpreterEnvironment has not seen the rollout's final answer: put "
                               "grade_final_answers in GRPOTrainer's reward_funcs (weight 0); it hands the answer "
                               "over. AsyncGRPOTrainer shows its reward functions no environment: there, use "
                               "retool_adapters.trl.async_worker.ReToolRolloutWorker")
        return float(self.reward_fn(self.grade, self._episode_stats()))

    def _episode_stats(self) -> EpisodeStats:
        refused = any(call.status == ToolStatus.SKIPPED for call in self.tool_calls)
        return EpisodeStats.of_calls(self.tool_calls, num_turns=self.num_turns, num_tool_rounds=self.num_tool_rounds,
                                     truncated=refused, finish_reason="max_tool_calls" if refused else "answer")

    def _grade_final_answer(self, completion: str | list[dict]) -> Grade:
        """Grade the model's last message: the only text ever graded, never the interpreter's output."""
        if self.answer is None:
            raise RuntimeError("reset() was never called on this environment")
        messages = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
        replies = [m for m in messages if m.get("role") == "assistant"]
        text = replies[-1].get("content") if replies else None
        self.num_turns = len(replies)
        self.num_tool_rounds = self._count_tool_rounds([len(m.get("tool_calls") or []) for m in replies])
        self.grade = grade(text if isinstance(text, str) else "", self.answer)
        self._end_session()
        return self.grade

    def _count_tool_rounds(self, calls_per_reply: list[int]) -> int | None:
        """Turns in which a call ran, matching the calls in the order TRL ran them to the assistant messages that wrote
        them (a last round TRL did not run is left over); None when they do not match (then the reward takes one
        call per round)."""
        calls, matched = iter(self.tool_calls), []
        for turn, n in enumerate(calls_per_reply):
            matched += [dataclasses.replace(call, turn=turn) for call in itertools.islice(calls, n)]
        return count_tool_rounds(matched) if next(calls, None) is None else None

    def _end_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            run_sync(self.sandbox.close_session(session))


_trl_episodes = itertools.count()


def grade_final_answers(completions: list, environments: list | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 for a correct final answer, else 0.0, graded in each rollout's `CodeInterpreterEnvironment`, which keeps
    the grade for its `get_reward()`. Give it weight 0: the environment's column is the reward."""
    if environments is None:
        raise ValueError("grade_final_answers grades in the rollouts' environments: pass GRPOTrainer an "
                         "environment_factory that makes CodeInterpreterEnvironments")
    return [float(env._grade_final_answer(completion).correct) if isinstance(env, CodeInterpreterEnvironment)
            else None for completion, env in zip(completions, environments, strict=True)]
