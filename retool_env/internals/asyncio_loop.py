"""asyncio's event-loop internals that `ToolEnvironment.step` uses to run a step without the loop's round trip.

`run_task` reads the selector loop's ready queue (`loop._ready`) and timers (`loop._scheduled`), runs the task's
first step (`Handle._run`) with the loop marked running (`asyncio.events._set_running_loop`), as CPython 3.11 has
them; on any other shape it is `loop.run_until_complete`, with the same result.
"""

from __future__ import annotations

import asyncio
import collections
import sys
from typing import Any

CHECKED_PYTHON = "3.11"
_set_running_loop = getattr(asyncio.events, "_set_running_loop", None)


def run_task(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    """`loop.run_until_complete(coro)`, without the loop's round trip when nothing is waited for.

    The coroutine runs as a task, as `run_until_complete` runs it (`asyncio.current_task()`, timeouts and context
    variables as there), but its first step is taken at once instead of after a poll of the selector; a step that
    awaits something still pending (a real sandbox call, a thread) is finished by the loop. Taken only on asyncio's
    own selector loop with nothing else ready or due, where the task's first step is the one callback the loop
    would run.
    """
    ready, timers = getattr(loop, "_ready", None), getattr(loop, "_scheduled", None)
    if (not isinstance(loop, asyncio.BaseEventLoop) or type(ready) is not collections.deque or ready
            or type(timers) is not list or (timers and timers[0].when() <= loop.time()) or _set_running_loop is None
            or loop.is_running() or loop.get_debug() or loop.get_task_factory() is not None):
        return loop.run_until_complete(coro)
    task = loop.create_task(coro)
    if len(ready) == 1:
        handle = ready.popleft()  # the task's first step, which the loop would run after polling its selector
        if not callable(getattr(handle, "_run", None)):
            ready.appendleft(handle)
            return loop.run_until_complete(task)
        _set_running_loop(loop)
        try:
            handle._run()
        finally:
            _set_running_loop(None)
        if task.done():
            return task.result()
    return loop.run_until_complete(task)


def shape_changes() -> list[str]:
    """What `run_task` reads of asyncio and no longer matches the running Python; empty on CPython 3.11."""
    loop = asyncio.new_event_loop()
    try:
        loop.call_soon(int)
        ready: Any = getattr(loop, "_ready", None)
        expected = {
            "a new event loop is an asyncio.BaseEventLoop": isinstance(loop, asyncio.BaseEventLoop),
            "loop._ready is a collections.deque of what call_soon scheduled": (
                type(ready) is collections.deque and len(ready) == 1),
            "loop._scheduled is a list": type(getattr(loop, "_scheduled", None)) is list,
            "the ready queue holds asyncio.Handle objects with _run()": (
                bool(ready) and isinstance(ready[0], asyncio.Handle) and callable(getattr(ready[0], "_run", None))),
            "asyncio.events._set_running_loop exists": callable(getattr(asyncio.events, "_set_running_loop", None)),
        }
    finally:
        loop.close()
    return [f"no longer true on Python {sys.version.split()[0]}: {claim}" for claim, holds in expected.items()
            if not holds]
