"""`RaySandbox`: code execution spread over a Ray cluster, as a pool of hardened `LocalSandbox` actors.

Ray does what a cluster scheduler does: it places each actor on a node that has the resource the user names, carries
the calls, and reports a lost node or process as `RayActorError`. The driver keeps only what Ray cannot know: how
busy each actor is (least-loaded routing), which actor holds which episode's state (session affinity), the global
limit on calls in flight, and the statistics. Needs the `ray` extra (`pip install 'retool-env[ray]'`); nothing
imports this module unless asked for `make_sandbox("ray")`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from .base import ExecResult, Sandbox, ToolStatus
from .local import LocalSandbox
from .pool import Admission, PoolStats

logger = logging.getLogger(__name__)


@ray.remote
class SandboxActor:
    """One `LocalSandbox` (its fork server and isolation layers) on the node Ray placed this actor on."""

    def __init__(self, sandbox_kwargs: dict[str, Any]) -> None:
        # Explicit, so the driver knows how many calls this actor runs at once: twice the cores, LocalSandbox's rule.
        self.concurrency = sandbox_kwargs.setdefault("max_concurrency", 2 * (os.cpu_count() or 1))
        self.sandbox = LocalSandbox(**sandbox_kwargs)

    async def start(self) -> dict[str, Any]:
        await asyncio.get_running_loop().run_in_executor(None, self.sandbox.start)
        return {"node_id": ray.get_runtime_context().get_node_id(), "concurrency": self.concurrency,
                "pid": os.getpid()}

    async def run(self, code: str, kwargs: dict[str, Any]) -> ExecResult:
        return await self.sandbox.run(code, **kwargs)

    async def close_session(self, session: str) -> None:
        await self.sandbox.close_session(session)

    async def ping(self) -> bool:
        """A health check through the whole path: actor, fork server, and back."""
        await self.sandbox.info()
        return True


@dataclass(eq=False)
class _Member:
    """One actor as the driver sees it."""

    index: int  # its place in the pool: a replacement takes the same index (a new, unique name)
    handle: Any
    ref: Any  # of `start()`
    started: Any  # the same, as a concurrent.futures.Future that any event loop can wait on
    node_id: str = ""
    capacity: int = 1
    ready: bool = False
    alive: bool = True
    in_flight: int = 0
    calls: int = 0
    replacement: bool = False  # started under a name of its own: no other process shares it


class RaySandbox(Sandbox):
    """Runs each call on one of many `LocalSandbox` actors spread over the nodes of a Ray cluster.

    Placement: every actor claims `resource_per_actor` units of `resource`. With a custom resource that only the
    sandbox nodes declare (`ray start --resources '{"sandbox": 1}'`), CPU-only nodes serve GPU trainers, one actor
    per node; with `resource="CPU"`, one actor per `resource_per_actor` cores wherever Ray finds them.

    Arguments:
        resource, resource_per_actor: see above.
        actors: how many actors to keep; default: as many as the cluster's `resource` allows when `start()` runs.
        name: actors are named `<name>-<i>` in Ray's `retool_env` namespace, so every process of a job that builds
            a RaySandbox with the same name (TRL's ranks, verl's agent-loop workers) shares one pool rather than
            each claiming the cluster; `close()` then leaves them to the process that created them. None: a private
            pool, killed by `close()`.
        max_in_flight: calls at the actors at once from this process; default: the actors' concurrency summed
            (processes sharing a named pool split it: pass the total divided by the number of processes).
        max_queued: calls waiting for a slot in the pool's FIFO queue; further callers wait to enter it. Nothing is
            dropped or sent to a busy actor: back-pressure reaches the rollout, whose episodes wait.
        address: passed to `ray.init` when this process is not connected yet (`"auto"`: the running cluster).
        health_interval: seconds between health checks; an actor that does not answer one in `health_timeout` is
            killed and replaced, as is one lost mid-call.
        call_margin: seconds past a call's own timeout before its actor counts as lost.
        actor_options: extra `.options()` for the actors (`runtime_env`, `max_concurrency`...).
        **sandbox_kwargs: `LocalSandbox` arguments for every actor (`timeout`, `memory_mb`, `require`...).

    Failures: a stateless call whose actor is lost is retried once on another actor; a stateful session whose actor
    is lost answers `sandbox_error` from then on (its variables are gone), so `run_episode` aborts the episode rather
    than train on it. Lost actors are replaced by new actors with names of their own (never looked up by name: that
    would hand back the lost actor while Ray has not yet marked its node dead); Ray places the replacement wherever
    the resource is free. Every blocking Ray call (kill, cancel, spawn, health checks) runs on the pool's own
    maintenance thread, never on Ray's callback threads nor on an event loop, and `close()` returns within
    `close_timeout` seconds whatever state the actors are in.
    """

    def __init__(
        self,
        *,
        resource: str = "CPU",
        resource_per_actor: float = 8,
        actors: int | None = None,
        name: str | None = "retool-sandbox",
        max_in_flight: int | None = None,
        max_queued: int = 100_000,
        address: str | None = None,
        health_interval: float = 10.0,
        health_timeout: float = 10.0,
        call_margin: float = 30.0,
        start_timeout: float = 300.0,
        close_timeout: float = 10.0,
        actor_options: dict[str, Any] | None = None,
        **sandbox_kwargs: Any,
    ) -> None:
        self.resource = resource
        self.resource_per_actor = resource_per_actor
        self.target = actors
        self.name = name
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.address = address
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.call_margin = call_margin
        self.start_timeout = start_timeout
        self.close_timeout = close_timeout
        self.timeout = float(sandbox_kwargs.get("timeout", 10.0))
        if resource == "CPU":
            sandbox_kwargs.setdefault("max_concurrency", max(1, int(2 * resource_per_actor)))
            claim: dict[str, Any] = {"num_cpus": resource_per_actor}
        else:
            claim = {"num_cpus": 0, "resources": {resource: resource_per_actor}}
        self._options = {**claim, "max_restarts": 0, "scheduling_strategy": "SPREAD", **(actor_options or {})}
        self._sandbox_kwargs = sandbox_kwargs
        self._members: list[_Member] = []
        self._sessions: dict[str, _Member] = {}
        self._stats = PoolStats()
        self._lock = self._stats.lock  # one lock for the routing state and its counters
        self._start_lock = threading.Lock()
        self._admission: Admission | None = None
        self._stop = threading.Event()
        self._chores: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._maintenance: threading.Thread | None = None
        self._closed = False

    # -- the pool ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect to Ray, start the actors and wait until every one is ready; calls do this lazily."""
        with self._start_lock:
            if self._closed:
                raise RuntimeError("this RaySandbox is closed")
            if self._admission is not None:
                return
            if not ray.is_initialized():
                ray.init(address=self.address, ignore_reinit_error=True)
            if self.target is None:
                available = ray.cluster_resources().get(self.resource, 0)
                self.target = int(available // self.resource_per_actor)
            if self.target < 1:
                raise RuntimeError(
                    f"the Ray cluster has no room for a sandbox actor ({self.resource_per_actor:g} x "
                    f"{self.resource!r}); start sandbox nodes with `ray start --resources '{{\"{self.resource}\": 1}}'`"
                    f" or pass resource='CPU' with a smaller resource_per_actor")
            if self._maintenance is None:
                self._maintenance = threading.Thread(target=self._maintain, name="retool-ray-sandbox", daemon=True)
                self._maintenance.start()
            members = [self._spawn(index) for index in range(self.target)]
            try:
                ray.get([m.ref for m in members], timeout=self.start_timeout)
            except Exception as exc:  # no room in time, or the actors failed (a bad sandbox option): give them up
                self._retire_all(members)
                if isinstance(exc, GetTimeoutError):
                    raise RuntimeError(f"{self.target} sandbox actors did not all start within "
                                       f"{self.start_timeout:g} s; is the resource free on enough nodes "
                                       "(`ray status`)?") from None
                raise RuntimeError(f"the sandbox actors failed to start: {exc}") from exc
            capacity = sum(m.capacity for m in members)
            self._admission = Admission(self.max_in_flight or capacity, self.max_queued)

    def _spawn(self, index: int, *, replacement: bool = False) -> _Member:
        """A new actor (or, in a named pool's first start, the one another process already started); Ray places it.
        It serves calls once its `start()` has answered. A replacement always gets a new name of its own."""
        if self.name is None:
            named: dict[str, Any] = {}
        elif replacement:
            named = {"name": f"{self.name}-{index}-{uuid.uuid4().hex[:8]}", "namespace": "retool_env"}
        else:
            named = {"name": f"{self.name}-{index}", "namespace": "retool_env", "get_if_exists": True}
        handle = SandboxActor.options(  # type: ignore[attr-defined]  # added by @ray.remote
            **self._options, **named).remote(dict(self._sandbox_kwargs))
        ref = handle.start.remote()
        member = _Member(index, handle, ref, ref.future(), replacement=replacement)
        with self._lock:
            self._members.append(member)
        member.started.add_done_callback(lambda future: self._on_started(member, future))
        return member

    def _on_started(self, member: _Member, future: Any) -> None:
        """Runs on Ray's own thread: records the outcome and makes no Ray call (one there can deadlock)."""
        try:
            info = future.result()
        except Exception as exc:  # the node went away before the actor came up, or the sandbox refused to start
            if self._drop(member):
                logger.warning("a sandbox actor failed to start: %s", exc)
                self._submit(lambda: self._kill(member))  # the next health check starts another
            return
        with self._lock:
            member.node_id, member.capacity, member.ready = info["node_id"], info["concurrency"], member.alive
            if member.alive:
                self._node(member.node_id).actors += 1

    def _drop(self, member: _Member) -> bool:
        """Take an actor out of routing (its sessions answer `sandbox_error`); no Ray call. Whether it was in."""
        with self._lock:
            if not member.alive:
                return False
            member.alive = False
            if member in self._members:
                self._members.remove(member)
            if member.ready:
                node = self._node(member.node_id)
                node.actors -= 1
                node.lost += 1
        return True

    def _lose(self, member: _Member) -> None:
        """An actor failed: out of routing now; killed and replaced by the maintenance thread."""
        if self._drop(member):
            self._submit(lambda: self._replace(member))

    def _replace(self, member: _Member) -> None:
        self._kill(member)
        if not self._closed:
            self._spawn(member.index, replacement=True)

    def _kill(self, member: _Member) -> None:
        with contextlib.suppress(Exception):
            ray.kill(member.handle, no_restart=True)

    def _retire_all(self, members: list[_Member]) -> None:
        for member in members:
            self._drop(member)
            self._submit(functools.partial(self._kill, member))

    def _submit(self, chore: Callable[[], Any]) -> None:
        """Run a blocking Ray call on the maintenance thread, in order."""
        self._chores.put(chore)

    def _node(self, node_id: str) -> Any:
        return self._stats.node(node_id)

    def _maintain(self) -> None:
        """The maintenance thread: chores as they come, a health check every `health_interval` seconds."""
        next_check = time.monotonic() + self.health_interval
        while True:
            try:
                chore = self._chores.get(timeout=max(0.0, next_check - time.monotonic()))
            except queue.Empty:
                chore = self.check_health
                next_check = time.monotonic() + self.health_interval
                if self._stop.is_set() or self._admission is None:
                    continue
            if chore is None:  # `close()`: everything asked before it is done
                return
            if not ray.is_initialized():  # the driver shut Ray down; a Ray call here would start a new one
                continue
            try:
                chore()
            except Exception as exc:  # Ray shutting down under us; `close()` stops this thread
                logger.debug("sandbox pool maintenance: %s", exc)

    def check_health(self) -> int:
        """Ping every ready actor; kill and replace those that fail or stay silent. Returns how many were lost."""
        with self._lock:
            members = [m for m in self._members if m.ready]
            missing = set(range(self.target or 0)) - {m.index for m in self._members}
        pings = {m.handle.ping.remote(): m for m in members}
        answered = ray.wait(list(pings), num_returns=len(pings), timeout=self.health_timeout)[0] if pings else []
        lost = 0
        for ref, member in pings.items():
            try:
                if ref not in answered:
                    raise TimeoutError(f"no answer in {self.health_timeout:g} s")
                ray.get(ref, timeout=self.health_timeout)
            except Exception as exc:
                logger.warning("sandbox actor on node %s failed its health check: %s", member.node_id[:8], exc)
                if self._drop(member):
                    self._replace(member)
                lost += 1
        for index in sorted(missing):  # replacements that failed to start
            if not self._closed:
                self._spawn(index, replacement=True)
        return lost

    # -- calls ---------------------------------------------------------------------------------------------------

    async def _ensure_started(self) -> None:
        if self._admission is None:
            await asyncio.get_running_loop().run_in_executor(None, self.start)

    async def _pick(self, exclude: _Member | None = None) -> _Member | None:
        """The least-loaded ready actor (ties: the one that served fewest calls); waits while none is ready."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            with self._lock:
                ready = [m for m in self._members if m.ready and m is not exclude]
                starting = [m.started for m in self._members if not m.ready]
                if ready:
                    member = min(ready, key=lambda m: (m.in_flight / m.capacity, m.calls))
                    self._claim(member)
                    return member
            remaining = deadline - time.monotonic()
            if not starting or remaining <= 0:
                return None
            await asyncio.wait([asyncio.wrap_future(f) for f in starting], timeout=remaining,
                               return_when=asyncio.FIRST_COMPLETED)

    def _claim(self, member: _Member, calls: int = 1) -> None:
        """Count a call on `member` (`calls=-1` hands a claim back); with `_lock` held."""
        member.in_flight += calls
        member.calls += calls
        self._node(member.node_id).in_flight += calls

    async def _call(self, member: _Member, code: str, kwargs: dict[str, Any]) -> ExecResult:
        """One call on one actor; raises `RayActorError` when the actor is lost (or silent past the margin)."""
        ref = member.handle.run.remote(code, kwargs)
        try:
            return await asyncio.wait_for(ref, kwargs["timeout"] + self.call_margin)
        except asyncio.TimeoutError:
            self._submit(lambda: ray.cancel(ref))
            raise RayActorError(error_msg="no answer within the call's timeout and margin") from None
        except asyncio.CancelledError:  # the episode gave up: stop the call on the actor too
            self._submit(lambda: ray.cancel(ref))
            raise
        finally:
            with self._lock:
                member.in_flight -= 1
                self._node(member.node_id).in_flight -= 1

    async def _run(
        self, code: str, *, timeout: float, session: str | None, stdin: str | None, memory_mb: int | None
    ) -> ExecResult:
        await self._ensure_started()
        assert self._admission is not None
        kwargs = {"timeout": timeout, "session": session, "stdin": stdin,
                  "memory_mb": memory_mb}
        begin = time.perf_counter()
        async with self._admission:
            result, node_id = await (self._run_session(code, kwargs) if session else self._run_stateless(code, kwargs))
        self._stats.record(node_id, time.perf_counter() - begin, result)
        return result

    async def _run_stateless(self, code: str, kwargs: dict[str, Any]) -> tuple[ExecResult, str | None]:
        lost: _Member | None = None
        for _ in range(2):
            member = await self._pick(exclude=lost)
            if member is None:
                break
            try:
                return await self._call(member, code, kwargs), member.node_id
            except RayActorError as exc:
                logger.warning("sandbox actor on node %s lost mid-call (%s); retrying the call elsewhere",
                               member.node_id[:8], type(exc).__name__)
                with self._lock:
                    self._node(member.node_id).retries += 1
                self._lose(member)
                lost = member
        note = "SandboxError: the sandbox actors were lost (retried once)" if lost else \
            f"SandboxError: no sandbox actor became ready within {self.start_timeout:g} s"
        return ExecResult.failure(ToolStatus.SANDBOX_ERROR, note), lost.node_id if lost else None

    async def _run_session(self, code: str, kwargs: dict[str, Any]) -> tuple[ExecResult, str | None]:
        session = kwargs["session"]
        member = self._sessions.get(session)
        if member is None:
            picked = await self._pick()
            if picked is None:
                return ExecResult.failure(ToolStatus.SANDBOX_ERROR, "SandboxError: no sandbox actor is ready"), None
            with self._lock:  # a turn's calls arrive together: the first to get here places the session
                member = self._sessions.setdefault(session, picked)
                if member is not picked:
                    self._claim(picked, -1)
                    self._claim(member)
        elif not member.alive:
            return _session_lost(member), member.node_id
        else:
            with self._lock:
                self._claim(member)
        try:
            return await self._call(member, code, kwargs), member.node_id
        except RayActorError:
            self._lose(member)
            return _session_lost(member), member.node_id

    async def close_session(self, session: str) -> None:
        member = self._sessions.pop(session, None)
        if member is not None and member.alive:
            ref = member.handle.close_session.remote(session)
            with contextlib.suppress(RayActorError, asyncio.TimeoutError):
                await asyncio.wait_for(ref, self.health_timeout)  # a lost node must not hold the episode up

    # -- reporting and shutdown ----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """In flight, queued, p50/p99 latency (seconds, from `run` to its answer), and per node id: ready actors,
        calls, `errors` (`sandbox_error` answers), `retries` (stateless calls moved after an actor there was lost) and
        `lost` actors; `starting`: actors Ray has not placed or started yet."""
        with self._lock:
            starting = sum(not m.ready for m in self._members)
        return self._stats.report(self._admission, starting=starting)

    def close(self) -> None:
        """Stop using the pool; kill a private pool's actors (their fork servers exit with them). A named pool's
        actors stay for the other processes, and end with the process that created them; replacements this process
        started are its own, and are killed. The cluster stays up. Returns within `close_timeout` seconds whatever
        state the actors are in (a kill Ray cannot finish is left to the maintenance thread, a daemon)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._lock:
            members, self._members = self._members, []
        for member in members:
            member.alive = False
            if self.name is None or member.replacement:
                self._submit(functools.partial(self._kill, member))
        self._submit(None)  # type: ignore[arg-type]
        if self._maintenance is not None and self._maintenance is not threading.current_thread():
            self._maintenance.join(self.close_timeout)  # no Ray calls after close (they would reconnect to Ray)

    def actor_nodes(self) -> list[str]:
        """The node id of every ready actor, for tests and placement checks."""
        with self._lock:
            return [m.node_id for m in self._members if m.ready]


def _session_lost(member: _Member) -> ExecResult:
    return ExecResult.failure(ToolStatus.SANDBOX_ERROR,
                              f"SandboxError: the sandbox holding this session's state was lost "
                              f"(node {member.node_id[:8]}); the episode cannot continue")
