"""The one interface every code executor implements, and the result it returns."""

from __future__ import annotations

import abc
import asyncio
from dataclasses import asdict, dataclass
from typing import Any

STATUSES = ("ok", "error", "timeout", "memory", "killed", "sandbox_error")


@dataclass(frozen=True)
class ExecResult:
    """What one execution produced.

    `status` is one of `ok` (ran to the end, exit code 0), `error` (an exception or a non-zero exit), `timeout`
    (the wall or CPU limit), `memory` (the memory limit), `killed` (a signal it did not ask for, e.g. SIGSEGV) and
    `sandbox_error` (the executor itself failed; the code may not have run). `note` is the executor's own one-line
    explanation (`TimeoutError: ...`), kept apart from what the program wrote.
    """

    status: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

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
    def failure(cls, status: str, note: str, **kw: Any) -> ExecResult:
        return cls(status=status, note=note, **kw)


def check_code(code: object) -> ExecResult | None:
    """Return an `error` result for code that is not valid text, so bad model output never raises."""
    if isinstance(code, (bytes, bytearray, memoryview)):
        try:
            bytes(code).decode("utf-8")
        except UnicodeDecodeError as exc:
            return ExecResult.failure("error", f"SyntaxError: the code is not valid UTF-8 text ({exc.reason})")
        return ExecResult.failure("error", "TypeError: code must be str, not bytes; decode it first")
    if not isinstance(code, str):
        return ExecResult.failure("error", f"TypeError: code must be str, not {type(code).__name__}")
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ExecResult.failure("error", f"SyntaxError: the code is not valid UTF-8 text ({exc.reason})")
    return None


class Sandbox(abc.ABC):
    """Runs untrusted Python and never raises for anything the code does.

    Subclasses implement `run`; `run_sync`, context management and `close` come for free.
    """

    @abc.abstractmethod
    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        session: str | None = None,
        stdin: str | None = None,
        memory_mb: int | None = None,
    ) -> ExecResult:
        """Execute `code`; `session` keeps variables between calls of one episode where supported."""

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

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
