"""The math-verify worker pool: fresh interpreters running `worker.py`, a hard timeout per comparison, counters.

math-verify's own timeouts use `signal.alarm`, which breaks off the main thread (verl's wrapper silently scores 0 in
a worker thread), and sympy can spin on inputs like `10^{10^{10}}`; so each worker is a fresh interpreter (never a
fork of the trainer: no torch, no `__main__` re-import) that a timed-out call kills and replaces. A timeout is "not
equivalent", counted in `grading_stats()`, never an exception.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from typing import Any

from .normalization import Verdict

_SOFT_TIMEOUT_FRACTION = 0.8  # the worker's own alarm fires first, so a kill (and a restart) is rarely needed

WORKER_STARTUP_TIMEOUT = 60.0
"""Seconds a new worker may take to import math-verify (not counted against a comparison's timeout)."""

_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")

_stats: Counter[str] = Counter()
_stats_lock = threading.Lock()


def count(key: str, n: int = 1) -> None:
    with _stats_lock:
        _stats[key] += n


def grading_stats(reset: bool = False) -> dict[str, int]:
    """Counters for a trainer to log: calls, fast-path and math-verify decisions, timeouts, worker errors/starts."""
    keys = ("calls", "fast_path", "math_verify_calls", "timeouts", "errors", "rejected", "worker_starts")
    with _stats_lock:
        snapshot = {key: _stats[key] for key in keys}
        if reset:
            _stats.clear()
    return snapshot


class _Worker:
    """One math-verify process spoken to over a pipe, one JSON line each way."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, _WORKER_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C aimed at the trainer does not kill a worker mid-call
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self._buffer = b""
        self._poll = select.poll()  # not select.select: a trainer's descriptors can be numbered past 1024
        self._poll.register(self.stdout.fileno(), select.POLLIN)
        self.ready = False
        count("worker_starts")

    def _read_line(self, deadline: float) -> dict[str, Any] | None:
        """The next reply, or None when the deadline passes or the worker died."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._poll.poll(remaining * 1000):
                return None
            chunk = os.read(self.stdout.fileno(), 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """Send a request and wait up to `timeout` for the reply (after the worker is ready)."""
        if not self.ready:
            hello = self._read_line(time.monotonic() + WORKER_STARTUP_TIMEOUT)
            if not hello or not hello.get("ready"):
                return {"error": (hello or {}).get("error", "math-verify worker failed to start")}
            self.ready = True
        try:
            self.stdin.write(json.dumps(request).encode() + b"\n")
            self.stdin.flush()
        except OSError:
            return None
        return self._read_line(time.monotonic() + timeout)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()


class _FairSlots:
    """First come, first served hand-off of worker slots: with `queue.Queue` a thread that puts a slot back and
    asks again at once can take it ahead of waiting threads, and starve them for seconds."""

    def __init__(self, items: list[_Worker | None]) -> None:
        self._free = deque(items)
        self._waiting: deque[tuple[threading.Event, list[_Worker | None]]] = deque()
        self._lock = threading.Lock()

    def get(self) -> _Worker | None:
        with self._lock:
            if self._free and not self._waiting:
                return self._free.popleft()
            ticket: tuple[threading.Event, list[_Worker | None]] = (threading.Event(), [])
            self._waiting.append(ticket)
        ticket[0].wait()
        return ticket[1][0]

    def put(self, item: _Worker | None) -> None:
        with self._lock:
            if not self._waiting:
                self._free.append(item)
                return
            event, box = self._waiting.popleft()
        box.append(item)
        event.set()


class _Pool:
    """A fixed number of worker slots; a caller holds one slot per comparison, so any thread can call."""

    def __init__(self, size: int) -> None:
        self._live: set[_Worker] = set()
        self._lock = threading.Lock()
        self.closed = False
        # All workers start together (in parallel, in the background) when the first comparison needs one.
        self._slots = _FairSlots([self._new_worker() for _ in range(size)])

    def _new_worker(self) -> _Worker | None:
        """A started worker, or None if no process can be started now (the next caller tries again)."""
        try:
            worker = _Worker()
        except OSError:
            return None
        with self._lock:
            self._live.add(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)

    def compare(self, pred: str, gold: str, timeout: float) -> Verdict:
        worker = self._slots.get()
        try:
            if worker is None or worker.proc.poll() is not None:
                worker = self._new_worker()
            if worker is None:
                count("errors")
                return Verdict(False, "error")
            reply = worker.call({"pred": pred, "gold": gold, "soft_timeout": _SOFT_TIMEOUT_FRACTION * timeout}, timeout)
            if reply is None or "error" in reply:
                # Hung (or dead): kill it and start the replacement now, so its start-up overlaps other work.
                self._discard(worker)
                worker = None if self.closed else self._new_worker()
                if reply is None:
                    count("timeouts")
                    return Verdict(False, "timeout", timed_out=True)
                count("errors")
                return Verdict(False, "error")
            if reply.get("timeout"):
                count("timeouts")
                return Verdict(False, "timeout", timed_out=True)
            return Verdict(bool(reply.get("equal")), "math_verify")
        finally:
            self._slots.put(worker)

    def close(self) -> None:
        self.closed = True
        with self._lock:
            workers, self._live = list(self._live), set()
        for worker in workers:
            worker.kill()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def default_pool_size() -> int:
    """`RETOOL_GRADING_WORKERS`, else min(4, cpus): most answers never reach math-verify."""
    configured = os.environ.get("RETOOL_GRADING_WORKERS", "")
    return max(1, int(configured)) if configured.isdigit() else max(1, min(4, os.cpu_count() or 1))


def _get_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.closed:
            _pool = _Pool(default_pool_size())
        return _pool


def compare(pred: str, gold: str, timeout: float) -> Verdict:
    """math-verify's verdict from a pooled worker; blocks the calling thread (any thread) up to about `timeout`."""
    count("math_verify_calls")
    return _get_pool().compare(pred, gold, timeout)


def close_grading_pool() -> None:
    """Stop the math-verify workers now (they restart on the next call); also runs at interpreter exit."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close()


def _forget_pool_after_fork() -> None:
    """A forked child (the sandbox forks) must not share the parent's worker pipes; it builds its own if needed."""
    global _pool, _pool_lock, _stats_lock
    _pool, _pool_lock, _stats_lock = None, threading.Lock(), threading.Lock()


atexit.register(close_grading_pool)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


