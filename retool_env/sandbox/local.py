"""`LocalSandbox`: the client side of the embedded fork server.

The trainer never forks itself: it starts the server once as a fresh interpreter with an empty environment, hands it
a listening Unix socket and a "lifeline" pipe (the server exits when the pipe closes, so a trainer that dies or
forgets `close()` leaves nothing behind), and opens one connection per call. Per-call connections bind to no event
loop, so one instance serves any number of loops and threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any

from .base import ExecResult, Sandbox, ToolStatus
from .forkserver import isolation as _isolation
from .forkserver import seccomp, uids
from .forkserver.cgroups import Delegation
from .forkserver.config import PRELOAD
from .forkserver.protocol import pack, read_frame

_SANDBOX_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(_SANDBOX_DIR))
# Import the server's modules without running `retool_env/__init__.py` or `retool_env/sandbox/__init__.py` (which
# may grow heavy imports): only the fork server's own package is imported as a package.
# Namespaces and the filesystem view first (isolation.enter), then the server, which reads its config from stdin.
_BOOTSTRAP = (
    "import io, json, sys, types\n"
    "for name, path in (('retool_env', {root!r}), ('retool_env.sandbox', {sandbox!r})):\n"
    "    module = types.ModuleType(name); module.__path__ = [path]; sys.modules[name] = module\n"
    "from retool_env.sandbox.forkserver import isolation\n"
    "config = isolation.enter(json.loads(sys.stdin.readline()))\n"
    "sys.stdin = io.StringIO(json.dumps(config) + '\\n')\n"
    "from retool_env.sandbox.forkserver.start import main\n"
    "main()\n"
)
_CLEAN_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONSAFEPATH": "1",  # no cwd on sys.path (3.11+)
    # Put the Python heap in transparent huge pages: fork() then copies one entry per 2 MB instead of 512, which
    # measured 12-15 ms -> 2 ms per fork of the warm server here (glibc >= 2.35, THP in `madvise` or `always` mode).
    "PYTHONMALLOC": "malloc",
    "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
}


class _Process:
    """One running server: its process, socket and lifeline. Cleans up after itself when garbage collected.

    Nothing of it lives on disk that could outlast a killed trainer: the socket has an abstract address (Linux),
    the log is an unnamed file, the server's cgroups are removed when it stops, and its uid block's lock (uids.py)
    is held by the server alone, so the kernel releases it when the server dies.
    """

    def __init__(self, config: dict[str, Any], view: dict[str, Any], start_timeout: float) -> None:
        self.address = f"\0retool-sandbox-{os.getpid()}-{secrets.token_hex(8)}"
        self.wrapper = "none"
        block = uids.UidBlock.acquire() if config["uid_per_call"] else None
        self.uid_block = None if block is None else range(block.first, block.first + block.size)
        try:
            self._start(config, view, block)
        finally:
            if block is not None:
                block.close()  # the server's copy holds the lock from now on
        self.measured = self._wait_ready(start_timeout)
        self.measured["cgroup"] = self.cgroup is not None and "cgroup" not in self.measured.get("missing", {})
        self.measured["cgroup_detail"] = self.cgroup_detail

    def _start(self, config: dict[str, Any], view: dict[str, Any], block: uids.UidBlock | None) -> None:
        self.cgroup, self.cgroup_detail = Delegation.create() if os.geteuid() == 0 else (None, "needs root")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.address)
        listener.listen(1024)
        lifeline_r, self.lifeline_w = os.pipe()
        config = {
            **config,
            "listen_fd": listener.fileno(),
            "lifeline_fd": lifeline_r,
            **({"uid_block_fd": block.fd, "uid_base": block.first, "uid_count": block.size} if block else {}),
            "cgroup": {"version": self.cgroup.version, "parents": self.cgroup.parents} if self.cgroup else None,
            "view": {**view, "cgroup_dirs": list(self.cgroup.parents) if self.cgroup else []},
        }
        bootstrap = _BOOTSTRAP.format(root=_PACKAGE_ROOT, sandbox=_SANDBOX_DIR)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - the server writes to it for its whole life
        self.proc = subprocess.Popen(
            # Not -I: it would ignore PYTHONMALLOC. The environment is ours alone, so -s is all that is needed.
            [sys.executable, "-s", "-c", bootstrap],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=_CLEAN_ENV,
            pass_fds=(listener.fileno(), lifeline_r, *([block.fd] if block else [])),
            cwd="/",
            start_new_session=True,  # Ctrl-C in the trainer's terminal is the trainer's business
        )
        listener.close()
        os.close(lifeline_r)
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.lifeline_w, self.cgroup, self.log)
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # on the command line, any process could read it
            self.proc.stdin.write(json.dumps(config).encode() + b"\n")
            self.proc.stdin.close()

    def _wait_ready(self, timeout: float) -> dict[str, Any]:
        """Wait for `view <report>` (the namespaces and view the server built), then `ready <layers>` (what it
        measured in a confined child)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while line.count(b"\n") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
        self.proc.stdout.close()
        view_line, _, ready_line = line.partition(b"\n")
        if not (view_line.startswith(b"view ") and ready_line.startswith(b"ready ")):
            self.log.seek(0)
            log = self.log.read()[-2000:].decode("utf-8", "replace")
            self.stop()
            raise RuntimeError(f"the sandbox server did not start (got {line[:200]!r}); its log:\n{log}")
        view = json.loads(view_line[len(b"view "):])
        self.wrapper = view["wrapper"]
        measured = json.loads(ready_line[len(b"ready "):])
        measured["missing"] = {**view["missing"], **measured.get("missing", {})}
        measured["view_paths"] = view.get("paths", [])
        return measured

    def alive(self) -> bool:
        return self.proc.poll() is None

    def healthy(self, grace: float = 1.0) -> bool:
        """After a failed call: is the server still up? The process outside its namespaces outlives it by a moment."""
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return True
        return False

    def stop(self) -> None:
        self._finalizer()


def _stop(proc: subprocess.Popen[bytes], lifeline_w: int, cgroup: Delegation | None, log: Any) -> None:
    """Close the lifeline (the server then cleans up and exits), wait briefly, then make sure."""
    with contextlib.suppress(OSError):
        os.close(lifeline_w)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, 9)
        proc.wait()
    log.close()
    if cgroup is not None:
        cgroup.remove()


class LocalSandbox(Sandbox):
    """Runs code in single-use children of a pre-warmed fork server on this machine.

    Arguments:
        timeout: default wall-clock limit per call, in seconds (CPU time is limited to about the same).
        memory_mb: memory each call may allocate beyond the warm interpreter.
        max_concurrency: calls executing at once; further calls queue in the server (the only limit).
        prefork: children kept forked and waiting for code.
        echo: print the value of a trailing expression, like Jupyter (False reproduces the ReTool paper).
        max_output_bytes: per stream; the first and last halves are kept and the middle is marked as cut.
        traceback_lines: how many final lines of a traceback the model sees.
        max_sessions: live per-episode sessions; the least recently used is closed beyond this.
        session_memory_mb: memory idle sessions may hold in all (0: half of what is available when the server
            starts); beyond it the least recently used idle sessions are closed.
        isolation: `auto` (default: the server's own namespaces and allowlist view, built with mount(2), where the
            machine allows), `namespaces` (those or an error) or `none` (the host as it is; needs `require="none"`).
        extra_paths: host paths the view adds, read-only, for code that needs more than Python and this package
            (a data file, a tool's install). Model code can read all of them: never a dataset, a checkout or a home.
        seccomp: load the allowlist seccomp filter in every child where the machine supports it.
        userns: give every child its own user and mount namespace (private /tmp and /dev/shm, locked mounts).
        drop_uid: as root, give every live call or session its own unprivileged uid. Always on as root: no child
            ever runs as uid 0 (False is refused).
        tmp_mb, shm_mb: size of each call's private /tmp and /dev/shm (counted in its cgroup's memory too).
        lean_zygote: also keep a zygote without the preloads beyond the standard library, for stateless code that
            names none of them: its children fork and exit faster (docs/sandbox.md); False: one zygote for all.
        require: `safe` (default: refuse to start unless model code gets the read-only allowlist view and, as root,
            its own non-zero uid; the error names the fix), `strict` (every layer; a uid per call and cgroups only
            as root) or `none` (start with what this machine allows, warning once about what is missing).
    """

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        memory_mb: int = 1024,
        max_concurrency: int | None = None,
        prefork: int | None = None,
        echo: bool = True,
        max_output_bytes: int = 16384,
        traceback_lines: int = 12,
        max_sessions: int = 64,
        session_memory_mb: int = 0,
        isolation: str = "auto",
        extra_paths: list[str] | tuple[str, ...] = (),
        seccomp: bool = True,
        userns: bool = True,
        drop_uid: bool = True,
        tmp_mb: int = 256,
        shm_mb: int = 64,
        require: str = "safe",
        preload: list[str] | None = None,
        lean_zygote: bool = True,
        start_timeout: float = 120.0,
    ) -> None:
        if require not in REQUIRE:
            raise ValueError(f"require must be one of {', '.join(map(repr, REQUIRE))}, got {require!r}")
        missing = [str(p) for p in extra_paths if not os.path.exists(p)]
        if missing:
            raise FileNotFoundError(f"extra_paths: {missing} do not exist")
        if not drop_uid and os.geteuid() == 0:
            raise ValueError("drop_uid=False as root would run model code as uid 0: no child ever does")
        # Twice the cores: a child waiting on I/O or being reaped should not leave a core idle.
        concurrency = max_concurrency or 2 * (os.cpu_count() or 1)
        prefork = prefork if prefork is not None else min(concurrency, 4)
        if os.geteuid() == 0 and max_sessions + concurrency + prefork >= uids.BLOCK_SIZE // 2:
            raise ValueError(f"max_sessions + max_concurrency + prefork must stay below {uids.BLOCK_SIZE // 2}: each "
                             f"live call or session has a uid of its own, from a block of {uids.BLOCK_SIZE}")
        self.timeout = timeout
        self.echo = echo
        self.isolation = _isolation.mode(isolation)
        self.require = require
        self.start_timeout = start_timeout
        self._view = {"mode": self.isolation, "extra_paths": [str(p) for p in extra_paths], "tmp_mb": tmp_mb,
                      "shm_mb": shm_mb}
        self._config = {
            "max_concurrency": concurrency,
            "prefork": prefork,
            "memory_mb": memory_mb,
            "max_output_bytes": max_output_bytes,
            "traceback_lines": traceback_lines,
            "max_sessions": max_sessions,
            "session_memory_mb": session_memory_mb,
            "use_seccomp": seccomp and _seccomp_supported(),
            "use_userns": userns,
            "uid_per_call": os.geteuid() == 0,
            "tmp_mb": tmp_mb,
            "shm_mb": shm_mb,
            "preload": list(PRELOAD if preload is None else preload),
            "lean_zygote": lean_zygote,
        }
        self._process: _Process | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- server lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start (or restart) the server now; calls do this lazily, but a trainer may want to pay it up front."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this LocalSandbox is closed")
            if self._process is None or not self._process.alive():
                if self._process is not None:
                    self._process.stop()
                process = _Process(self._config, self._view, self.start_timeout)
                self._check_layers(process)
                self._process = process

    def _check_layers(self, process: _Process) -> None:
        """Fail closed: stop the server and raise, naming the fix, unless `require` is met; as root, whatever
        `require` says, unless each child runs as its own non-zero uid."""
        root = os.geteuid() == 0
        rows = _isolation.layers(process.wrapper, process.measured, root=root)
        by_name = {row.name: row for row in rows}
        missing = [row for row in _isolation.required(rows, root=root, level=self.require) if not row.active]
        if root and not by_name["uid per call"].active and by_name["uid per call"] not in missing:
            missing.append(by_name["uid per call"])  # never a child as uid 0, even with require="none"
        if missing:
            process.stop()
            text = "; ".join(f"{row.name} ({row.detail})" for row in missing)
            fix = _isolation.fix_for(missing, root=root)
            degrade = "" if by_name["uid per call"] in missing and root else (
                " To run with less isolation anyway, pass require='none' (model code may then read the host's files)."
            )
            raise RuntimeError(f"LocalSandbox(require={self.require!r}) refuses to start: missing {text}. Fix: "
                               f"{fix}.{degrade}")
        weak = [row for row in _isolation.required(rows, root=root) if not row.active]
        if not weak:
            return
        text = "; ".join(f"{row.name} ({row.detail})" for row in weak)
        key = (process.wrapper, text)
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"LocalSandbox runs without: {text}. `retool-env doctor` explains; "
                          "require='strict' refuses to start instead.", RuntimeWarning, stacklevel=4)

    def layers(self) -> list[_isolation.Layer]:
        """Every isolation layer and whether it is on, as measured in a confined child of the running server."""
        self.start()
        assert self._process is not None
        return _isolation.layers(self._process.wrapper, self._process.measured, root=os.geteuid() == 0)

    async def _ready_process(self) -> _Process:
        process = self._process
        if process is not None and process.alive():
            return process
        await asyncio.get_running_loop().run_in_executor(None, self.start)
        assert self._process is not None
        return self._process

    @property
    def server_pid(self) -> int | None:
        """The host pid of the server process (or of its namespace wrapper)."""
        return self._process.proc.pid if self._process else None

    @property
    def uid_block(self) -> range | None:
        """As root, the uids this server gives its calls and sessions: its own block, shared with no other server
        on the machine (None before it starts, and unprivileged)."""
        return self._process.uid_block if self._process else None

    @property
    def wrapper(self) -> str | None:
        return self._process.wrapper if self._process else None

    def _discard_broken(self, process: _Process | None) -> None:
        """The server stopped answering: stop what is left of it so the next call starts a fresh one."""
        with self._lock:
            if process is not None and self._process is process:
                process.stop()
                self._process = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._process is not None:
                self._process.stop()
                self._process = None

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    async def __aenter__(self) -> LocalSandbox:
        await self._ready_process()
        return self

    # -- calls ---------------------------------------------------------------------------------------------------

    async def _request(self, request: dict[str, Any]) -> Any:
        for attempt in range(2):
            process = await self._ready_process()
            try:
                reader, writer = await asyncio.open_unix_connection(process.address, limit=1 << 24)
            except (ConnectionRefusedError, FileNotFoundError):
                # Nobody listens: the server died between calls. The request never left, so restart and retry once.
                await asyncio.get_running_loop().run_in_executor(None, self._discard_broken, process)
                if attempt:
                    raise
                continue
            try:
                writer.write(pack(request))
                await writer.drain()
                return await read_frame(reader)
            except (OSError, EOFError, asyncio.IncompleteReadError):
                loop = asyncio.get_running_loop()
                if not await loop.run_in_executor(None, process.healthy):
                    await loop.run_in_executor(None, self._discard_broken, process)
                raise
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        raise AssertionError("unreachable")

    async def _run(
        self,
        code: str,
        *,
        timeout: float,
        session: str | None,
        stdin: str | None,
        memory_mb: int | None,
        echo: bool | None = None,
    ) -> ExecResult:
        request = {
            "op": "run",
            "code": code,
            "timeout": timeout,
            "session": session,
            "stdin": stdin,
            "memory_mb": memory_mb,
            "echo": self.echo if echo is None else echo,
        }
        start = time.perf_counter()
        try:
            response = await self._request(request)
        except (OSError, EOFError, asyncio.IncompleteReadError, RuntimeError, ValueError) as exc:
            return ExecResult.failure(
                ToolStatus.SANDBOX_ERROR, f"SandboxError: the sandbox server failed ({type(exc).__name__}: {exc})",
                duration=time.perf_counter() - start,
            )  # fmt: skip
        return ExecResult(**response)

    async def close_session(self, session: str) -> None:
        if self._process is not None and self._process.alive():
            with contextlib.suppress(OSError, EOFError, asyncio.IncompleteReadError):
                await self._request({"op": "close_session", "session": session})

    async def info(self) -> dict[str, Any]:
        """The server's counters (pool, sessions, running calls) and measured layers: for tests and monitoring."""
        return await self._request({"op": "info"})


def _seccomp_supported() -> bool:
    return seccomp.supported() is None


_WARNED: set[tuple[str, str]] = set()
REQUIRE = ("safe", "strict", "none")
