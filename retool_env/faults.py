"""Injected transient faults: a sandbox wrapper that refuses a share of calls before they run.

Real sandboxes fail now and then for reasons no model can foresee (a SandboxFusion endpoint answering 503, a Ray
actor restarting, a pool with no free worker). `FaultInjectingSandbox` makes that happen at a rate you set, so a
policy can be trained and tested on recovering from it: the call is refused before the wrapped sandbox sees it, with
a `sandbox_error` status and a message that says nothing ran and the call may be retried. It counts as an executed,
failed call (`Trajectory.tool_stats`: the reward's k, `max_tool_calls`, `tool_error_rate`).

Whether a call is refused is a pure function of `seed` and the call's key (the environment's key: the problem, the
episode's seed if `reset` got one, every token of the episode so far and the call's place in its turn), so a run
with seeded sampling gets the same faults every time, however its episodes are scheduled. `EnvConfig.fault_rate`
and `fault_seed` turn it on in `ToolEnvironment`.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from retool_env.sandbox.base import ExecResult, Sandbox, ToolStatus

FAULT_MESSAGE = "SandboxError: the sandbox was busy and refused this call before it ran. Nothing ran; retry the call."


def episode_fault_key(problem_id: str, episode_seed: int | None, token_ids: Sequence[int], index: int) -> bytes:
    """The key of one call: the problem, the episode's seed (None without one), the episode's tokens up to the call
    (prompt and completion) and the call's index within its turn. Same episode so far, same key."""
    head = repr((problem_id, episode_seed, index)).encode()
    return head + b"\0" + np.asarray(token_ids, dtype=np.int64).tobytes()


class FaultInjectingSandbox(Sandbox):
    """Wraps any `Sandbox`; refuses a `rate` share of calls before they run, with `message` and status
    `sandbox_error`. A call made with `fault_key=...` (as `ToolEnvironment` makes them) is refused by a draw keyed
    on `seed` and that key; one without draws from a stream seeded by `seed`, in call order. `injected` counts the
    refusals. Closing the wrapper closes the wrapped sandbox."""

    def __init__(self, sandbox: Sandbox, rate: float, *, seed: int = 0, message: str = FAULT_MESSAGE) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1 or math.isnan(rate):
            raise ValueError(f"fault_rate must be a number in [0, 1], got {rate!r}")
        if not message:
            raise ValueError("an injected fault needs a message the model can read")
        self.sandbox, self.rate, self.seed, self.message = sandbox, float(rate), int(seed), message
        self.timeout = sandbox.timeout
        self.injected = 0
        self._unkeyed = itertools.count()

    def refuses(self, key: bytes | str) -> bool:
        """Whether the call with this key is refused: a uniform draw in [0, 1) from a hash of seed and key."""
        data = key.encode() if isinstance(key, str) else bytes(key)
        digest = hashlib.blake2b(data, digest_size=8, key=str(self.seed).encode()).digest()
        return int.from_bytes(digest, "little") / 2 ** 64 < self.rate

    async def _run(self, code: str, *, timeout: float, session: str | None, stdin: str | None,
                   memory_mb: int | None, fault_key: bytes | str | None = None) -> ExecResult:
        key = fault_key if fault_key is not None else f"unkeyed call {next(self._unkeyed)}"
        if self.refuses(key):
            self.injected += 1
            return ExecResult.failure(ToolStatus.SANDBOX_ERROR, self.message)
        return await self.sandbox.run(code, timeout=timeout, session=session, stdin=stdin, memory_mb=memory_mb)

    async def close_session(self, session: str) -> None:
        await self.sandbox.close_session(session)

    async def aclose(self) -> None:
        await self.sandbox.aclose()

    def close(self) -> None:
        self.sandbox.close()

    def __getattr__(self, name: str) -> Any:  # the wrapped sandbox's extras (`stats()` of a pool)
        if name == "sandbox":
            raise AttributeError(name)
        return getattr(self.sandbox, name)


def with_faults(sandbox: Sandbox, config: Any) -> Sandbox:
    """`sandbox` wrapped in a `FaultInjectingSandbox` when `config.fault_rate` is not 0 (an `EnvConfig`), else as is.
    A stateful episode is refused: `run_episode` aborts one on any `sandbox_error` (its state may be lost), injected
    ones included."""
    if not config.fault_rate:
        return sandbox
    if config.stateful:
        raise ValueError("fault_rate needs stateful=False: a stateful episode is aborted on any sandbox_error, so "
                         "an injected fault would end it instead of letting the model retry")
    return FaultInjectingSandbox(sandbox, config.fault_rate, seed=config.fault_seed)
