"""Inside a confined child: wait for code, run it, report through the output buffer, exit.

A single-use child runs one request. A session head holds an episode's state and runs each cell in a fork of itself;
the fork becomes the new head only if the cell succeeded, so a crash or a timeout rolls the state back. A session is
as trusted as its code: everything a head says is checked by the server, and concerns only its own episode.

Every child confirms "confined, about to run" (`run` on its code socket, `S` from a cell) right before the code
starts: from then on whatever happens is the code's own outcome, so code cannot pass itself off as a sandbox failure.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import resource
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from . import cell, confine
from .protocol import read_frame_blocking, read_frame_with_fds

_PR_SET_PDEATHSIG = 1
_MB = 1 << 20


def _apply_request_limits(request: dict[str, Any], base_memory_mb: int, *, keep_hard: bool) -> None:
    """The call's CPU and memory limits. A session cell may become the head of later calls, which may ask for more:
    it lowers only its soft limits (the server's wall-clock deadline is what bounds it)."""
    cpu = math.ceil(request["timeout"]) + 1
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    if keep_hard:
        soft = cpu if cpu_hard == resource.RLIM_INFINITY else min(cpu, cpu_hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
    else:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory_mb = request.get("memory_mb")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    lower = hard - (base_memory_mb - memory_mb) * _MB if memory_mb and 0 < memory_mb < base_memory_mb else hard
    resource.setrlimit(resource.RLIMIT_AS, (lower, hard if keep_hard else lower))


def execute(request: dict[str, Any], buffer: cell.OutputBuffer, namespace: dict[str, Any], started: Callable[[], Any],
            *, memory_mb: int, traceback_lines: int, session: bool = False) -> int:
    """Run one request's code in `namespace`, calling `started()` just before it; the exit code the process should
    end with."""
    _apply_request_limits(request, memory_mb, keep_hard=session)
    sys.stdin = io.StringIO(request.get("stdin") or "")
    cell.capture(buffer)
    started()
    status, code = cell.run_cell(
        request["code"], namespace, echo=request.get("echo", True), traceback_lines=traceback_lines
    )
    buffer.set_status(status)
    return code


def _fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": __builtins__}


_REHEARSAL = "import math\nx = [math.sqrt(2) * i for i in range(3)]\nprint(x)\nx"
_REHEARSAL_REQUEST = '{"op": "run", "code": "print(1)", "timeout": 1.0, "echo": true}'


def warm_up_cell() -> None:
    """Run a harmless cell through a call's whole path once, in the server before it forks the zygote: what a first
    call sets up (the parser and compiler, the capture's streams, their codecs) is then set up in every child, which
    only pays for the pages it writes. Nothing is kept: the buffer is the server's own, the streams are put back."""
    buffer = cell.OutputBuffer(4096)
    streams = sys.stdin, sys.stdout, sys.stderr
    try:
        json.loads(_REHEARSAL_REQUEST)
        sys.stdin = io.StringIO("")
        cell.capture(buffer)
        status, _ = cell.run_cell(_REHEARSAL, _fresh_namespace(), echo=True, traceback_lines=1)
        buffer.set_status(status)
    finally:
        captured: tuple[Any, ...] = sys.stdout, sys.stderr
        sys.stdin, sys.stdout, sys.stderr = streams
        for stream in captured:
            with contextlib.suppress(Exception):
                stream.detach()  # so that collecting it later does not write to the closed buffer
        buffer.read(0), buffer.read(1)
        buffer.close()


def _rehearse() -> None:
    """Run a harmless cell while waiting for the real one: the pages any call writes (parser, compiler, output path)
    are copied from the zygote now, off the call's critical path. Nothing of it is kept."""
    stdout = sys.stdout
    sys.stdout = io.StringIO()
    try:
        json.loads(_REHEARSAL_REQUEST)
        cell.run_cell(_REHEARSAL, {"__builtins__": __builtins__}, echo=True, traceback_lines=1)
    finally:
        sys.stdout = stdout


def single_use_main(code_fd: int, buffer: cell.OutputBuffer, **limits: Any) -> None:
    """Run one request: say `run` on the code socket just before the code starts, and `done <exit code>` before
    exiting, so the server answers without waiting for the kernel to tear down this process's namespaces (it kills
    the process then, in case the report came from the code itself: a call can only cut its own output short).
    It rehearses only while no request is waiting: when calls come faster than children are made, the request is
    there as soon as the child is confined, and a rehearsal would only delay it."""
    if not select.select([code_fd], [], [], 0)[0]:
        _rehearse()
    request = read_frame_blocking(code_fd)
    if request is None:
        os._exit(0)
    code = execute(request, buffer, _fresh_namespace(), lambda: os.write(code_fd, b"run\n"), **limits)
    with contextlib.suppress(OSError):
        os.write(code_fd, f"done {code}\n".encode())
    os._exit(code)


def _die_with(zygote: int, old_head: int | None = None) -> None:
    """A cell that took over as head outlives its parent; re-arm the death signal once the zygote adopts it.
    It waits for as long as the old head takes to exit (a loaded machine may take seconds), and exits if it is
    adopted by anyone else (the zygote is gone)."""
    libc = confine.libc()
    while True:
        parent = os.getppid()
        if parent == zygote:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() == zygote:
                return
        elif parent != old_head:
            os._exit(0)
        time.sleep(0.001)


def _reap_strays(waitpid: Any) -> None:
    """Collect what the server killed of an earlier cell's children (they were ours), so no zombie is left."""
    while True:
        try:
            pid, _ = waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _next_frame(command: socket.socket, op: str) -> tuple[Any, list[int]]:
    """The next frame on the code socket whose op is `op`, with its descriptors; the others are stale (a hand-over
    that never completed left its `hello` there). Exits once the server is gone."""
    while True:
        os.set_blocking(command.fileno(), True)  # a cell shares its file description, and may have changed that
        frame, fds = read_frame_with_fds(command)
        if frame is None:
            os._exit(0)
        if isinstance(frame, dict) and frame.get("op") == op:
            return frame, fds
        for fd in fds:
            os.close(fd)


def _answer_hello(command: socket.socket) -> socket.socket:
    """Take the report channel the server sends on the code socket and answer `R` on it: the server's proof that
    this process is back in the head's loop. A stale one (its call is over) is closed at the server's end."""
    while True:
        _, fds = _next_frame(command, "hello")
        # Family, type and protocol named: the filter refuses the calls that would find them out.
        channels = [socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, fileno=fd) for fd in fds]
        for extra in channels[1:]:
            extra.close()
        if channels:
            try:
                os.write(channels[0].fileno(), b"R\n")
                return channels[0]
            except OSError:
                channels[0].close()


_IGNORED = (signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ)


def _clear_handlers() -> None:
    """Before a cell becomes the head: no handler, timer or trace function it installed may run inside the head's
    loop (its threads are the server's to count). SIGHUP stays ignored (see `session_head_main`)."""
    for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
        signal.setitimer(timer, 0)
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # SIGKILL, SIGSTOP, glibc's own
            signal.signal(sig, signal.SIG_IGN if sig in _IGNORED else signal.SIG_DFL)
    sys.settrace(None)
    sys.setprofile(None)


def session_head_main(command_fd: int, status_fd: int, buffer: cell.OutputBuffer, zygote: int,
                      **limits: Any) -> None:
    """Hold an episode's state and run each request as a cell, a fork of itself (the server's `_run_cell` tells
    the protocol and why it holds). The head reports on a channel the server sent it (`_answer_hello`): `C <pid>`,
    then `X <wait status>`; the cell says `S` on the status socket just before its code starts. A cell that
    succeeded answers the hello the server sent after the request, and becomes the head once the server ends its
    old head."""
    namespace = _fresh_namespace()
    # Once its head exits, a cell that took over leads an orphaned process group, which the kernel sends SIGHUP.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # User code may rebind the os module's names.
    fork, write, waitpid, getppid = os.fork, os.write, os.waitpid, os.getppid
    command = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=command_fd)
    reports = _answer_hello(command)
    while True:
        _die_with(zygote)
        _reap_strays(waitpid)
        request, fds = _next_frame(command, "run")
        for fd in fds:
            os.close(fd)
        pid = fork()
        if pid == 0:
            reports.close()  # its head's channel: no cell holds it while its code runs
            os.setpgid(0, 0)  # its own group, so a timeout kills the cell and not the head
            code = execute(request, buffer, namespace, lambda: write(status_fd, b"S\n"), session=True, **limits)
            if buffer.status() != cell.STATUS_OK:
                os._exit(code)
            old_head = getppid()
            _clear_handlers()
            reports = _answer_hello(command)  # done: the server takes this process as the head, and ends the old one
            _die_with(zygote, old_head)  # adopted by the zygote once the old head is gone
            continue  # this fork is the new head, with the cell's state
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # also here, so the group exists before the server may need to kill it
        write(reports.fileno(), f"C {pid}\n".encode())
        _, wait_status = waitpid(pid, 0)
        write(reports.fileno(), f"X {wait_status}\n".encode())
