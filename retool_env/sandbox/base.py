"""The one interface every code executor implements, and the result it returns.

`Sandbox.run` is the contract: it checks and normalises its arguments once (bad code becomes an `error` result, a
bad timeout or memory limit a `ValueError`), then calls the backend's `_run` with every argument filled in. A new
backend implements `_run` only.
"""

from __future__ import annotations

import abc
import asyncio
import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, TypeVar


class ToolStatus(str, Enum):
    """How a tool call ended. A `str`, so `status == "ok"` and JSON keep working; the first six come from a sandbox,
    the last two from the environment (the call never reached one).

    | status          | ran | failed | meaning                                                              |
    |-----------------|-----|--------|----------------------------------------------------------------------|
    | `ok`            | yes | no     | ran to the end, exit code 0                                          |
    | `error`         | yes | yes    | raised an exception or exited non-zero                               |
    | `timeout`       | yes | yes    | hit the wall-clock or CPU limit (the model sees the partial output)  |
    | `memory`        | yes | yes    | hit the memory limit                                                 |
    | `killed`        | yes | yes    | died of a signal it did not ask for                                  |
    | `sandbox_error` | yes | yes    | the executor itself failed; the code may not have run                |
    | `invalid`       | no  | -      | could not be parsed (bad JSON, no code...); the model is told why    |
    | `skipped`       | no  | -      | over `max_tool_calls`: not run, the episode ends                     |
    """

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    KILLED = "killed"
    SANDBOX_ERROR = "sandbox_error"
    INVALID = "invalid"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ExecResult:
    """What one execution produced.

    `status` is a `ToolStatus` (a plain string given here is converted): `ok` (ran to the end, exit code 0), `error`
    (an exception or a non-zero exit), `timeout` (the wall or CPU limit), `memory` (the memory limit), `killed` (a
    signal it did not ask for, e.g. SIGSEGV) or `sandbox_error` (the executor itself failed; the code may not have
    run). `note` is the executor's own one-line explanation (`TimeoutError: ...`), kept apart from what the program
    wrote.
    """

    status: ToolStatus
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ToolStatus(self.status))

    @property
    def ok(self) -> bool:
        return self.status is ToolStatus.OK

    @property
    def output(self) -> str:
        """The text a model should see: stdout, then the error lines, then the executor's note."""
        parts = [p.rstrip("\n") if i else p for i, p in enumerate((self.stdout, self.stderr, self.note)) if p]
        text = ""
        for part in parts:
            if text and not text.endswith("\n"):
                text += "\n"
            text += part
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def failure(cls, status: ToolStatus | str, note: str, **kw: Any) -> ExecResult:
        return cls(status=ToolStatus(status), note=note, **kw)


def check_code(code: object) -> ExecResult | None:
    """Return an `error` result for code that is not valid text, so bad model output never raises."""
    if isinstance(code, (bytes, bytearray, memoryview)):
        try:
            bytes(code).decode("utf-8")
        except UnicodeDecodeError as exc:
            return ExecResult.failure(ToolStatus.ERROR, f"SyntaxError: the code is not valid UTF-8 text ({exc.reason})")
        return ExecResult.failure(ToolStatus.ERROR, "TypeError: code must be str, not bytes; decode it first")
    if not isinstance(code, str):
        return ExecResult.failure(ToolStatus.ERROR, f"TypeError: code must be str, not {type(code).__name__}")
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ExecResult.failure(ToolStatus.ERROR, f"SyntaxError: the code is not valid UTF-8 text ({exc.reason})")
    return None


_S = TypeVar("_S", bound="Sandbox")


class Sandbox(abc.ABC):
    """Runs untrusted Python and never raises for anything the code does.

    Subclasses implement `_run` (and `close` where they hold resources); `run` checks the arguments for them, and
    `run_sync` and context management come for free. `timeout` is the default time limit of a call, in seconds.
    """

    timeout: float = 10.0

    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        session: str | None = None,
        stdin: str | None = None,
        memory_mb: int | None = None,
        **options: Any,
    ) -> ExecResult:
        """Execute `code`; `session` keeps variables between calls of one episode where supported.

        Code that is not text comes back as an `error` result (model output never raises); a `timeout` that is not a
        finite number of seconds above 0, a `memory_mb` that is not a positive integer, or a `session`/`stdin` that
        is not a string raise `ValueError` (a caller's bug). `options` are a backend's own (`LocalSandbox`'s `echo`).
        """
        bad = check_code(code)
        if bad is not None:
            return bad
        return await self._run(code, timeout=self._timeout(timeout), session=_text("session", session),
                               stdin=_text("stdin", stdin), memory_mb=_megabytes(memory_mb), **options)

    @abc.abstractmethod
    async def _run(
        self, code: str, *, timeout: float, session: str | None, stdin: str | None, memory_mb: int | None
    ) -> ExecResult:
        """Execute checked arguments: `code` is valid text, `timeout` a positive float (the default filled in)."""

    def _timeout(self, timeout: float | None) -> float:
        value = self.timeout if timeout is None else timeout
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"timeout must be a finite positive number of seconds, got {timeout!r}")
        return float(value)

    async def close_session(self, session: str) -> None:  # noqa: B027 - a no-op where sessions do not exist
        """Forget one episode's state."""

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:  # noqa: B027 - stateless sandboxes hold nothing
        """Release processes and connections; safe to call twice."""

    def run_sync(self, code: str, **kw: Any) -> ExecResult:
        """Blocking `run` for code without an event loop (a thread, a script, gymnasium's `step`)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run(code, **kw))
        raise RuntimeError("run_sync() was called inside a running event loop; use `await sandbox.run(...)` instead")

    async def __aenter__(self: _S) -> _S:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text(name: str, value: str | None) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be a string or None, got {type(value).__name__}")
    return value


def _megabytes(memory_mb: int | None) -> int | None:
    if memory_mb is None:
        return None
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0:
        raise ValueError(f"memory_mb must be a positive integer number of megabytes or None, got {memory_mb!r}")
    return memory_mb
