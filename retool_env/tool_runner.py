"""ToolRunner: the episode rules of a tool call, written once for every environment that runs one.

`ToolEnvironment` (token level) and TRL's `CodeInterpreterEnvironment` (TRL's own tool loop) both hand a parsed call
to a `ToolRunner`, so a call is budgeted, run, shown and recorded the same way on every path:

- the budget: `max_tool_calls` executed calls per episode (`calls_left`);
- the run: the config's sandbox (one per spec for the whole process, `shared_sandbox`), `tool_timeout`, the
  episode's sandbox session when `stateful`;
- the observation: the output, `EMPTY_OUTPUT` when there is none, a failed call's output cut as `error_format` says,
  an invalid call's reason as `Error: ...`, all clipped to `max_observation_tokens` (head and tail kept);
- the end: `on_timeout="abort"` ends the episode at a timed-out call (`aborts`).

The records (`ToolCallRecord`, with the turn that wrote the call) are what `EpisodeStats.of` counts for the reward.
"""

from __future__ import annotations

import asyncio
import atexit
from collections.abc import Sequence
from typing import Any

from retool_env.config import EnvConfig
from retool_env.faults import with_faults
from retool_env.formats import ToolCall
from retool_env.sandbox import ExecResult, Sandbox, make_sandbox
from retool_env.tokens import clip_tokens
from retool_env.trajectory import NOT_RUN, ToolCallRecord, ToolStatus

EMPTY_OUTPUT = "(no output)"
ON_TIMEOUT = ("feedback", "abort")
LAST_LINE_CHARS = 400  # the ReTool evaluation's cut of a traceback's last line

_shared_sandboxes: dict[str, Sandbox] = {}


def shared_sandbox(spec: str) -> Sandbox:
    """One sandbox per spec for the whole process: many environments share one fork server."""
    if spec not in _shared_sandboxes:
        _shared_sandboxes[spec] = make_sandbox(spec)
    return _shared_sandboxes[spec]


@atexit.register
def _close_shared_sandboxes() -> None:
    for sandbox in _shared_sandboxes.values():
        sandbox.close()


def parse_error_format(spec: str) -> tuple[str, int]:
    """`EnvConfig.error_format` read: ("full", 0), ("last_line", 400) or ("head_tail", N)."""
    kind, _, size = str(spec).partition(":")
    if kind in ("full", "last_line") and not size:
        return kind, LAST_LINE_CHARS if kind == "last_line" else 0
    if kind == "head_tail" and size.isdigit() and int(size) >= 2:
        return kind, int(size)
    raise ValueError(f"error_format must be full, last_line or head_tail:N (N >= 2), not {spec!r}")


def format_error(text: str, error_format: tuple[str, int]) -> str:
    """What the model is shown of a failed call's output (`EnvConfig.error_format`); linear in the output."""
    kind, size = error_format
    if kind == "last_line":
        lines = [line for line in text.splitlines() if line.strip()]
        return (lines[-1] if lines else text)[:size]
    if kind == "head_tail" and len(text) > size:
        return f"{text[:size // 2]}\n...\n{text[len(text) - size // 2:]}"
    return text


class ToolRunner:
    """Runs an episode's tool calls as an `EnvConfig` says: budget, sandbox, observation text, record.

    `tokenizer` measures `max_observation_tokens`. A bad tool setting (`max_tool_calls`, `max_observation_tokens`,
    `error_format`, `on_timeout`) is refused here, with what to pass instead.
    """

    def __init__(self, config: EnvConfig, tokenizer: Any) -> None:
        if config.max_observation_tokens < 1:
            raise ValueError(f"max_observation_tokens={config.max_observation_tokens!r}: a token budget must be at "
                             f"least 1")
        if config.max_tool_calls < 0:
            raise ValueError(f"max_tool_calls={config.max_tool_calls!r}: must be 0 (no tool) or more")
        if config.on_timeout not in ON_TIMEOUT:
            raise ValueError(f"on_timeout must be one of {ON_TIMEOUT}, not {config.on_timeout!r}")
        self.config = config
        self.tokenizer = tokenizer
        self.error_format = parse_error_format(config.error_format)
        spec = config.sandbox
        self.sandbox: Sandbox = with_faults(shared_sandbox(spec) if isinstance(spec, str) else spec, config)

    def __getstate__(self) -> dict[str, Any]:
        """A runner pickles as its settings: a sandbox named by a spec is found again in the unpickling process."""
        state = dict(self.__dict__)
        if isinstance(self.config.sandbox, str):
            del state["sandbox"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "sandbox" not in state:
            self.sandbox = with_faults(shared_sandbox(self.config.sandbox), self.config)

    # ----------------------------------------------------------------------------------------------- the budget
    def calls_left(self, records: Sequence[ToolCallRecord]) -> int:
        """Calls the sandbox may still run this episode (`max_tool_calls` less the executed ones)."""
        return self.config.max_tool_calls - sum(record.status not in NOT_RUN for record in records)

    def over_budget(self, records: Sequence[ToolCallRecord], calls: Sequence[ToolCall]) -> bool:
        """Whether a turn's calls would run more than the episode's `max_tool_calls` (invalid ones never run)."""
        return sum(call.code is not None for call in calls) > self.calls_left(records)

    def skipped(self, calls: Sequence[ToolCall], turn: int) -> list[ToolCallRecord]:
        """The records of a turn's calls that were never run, as the budget was spent."""
        return [ToolCallRecord(call.code, "", ToolStatus.SKIPPED, turn=turn) for call in calls]

    def refused(self, code: str | None, turn: int = 0) -> ToolCallRecord:
        """The record of one call refused as the budget is spent, telling the model to answer instead."""
        text = f"Error: the budget of {self.config.max_tool_calls} tool calls is spent; give the final answer now."
        return self._record(code, text, ToolStatus.SKIPPED, 0.0, turn)

    # ------------------------------------------------------------------------------------------------- the run
    async def run(self, call: ToolCall, *, session: str | None = None, turn: int = 0,
                  code: str | None = None, fault_key: bytes | None = None) -> ToolCallRecord:
        """Run one parsed call in the sandbox (an invalid one is answered with its reason) and record what the
        model is shown. `code` replaces the call's code in the record (the text the model wrote, say); `fault_key`
        keys the call's injected fault (`EnvConfig.fault_rate`, `retool_env.faults`)."""
        recorded = call.code if code is None else code
        if call.code is None:  # a call that could not be parsed: tell the model what was wrong
            return self._record(recorded, f"Error: {call.error or 'invalid tool call'}", ToolStatus.INVALID, 0.0, turn)
        keyed: dict[str, Any] = {} if fault_key is None else {"fault_key": fault_key}
        result = await self.sandbox.run(call.code, timeout=self.config.tool_timeout, session=session, **keyed)
        return self._record(recorded, self.observation(result), result.status, result.duration, turn)

    async def run_turn(self, calls: Sequence[ToolCall], *, session: str | None = None, turn: int = 0,
                       fault_keys: Sequence[bytes] | None = None) -> list[ToolCallRecord]:
        """A turn's calls, run concurrently, their records in the order the model wrote them."""
        keys = list(fault_keys) if fault_keys is not None else [None] * len(calls)
        if len(calls) == 1:  # the usual turn: awaited in place (a task per call costs more than a step's parsing)
            return [await self.run(calls[0], session=session, turn=turn, fault_key=keys[0])]
        return list(await asyncio.gather(*(self.run(call, session=session, turn=turn, fault_key=key)
                                           for call, key in zip(calls, keys, strict=True))))

    def observation(self, result: ExecResult) -> str:
        """The text of a call's result before clipping: its output, a failed call's cut as `error_format` says."""
        text = result.output or EMPTY_OUTPUT
        return text if result.status == ToolStatus.OK else format_error(text, self.error_format)

    def aborts(self, records: Sequence[ToolCallRecord]) -> bool:
        """Whether the episode ends at these records: a timed-out call with `on_timeout="abort"`."""
        return self.config.on_timeout == "abort" and any(r.status == ToolStatus.TIMEOUT for r in records)

    def _record(self, code: str | None, text: str, status: str, duration: float, turn: int) -> ToolCallRecord:
        text = clip_tokens(text, self.tokenizer, self.config.max_observation_tokens)
        return ToolCallRecord(code, text, status, duration, turn=turn)

