"""The zygote: a warm copy of the server, forked before the server handled any request, that forks the children.

Model code must never find another call's code or output in its own memory. Every child is a copy of the process
that forked it, so that process must never have held any: the server receives code and reads output, the zygote
only forks. It gives each child its own uid (when root, from its server's block: uids.py), its own cgroup (one per
slot), its own session, and the descriptors the server passed for it (code socket, output memfd, status socket),
which it closes right after the fork.
It reaps every child (it is their sub-reaper) and reports each exit; on `release` it kills whatever a call left
running, and frees its uid and cgroup for the next call once nothing of it is left.

Messages (see protocol.py): server -> zygote `fork` (cid, session) with descriptors, `release` (cid);
zygote -> server `layers` (once, at start), `forked` (cid, pid, cgroup), `exit` (pid, status, cpu, oom).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from . import cell, child, confine, seccomp, uids
from .cgroups import CallGroup, Delegation
from .protocol import recv_message, send_message

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_SET_DUMPABLE = 1, 36, 4
_TCACHE_SIZES, _TCACHE_COUNT = range(16, 1040, 16), 7  # glibc's default per-thread cache: 64 sizes, 7 chunks each
_DRAIN_LIMIT = 1 << 18  # mallocs: the zygote's heap holds a few MB free at most
_DRAIN_BATCH = 256  # mallocs between two looks at what is left


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def drain_free_chunks() -> int:
    """Take every free chunk of the zygote's malloc heap (its caches and bins), and keep them; returns how many
    allocations that took. A child's allocations then come from the top of the heap, packed in a few fresh pages,
    instead of from free chunks strewn over hundreds of the zygote's pages, each reuse a page copied (and its
    neighbours' headers, unlinked: more). The zygote's own allocations between forks come from there too. The cost
    is what was free (under a MB for the lean zygote), held by the zygote; glibc only (0 elsewhere)."""
    from .confine import libc

    lib = libc()
    try:
        mallinfo2, malloc, free = lib.mallinfo2, lib.malloc, lib.free
    except AttributeError:  # not glibc >= 2.33
        return 0
    mallinfo2.restype, malloc.restype = _MallInfo2, ctypes.c_void_p
    malloc.argtypes, free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
    free(malloc(1 << 16))  # a large request first merges the fast bins' chunks into the others
    taken = 0
    for size in _TCACHE_SIZES:  # the per-thread cache's chunks count as in use: take each size's few
        for _ in range(_TCACHE_COUNT):
            malloc(size - 8)
            taken += 1
    budget = None
    while taken < _DRAIN_LIMIT:
        info = mallinfo2()  # it walks every free chunk: asked once per batch, not per allocation
        left = info.fordblks - info.keepcost - info.fsmblks
        if left < 64:  # the bins are empty: only the top chunk is left (and the few fast-bin chunks this loop's own
            break  # Python objects freed)
        # At most what was free, in the smallest chunks: what another thread's arena holds counts in `left` too,
        # and this thread cannot take it.
        budget = left // 32 + _DRAIN_BATCH if budget is None else budget
        batch = min(_DRAIN_BATCH, budget)
        if batch <= 0:
            break
        for _ in range(batch):
            malloc(16)  # the smallest chunk: carves up whatever the bins hold
        taken, budget = taken + batch, budget - batch
    return taken


@dataclass(kw_only=True)
class ZygoteConfig:
    """What every child is made with (the server's `Config` adds what only the server needs). What the client
    decides has no default here: `LocalSandbox`'s arguments are the one place its defaults are written."""

    memory_mb: int
    max_output_bytes: int
    traceback_lines: int
    tmp_mb: int
    shm_mb: int
    use_seccomp: bool
    use_userns: bool
    uid_per_call: bool
    file_size_mb: int = 64
    open_files: int = 64
    processes: int = 1024
    uid_base: int = uids.FIRST_UID  # this server's block (uids.py): a uid per live call or session, the last for probes
    uid_count: int = uids.BLOCK_SIZE
    cgroup: dict[str, Any] | None = None  # Delegation fields
    masks: list[str] = field(default_factory=list)  # directories each child covers with its own tmpfs
    rebinds: list[tuple[str, str]] = field(default_factory=list)  # (visible copy, path under a mask) bound back
    private_proc: str = ""  # the view's hidepid /proc, which each child binds over its /proc
    hidden: list[str] = field(default_factory=list)  # directories each child covers with an empty tmpfs (cgroups)
    group_prefix: str = ""  # of its cgroups' names: two zygotes of one server make theirs in the same parent


@dataclass
class _Record:
    pid: int
    uid: int | None
    group: CallGroup | None
    single_use: bool
    reaped: bool = False


class Zygote:
    def __init__(self, sock: socket.socket, config: ZygoteConfig) -> None:
        self.sock = sock
        self.config = config
        self.pid = os.getpid()
        self.delegation = Delegation(**config.cgroup) if config.cgroup else None
        self.free_uids: list[int] = []
        self.next_uid = config.uid_base
        self.records: dict[int, _Record] = {}
        self.by_pid: dict[int, _Record] = {}  # until reaped
        self.lingering: list[tuple[int, _Record]] = []  # released, but processes were still there
        self.free_groups: list[CallGroup] = []
        self.groups_made = 0
        self.oom_kills: dict[CallGroup, int] = {}  # per group, as last seen: a new kill belongs to its live call
        self.limits = confine.Limits(
            memory_mb=config.memory_mb, file_size_mb=config.file_size_mb, open_files=config.open_files,
            tmp_mb=config.tmp_mb, shm_mb=config.shm_mb, processes=config.processes,
        )  # fmt: skip
        filters = (seccomp.Template(allow_fork=False), seccomp.Template(allow_fork=True))
        self.layers = confine.Layers(userns=config.use_userns, uid=None, seccomp=config.use_seccomp, filters=filters)
        self.missing: dict[str, str] = {}

    # -- children ------------------------------------------------------------------------------------------------

    def _new_group(self, name: str) -> CallGroup:
        assert self.delegation is not None
        group = self.delegation.group(name)
        cfg = self.config
        group.create(memory_mb=cfg.memory_mb + cfg.tmp_mb + cfg.shm_mb + 64, pids=cfg.processes, cpus=1.0)
        return group

    def _take_group(self) -> CallGroup | None:
        """A slot's cgroup: one at a time per live call or session, reused once empty (cheaper than mkdir/rmdir)."""
        if self.delegation is None:
            return None
        if self.free_groups:
            return self.free_groups.pop()
        self.groups_made += 1
        return self._new_group(f"{self.config.group_prefix}slot{self.groups_made}")

    def _spawn(self, layers: confine.Layers, fds: list[int], session: bool, main: Any,
               report_fd: int | None = None) -> int:
        """Fork a child that confines itself with `layers`, then runs `main(fds)`; returns its pid.
        A failure is written to `report_fd` (the probes') and ends the child with status 71 (confining) or 70."""
        pid = os.fork()
        if pid != 0:
            return pid
        status = 71
        try:
            confine.prepare(parent=self.pid, keep=tuple(fds), layers=layers, limits=self.limits,
                            masks=self.config.masks, rebinds=self.config.rebinds, session=session,
                            private_proc=self.config.private_proc, hidden=tuple(self.config.hidden))
            status = 70
            main(fds)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                if report_fd is not None:
                    os.write(report_fd, f"{type(exc).__name__}: {exc}".encode()[:500])
        finally:
            os._exit(status)
        raise AssertionError("unreachable")

    def _take_uid(self) -> int:
        if self.free_uids:
            return self.free_uids.pop()
        if self.next_uid >= self.probe_uid:
            raise OSError(f"all {self.config.uid_count - 1} uids of this server's block are in use")
        self.next_uid += 1
        return self.next_uid - 1

    @property
    def probe_uid(self) -> int:
        return self.config.uid_base + self.config.uid_count - 1

    def _child_main(self, session: bool, kept: list[int]) -> None:
        cfg = self.config
        limits = {"memory_mb": cfg.memory_mb, "traceback_lines": cfg.traceback_lines}
        buffer = cell.OutputBuffer(cfg.max_output_bytes, fd=kept[1])
        buffer.release_fd()
        if session:
            child.session_head_main(kept[0], kept[2], buffer, self.pid, **limits)
        else:
            child.single_use_main(kept[0], buffer, **limits)

    def fork(self, requests: list[tuple[int, bool, list[int]]]) -> None:
        """Fork a child for each (cid, session, descriptors), back to back.

        Each fork() makes every page of the zygote copy-on-write again, and whatever the zygote then writes (a few
        hundred pages of Python objects, for its messages and records) is copied while its children still share it.
        So everything is prepared before the first fork and reported after the last: between two forks the zygote
        writes almost nothing, and a burst of requests pays for the copies once. A child closes every descriptor but
        its own before it drops privileges, long before any code arrives."""
        ready = []
        for cid, session, fds in requests:
            uid = None
            try:
                uid = self._take_uid() if self.layers.uid is not None else None
                group = self._take_group()
            except OSError as exc:  # no child without its uid and cgroup: the server answers with a sandbox error
                for fd in fds:
                    os.close(fd)
                what = "cgroup" if uid is not None or self.layers.uid is None else "uid"
                send_message(self.sock, {"op": "forked", "cid": cid, "pid": -1, "error": f"{what}: {exc}"})
                if uid is not None:
                    self.free_uids.append(uid)
                continue
            layers = replace(self.layers, uid=uid, cgroup=group)
            ready.append((cid, session, fds, uid, group, layers, functools.partial(self._child_main, session)))
        pids = []
        for _, session, fds, _, _, layers, main in ready:
            pids.append(self._spawn(layers, fds, session, main))
            for fd in fds:
                os.close(fd)
        for pid, (cid, session, _, uid, group, _, _) in zip(pids, ready, strict=True):
            self.records[cid] = self.by_pid[pid] = _Record(pid, uid, group, single_use=not session)
            memory_group = None if group is None else [group.version, list(group.dirs)]  # for the server's budget
            send_message(self.sock, {"op": "forked", "cid": cid, "pid": pid, "group": memory_group})

    def release(self, cid: int) -> None:
        record = self.records.pop(cid, None)
        if record is not None:
            self.lingering.append((cid, record))
        self._tidy()

    def _kill_strays(self) -> None:
        """Without seccomp a child may leave its session (setsid): kill what was re-parented to us and is not ours."""
        known = {record.pid for record in self.records.values()}
        sessions = {record.pid for record in self.records.values()}
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in known:
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == self.pid and int(fields[3]) not in sessions:
                    os.kill(int(entry), signal.SIGKILL)

    def _tidy(self) -> None:
        """Kill what released calls left running; free their cgroup and uid once nothing of them remains."""
        if not self.layers.seccomp and self.delegation is None:
            # A process that left its session is re-parented to us once its parent exits; with cgroups, killing
            # the call's group below finds it instead.
            self._kill_strays()
        still = []
        for cid, record in self.lingering:
            # A single-use child cannot fork under seccomp: once reaped, nothing of it is left. Anything else: kill
            # whatever is in the session it leads, and in its cgroup (which a setsid() does not leave).
            cannot_fork = record.single_use and self.layers.seccomp
            left = not record.reaped if cannot_fork else confine.kill_session(record.pid)
            if record.group is not None and not cannot_fork:
                left += record.group.kill()
            if left or (record.group is not None and record.group.pids()):
                still.append((cid, record))
                continue
            if record.uid is not None:
                self.free_uids.append(record.uid)
            if record.group is not None:
                self.free_groups.append(record.group)
        self.lingering = still

    def reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            record = self.by_pid.pop(pid, None)
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            oom = bool(killed and record and record.group and self._new_oom_kill(record.group))
            if record is not None:
                record.reaped = True
            message = {"op": "exit", "pid": pid, "status": status, "cpu": usage.ru_utime + usage.ru_stime, "oom": oom}
            send_message(self.sock, message)
        if self.lingering:
            self._tidy()

    def _new_oom_kill(self, group: CallGroup) -> bool:
        seen, now = self.oom_kills.get(group, 0), group.oom_kills()
        self.oom_kills[group] = now
        return now > seen

    # -- start: which layers this machine allows -----------------------------------------------------------------

    def _probe(self, layers: confine.Layers) -> tuple[dict[str, Any] | None, str]:
        """Fork a child with `layers`; (what it reports about itself, "") or (None, why it could not start)."""
        report_r, report_w = os.pipe()

        def main(kept: list[int]) -> None:
            paths = [os.path.dirname(os.__file__), *(p for p in sys.path if p.endswith("site-packages"))]
            for path in paths:  # the child imports lazily: the Python install must be readable
                os.listdir(path)
            with open(os.__file__, "rb") as f:
                f.read(1)
            with open(kept[0], "w") as f:  # the pipe's fd
                json.dump(confine.status(), f)
            os._exit(0)

        pid = self._spawn(layers, [report_w], False, main, report_fd=report_w)
        os.close(report_w)
        with os.fdopen(report_r) as f:
            text = f.read()
        os.waitpid(pid, 0)
        if text.startswith("{"):
            return json.loads(text), ""
        return None, f"a child could not start with it ({text or 'no report'})"

    def decide_layers(self) -> dict[str, Any]:
        """Add one layer at a time, keeping those a probe child can really start with. The uid comes first: a user
        namespace made by root would map uid 0, which the server's capabilities (rightly) do not allow."""
        layers = replace(self.layers, userns=False, uid=None, seccomp=False)
        steps = [
            ("uid per call", self.config.uid_per_call, lambda la: replace(la, uid=self.probe_uid)),
            ("user namespace", self.config.use_userns, lambda la: replace(la, userns=True)),
            ("cgroup", self.delegation is not None, None),
            ("seccomp", self.config.use_seccomp, lambda la: replace(la, seccomp=True)),
        ]
        status: dict[str, Any] | None = None
        for name, wanted, add in steps:
            if not wanted:
                continue
            try:
                group = self._new_group(f"{self.config.group_prefix}probe") if name == "cgroup" else None
            except OSError as exc:
                self.missing[name], self.delegation = f"cannot create a cgroup: {exc}", None
                continue
            candidate = replace(layers, cgroup=group) if add is None else add(layers)
            status, why = self._probe(candidate)
            if group is not None:
                group.remove()
            if status is None:
                self.missing[name] = why
                if name == "cgroup":
                    self.delegation = None
                continue
            layers = replace(candidate, cgroup=None)
        if status is None:
            status, _ = self._probe(layers)
        self.layers = layers
        return {"op": "layers", "missing": self.missing, "child": status or {}}

    # -- loop ----------------------------------------------------------------------------------------------------

    def serve(self) -> None:
        layers = self.decide_layers()
        wakeup_r, wakeup_w = os.pipe()
        for fd in (wakeup_r, wakeup_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        stopping: list[int] = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ, "server")
        selector.register(wakeup_r, selectors.EVENT_READ, "signal")
        drain_free_chunks()  # some ms: before the server hears that this zygote is ready, so no call waits for it
        send_message(self.sock, layers)
        self.reap()
        while True:
            for key, _ in selector.select():
                if key.data == "signal":
                    with contextlib.suppress(BlockingIOError):
                        os.read(wakeup_r, 4096)
                    if stopping:
                        self.shutdown()
                        return
                    self.reap()
                    continue
                if not self._handle_messages():
                    self.shutdown()
                    return

    def _handle_messages(self) -> bool:
        """Every message waiting from the server: releases first (they may free a uid or a cgroup), then the forks,
        back to back. False once the server is gone."""
        forks, alive = [], True
        while True:
            try:
                message, fds = recv_message(self.sock, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if message is None:
                alive = False
                break
            if message["op"] == "fork":
                forks.append((message["cid"], message["session"], fds))
            elif message["op"] == "release":
                self.release(message["cid"])
            else:
                for fd in fds:
                    os.close(fd)
        if not alive:  # nobody left to run code in them
            for _, _, fds in forks:
                for fd in fds:
                    os.close(fd)
        elif forks:
            self.fork(forks)
        return alive

    def shutdown(self) -> None:
        for cid in list(self.records):
            self.release(cid)
        for _ in range(100):
            self.reap()
            if not self.lingering:
                break
            time.sleep(0.01)


def run(sock: socket.socket, config: ZygoteConfig, close: list[int]) -> None:
    """Become the zygote (in a process just forked from the server); never returns."""
    from .confine import libc

    try:
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the server's "ready" pipe is the server's
        confine.set_child_environment()  # once, for every child
        confine._last_capability()  # read once, before any child could not
        lib = libc()
        lib.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # the server died: kill everything, then exit
        lib.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        lib.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        Zygote(sock, config).serve()
    finally:
        os._exit(0)

