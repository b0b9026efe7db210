"""Control groups for sandbox calls: memory (tmpfs included), process count and CPU, for everything a call starts.

The trainer side (`Delegation.create`, as root) makes one parent group per sandbox server in each controller,
cgroup v1 (memory, pids, cpu) or v2 (one directory with those controllers enabled below it), and binds them into
the server's namespace; the server makes one group per slot under it (a slot holds one live call or session at a
time, and is reused once nothing of its last call is left), and the trainer removes them all when the server stops.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

ROOT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000
_PREFIX = "retool-sandbox-"


def _own_group(controller: str) -> str | None:
    """This process's group in a v1 controller ("" for v2's unified line), from /proc/self/cgroup."""
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(",") or (controller == "" and names == ""):
                return path
    return None


def _write(path: str, value: str) -> None:
    """One write(2), as cgroupfs expects; bare system calls, as a freshly forked child joins its group with it."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _remove_stale(base: str) -> None:
    """Parent groups of trainers that died without closing their sandbox (the server could not remove them)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            pid = entry.name.removeprefix(_PREFIX).split("-")[0]
            if entry.name.startswith(_PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                Delegation(0, (entry.path,)).remove()


def _mkdir_writable(path: str) -> str | None:
    try:
        os.mkdir(path)
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror}"
    return None


def _read(path: str) -> str:
    """A control file's text with bare system calls (the zygote reads one per child exit)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 1 << 16)]
        while chunks[-1]:
            chunks.append(os.read(fd, 1 << 16))
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Delegation:
    """The parent directories a server may create call groups in: one per v1 controller, or one v2 directory."""

    version: int
    parents: tuple[str, ...]

    @classmethod
    def create(cls) -> tuple[Delegation | None, str]:
        """Make a fresh parent group for one server; (None, why) where this machine or user cannot."""
        name = f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        if os.path.exists(os.path.join(ROOT, "cgroup.controllers")):  # pure v2
            own = _own_group("")
            if own is None:
                return None, "no cgroup v2 membership in /proc/self/cgroup"
            base = os.path.join(ROOT, own.lstrip("/"))
            parent = os.path.join(base, name)
            _remove_stale(base)
            problem = _mkdir_writable(parent)
            if problem:
                return None, problem
            try:
                with open(os.path.join(base, "cgroup.subtree_control")) as f:
                    enabled = f.read().split()
                missing = [c for c in V1_CONTROLLERS if c not in enabled]
                if missing:
                    return cls._fail(parent, f"controllers {missing} not enabled in {base}")
                _write(os.path.join(parent, "cgroup.subtree_control"), " ".join(f"+{c}" for c in V1_CONTROLLERS))
            except OSError as exc:
                return cls._fail(parent, f"cannot delegate controllers: {exc.strerror}")
            return cls(2, (parent,)), "cgroup v2"
        parents: list[str] = []
        for controller in V1_CONTROLLERS:
            own = _own_group(controller)
            mount = os.path.join(ROOT, controller)
            if own is None or not os.path.isdir(mount):
                cls(1, tuple(parents)).remove()
                return None, f"no cgroup v1 {controller} controller mounted"
            parent = os.path.join(mount, own.lstrip("/"), name)
            _remove_stale(os.path.dirname(parent))
            problem = _mkdir_writable(parent)
            if problem:
                cls(1, tuple(parents)).remove()
                return None, problem
            parents.append(parent)
        return cls(1, tuple(parents)), "cgroup v1 (" + ", ".join(V1_CONTROLLERS) + ")"

    @staticmethod
    def _fail(parent: str, why: str) -> tuple[None, str]:
        with contextlib.suppress(OSError):
            os.rmdir(parent)
        return None, why

    def group(self, name: str) -> CallGroup:
        return CallGroup(self.version, tuple(os.path.join(p, name) for p in self.parents))

    def kill_all(self) -> None:
        """SIGKILL every process still in a call group (the last word, should the server die without cleaning up)."""
        for parent in self.parents:
            with contextlib.suppress(OSError):
                for entry in os.scandir(parent):
                    if entry.is_dir(follow_symlinks=False):
                        CallGroup(self.version, (entry.path,)).kill()

    def remove(self, wait: float = 2.0) -> None:
        """Kill what is left in the call groups, remove them, then the parents; killed processes take a moment to
        leave."""
        self.kill_all()
        deadline = time.monotonic() + wait
        for parent in self.parents:
            while os.path.isdir(parent):
                with contextlib.suppress(OSError):
                    for entry in os.scandir(parent):
                        if entry.is_dir(follow_symlinks=False):
                            with contextlib.suppress(OSError):
                                os.rmdir(entry.path)
                with contextlib.suppress(OSError):
                    os.rmdir(parent)
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)


@dataclass(frozen=True)
class CallGroup:
    """One call's (or session's) group: its directories, one per controller (v1) or one (v2)."""

    version: int
    dirs: tuple[str, ...]

    def create(self, *, memory_mb: int, pids: int, cpus: float) -> None:
        for d in self.dirs:
            os.mkdir(d)
        period = _CPU_PERIOD_US
        if self.version == 2:
            (d,) = self.dirs
            _write(f"{d}/memory.max", str(memory_mb << 20))
            with contextlib.suppress(OSError):
                _write(f"{d}/memory.swap.max", "0")
            _write(f"{d}/pids.max", str(pids))
            _write(f"{d}/cpu.max", f"{int(cpus * period)} {period}")
            return
        memory, pid_dir, cpu = self.dirs
        _write(f"{memory}/memory.limit_in_bytes", str(memory_mb << 20))
        _write(f"{pid_dir}/pids.max", str(pids))
        _write(f"{cpu}/cpu.cfs_period_us", str(period))
        _write(f"{cpu}/cpu.cfs_quota_us", str(int(cpus * period)))

    def join(self) -> None:
        """Move the calling process in (before it gives up the right to)."""
        for d in self.dirs:
            _write(f"{d}/cgroup.procs", "0")

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in _read(f"{self.dirs[0]}/cgroup.procs").split()]
        except OSError:
            return []

    @contextlib.contextmanager
    def forks_held(self) -> Iterator[None]:
        """While inside, no process in the group can fork (pids.max 0; a fork already past the check completes), so
        what is listed after a fork's parent has died is all there is."""
        limit = f"{self.dirs[0 if self.version == 2 else 1]}/pids.max"
        try:
            before = _read(limit).strip()
            _write(limit, "0")
        except OSError:
            before = None
        try:
            yield
        finally:
            if before is not None:
                with contextlib.suppress(OSError):
                    _write(limit, before)

    def kill(self) -> int:
        """SIGKILL every process in the group, wherever it moved in the process tree; returns how many. On cgroup v2
        (Linux 5.14+) the kernel kills them all at once (`cgroup.kill`), forks in flight included."""
        victims = self.pids()
        if self.version == 2 and victims:
            with contextlib.suppress(OSError):
                _write(f"{self.dirs[0]}/cgroup.kill", "1")
                return len(victims)
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return len(victims)

    def memory_bytes(self) -> int | None:
        """Memory charged to the group now (its tmpfs files included), or None if it cannot be read."""
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            return int(_read(f"{self.dirs[0]}/{name}"))
        return None

    def oom_kills(self) -> int:
        """How many processes the kernel has killed here for memory, ever."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in _read(f"{self.dirs[0]}/{name}").splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self) -> bool:
        """Remove the group; False while processes are still leaving it."""
        done = True
        for d in self.dirs:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                done = False
        return done
