"""The fork server: a pre-warmed Python that forks one single-use child per call.

Started once by `LocalSandbox` (never forked from the trainer), with an empty environment and, where the machine
allows, inside bubblewrap. It keeps a few children forked ahead of demand, each already in its own session, working
directory, rlimits, uid and seccomp filter, blocked on a pipe until its code arrives. The concurrency limit lives
here and nowhere else. Sessions (per-episode state) are fork snapshots: a head process holds the state, each cell runs
in a fork of it, and the fork becomes the new head only if the cell succeeded, so a crash or timeout rolls back.

Protocol: on a Unix socket, one request per connection, each message a 4-byte big-endian length and JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import math
import os
import resource
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from . import cell, seccomp

PRELOAD = [
    "math", "cmath", "fractions", "decimal", "itertools", "functools", "collections", "statistics", "random", "re",
    "string", "heapq", "bisect", "operator", "copy", "json", "datetime", "time", "typing", "dataclasses", "numbers",
    "array", "textwrap", "pprint", "enum", "sympy", "numpy",
]  # fmt: skip
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_M_ARENA_MAX = -8
_FRAME = struct.Struct(">I")
_MB = 1 << 20


def pack(obj: Any) -> bytes:
    data = json.dumps(obj).encode("utf-8")
    return _FRAME.pack(len(data)) + data


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame_blocking(fd: int) -> Any | None:
    header = _read_exact(fd, _FRAME.size)
    if header is None:
        return None
    body = _read_exact(fd, _FRAME.unpack(header)[0])
    return None if body is None else json.loads(body)


async def read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    return json.loads(await reader.readexactly(size))


@dataclass
class Config:
    """What the client decides; sent to the server as JSON on its command line."""

    listen_fd: int
    lifeline_fd: int
    jobs_dir: str
    max_concurrency: int = 2
    prefork: int = 2
    memory_mb: int = 1024
    max_output_bytes: int = 16384
    traceback_lines: int = 12
    file_size_mb: int = 64
    open_files: int = 64
    max_sessions: int = 64
    use_seccomp: bool = True
    scratch_dirs: list[str] = field(default_factory=list)  # emptied of anything a child left behind
    scratch_keep: list[str] = field(default_factory=list)  # host paths bound inside a scratch dir: never swept
    drop_to_uid: int | None = None
    preload: list[str] = field(default_factory=lambda: list(PRELOAD))


@dataclass
class Child:
    """A process forked from the server, with its output page, code pipe and private directory."""

    pid: int
    code_fd: int
    buffer: cell.OutputBuffer
    workdir: str
    exited: asyncio.Future[tuple[int, Any]]
    status_fd: int = -1  # session heads report each cell on it


@dataclass
class Session:
    head: Child
    status: asyncio.StreamReader
    transport: asyncio.BaseTransport
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def warm_up(preload: list[str]) -> None:
    """Import and exercise the libraries model code uses, then freeze them out of the GC (copy-on-write friendly)."""
    for name in preload:
        with contextlib.suppress(Exception):
            __import__(name)
    if "sympy" in sys.modules:
        import sympy

        x, y = sympy.symbols("x y")
        sympy.factor(x**4 - 1), sympy.solve([x + y - 3, x - y - 1], [x, y]), sympy.simplify(sympy.sin(x) ** 2 + sympy.cos(x) ** 2)
        sympy.expand((x + 1) ** 5), sympy.Rational(3, 4) + 1, sympy.isprime(97), sympy.factorint(360), sympy.N(sympy.pi, 30)
        sympy.nsimplify(0.5), sympy.sqrt(8), sympy.binomial(10, 3), sympy.diff(x**3, x), sympy.integrate(x**2, x)
        sympy.Matrix([[1, 2], [3, 4]]).det(), sympy.summation(x, (x, 1, 10)), sympy.limit(1 / x, x, sympy.oo)
        str(sympy.latex(x**2 / 3)), sympy.gcd(12, 18), sympy.divisors(12), sympy.totient(10), sympy.primerange(1, 20)
    if "numpy" in sys.modules:
        import numpy as np

        a = np.arange(16.0).reshape(4, 4) + np.eye(4)
        np.linalg.solve(a, np.ones(4)), np.linalg.det(a), np.random.default_rng(0).random(3), str(a), np.sort(a)
    sys.set_int_max_str_digits(0)
    threading.stack_size(512 * 1024)  # so hundreds of threads fit under the address-space limit
    with contextlib.suppress(Exception):
        _libc().mallopt(_M_ARENA_MAX, 2)  # glibc reserves 64 MB of address space per malloc arena otherwise
    gc.collect()
    gc.freeze()


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.semaphore = asyncio.Semaphore(config.max_concurrency)
        self.pool: list[Child] = []
        self.waiters: dict[int, asyncio.Future[tuple[int, Any]]] = {}
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.running: dict[int, Child] = {}
        self.stopped = asyncio.Event()
        self.refilling = False
        self.pid = os.getpid()

    # -- children ------------------------------------------------------------------------------------------------

    def _fork(self, *, session: bool) -> Child:
        """Fork a child that prepares its sandbox, then waits for work (a cell, or a session's commands)."""
        loop = asyncio.get_running_loop()
        buffer = cell.OutputBuffer(self.config.max_output_bytes)
        workdir = tempfile.mkdtemp(dir=self.config.jobs_dir)
        if self.config.drop_to_uid is not None:
            os.chown(workdir, self.config.drop_to_uid, self.config.drop_to_uid)
        code_r, code_w = os.pipe()
        status_r, status_w = os.pipe() if session else (-1, -1)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                os.close(code_w)
                if status_r >= 0:
                    os.close(status_r)
                self._prepare_child(workdir, keep=(code_r, status_w), session=session)
                if session:
                    self._session_head_main(code_r, status_w, buffer)
                else:
                    self._child_main(code_r, buffer)
            finally:
                os._exit(70)
        os.close(code_r)
        if status_w >= 0:
            os.close(status_w)
        os.set_blocking(code_w, False)
        exited: asyncio.Future[tuple[int, Any]] = loop.create_future()
        self.waiters[pid] = exited
        return Child(pid, code_w, buffer, workdir, exited, status_r)

    def _prepare_child(self, workdir: str, keep: tuple[int, int], *, session: bool) -> None:
        """Everything a child does before it sees code: off the critical path."""
        cfg = self.config
        os.setsid()
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.pid:
            os._exit(0)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the file-size limit, writes fail with EFBIG instead
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        low, high = sorted(fd for fd in keep if fd >= 0) if keep[1] >= 0 else (keep[0], keep[0])
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, 1 << 16)
        os.chdir(workdir)
        limit_as = _address_space() + cfg.memory_mb * _MB
        resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
        resource.setrlimit(resource.RLIMIT_FSIZE, (cfg.file_size_mb * _MB, cfg.file_size_mb * _MB))
        resource.setrlimit(resource.RLIMIT_NOFILE, (cfg.open_files, cfg.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (4096, 4096))  # per uid; ignored for root
        if cfg.drop_to_uid is not None:
            uid = cfg.drop_to_uid
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
        if cfg.use_seccomp:
            # A session's cells are forks with other pids, so they may signal only their own group.
            seccomp.install(seccomp.build_filter(0 if session else os.getpid(), allow_fork=session))

    @staticmethod
    def _apply_request_limits(request: dict[str, Any], base_memory_mb: int) -> None:
        cpu = math.ceil(request["timeout"]) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        memory_mb = request.get("memory_mb")
        if memory_mb and 0 < memory_mb < base_memory_mb:
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            lower = hard - (base_memory_mb - memory_mb) * _MB
            resource.setrlimit(resource.RLIMIT_AS, (lower, lower))

    def _execute(self, request: dict[str, Any], buffer: cell.OutputBuffer, namespace: dict[str, Any]) -> int:
        import io

        self._apply_request_limits(request, self.config.memory_mb)
        sys.stdin = io.StringIO(request.get("stdin") or "")
        cell.capture(buffer)
        status, code = cell.run_cell(
            request["code"], namespace, echo=request.get("echo", True), traceback_lines=self.config.traceback_lines
        )
        buffer.set_status(status)
        return code

    def _child_main(self, code_fd: int, buffer: cell.OutputBuffer) -> None:
        request = read_frame_blocking(code_fd)
        if request is None:
            os._exit(0)
        os.close(code_fd)
        os._exit(self._execute(request, buffer, {"__name__": "__main__", "__builtins__": __builtins__}))

    def _session_head_main(self, command_fd: int, status_fd: int, buffer: cell.OutputBuffer) -> None:
        """Hold an episode's state; run each cell in a fork that replaces this process only if the cell succeeds."""
        namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
        fork, write, waitpid = os.fork, os.write, os.waitpid  # user code may rebind the os module's names
        while True:
            self._die_with_server()
            request = read_frame_blocking(command_fd)
            if request is None:
                os._exit(0)
            takeover_r, takeover_w = os.pipe()
            pid = fork()
            if pid == 0:
                os.close(takeover_r)
                os.setpgid(0, 0)  # its own group, so a timeout kills the cell and not the head
                code = self._execute(request, buffer, namespace)
                if buffer.status() != cell.STATUS_OK:
                    os._exit(code)
                write(takeover_w, b"T")
                os.close(takeover_w)
                continue  # this fork is the new head, with the cell's state
            os.close(takeover_w)
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)  # also here, so the group exists before the server may need to kill it
            write(status_fd, f"C {pid}\n".encode())
            took_over = os.read(takeover_r, 1) == b"T"
            os.close(takeover_r)
            if took_over:
                write(status_fd, b"T\n")
                os._exit(0)
            _, wait_status = waitpid(pid, 0)
            write(status_fd, f"X {wait_status}\n".encode())

    def _die_with_server(self) -> None:
        """A cell that took over as head outlives its parent; re-arm the death signal once the server adopts it."""
        for _ in range(1000):
            if os.getppid() == self.pid:
                _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                if os.getppid() == self.pid:
                    return
            time.sleep(0.001)
        os._exit(0)

    def _reap(self) -> None:
        """SIGCHLD: collect every exited child; hand the status to whoever waits for it."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            waiter = self.waiters.pop(pid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result((status, usage))

    def _known_pids(self) -> set[int]:
        pids = set(self.waiters) | {c.pid for c in self.pool} | set(self.running)
        return pids | {s.head.pid for s in self.sessions.values()}

    def _kill_strays(self) -> None:
        """Kill processes that escaped their group and were re-parented to this (sub-reaper) server."""
        known = self._known_pids()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in known:
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == self.pid:
                with contextlib.suppress(OSError):
                    os.killpg(int(entry), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.kill(int(entry), signal.SIGKILL)

    def _sweep_scratch(self) -> None:
        """Remove files children wrote next to their own directory (they share a uid, so they can)."""
        known = {c.workdir for c in self.pool} | {c.workdir for c in self.running.values()}
        known |= {s.head.workdir for s in self.sessions.values()} | {self.config.jobs_dir}
        for directory in [self.config.jobs_dir, *self.config.scratch_dirs]:
            with contextlib.suppress(OSError):
                for entry in os.scandir(directory):
                    if entry.path in known or any(k == entry.path or k.startswith(entry.path + "/")
                                                  for k in self.config.scratch_keep):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)

    def _discard(self, child: Child) -> None:
        """Kill a child's group and free its pipe, page and directory. Idempotent: fd numbers get reused."""
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        for fd in (child.code_fd, child.status_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        child.code_fd = child.status_fd = -1
        shutil.rmtree(child.workdir, ignore_errors=True)
        child.buffer.close()

    def _refill(self) -> None:
        """Fork one pool child per loop turn, so queued work interleaves with the forks."""
        for dead in [c for c in self.pool if c.exited.done()]:
            self.pool.remove(dead)
            self._discard(dead)
        if len(self.pool) >= self.config.prefork or self.stopped.is_set():
            self.refilling = False
            return
        self.pool.append(self._fork(session=False))
        asyncio.get_running_loop().call_soon(self._refill)

    def _schedule_refill(self) -> None:
        if not self.refilling:
            self.refilling = True
            asyncio.get_running_loop().call_soon(self._refill)

    def _take(self) -> Child:
        while self.pool:
            child = self.pool.pop(0)
            if not child.exited.done():
                return child
            self._discard(child)
        return self._fork(session=False)

    # -- results -------------------------------------------------------------------------------------------------

    def _result(self, child: Child, wait_status: int, usage: Any, request: dict[str, Any], duration: float, timed_out: bool) -> dict[str, Any]:
        stdout, stdout_truncated = child.buffer.read(0)
        stderr, stderr_truncated = child.buffer.read(1)
        state = child.buffer.status()
        timeout = request["timeout"]
        exit_code: int | None = None
        note = ""
        if os.WIFEXITED(wait_status):
            exit_code = os.WEXITSTATUS(wait_status)
        cpu = (usage.ru_utime + usage.ru_stime) if usage is not None else 0.0
        if timed_out:
            status, note = "timeout", f"TimeoutError: execution exceeded the {timeout:g} s time limit"
        elif os.WIFSIGNALED(wait_status):
            sig = os.WTERMSIG(wait_status)
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= math.ceil(timeout)):
                status, note = "timeout", f"TimeoutError: execution exceeded the {math.ceil(timeout) + 1} s CPU time limit"
            else:
                status, note = "killed", f"Killed: the process was terminated by signal {signal.Signals(sig).name}"
        elif state == cell.STATUS_MEMORY:
            memory = request.get("memory_mb") or self.config.memory_mb
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
            child = self._take()
            self.running[child.pid] = child
            start = time.perf_counter()
            timed_out = False
            try:
                try:
                    await self._send(child.code_fd, request)
                    wait_status, usage = await asyncio.wait_for(asyncio.shield(child.exited), request["timeout"])
                except (asyncio.TimeoutError, BrokenPipeError):
                    timed_out = not child.exited.done()
                    with contextlib.suppress(OSError):
                        os.killpg(child.pid, signal.SIGKILL)
                    wait_status, usage = await child.exited
                duration = time.perf_counter() - start
                return self._result(child, wait_status, usage, request, duration, timed_out)
            finally:
                self.running.pop(child.pid, None)
                self._discard(child)
                self._sweep_scratch()
                self._schedule_refill()  # after the result: the fork then competes with no one on a busy core
                if not self.config.use_seccomp:
                    self._kill_strays()

    async def _open_session(self, name: str) -> Session:
        while len(self.sessions) >= self.config.max_sessions:  # close the least recently used, idle if possible
            idle = [key for key, s in self.sessions.items() if not s.lock.locked()]
            self._close(self.sessions.pop(idle[0] if idle else next(iter(self.sessions))))
        head = self._fork(session=True)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        pipe = os.fdopen(head.status_fd, "rb", 0)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        head.status_fd = -1  # owned by the transport now
        session = Session(head, reader, transport)
        self.sessions[name] = session
        return session

    @staticmethod
    def _is_cell(pid: int, parents: tuple[int, ...]) -> bool:
        """The session pipe is writable by cell code, so check a reported pid before signalling it."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return False
        return int(fields[1]) in parents and int(fields[2]) == pid  # its parent is ours, and it leads its own group

    def _close(self, session: Session) -> None:
        with contextlib.suppress(OSError):
            os.killpg(session.head.pid, signal.SIGKILL)
        session.transport.close()
        self._discard(session.head)
        self._kill_strays()

    async def run_session(self, name: str, request: dict[str, Any]) -> dict[str, Any]:
        session = self.sessions.get(name) or await self._open_session(name)
        self.sessions.move_to_end(name)
        async with session.lock, self.semaphore:
            head = session.head
            head.buffer.reset()
            start = time.perf_counter()
            deadline = start + request["timeout"]
            timed_out = False
            problem = ""
            try:
                await self._send(head.code_fd, request)
                line = await asyncio.wait_for(session.status.readline(), max(0.0, deadline - time.perf_counter()) + 5)
                cell_pid = int(line.split()[1])
                # A quick cell may already have taken over, its head gone and this server its parent.
                if not line.startswith(b"C ") or not self._is_cell(cell_pid, (head.pid, self.pid)):
                    raise ValueError(f"unexpected report from the session head: {line!r}")
                try:
                    line = await asyncio.wait_for(session.status.readline(), max(0.0, deadline - time.perf_counter()))
                except asyncio.TimeoutError:
                    timed_out = True
                    with contextlib.suppress(OSError):
                        os.killpg(cell_pid, signal.SIGKILL)
                    line = await asyncio.wait_for(session.status.readline(), 2.0)
            except (asyncio.TimeoutError, OSError, ValueError, IndexError) as exc:
                problem = f" ({type(exc).__name__}: {exc})"
                line = b""
            duration = time.perf_counter() - start
            if line == b"T\n" and self._is_cell(cell_pid, (head.pid, self.pid)):
                self.waiters[cell_pid] = asyncio.get_running_loop().create_future()  # the new head
                session.head = Child(cell_pid, head.code_fd, head.buffer, head.workdir, self.waiters[cell_pid])
                return self._result(session.head, 0, None, request, duration, False)
            if line.startswith(b"X "):
                result = self._result(head, int(line.split()[1]), None, request, duration, timed_out)
                self._kill_strays()
                return result
            if self.sessions.get(name) is session:
                del self.sessions[name]
            self._close(session)
            if timed_out:
                note = f"TimeoutError: execution exceeded the {request['timeout']:g} s time limit; the session was reset"
                return {"status": "timeout", "note": note, "duration": duration}
            note = f"SandboxError: the session's interpreter died and its state is lost{problem}"
            return {"status": "sandbox_error", "note": note, "duration": duration}

    async def close_session(self, name: str) -> None:
        session = self.sessions.pop(name, None)
        if session is not None:
            async with session.lock:
                self._close(session)

    def info(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "pool": len(self.pool),
            "sessions": len(self.sessions),
            "running": len(self.running),
            "jobs": len(os.listdir(self.config.jobs_dir)),
            "seccomp": self.config.use_seccomp,
            "uid": self.config.drop_to_uid,
        }

    @staticmethod
    def _peer_is_us(writer: asyncio.StreamWriter) -> bool:
        """Abstract socket addresses have no file permissions, so only our own uid may submit work."""
        import socket

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
                    response = await self.run_session(request["session"], request)
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
        for child in [*self.pool, *self.running.values()]:
            self._discard(child)
        for session in self.sessions.values():
            self._close(session)
        self._kill_strays()
        shutil.rmtree(self.config.jobs_dir, ignore_errors=True)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGCHLD, self._reap)
        loop.add_signal_handler(signal.SIGTERM, self.stopped.set)

        def lifeline() -> None:  # the client holds the other end; EOF means it is gone
            with contextlib.suppress(OSError):
                if os.read(self.config.lifeline_fd, 1):
                    return
            self.stopped.set()

        loop.add_reader(self.config.lifeline_fd, lifeline)
        import socket

        listener = socket.socket(fileno=self.config.listen_fd)
        server = await asyncio.start_unix_server(self.handle, sock=listener, backlog=1024)
        self._schedule_refill()
        print("ready", flush=True)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        try:
            await self.stopped.wait()
        finally:
            server.close()
            self.shutdown()


def main(argv: list[str] | None = None) -> None:
    """Entry point: `python -c ... server.main()` with the JSON config as the only argument."""
    config = Config(**json.loads((argv or sys.argv)[1]))
    _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    os.makedirs(config.jobs_dir, exist_ok=True)
    warm_up(config.preload)
    asyncio.run(Server(config).serve())
