"""The sandbox server: a pre-warmed Python that schedules calls and sessions onto confined children.

Started once by `LocalSandbox` (never forked from the trainer), with an empty environment and, where the machine
allows, inside bubblewrap. Right after warming up, before the first request, its entry point (start.py) forks the
zygotes (zygote.py), which fork every child, so no child is ever a copy of a process that held another call's code
or output. The server keeps a few children forked
ahead of demand, each already confined (confine.py) and blocked on a pipe until its code arrives. The concurrency
limit lives here and nowhere else. Sessions (per-episode state) are fork snapshots (child.py); between two of its
calls a session is stopped, and anything but its head that it left running is killed.

Two zygotes (start.py): the full one, and a lean one without sympy and numpy whose children cost less; each
stateless call takes a child of the one its code needs (`needs_full`), sessions always the full one.

Protocol: on a Unix socket, one request per connection (protocol.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import signal
import socket
import struct
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from . import cell, confine
from .cgroups import CallGroup
from .config import Config, needs_full
from .protocol import pack, read_frame, recv_message, send_message


@dataclass
class ZygoteLink:
    """The server's end of one zygote: its socket and pid, and the children it forked ahead of demand."""

    name: str  # "full" or "lean"
    sock: socket.socket
    pid: int
    pool: list[Child] = field(default_factory=list)
    refilling: bool = False
    forked: int = 0  # children it has forked (for `info`, and the bench's record of which zygote a call used)


@dataclass
class Child:
    """A confined process, its code pipe and output buffer; `sid` names every process it starts."""

    cid: int
    zygote: ZygoteLink
    pid: int
    code_fd: int
    buffer: cell.OutputBuffer
    exited: asyncio.Future[tuple[int, float, bool]]  # (wait status, CPU seconds, killed for memory)
    sid: int  # the session it leads: kept when a cell takes over as head
    status_fd: int = -1  # a session's: each of its cells says `S` on it (StartChannel)
    group: CallGroup | None = None  # its cgroup (a session's cells share it): what it holds in memory
    report: bytes = b""  # what a single-use child said on its code socket: `run\n`, then `done <exit code>\n`
    report_closed: bool = False

    @property
    def started(self) -> bool:
        """The child said it is confined and about to run the code: whatever happens next is the code's doing."""
        return self.report.startswith(b"run\n")


_CREDENTIALS = struct.Struct("3i")  # pid, uid, gid
_CREDENTIALS_SPACE = socket.CMSG_SPACE(_CREDENTIALS.size)


def _writer(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The pid the kernel attached to a message (SO_PASSCRED); None for end of file, which carries none."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _CREDENTIALS.size:
            return int(_CREDENTIALS.unpack(data[: _CREDENTIALS.size])[0])
    return None


def _passing_credentials(sock: socket.socket) -> socket.socket:
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return sock


class StartChannel:
    """The socket on which a session's cells say `S` just before their code starts. Every process of the session
    holds it; the kernel names each message's writer. It is read only when the server needs to know, a bounded
    number of messages, so a flood fills its writers' buffer and costs the server one bounded read."""

    def __init__(self, fd: int) -> None:
        self.sock = _passing_credentials(socket.socket(fileno=fd))
        self.started = False

    def _drain(self, limit: int = 4096) -> None:
        for _ in range(limit):  # a cell's `S` precedes anything its code writes, and the buffer holds a few hundred
            try:
                data, ancillary, _, _ = self.sock.recvmsg(8, _CREDENTIALS_SPACE)
            except OSError:  # nothing waiting (BlockingIOError) or closed
                return
            if not data and _writer(ancillary) is None:
                return
            self.started |= data == b"S\n"

    def clear(self) -> None:
        """Forget what earlier calls said."""
        self._drain()
        self.started = False

    def any_started(self) -> bool:
        """Whether a cell said its code was starting since `clear` (only the session's own processes hold this
        socket, and the head never writes on it)."""
        self._drain()
        return self.started

    def close(self) -> None:
        self.sock.close()


class ReportChannel:
    """A head's report socket (SOCK_SEQPACKET): the server sends one end to the head on the code socket (`_hello`)
    and keeps the other. Each message comes with its writer's pid as the kernel saw it (SO_PASSCRED), and only those
    from `writer` are kept, a few at a time: a flood from any other process costs a read, never a place. End of file
    (every holder gone) is kept too, as (0, b"")."""

    def __init__(self, sock: socket.socket, writer: int,
                 events: asyncio.Queue[tuple[ReportChannel, int, bytes]]) -> None:
        """`writer` 0: any process that holds the other end (a hand-over's, whose pid is checked as it is read)."""
        self.sock = _passing_credentials(sock)
        self.writer = writer
        self.events = events  # the session's: one queue for the head's channel and a hand-over's
        self.pending = 0
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        for _ in range(64):  # then let the loop breathe
            try:
                data, ancillary, _, _ = self.sock.recvmsg(64, _CREDENTIALS_SPACE)
            except BlockingIOError:
                return
            except OSError:
                data, ancillary = b"", []
            pid = _writer(ancillary)
            if not data and pid is None:
                self.close()
                self.events.put_nowait((self, 0, b""))
                return
            if pid is not None and self.writer in (0, pid) and self.pending < 16:
                self.pending += 1
                self.events.put_nowait((self, pid, data))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


@dataclass
class Session:
    head: Child
    status: StartChannel
    reports: ReportChannel  # from the head alone: its cells close their copy before their code runs
    events: asyncio.Queue[tuple[ReportChannel, int, bytes]]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    took_over: bool = False  # a cell became the head: the head's process now holds what model code left in it
    memory: int = 0  # bytes it held when last paused (a stopped session does not grow)


def _thread_count(pid: int) -> int:
    """The threads a process runs now, as the kernel counts them (nothing in the process can change what it says);
    0 once it is exiting or gone (a zombie counts one)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
        if fields["State"].split()[0] not in ("Z", "X"):
            return int(fields["Threads"])
    return 0


_RESET_NOTICES = 1024  # sessions closed by the server whose next call has not come yet, remembered at most


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def signal_name(sig: int) -> str:
    """A signal's name for a note, for every number a process can die of (`signal.Signals` lacks the real-time ones,
    and raising here would turn the code's own signal into an executor failure)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        if signal.SIGRTMIN <= sig <= signal.SIGRTMAX:
            return f"SIGRTMIN+{sig - signal.SIGRTMIN}"
        return f"signal {sig}"


def _available_mb() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) >> 10
    return 4096


def _anonymous_bytes(pid: int) -> int:
    """Resident pages not backed by a file (statm: resident minus shared), readable for any pid."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/statm") as f:
        fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    return 0


def _confinement(report: dict[str, Any]) -> tuple[Any, ...]:
    """What a zygote's probe child had, less what differs per child (its uid, cgroup, namespaces' ids)."""
    child = report.get("child", {})
    kept = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "dumpable")
    return sorted(report.get("missing", {})), [child.get(key) for key in kept], "ns_user" in child


class Server:
    def __init__(self, config: Config, full: ZygoteLink, lean: ZygoteLink | None = None,
                 heavy: frozenset[str] = frozenset()) -> None:
        self.config = config
        self.full = full  # sessions, and stateless code that needs what only it preloads
        self.lean = lean
        self.heavy = heavy  # top-level modules only the full zygote preloads
        self.semaphore = asyncio.Semaphore(config.max_concurrency)
        self.forking: dict[int, asyncio.Future[tuple[int, asyncio.Future[Any], CallGroup | None]]] = {}
        self.waiters: dict[int, asyncio.Future[tuple[int, float, bool]]] = {}
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.opening: dict[str, asyncio.Future[Session]] = {}
        self.running: dict[int, Child] = {}
        self.cids = itertools.count(1)
        self.stopped = asyncio.Event()
        self.layers: dict[str, Any] = {}
        self.memory_budget = (config.session_memory_mb or _available_mb() // 2) << 20
        self.zygote_anon = _anonymous_bytes(full.pid)
        self.evicted = 0  # sessions closed to fit the memory budget
        self.reset_notices: OrderedDict[str, str] = OrderedDict()  # what a closed session's next call is told

    # -- the zygote ----------------------------------------------------------------------------------------------

    @property
    def zygotes(self) -> list[ZygoteLink]:
        return [self.full] if self.lean is None else [self.full, self.lean]

    def zygote_for(self, code: object) -> ZygoteLink:
        """The zygote a stateless call's child comes from (`needs_full`)."""
        if self.lean is None or not isinstance(code, str) or needs_full(code, self.heavy):
            return self.full
        return self.lean

    def _on_zygote(self, zygote: ZygoteLink) -> None:
        try:
            message, fds = recv_message(zygote.sock)
        except OSError:
            message, fds = None, []
        for fd in fds:
            os.close(fd)
        if message is None:  # a zygote died: stop, and the client starts a fresh server (both zygotes) at its next call
            self.stopped.set()
            return
        loop = asyncio.get_running_loop()
        if message["op"] == "forked":
            waiter = self.forking.pop(message["cid"], None)
            if message["pid"] < 0:
                if waiter is not None and not waiter.done():
                    waiter.set_exception(OSError(f"the zygote could not fork a child ({message.get('error')})"))
                return
            exited = self.waiters[message["pid"]] = loop.create_future()  # before its exit can be reported
            if waiter is not None and not waiter.done():
                group = message.get("group")
                waiter.set_result((message["pid"], exited, CallGroup(group[0], tuple(group[1])) if group else None))
        elif message["op"] == "exit":
            ended = self.waiters.pop(message["pid"], None)
            if ended is not None and not ended.done():
                ended.set_result((message["status"], message["cpu"], message["oom"]))

    async def _fork(self, zygote: ZygoteLink, *, session: bool) -> Child:
        """Have `zygote` fork a confined child with a private code pipe and output buffer (and status socket)."""
        cid = next(self.cids)
        buffer = cell.OutputBuffer(self.config.max_output_bytes)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # code in, `done <exit code>` out
        code_w, code_r = ours.detach(), theirs.detach()
        status_r, status_w = ((s.detach() for s in socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET))
                              if session else (-1, -1))
        forked = self.forking[cid] = asyncio.get_running_loop().create_future()
        try:
            send_message(zygote.sock, {"op": "fork", "cid": cid, "session": session},
                         [code_r, buffer.fd] + ([status_w] if session else []))
            zygote.forked += 1
        finally:
            os.close(code_r)
            buffer.release_fd()
            if status_w >= 0:
                os.close(status_w)
        pid, exited, group = await forked
        os.set_blocking(code_w, False)
        return Child(cid, zygote, pid, code_w, buffer, exited, sid=pid, status_fd=status_r, group=group)

    def _discard(self, child: Child) -> None:
        """Kill a child's group, free its pipes and buffer, and have the zygote clean up after it. Idempotent."""
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        for fd in (child.code_fd, child.status_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if child.code_fd >= 0 or child.status_fd >= 0:
            with contextlib.suppress(OSError):
                send_message(child.zygote.sock, {"op": "release", "cid": child.cid})
        child.code_fd = child.status_fd = -1
        child.buffer.close()

    async def _refill(self, zygote: ZygoteLink) -> None:
        """Fork what a zygote's pool lacks, all requests at once: it forks a burst back to back (zygote.py)."""
        try:
            while len(zygote.pool) < self.config.prefork and not self.stopped.is_set():
                wanted = self.config.prefork - len(zygote.pool)
                forked = await asyncio.gather(*(self._fork(zygote, session=False) for _ in range(wanted)),
                                              return_exceptions=True)
                zygote.pool += [c for c in forked if isinstance(c, Child)]
                failed = next((c for c in forked if isinstance(c, BaseException)), None)
                if failed is not None:
                    raise failed
        except OSError as exc:  # the next call forks on demand, and reports the failure if it persists
            print(f"sandbox server: prefork failed: {exc}", file=sys.stderr, flush=True)
        finally:
            zygote.refilling = False

    def _schedule_refill(self, zygote: ZygoteLink) -> None:
        if not zygote.refilling and not self.stopped.is_set():
            zygote.refilling = True
            asyncio.get_running_loop().create_task(self._refill(zygote))

    async def _take(self, zygote: ZygoteLink) -> Child:
        while zygote.pool:
            child = zygote.pool.pop(0)
            if not child.exited.done():
                return child
            self._discard(child)
        return await self._fork(zygote, session=False)

    # -- results -------------------------------------------------------------------------------------------------

    def _result(self, child: Child, exit_info: tuple[int, float, bool], request: dict[str, Any], duration: float,
                timed_out: bool, started: bool) -> dict[str, Any]:
        """The call's result; `sandbox_error` only when the child never said it was about to run the code."""
        wait_status, cpu, oom = exit_info
        stdout, stdout_truncated = child.buffer.read(0)
        stderr, stderr_truncated = child.buffer.read(1)
        state = child.buffer.status()
        timeout = request["timeout"]
        exit_code: int | None = None
        note = ""
        memory = request.get("memory_mb") or self.config.memory_mb
        if os.WIFEXITED(wait_status):
            exit_code = os.WEXITSTATUS(wait_status)
        if not started:
            why = (f"did not start the code within the {timeout:g} s time limit" if timed_out
                   else "could not confine the call")
            status, note = "sandbox_error", f"SandboxError: the sandbox {why}; the code did not run"
        elif timed_out:
            status, note = "timeout", f"TimeoutError: execution exceeded the {timeout:g} s time limit"
        elif os.WIFSIGNALED(wait_status):
            sig = os.WTERMSIG(wait_status)
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= math.ceil(timeout)):
                status = "timeout"
                note = f"TimeoutError: execution exceeded the {math.ceil(timeout) + 1} s CPU time limit"
            elif sig == signal.SIGKILL and oom:
                status = "memory"
                note = f"MemoryError: execution exceeded the {memory} MB memory limit (files in /tmp count)"
            else:
                status, note = "killed", f"Killed: the process was terminated by signal {signal_name(sig)}"
        elif state == cell.STATUS_MEMORY:
            status, note = "memory", f"MemoryError: execution exceeded the {memory} MB memory limit"
        elif exit_code == 0:
            status = "ok"
        else:
            status = "error"
            if not stderr.strip():
                note = f"SystemExit: {exit_code}"
        return {
            "status": status, "stdout": stdout, "stderr": stderr, "exit_code": exit_code, "duration": duration,
            "stdout_truncated": stdout_truncated, "stderr_truncated": stderr_truncated, "note": note,
        }  # fmt: skip

    @staticmethod
    def _failed_after_start(child: Child, duration: float, exc: Exception, reset: str = "") -> dict[str, Any]:
        """The result when the server's own path fails once the code has started: the code's outcome (`killed`,
        with what failed), never `sandbox_error`, whatever the code did to cause it."""
        result: dict[str, Any] = {"status": "killed", "duration": duration,
                                  "note": f"Killed: the call ended abnormally ({type(exc).__name__}: {exc}){reset}"}
        with contextlib.suppress(Exception):
            result["stdout"], result["stdout_truncated"] = child.buffer.read(0)
            result["stderr"], result["stderr_truncated"] = child.buffer.read(1)
        return result

    @staticmethod
    def _absorb(child: Child) -> None:
        """Take in what a single-use child has said on its code socket so far (a few bytes at most)."""
        while len(child.report) < 64 and not child.report_closed:
            try:
                chunk = os.read(child.code_fd, 64)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                child.report_closed = True
            child.report += chunk

    async def _read_done(self, child: Child) -> int | None:
        """The exit code a single-use child reports after `run`, just before it exits, or None (it closed, or sent
        garbage)."""
        loop = asyncio.get_running_loop()
        while not child.report_closed and child.report.count(b"\n") < 2 and len(child.report) < 64:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(child.code_fd, _resolve, ready)
            try:
                await ready
            finally:
                loop.remove_reader(child.code_fd)
            self._absorb(child)
        match = re.fullmatch(rb"run\ndone (\d{1,3})\n", child.report)
        return int(match.group(1)) & 0xFF if match else None

    async def _finished(self, child: Child) -> tuple[int, float, bool]:
        """How the child ended: its own report (then it is killed, its teardown unwaited), else its exit."""
        reader = asyncio.ensure_future(self._read_done(child))
        try:
            await asyncio.wait([reader, child.exited], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]  # two result types
            if reader.done() and reader.result() is not None:
                with contextlib.suppress(OSError):
                    os.killpg(child.pid, signal.SIGKILL)
                return int(reader.result() or 0) << 8, 0.0, False
            return await asyncio.shield(child.exited)
        finally:
            reader.cancel()

    async def _send(self, fd: int, request: dict[str, Any]) -> None:
        data = pack(request)
        loop = asyncio.get_running_loop()
        while data:
            try:
                written = os.write(fd, data)
                data = data[written:]
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)

    # -- requests ------------------------------------------------------------------------------------------------

    async def run_stateless(self, request: dict[str, Any]) -> dict[str, Any]:
        async with self.semaphore:
            child = await self._take(self.zygote_for(request.get("code")))
            self.running[child.pid] = child
            start = time.perf_counter()
            timed_out = False
            try:
                try:
                    await self._send(child.code_fd, request)
                    exit_info = await asyncio.wait_for(self._finished(child), request["timeout"])
                except (asyncio.TimeoutError, BrokenPipeError):
                    timed_out = not child.exited.done()
                    with contextlib.suppress(OSError):
                        os.killpg(child.pid, signal.SIGKILL)
                    exit_info = await child.exited
                duration = time.perf_counter() - start
                self._absorb(child)  # its `run` may still be unread when its exit is reported first
                return self._result(child, exit_info, request, duration, timed_out, child.started)
            except Exception as exc:
                self._absorb(child)
                if not child.started:
                    raise
                with contextlib.suppress(OSError):
                    os.killpg(child.pid, signal.SIGKILL)
                return self._failed_after_start(child, time.perf_counter() - start, exc)
            finally:
                self.running.pop(child.pid, None)
                # After the response is written (call_soon): the child is already dead or dying, and the release and
                # the next fork then compete with no one on a busy core.
                loop = asyncio.get_running_loop()
                loop.call_soon(self._discard, child)
                loop.call_soon(self._schedule_refill, child.zygote)

    async def _open_session(self, name: str, wait: float) -> Session:
        while len(self.sessions) >= self.config.max_sessions:  # close the least recently used, idle if possible
            idle = [key for key, s in self.sessions.items() if not s.lock.locked()]
            closed = idle[0] if idle else next(iter(self.sessions))
            self._close(self.sessions.pop(closed))
            self._tell(closed, f"at most {self.config.max_sessions} sessions are kept open, and it was the least "
                               "recently used")
        head = await self._fork(self.full, session=True)
        status = StartChannel(head.status_fd)
        head.status_fd = -1  # owned by the channel now
        events: asyncio.Queue[tuple[ReportChannel, int, bytes]] = asyncio.Queue()
        reports = None
        try:
            reports = self._hello(head.code_fd, head.pid, events)
            _, _, line = await asyncio.wait_for(events.get(), wait)
            if line != b"R\n":
                raise OSError(f"its first word was {line!r}")
        except (OSError, asyncio.TimeoutError) as exc:
            status.close()
            if reports is not None:
                reports.close()
            self._discard(head)
            raise OSError(f"the session's interpreter did not start ({type(exc).__name__}: {exc})") from exc
        session = Session(head, status, reports, events)
        self.sessions[name] = session
        return session

    @staticmethod
    def _hello(code_fd: int, writer: int, events: asyncio.Queue[tuple[ReportChannel, int, bytes]]) -> ReportChannel:
        """Send a fresh report channel on the session's code socket, to be read by a head in its loop, which answers
        `R` on it (`_run_cell`). Only `writer`'s messages count on it (0: anyone's), as the kernel names them."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        channel = ReportChannel(ours, writer, events)
        try:
            code = socket.socket(fileno=code_fd)
            try:
                socket.send_fds(code, [pack({"op": "hello"})], [theirs.fileno()])
            finally:
                code.detach()
        except OSError:
            channel.close()
            raise
        finally:
            theirs.close()
        return channel

    def _is_cell(self, pid: int, head: Child, *, gone_ok: bool = False) -> bool:
        """A head that took over is a process model code ran in, so check a pid it reports before signalling it.
        `gone_ok`: a quick cell may have ended (and been reaped) before we look."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # gone before the open, or reaped between open and read
            return gone_ok and pid > 0
        except (OSError, IndexError):
            return False
        parent, group, sid = int(fields[1]), int(fields[2]), int(fields[3])
        return parent in (head.pid, self.full.pid) and group == pid and sid == head.sid

    def _close(self, session: Session) -> None:
        session.status.close()
        session.reports.close()
        confine.sweep(session.head.sid, session.head.group, wait=0)  # one round: the zygote kills what is left
        self._discard(session.head)

    def _pause(self, session: Session) -> None:
        """Between calls nothing of a session runs: its head is stopped and everything else it started killed, in
        its session and its cgroup, until none is left (`confine.sweep`). Then what it holds is measured, and
        sessions are closed until what they hold fits the memory budget (`_fit_memory_budget`)."""
        with contextlib.suppress(OSError):
            os.kill(session.head.pid, signal.SIGSTOP)
        confine.wait_stopped(session.head.pid)
        confine.sweep(session.head.sid, session.head.group, keep=session.head.pid)
        session.memory = self._memory_of(session.head)
        self._fit_memory_budget(grew=session)

    def _memory_of(self, head: Child) -> int:
        """Bytes a stopped session holds: its cgroup's charge (its /tmp included), else its head's private pages
        beyond what it shares with the zygote (an estimate: files in its /tmp are not seen)."""
        if head.group is not None:
            charged = head.group.memory_bytes()
            if charged is not None:
                return charged
        return max(0, _anonymous_bytes(head.pid) - self.zygote_anon)

    def _fit_memory_budget(self, grew: Session) -> None:
        """Past the budget, close sessions holding more than an equal share of it until the rest fit: `grew` (the
        one just measured) first, then the largest. A session within its share is never closed for what its siblings
        hold, and a closed session's next call is told why (`_tell`)."""
        total = sum(s.memory for s in self.sessions.values())
        if total <= self.memory_budget:
            return
        share = self.memory_budget // len(self.sessions)
        over = [(name, s) for name, s in self.sessions.items()
                if s.memory > share and (s is grew or not s.lock.locked())]
        for name, session in sorted(over, key=lambda item: (item[1] is grew, item[1].memory), reverse=True):
            if total <= self.memory_budget:
                return
            total -= session.memory
            del self.sessions[name]
            if session is grew:  # once its call has answered (it holds the head's output)
                asyncio.get_running_loop().call_soon(self._close, session)
            else:
                self._close(session)
            self.evicted += 1
            self._tell(name, f"it held {session.memory >> 20} MB, more than its {share >> 20} MB share of the "
                             f"{self.memory_budget >> 20} MB memory budget of idle sessions")

    def _tell(self, name: str, why: str) -> None:
        """Remember why the server closed session `name`, for its next call's note."""
        self.reset_notices[name] = (f"SessionReset: this session was closed after its last call ({why}); its "
                                    "variables and imports are gone, so define what you need again")
        while len(self.reset_notices) > _RESET_NOTICES:
            self.reset_notices.popitem(last=False)

    async def run_session_told(self, name: str, request: dict[str, Any]) -> dict[str, Any]:
        """`run_session`, its note saying first whether the server closed this session since its last call."""
        notice = "" if name in self.sessions or name in self.opening else self.reset_notices.pop(name, "")
        result = await self.run_session(name, request)
        if notice:
            result["note"] = "\n".join(filter(None, (notice, result.get("note"))))
        return result

    async def _session(self, name: str, wait: float) -> Session:
        """The named session, opened once even when several of its calls arrive together."""
        session = self.sessions.get(name)
        if session is not None:
            return session
        opening = self.opening.get(name)
        if opening is None:
            opening = self.opening[name] = asyncio.ensure_future(self._open_session(name, wait))
            opening.add_done_callback(lambda _: self.opening.pop(name, None))
        return await asyncio.shield(opening)

    async def run_session(self, name: str, request: dict[str, Any]) -> dict[str, Any]:
        """One cell of a session (`_run_cell`). Once a cell has taken over, the head's process is one that model code
        ran in: whatever becomes of it, or of the server's own path, is the code's outcome, never `sandbox_error`."""
        session = await self._session(name, request["timeout"] + 5)
        if self.sessions.get(name) is session:
            self.sessions.move_to_end(name)
        async with session.lock, self.semaphore:
            start = time.perf_counter()
            try:
                return await self._run_cell(name, session, request, start)
            except Exception as exc:  # the server's own path failed: what the session holds is unknown, so reset it
                self._forget(name, session)
                if session.took_over or session.status.any_started():
                    return self._failed_after_start(session.head, time.perf_counter() - start, exc,
                                                    "; the session was reset")
                note = f"SandboxError: the session failed before the code started ({type(exc).__name__}: {exc})"
                return {"status": "sandbox_error", "note": note, "duration": time.perf_counter() - start}

    def _forget(self, name: str, session: Session) -> None:
        if self.sessions.get(name) is session:
            del self.sessions[name]
        self._close(session)

    @staticmethod
    async def _event(session: Session, deadline: float) -> tuple[ReportChannel, int, bytes]:
        """The next message on the head's channel or a hand-over's. Raises TimeoutError past `deadline`."""
        channel, pid, line = await asyncio.wait_for(session.events.get(), max(0.0, deadline - time.perf_counter()))
        channel.pending -= bool(line)
        return channel, pid, line

    async def _from_head(self, session: Session, deadline: float) -> bytes:
        """The head's next report; b"" once it is gone."""
        while not session.reports.closed or not session.events.empty():
            channel, _, line = await self._event(session, deadline)
            if channel is session.reports:
                return line
        return b""

    async def _run_cell(self, name: str, session: Session, request: dict[str, Any], start: float) -> dict[str, Any]:
        """The head forks a cell for the code and reports on its own channel: `C <cell pid>`, then `X <wait status>`
        once the cell ends; the cell says `S` just before its code starts.

        Why the head's word can be trusted. The server believes what the kernel says about a process, never a
        secret in its memory (its code can read all of it). With the request it sends a fresh report channel on the
        code socket (`_hello`); a cell that succeeded clears its signal handlers, reads the channel back in the
        head's loop and answers `R` on it. The server takes the cell as the new head on that answer from the cell's
        pid (the kernel names each writer) once the kernel counts one thread in it, and then ends the old head,
        which held the state from before the cell. So a stop proves nothing (a cell that stops its own group runs
        into its time limit); a cell cannot become the head with a thread left running (an `error`, the state as
        before it); and every report comes from a head's one thread, on a channel none of its cells holds (each
        closes its copy before its code runs), out of reach of any flood. What code does to its own interpreter
        (rewriting the loop's functions) it does to its own later cells.
        """
        head = session.head
        head.buffer.reset()
        session.status.clear()
        while not session.events.empty():  # what an earlier call left unread (a channel's end stays known)
            session.events.get_nowait()[0].pending = 0
        deadline = start + request["timeout"]
        timed_out, threads_left, cell, answered = False, 0, 0, 0
        problem, line = "", b""
        handover: ReportChannel | None = None
        try:
            with contextlib.suppress(OSError):
                os.kill(head.pid, signal.SIGCONT)
            await self._send(head.code_fd, request)
            handover = self._hello(head.code_fd, 0, session.events)  # read after the request: by the cell, if any
            while True:
                try:  # a loaded machine may take a while to fork: the cell's pid gets 5 s more
                    channel, pid, line = await self._event(session, deadline if cell else deadline + 5)
                except asyncio.TimeoutError:
                    if not cell:
                        raise
                    timed_out = True
                    if self._is_cell(cell, head):
                        with contextlib.suppress(OSError):
                            os.killpg(cell, signal.SIGKILL)
                    line = await self._from_head(session, time.perf_counter() + 2.0)
                    break
                if channel is session.reports and not cell:
                    named = re.fullmatch(rb"C (\d{1,9})\n", line)
                    if named is None or not self._is_cell(int(named[1]), head, gone_ok=True):
                        raise ValueError(f"unexpected report from the session head: {line!r}")
                    cell = int(named[1])
                elif channel is session.reports:
                    break
                elif channel is handover and line == b"R\n":
                    answered = pid  # the cell may answer before its head's `C` is read
                if cell and answered == cell:
                    answered = 0
                    threads = await self._threads_after_joins(cell, deadline)
                    if threads == 1 and self._is_cell(cell, head):
                        return await self._hand_over(session, handover, cell, request, start, deadline)
                    threads_left = max(0, threads - 1)
                    if self._is_cell(cell, head):
                        with contextlib.suppress(OSError):  # its head then reports how it ended, its state kept
                            os.killpg(cell, signal.SIGKILL)
        except (asyncio.TimeoutError, OSError, ValueError) as exc:
            problem = f" ({type(exc).__name__}: {exc})"
            line = b""
        finally:
            if handover is not None and handover is not session.reports:
                handover.close()
        duration = time.perf_counter() - start
        ended = re.fullmatch(rb"X (\d{1,5})\n", line)
        if ended is not None and int(ended[1]) < 1 << 16:
            started = session.took_over or session.status.any_started()
            result = self._result(head, (int(ended[1]), 0.0, False), request, duration, timed_out, started)
            if threads_left and not timed_out:
                result["status"] = "error"
                result["note"] = (f"RuntimeError: the cell left {threads_left} thread(s) running; a session keeps no "
                                  "thread between calls, so its state is as before the cell (join threads before it "
                                  "ends)")
            self._pause(session)
            return result
        self._forget(name, session)
        if timed_out:
            note = f"TimeoutError: execution exceeded the {request['timeout']:g} s time limit; the session was reset"
            return {"status": "timeout", "note": note, "duration": duration}
        if session.took_over or session.status.any_started():
            note = ("Killed: the session's interpreter, which runs the code, died; its state is lost and the session "
                    "was reset")
            return {"status": "killed", "note": note + problem, "duration": duration}
        note = f"SandboxError: the session's interpreter died and its state is lost{problem}"
        return {"status": "sandbox_error", "note": note, "duration": duration}

    @staticmethod
    async def _threads_after_joins(pid: int, deadline: float) -> int:
        """The threads of a cell that answered: a thread its code joined may take a moment to leave the kernel's
        count, so more than one is counted again for up to 0.5 s (within the time limit)."""
        until = min(deadline, time.perf_counter() + 0.5)
        while (threads := _thread_count(pid)) > 1 and time.perf_counter() < until:
            await asyncio.sleep(0.005)
        return threads

    async def _hand_over(self, session: Session, handover: ReportChannel, cell: int, request: dict[str, Any],
                         start: float, deadline: float) -> dict[str, Any]:
        """Make the cell that answered the hand-over the session's head, end the old head, and pause the session."""
        duration = time.perf_counter() - start
        head = session.head
        exited = self.waiters[cell] = asyncio.get_running_loop().create_future()  # reported once the zygote adopts it
        session.head = Child(head.cid, head.zygote, cell, head.code_fd, head.buffer, exited, sid=head.sid,
                             group=head.group)
        session.reports.close()
        session.reports = handover
        session.took_over = True
        with contextlib.suppress(OSError):
            os.kill(head.pid, signal.SIGKILL)
        # Stop the new head only once the old one has exited: its exit orphans the new head's process group, and the
        # kernel then sends it SIGCONT if it is stopped. A loaded machine may take seconds, so the wait is what is
        # left of the call's time limit, plus 5 s, as for its first report.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(head.exited), max(0.0, deadline - time.perf_counter()) + 5)
        self._pause(session)
        return self._result(session.head, (0, 0.0, False), request, duration, False, True)

    async def close_session(self, name: str) -> None:
        self.reset_notices.pop(name, None)  # closed by its owner: a later session of that name starts fresh
        session = self.sessions.pop(name, None)
        if session is not None:
            async with session.lock:
                self._close(session)

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "pool": sum(len(z.pool) for z in self.zygotes),
            "zygotes": {z.name: {"pid": z.pid, "pool": len(z.pool), "forked": z.forked} for z in self.zygotes},
            "sessions": len(self.sessions),
            "session_memory_mb": sum(s.memory for s in self.sessions.values()) >> 20,
            "session_memory_budget_mb": self.memory_budget >> 20,
            "sessions_evicted": self.evicted,
            "running": len(self.running),
            "layers": self.layers,
        }

    @staticmethod
    def _peer_is_us(writer: asyncio.StreamWriter) -> bool:
        """Abstract socket addresses have no file permissions, so only our own uid may submit work."""
        sock = writer.get_extra_info("socket")
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1] == os.getuid()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._peer_is_us(writer):
            writer.close()
            return
        try:
            request = await read_frame(reader)
            op = request.get("op")
            if op == "run":
                if request.get("session"):
                    response = await self.run_session_told(request["session"], request)
                else:
                    response = await self.run_stateless(request)
            elif op == "close_session":
                await self.close_session(request["session"])
                response = {}
            elif op == "info":
                response = self.info()
            else:
                response = {"status": "sandbox_error", "note": f"SandboxError: unknown op {op!r}"}
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        except Exception as exc:  # a bug here must cost one call, not the server
            response = {"status": "sandbox_error", "note": f"SandboxError: {type(exc).__name__}: {exc}"}
        try:
            writer.write(pack(response))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        self.stopped.set()
        for child in [*(c for z in self.zygotes for c in z.pool), *self.running.values()]:
            self._discard(child)
        for session in self.sessions.values():
            self._close(session)
        for zygote in self.zygotes:
            zygote.sock.close()  # each zygote then kills what is left and exits: wait for them
        for zygote in self.zygotes:
            with contextlib.suppress(OSError):
                for _ in range(300):
                    if os.waitpid(zygote.pid, os.WNOHANG)[0]:
                        break
                    time.sleep(0.01)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stopped.set)
        loop.add_signal_handler(signal.SIGCHLD, lambda: None)

        def lifeline() -> None:  # the client holds the other end; EOF means it is gone
            with contextlib.suppress(OSError):
                if os.read(self.config.lifeline_fd, 1):
                    return
            self.stopped.set()

        loop.add_reader(self.config.lifeline_fd, lifeline)
        reports = {}
        for zygote in self.zygotes:
            message, _ = recv_message(zygote.sock)  # which layers the zygote could apply, measured in a child
            if message is None:
                raise RuntimeError(f"the {zygote.name} zygote died while probing isolation layers")
            reports[zygote.name] = {"missing": message["missing"], "child": message["child"]}
        self.layers = reports["full"]
        if self.lean is not None and _confinement(reports["lean"]) != _confinement(self.layers):
            print(f"sandbox server: the lean zygote's layers differ ({reports['lean']}); not using it",
                  file=sys.stderr, flush=True)
            self.lean.sock.close()  # it exits; shutdown() reaps it
            self.lean = None
        for zygote in self.zygotes:
            loop.add_reader(zygote.sock.fileno(), self._on_zygote, zygote)
        listener = socket.socket(fileno=self.config.listen_fd)
        server = await asyncio.start_unix_server(self.handle, sock=listener, backlog=1024)
        for zygote in self.zygotes:
            zygote.refilling = True
        await asyncio.gather(*(self._refill(z) for z in self.zygotes))  # the first calls find their children waiting
        print("ready " + json.dumps(self.layers), flush=True)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        try:
            await self.stopped.wait()
        finally:
            server.close()
            self.shutdown()
