"""What every pool of executors shares, and `SandboxFusionPool`: several SandboxFusion-compatible endpoints as one.

- `Admission`: the global limit on calls in flight and the bounded FIFO queue in front of it, usable from any event
  loop or thread (one sandbox may serve many loops, as `LocalSandbox` does).
- `PoolStats`: per-node counters and latency windows behind a pool's `stats()`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import ExecResult, Sandbox, ToolStatus
from .fusion import EndpointFailure, SandboxFusionSandbox

_WINDOW = 4096  # latencies kept for p50/p99


class Gate:
    """A FIFO semaphore that callers on any event loop or thread can wait on (asyncio's belong to one loop)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self.waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()
        self._lock = threading.Lock()

    async def acquire(self) -> None:
        with self._lock:
            if self.active < self.limit and not self.waiters:
                self.active += 1
                return
            waiter = (asyncio.get_running_loop(), asyncio.get_running_loop().create_future())
            self.waiters.append(waiter)
        try:
            await waiter[1]
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)
            if waiter[1].done() and not waiter[1].cancelled():  # granted just before the cancellation: pass it on
                self.release()
            raise

    def release(self) -> None:
        """Hand the slot to the first waiter (on its own loop), or free it."""
        with self._lock:
            while self.waiters:
                loop, future = self.waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._grant, future)
                    return
                except RuntimeError:  # that caller's loop is closed
                    continue
            self.active -= 1

    def _grant(self, future: asyncio.Future) -> None:
        if future.cancelled():
            self.release()
        else:
            future.set_result(None)

    @property
    def waiting(self) -> int:
        return len(self.waiters)


class Admission:
    """At most `max_in_flight` calls at the executors, `max_queued` more waiting in FIFO order, and any further
    callers waiting to join the queue: nothing is dropped, and no executor gets more than the pool allows."""

    def __init__(self, max_in_flight: int, max_queued: int) -> None:
        self.in_flight = Gate(max_in_flight)
        self.queue = Gate(max_in_flight + max_queued)

    async def __aenter__(self) -> None:
        await self.queue.acquire()
        try:
            await self.in_flight.acquire()
        except BaseException:
            self.queue.release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.in_flight.release()
        self.queue.release()

    @property
    def queued(self) -> int:
        return self.queue.active - self.in_flight.active + self.queue.waiting


@dataclass
class NodeStats:
    actors: int = 0
    in_flight: int = 0
    calls: int = 0
    errors: int = 0
    retries: int = 0
    lost: int = 0
    latencies: deque = field(default_factory=lambda: deque(maxlen=_WINDOW))


class PoolStats:
    """Counters per node (a Ray node id, an endpoint URL); `lock` also guards the pool's own routing state."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nodes: dict[str, NodeStats] = {}
        self.latencies: deque[float] = deque(maxlen=_WINDOW)

    def node(self, key: str) -> NodeStats:
        """The counters of one node; call with `lock` held."""
        return self.nodes.setdefault(key, NodeStats())

    def record(self, key: str | None, latency: float, result: ExecResult) -> None:
        with self.lock:
            self.latencies.append(latency)
            if key is not None:
                node = self.node(key)
                node.calls += 1
                node.errors += result.status == ToolStatus.SANDBOX_ERROR
                node.latencies.append(latency)

    def report(self, admission: Admission | None, **extra: Any) -> dict[str, Any]:
        """In flight, queued, p50/p99 latency (seconds, from `run` to its answer), and per node: calls, `errors`
        (`sandbox_error` answers), `retries` (calls moved elsewhere after this node failed), `lost` executors."""
        with self.lock:
            nodes = {key: {"actors": s.actors, "in_flight": s.in_flight, "calls": s.calls, "errors": s.errors,
                           "retries": s.retries, "lost": s.lost, **percentiles(s.latencies)}
                     for key, s in self.nodes.items()}
            latencies = list(self.latencies)
        return {
            "actors": sum(n["actors"] for n in nodes.values()),
            **extra,
            "in_flight": admission.in_flight.active if admission else 0,
            "queued": admission.queued if admission else 0,
            **{key: sum(n[key] for n in nodes.values()) for key in ("calls", "errors", "retries", "lost")},
            **percentiles(latencies),
            "nodes": nodes,
        }


def percentiles(latencies: Any) -> dict[str, float | None]:
    ordered = sorted(latencies)
    if not ordered:
        return {"p50": None, "p99": None}
    return {"p50": ordered[len(ordered) // 2], "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]}


@dataclass(eq=False)
class _Endpoint:
    url: str
    client: SandboxFusionSandbox
    capacity: int
    up: bool = True
    next_probe: float = 0.0
    in_flight: int = 0
    calls: int = 0


class SandboxFusionPool(Sandbox):
    """Several SandboxFusion-compatible endpoints (SandboxFusion, `retool-env sandbox serve`) behind one sandbox.

    Calls go to the least-loaded endpoint that is up. A call whose endpoint fails (connection refused or reset, a
    timeout past the call's own, 5xx, an unreadable or unauthenticated answer) is retried once on another endpoint,
    and the endpoint is taken out of routing until a probe (`print(1)` through its `/run_code`) passes; down
    endpoints are probed again every `health_interval` seconds. An answer is never retried, whatever it says
    (`error`, `killed`, even `sandbox_error`): the code's own outcome must not run it twice nor take an endpoint
    out. The calls are stateless, as SandboxFusion's are, so a retry after an endpoint failure is safe.

    Arguments:
        urls: a list of `/run_code` URLs, or the path of a file with one per line (`#` comments allowed).
        per_endpoint: calls in flight per endpoint (SandboxFusion's maintainers advise an instance per <= 32 cores).
        max_in_flight: calls at the endpoints at once; default: `per_endpoint` times the number of endpoints.
        max_queued: calls waiting in the pool's FIFO queue; further callers wait to join it.
        **client_kwargs: `SandboxFusionSandbox` arguments for every endpoint (`timeout`, `memory_mb`...).
    """

    def __init__(
        self,
        urls: Sequence[str] | str | Path,
        *,
        per_endpoint: int = 32,
        max_in_flight: int | None = None,
        max_queued: int = 100_000,
        health_interval: float = 10.0,
        **client_kwargs: Any,
    ) -> None:
        if isinstance(urls, (str, Path)):
            lines = Path(urls).read_text().splitlines()
            urls = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
        if not urls:
            raise ValueError("SandboxFusionPool needs at least one /run_code URL")
        client_kwargs.setdefault("retries", 0)  # the pool moves a failed call to another endpoint instead
        self.endpoints = [_Endpoint(url, SandboxFusionSandbox(url, **client_kwargs), per_endpoint) for url in urls]
        self.timeout = self.endpoints[0].client.timeout
        self.health_interval = health_interval
        self.admission = Admission(max_in_flight or per_endpoint * len(self.endpoints), max_queued)
        self._stats = PoolStats()
        self._probes: set[asyncio.Future] = set()
        for endpoint in self.endpoints:
            self._stats.node(endpoint.client.url).actors = 1

    async def _pick(self, exclude: _Endpoint | None) -> _Endpoint | None:
        """The least-loaded endpoint that is up; when none is, probe the ones due for it first."""
        for attempt in range(2):
            with self._stats.lock:
                up = [e for e in self.endpoints if e.up and e is not exclude]
                if up:
                    endpoint = min(up, key=lambda e: (e.in_flight / e.capacity, e.calls))
                    endpoint.in_flight += 1
                    endpoint.calls += 1
                    self._stats.node(endpoint.client.url).in_flight += 1
                    return endpoint
            if attempt == 0:
                await self.check_health(only_due=False)
        return None

    async def check_health(self, only_due: bool = True) -> int:
        """Probe the endpoints that are down (only those due for it); returns how many are up."""
        await asyncio.gather(*(self._probe(e) for e in self._due_for_probe(only_due)))
        return sum(e.up for e in self.endpoints)

    def _due_for_probe(self, only_due: bool = True) -> list[_Endpoint]:
        now = time.monotonic()
        with self._stats.lock:
            due = [e for e in self.endpoints if not e.up and (not only_due or e.next_probe <= now)]
            for endpoint in due:
                endpoint.next_probe = now + self.health_interval
        return due

    async def _probe(self, endpoint: _Endpoint) -> None:
        result = await endpoint.client.run("print(1)", timeout=5)
        with self._stats.lock:
            endpoint.up = result.ok
            self._stats.node(endpoint.client.url).actors = int(result.ok)

    def _down(self, endpoint: _Endpoint) -> None:
        with self._stats.lock:
            node = self._stats.node(endpoint.client.url)
            node.retries += 1
            if endpoint.up:
                endpoint.up, node.actors, node.lost = False, 0, node.lost + 1
                endpoint.next_probe = time.monotonic() + self.health_interval

    async def _run(
        self, code: str, *, timeout: float, session: str | None, stdin: str | None, memory_mb: int | None
    ) -> ExecResult:
        begin = time.perf_counter()
        for endpoint in self._due_for_probe():  # in the background: no caller waits on a probe while others are up
            task = asyncio.ensure_future(self._probe(endpoint))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)
        async with self.admission:
            failed: _Endpoint | None = None
            key: str | None = None
            result = ExecResult.failure(ToolStatus.SANDBOX_ERROR, "SandboxError: every SandboxFusion endpoint is down")
            for _ in range(2):
                picked = await self._pick(exclude=failed)
                if picked is None:
                    break
                endpoint = picked
                key = endpoint.client.url
                try:
                    result = await endpoint.client.attempt(code, timeout=timeout, stdin=stdin, memory_mb=memory_mb)
                    break  # whatever the code did (a `sandbox_error` it reported included) is its answer
                except EndpointFailure as exc:  # the endpoint failed, not the code: out until a probe passes
                    result = ExecResult.failure(ToolStatus.SANDBOX_ERROR, f"SandboxError: {key} failed ({exc})")
                    self._down(endpoint)
                    failed = endpoint
                finally:
                    with self._stats.lock:
                        endpoint.in_flight -= 1
                        self._stats.node(endpoint.client.url).in_flight -= 1
        self._stats.record(key, time.perf_counter() - begin, result)
        return result

    def stats(self) -> dict[str, Any]:
        """In flight, queued, p50/p99 latency and, per endpoint URL, calls, errors, retries, `lost` (times it went
        down) and `actors` (1 while it is up)."""
        return self._stats.report(self.admission)

    async def aclose(self) -> None:
        for endpoint in self.endpoints:
            await endpoint.client.aclose()

    def close(self) -> None:
        for endpoint in self.endpoints:
            endpoint.client.close()
