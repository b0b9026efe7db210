"""ToolEnvironment: the token-level gym environment between two generations of a tool-using math model."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from retool_env.chat import SAMPLE_MODES, Conversation, with_chat_template
from retool_env.config import EnvConfig
from retool_env.data import Problem, load_dataset_problems
from retool_env.faults import episode_fault_key
from retool_env.formats import ParsedAction, make_format
from retool_env.grading import Grade, agrade
from retool_env.internals.asyncio_loop import run_task
from retool_env.prompts import get_prompt, prompt_messages, render_prompt
from retool_env.reasoning import THINK, graded_text
from retool_env.rewards import EpisodeStats, get_reward_fn
from retool_env.sandbox import Sandbox
from retool_env.tokens import decode, load_tokenizer
from retool_env.tool_runner import ToolRunner
from retool_env.trajectory import ToolCallRecord, Trajectory

_episode_counter = itertools.count()

# `reset(options=...)` keys that replace a setting of `EnvConfig` for one episode: budgets and tool settings, which
# need nothing rebuilt (tool format, prompt, sandbox, reward and chat template are fixed at construction).
EPISODE_OVERRIDES = ("max_tool_calls", "max_completion_tokens", "max_observation_tokens", "max_turn_tokens",
                     "max_model_len", "tool_timeout", "error_format", "on_timeout")
RESET_OPTIONS = ("problem", "index", *EPISODE_OVERRIDES)


def _check_budgets(config: EnvConfig) -> EnvConfig:
    """The config, once its episode settings are valid (the tool settings are `ToolRunner`'s to check)."""
    if config.max_completion_tokens < 1:
        raise ValueError(f"max_completion_tokens={config.max_completion_tokens!r}: a token budget must be at least 1")
    if config.sample_mode not in SAMPLE_MODES:
        raise ValueError(f"sample_mode must be one of {SAMPLE_MODES}, not {config.sample_mode!r}")
    return config


@dataclass
class _PendingTools:
    """Tool calls parsed from an action, waiting for the sandbox."""

    parsed: ParsedAction
    turn: int


class ToolEnvironment(gym.Env):
    """A math problem solved by a language model that may call a Python interpreter, one turn per step.

    ## Description
    Token in, token out: the observation after `reset` is the prompt's token ids; an action is the token ids the
    policy generated for one turn, appended to the episode verbatim (never re-tokenized); the observation after a
    step is the token ids the environment appends: the interpreter's answer rendered for the next generation. The
    full record, with `env_mask` and `logprobs` aligned to the completion, is `env.unwrapped.trajectory`.

    ## Action Space
    `Sequence(Discrete(vocab_size), stack=True)`: a 1-D integer array of token ids. Logprobs ride along as a mapping
    `{"token_ids": ids, "logprobs": floats, "finish_reason": "stop" | "length"}` (gymnasium wrappers pass `step`
    a single argument). Without a finish reason, a turn that used all of `info["max_new_tokens"]` without an end
    token counts as cut off.

    ## Observation Space
    `Sequence(Discrete(vocab_size), stack=True)`: the prompt after `reset`, then each step's appended tokens (empty
    when the episode ends). In the `turn` sample mode, a step after which the chat template rewrote history returns
    the whole new context instead, with `info["new_sample"]` True.

    ## Chat Templates
    `chat_template` picks the template (default: the tokenizer's). After every tool call the real conversation is
    rendered, so the environment knows whether the next context extends the token stream. A template that rewrites
    earlier turns (Qwen3 drops an empty think block from a turn that is no longer last; DeepSeek-R1-Distill strips
    reasoning from history) is never followed silently: `sample_mode="episode"` keeps one sample, appends the
    tool turn as the template renders it, and counts the turn in `trajectory.rewritten_turns` with a warning (train
    on a prefix-preserving version instead: TRL's, e.g. `chat_template="qwen3_training"`); `sample_mode="turn"`
    starts a new sample whose prompt is the context exactly as the template renders it (`trajectory.samples`).

    ## Tool Formats
    `hermes`: `<tool_call>{"name": "code_interpreter", "arguments": {"code": ...}}</tool_call>` blocks, several per
    turn allowed; results are `tool` turns rendered by the tokenizer's chat template. `retool`: the paper's
    `<code>```python ...```</code>` with generation stopped at `</code>` and the result inline as
    `<interpreter>...</interpreter>`. A turn without a tool call is the final answer. A malformed call is answered
    with an observation saying what was wrong. `info["stop"]` and `info["stop_token_ids"]` tell the generator when
    to stop; a closing token the model did not emit is inserted with mask 0 (also the template's end of turn after
    a hermes call turn the model ended with another end token, such as `<|endoftext|>`). Interpreter output is
    encoded with special tokens split: code that prints `<|im_end|>` cannot write a turn. Reasoning is read as
    vLLM's reasoning parsers read it: hermes calls only from the content after `</think>` (a call inside the think
    block is not run); the retool format runs code inside reasoning, as the paper's model does.

    ## Rewards
    0 on every step but the last; then the reward scheme's value for the graded final answer (`retool`: +1 if
    correct, else `min(-0.6, -1 + 0.1 * k)` for k executed tool calls). Only text the model generated is graded:
    interpreter output that prints `\\boxed{...}` earns nothing. Only an answer turn is graded, and only its
    content after its reasoning block: an episode that ends on a turn with a tool call (over `max_tool_calls`, an
    observation that does not fit, a turn stopped inside an unclosed call) has no answer.

    ## Starting State
    A problem drawn with the environment's seeded RNG, or chosen with `options={"index": i}` or
    `options={"problem": Problem | dict}`. `options` may also set an episode's budgets and tool settings
    (`EPISODE_OVERRIDES`, see `reset`); any other key is refused.

    ## Episode End
    Terminated when the model answers (a turn without a tool call). Truncated when a turn is cut off by the token
    budget (`finish_reason="length"`), when a tool call times out with `on_timeout="abort"` (`"tool_timeout"`), when
    a tool turn's result would not fit `max_completion_tokens` or `max_model_len` (`"observation_too_long"`), or
    when a turn would exceed `max_tool_calls` (`"max_tool_calls"`).
    An action longer than the budget left is clipped to it and ends the episode (`max_completion_tokens`, whatever
    it holds). A truncated episode is still graded on what the model wrote in its last turn, if that turn was an
    answer (no tool call).

    ## Budgets
    `max_tool_calls` (executed calls per episode), `max_completion_tokens` (all tokens after the prompt, model and
    environment, as TRL's `max_completion_length` and verl's `response_length`; in the `turn` sample mode, the
    tokens after the episode's prompt in the rewritten context), `max_model_len` (prompt and completion of the
    context together, as vLLM's), `max_observation_tokens` (each tool output, head and tail kept around a marker,
    the marker counted), `max_turn_tokens` (caps `info["max_new_tokens"]`).

    ## Arguments
    `tokenizer` (object, name or path), `dataset` (Problems, dicts, a file or a name `load_problems` knows),
    `split` (for named datasets; None picks each dataset's default), `tool_format`, `prompt` (a name in
    `retool_env.prompts.PROMPTS` or a PromptTemplate; default: the format's),
    `sandbox` ("local", "ray", a SandboxFusion URL, or a Sandbox), `reward` (a scheme name or callable) and
    `reward_kwargs`, the budgets above, `tool_timeout` (seconds per call), `error_format` (what a failed call
    shows: full, last_line, head_tail:N), `on_timeout` (feedback or abort), `stateful` (variables persist between an
    episode's calls), `chat_template` and `sample_mode` (above): the fields of `retool_env.config.EnvConfig`, which
    declares their defaults, so `ToolEnvironment(tokenizer, dataset, **config)` takes an EnvConfig. Besides:
    `render_mode` ("ansi"), `vocab_size` (defaults to the tokenizer's length).

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": ["ansi"]}  # noqa: RUF012 (gymnasium's convention)

    def __init__(
        self,
        tokenizer: Any,
        dataset: Any = None,
        *,
        split: str | None = None,
        render_mode: str | None = None,
        vocab_size: int | None = None,
        **config: Any,
    ) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', not {render_mode!r}")
        self.config = _check_budgets(EnvConfig(**config))  # the defaults, and a TypeError naming any unknown argument
        self.episode_config = self.config  # with `reset(options=...)`'s overrides for the current episode
        self.tokenizer = with_chat_template(load_tokenizer(tokenizer), self.config.chat_template)
        self.problems = load_dataset_problems(dataset, split=split)
        self.format = make_format(self.config.tool_format, self.tokenizer, self.config.template_kwargs)
        self.prompt = get_prompt(self.config.prompt or self.format.default_prompt)
        self.tools = ToolRunner(self.config, self.tokenizer)  # budget, sandbox and observation text of a tool call
        self.reward_fn = get_reward_fn(self.config.reward, **self.config.reward_options)
        self.render_mode = render_mode
        self.vocab_size = vocab_size or len(self.tokenizer)
        self.action_space = spaces.Sequence(spaces.Discrete(self.vocab_size), stack=True)
        self.observation_space = spaces.Sequence(spaces.Discrete(self.vocab_size), stack=True)
        self.trajectory: Trajectory | None = None
        self.problem: Problem | None = None
        self._session: str | None = None
        self._episode_seed: int | None = None  # keys injected faults (retool_env.faults)
        self._done = False
        self._last_results: list[dict[str, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task] = set()
        self._answer_text = ""
        self._conversation: Conversation | None = None
        self._thinking = False  # a think block is open where the next generation starts

    # ----------------------------------------------------------------------------------------------------- reset
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """A new episode. `options`: `problem` (a Problem or dict) or `index` (into the dataset) picks the problem,
        else the seeded RNG draws one; any of `EPISODE_OVERRIDES` (budgets and tool settings: `max_tool_calls`,
        `max_completion_tokens`, `max_observation_tokens`, `max_turn_tokens`, `max_model_len`, `tool_timeout`,
        `error_format`, `on_timeout`) replaces the `EnvConfig` setting for this episode only
        (`env.unwrapped.episode_config`)."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise ValueError(f"unknown reset option(s) {unknown}: reset(options=...) accepts {list(RESET_OPTIONS)} "
                             f"(other settings are fixed when the environment is built)")
        overrides = {name: options[name] for name in EPISODE_OVERRIDES if name in options}
        config = _check_budgets(dataclasses.replace(self.config, **overrides)) if overrides else self.config
        tools = self.tools if self.tools.config == config else ToolRunner(config, self.tokenizer)
        super().reset(seed=seed)
        self._episode_seed = seed
        self._end_session()
        self.episode_config, self.tools = config, tools
        if "problem" in options:
            problem = options["problem"]
            self.problem = problem if isinstance(problem, Problem) else Problem.from_dict(problem)
        elif "index" in options:
            self.problem = self.problems[int(options["index"])]
        else:
            self.problem = self.problems[int(self.np_random.integers(len(self.problems)))]
        template_kwargs = config.template_kwargs
        messages = prompt_messages(self.prompt, self.problem.question, self.format.system_prompt)
        if self.format.system_prompt is None and not template_kwargs:
            prompt_ids = render_prompt(self.tokenizer, self.prompt, self.problem.question, self.format.tools)
        else:  # the tools shown in the system message, or template options: rendered as the conversation is
            prompt_ids = list(self.tokenizer.apply_chat_template(
                messages, tools=self.format.tools or None, add_generation_prompt=True, tokenize=True,
                return_dict=False, **template_kwargs))
        if self.format.tool_turns:  # tool results are turns the chat template renders, after the model's
            assert self.format.turn_end is not None  # every format with tool turns finds its turn end
            self._conversation = Conversation(self.tokenizer, messages, self.format.tools, self.format.turn_end,
                                              template_kwargs, self.format.split_reasoning)
        if config.max_model_len is not None and len(prompt_ids) >= config.max_model_len:
            raise ValueError(f"the prompt of problem {self.problem.id!r} has {len(prompt_ids)} tokens, not fewer than "
                             f"max_model_len={config.max_model_len}; raise max_model_len or shorten the prompt")
        self.trajectory = Trajectory(prompt_ids=prompt_ids, problem_id=self.problem.id, gold=self.problem.answer)
        self._thinking = decode(self.tokenizer, prompt_ids[-4:]).rstrip().endswith(THINK)
        self._answer_text = ""
        self._session = f"episode-{next(_episode_counter)}" if config.stateful else None
        self._done = False
        self._last_results = []
        return np.asarray(prompt_ids, dtype=np.int64), self._info()

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox the episode's tool calls run in (`EnvConfig.sandbox`, one per spec for the process)."""
        return self.tools.sandbox

    # ------------------------------------------------------------------------------------------------------ step
    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """`astep` run to completion on the environment's own event loop (tool calls of a turn run concurrently)."""
        return self._run_blocking(self.astep(action))

    def _run_blocking(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
            return run_task(self._loop, coro)
        coro.close()
        raise RuntimeError("step() was called inside a running event loop; use `await env.unwrapped.astep(...)`")

    async def astep(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """`step` for asyncio: awaits the sandbox, so thousands of episodes can run in one process."""
        pending = self._take_action(action)
        if isinstance(pending, _PendingTools):
            calls = pending.parsed.tool_calls
            keys = [self._fault_key(i) for i in range(len(calls))] if self.config.fault_rate else None
            records = await self.tools.run_turn(calls, session=self._session, turn=pending.turn, fault_keys=keys)
            observed = self._observe(pending, records)
            if observed is not None:
                return observed
            pending = True
        assert self.problem is not None
        outcome = self._finish(await agrade(self._answer_text, self.problem.answer), truncated=pending)
        if self._session is not None:
            session, self._session = self._session, None
            await asyncio.shield(self.sandbox.close_session(session))  # an episode cancelled here leaks no session
        return outcome

    def _take_action(self, action: Any) -> _PendingTools | bool:
        """Append the action; return the tool calls to run, or whether the episode ends truncated."""
        if self.trajectory is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode has ended; call reset() to start a new one")
        token_ids, logprobs, finish_reason = self._split_action(action)
        traj = self.trajectory
        assert traj is not None, "reset() starts an episode"
        room = self._room()
        overrun = len(token_ids) > room  # a generator that ignored the budget: keep what fits, then end the episode
        if overrun:
            token_ids, logprobs = token_ids[:room], None if logprobs is None else logprobs[:room]
        cut_off = finish_reason == "length" or (finish_reason is None and len(token_ids) >= self._max_new_tokens())
        traj.append_model(token_ids, logprobs)
        opened = self._thinking
        parsed = self.format.parse(token_ids, reasoning_open=opened)
        # The content of the model's latest turn, if an answer: the only text ever graded.
        self._answer_text = graded_text(parsed.content) if parsed.is_answer else ""
        self._thinking = parsed.thinking
        turn = traj.num_turns
        if overrun:  # one finish reason, whatever the clipped turn holds
            traj.finish_reason = "max_completion_tokens"
            return True
        if not parsed.complete and (cut_off or parsed.in_call):  # out of tokens mid-turn, or stopped inside a call
            traj.finish_reason = "length"
            return True
        if parsed.is_final:  # includes a turn that stopped early without an end token: read it as the answer
            traj.finish_reason = "answer"
            return False
        if self.tools.over_budget(traj.tool_calls, parsed.tool_calls):
            traj.tool_calls.extend(self.tools.skipped(parsed.tool_calls, turn))
            traj.finish_reason = "max_tool_calls"
            return True
        return _PendingTools(parsed, turn)

    def _split_action(self, action: Any) -> tuple[list[int], list[float] | None, str | None]:
        logprobs = finish_reason = None
        if isinstance(action, Mapping):
            if "token_ids" not in action:
                raise ValueError("an action mapping needs 'token_ids' (optionally 'logprobs', 'finish_reason')")
            action, logprobs, finish_reason = action["token_ids"], action.get("logprobs"), action.get("finish_reason")
        if isinstance(action, (str, bytes)):
            raise TypeError(f"an action is the token ids the policy generated, not text ({action[:40]!r}...): pass "
                            "tokenizer.encode(text, add_special_tokens=False), or use an adapter that takes text")
        if type(action) is list and all(type(i) is int for i in action):  # the usual action: no array needed
            ids = list(action)
        else:
            array = np.asarray(action)
            if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
                raise ValueError(f"an action is a 1-D sequence of token ids, got shape {array.shape} dtype "
                                 f"{array.dtype}")
            ids = array.tolist()
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            raise ValueError(f"action token ids must lie in [0, {self.vocab_size}); got {min(ids)}..{max(ids)}")
        return ids, (None if logprobs is None else [float(x) for x in logprobs]), finish_reason

    # ------------------------------------------------------------------------------------------------ tool calls
    def _fault_key(self, index: int) -> bytes:
        """The key of the turn's `index`-th call for injected faults (`EnvConfig.fault_rate`): the episode so far."""
        assert self.problem is not None and self.trajectory is not None
        return episode_fault_key(self.problem.id, self._episode_seed,
                                 self.trajectory.prompt_ids + self.trajectory.completion_ids, index)

    def _observe(self, pending: _PendingTools, records: list[ToolCallRecord]) -> tuple | None:
        """Record the tool results and append their rendering; None when it does not fit (the episode ends)."""
        traj, config = self.trajectory, self.episode_config
        assert traj is not None, "reset() starts an episode"
        traj.tool_calls.extend(records)
        if self.tools.aborts(records):
            traj.finish_reason = "tool_timeout"  # graded on what the model wrote, as the token budget's end is
            return None
        self._last_results = [{"code": r.code, "output": r.output, "status": r.status, "duration": r.duration}
                              for r in records]
        outputs = [record.output for record in records]
        obs_ids, context_ids = self._next_context(pending.parsed, outputs)
        context_length = traj.context_length + len(obs_ids) if context_ids is None else len(context_ids)
        over_completion = context_length - len(traj.episode_prompt_ids) >= config.max_completion_tokens
        if over_completion or (config.max_model_len is not None and context_length >= config.max_model_len):
            traj.finish_reason = "observation_too_long"  # a complete tool turn: no room left for its result
            return None
        if context_ids is None:
            traj.append_env(obs_ids)
        else:
            traj.start_sample(context_ids)
        traj.turns[-1].num_tool_calls = len(records)
        if self._conversation is not None:
            self._thinking = self._conversation.text.rstrip().endswith(THINK)
        info = {**self._info(), "new_sample": context_ids is not None}
        return np.asarray(context_ids or obs_ids, dtype=np.int64), 0.0, False, False, info

    def _next_context(self, parsed: ParsedAction, outputs: list[str]) -> tuple[list[int], list[int] | None]:
        """The tokens that follow the model's turn, and the whole new context when the template rewrote history
        in the `turn` sample mode (else None)."""
        if self._conversation is None:  # results inline in the model's turn: the template never re-renders it
            return [*parsed.closing_ids, *self.format.observation_ids(outputs)], None
        after = self._conversation.after_tools(parsed.text, parsed.closing_ids, self.format.tool_messages(outputs),
                                               parsed.tool_message, parsed.end_text)
        if after.rewritten is None or self.config.sample_mode == "turn":
            return after.appended, after.rewritten
        assert self.trajectory is not None
        if not self.trajectory.rewritten_turns:
            warnings.warn("the chat template rewrote an earlier turn of the conversation, so the episode's tokens "
                          "differ from what the template renders (counted in trajectory.rewritten_turns); use a "
                          "prefix-preserving template (e.g. chat_template='qwen3_training') or sample_mode='turn'",
                          stacklevel=3)
        self.trajectory.rewritten_turns += 1
        return after.appended, None

    # ------------------------------------------------------------------------------------------------ the end
    def _finish(self, result: Grade, truncated: bool) -> tuple:
        traj = self.trajectory
        assert traj is not None, "reset() starts an episode"
        traj.truncated = truncated
        traj.correct, traj.pred, traj.strict_correct = result.correct, result.pred, result.strict_correct
        traj.graded_text = self._answer_text
        traj.reward = float(self.reward_fn(result, EpisodeStats.of(traj)))
        self._done = True
        return np.zeros(0, dtype=np.int64), traj.reward, not truncated, truncated, self._info()

    def episode_stats(self) -> EpisodeStats:
        """What the reward scheme was given for the episode (`EpisodeStats.of` its trajectory)."""
        assert self.trajectory is not None, "reset() starts an episode"
        return EpisodeStats.of(self.trajectory)

    def _room(self) -> int:
        """Tokens the next turn may hold before the completion budget or the context cap runs out."""
        traj, config = self.trajectory, self.episode_config
        assert traj is not None, "reset() starts an episode"
        room = config.max_completion_tokens - traj.completion_length
        if config.max_model_len is not None:
            room = min(room, config.max_model_len - traj.context_length)
        return max(0, room)

    def _max_new_tokens(self) -> int:
        remaining = self._room()
        return min(remaining, self.episode_config.max_turn_tokens or remaining)

    def _info(self) -> dict[str, Any]:
        traj = self.trajectory
        assert traj is not None, "reset() starts an episode"
        info = {
            "problem_id": self.problem.id if self.problem is not None else "",
            "stop_token_ids": self.format.stop_token_ids,
            "stop": self.format.stop_strings,
            "max_new_tokens": self._max_new_tokens(),
            "turn": traj.num_turns,
            "num_tool_calls": traj.num_tool_calls,
            "tool_results": list(self._last_results),
            "new_sample": False,  # True after a step whose observation is a whole new context (`turn` mode)
        }
        if self._done:
            info.update(reward=traj.reward, correct=traj.correct, pred=traj.pred, strict_correct=traj.strict_correct,
                        finish_reason=traj.finish_reason)
        return info

    # ------------------------------------------------------------------------------------------- render, close
    def render(self) -> str | None:
        """The episode as text with model and environment spans marked (render_mode="ansi")."""
        if self.render_mode != "ansi" or self.trajectory is None:
            return None
        traj, decode, parts = self.trajectory, self.tokenizer.decode, []
        for index, sample in enumerate(traj.samples):
            parts.append(f"=== {'prompt' if index == 0 else 'context rewritten by the chat template'} ===\n"
                         f"{decode(sample.prompt_ids)}")
            for turn in (traj.turns[i] for i in sample.turns):
                parts.append(f"=== model ===\n{decode(sample.completion_ids[turn.start:turn.end])}")
                if turn.env_end > turn.end:
                    parts.append(f"=== environment ===\n{decode(sample.completion_ids[turn.end:turn.env_end])}")
        if self._done:
            parts.append(f"=== reward {traj.reward:+.2f} ({traj.finish_reason}; pred={traj.pred!r}, "
                         f"gold={traj.gold!r}) ===")
        return "\n".join(parts)

    def _end_session(self) -> None:
        """Close the sandbox session of an episode left unfinished (reset or close before it ended)."""
        if self._session is None:
            return
        session, self._session = self._session, None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._run_blocking(self.sandbox.close_session(session))
        else:
            task = loop.create_task(self.sandbox.close_session(session))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def close(self) -> None:
        self._end_session()
        if self._loop is not None:
            self._loop.close()
        super().close()


def make_env_factory(**kwargs: Any) -> Callable[[], ToolEnvironment]:
    """A zero-argument constructor, for rollout drivers and vectorised set-ups that build one env per episode."""
    return lambda: ToolEnvironment(**kwargs)
