"""What a sandbox child does to itself after the fork and before it sees code, in this order:

1. its own session (so everything it starts can be found and killed by session id) and its cgroup;
2. every descriptor closed except its own;
3. an unprivileged uid of its own (when the server is root), never the server's;
4. a user namespace and a mount namespace of its own: every inherited mount is locked (a later umount or remount
   cannot reveal or unlock it), and fresh, size-bounded tmpfs mounts at /tmp and /dev/shm, gone with the call;
   the view's second /proc (hidepid=invisible: a process that is not dumpable, as every child is, is seen only by
   itself) over /proc, and an empty tmpfs over the server's cgroup directories, so no call sees another's
   processes, names, memory or cgroup files;
5. rlimits, a scrubbed environment (set once by the zygote), every capability dropped (effective, permitted,
   inheritable, ambient, bounding), not dumpable (no ptrace, no /proc/<pid>/mem), no_new_privs and the seccomp
   allowlist.

Every Python object a fresh child touches costs it a page copied from the zygote, so these steps use bare system
calls and structures built before the fork.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal.signal without its enum wrapping (see prepare)
import contextlib
import ctypes
import functools
import os
import resource
import signal
import time
from dataclasses import dataclass

from . import seccomp
from .cgroups import CallGroup

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC = 0x1, 0x2, 0x4, 0x8, 0x20, 0x1000, 0x4000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 1, 4, 24, 38, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_MB = 1 << 20


FilterTemplate = seccomp.Template  # named here: inside `Layers`, `seccomp` is the field


@dataclass(frozen=True)
class Layers:
    """Which layers the server applies to every child; decided once at start (`Zygote.decide_layers`)."""

    userns: bool = True
    uid: int | None = None  # None: keep the server's uid (an unprivileged server cannot give each call its own)
    seccomp: bool = True
    cgroup: CallGroup | None = None
    filters: tuple[FilterTemplate, FilterTemplate] | None = None  # (single-use, session), built before the fork


@dataclass(frozen=True)
class Limits:
    memory_mb: int
    file_size_mb: int
    open_files: int
    tmp_mb: int
    shm_mb: int
    processes: int


@functools.cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


CHILD_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}


def set_child_environment() -> None:
    """The whole environment a child sees: the zygote sets it once, before any child, and never changes it, so
    every child inherits exactly this (checked here, not in each child)."""
    os.environ.clear()
    os.environ.update(CHILD_ENVIRONMENT)
    if dict(os.environ) != CHILD_ENVIRONMENT:
        raise RuntimeError("the child environment could not be set")


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def write_file(path: str, text: str) -> None:
    """Write a short control file (/proc, cgroupfs) with bare system calls: a child pays a copied page for every
    Python object it touches, and `open()`'s file objects touch many."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def address_space() -> int:
    fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return int(os.read(fd, 256).split()[0]) * resource.getpagesize()
    finally:
        os.close(fd)


def _close_all_but(keep: tuple[int, ...]) -> None:
    low = 3
    for fd in sorted(fd for fd in keep if fd >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _enter_namespaces(uid: int, gid: int) -> None:
    """A user namespace mapping this uid to itself (no other), with private mounts and System V IPC."""
    lib = libc()
    _check(lib.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")  # so we may write our own maps
    _check(lib.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWIPC), "unshare")
    write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/gid_map", f"{gid} {gid} 1")


def _mount_tmpfs(path: str, size_mb: int) -> None:
    opts = f"size={size_mb}m,mode=0700".encode()
    _check(libc().mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts), f"mount {path}")


def _hide(path: str) -> None:
    """Cover `path` with an empty, read-only tmpfs."""
    flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    _check(libc().mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"size=4k,mode=0555"), f"hide {path}")


def _bind_proc(source: str) -> None:
    """Put the view's hidepid /proc (and what is bound read-only below it) over /proc."""
    _check(libc().mount(source.encode(), b"/proc", None, _MS_BIND | _MS_REC, None), "bind /proc")


def _bind_read_only(source: str, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    lib = libc()
    _check(lib.mount(source.encode(), path.encode(), None, _MS_BIND | _MS_REC, None), f"bind {path}")
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
    _check(lib.mount(None, path.encode(), None, flags, None), f"remount {path} read-only")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@functools.cache
def _last_capability() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        return int(f.read())


def _drop_bounding_and_ambient() -> None:
    """Empty the bounding and ambient sets (this needs CAP_SETPCAP, so it comes before giving up the others)."""
    lib = libc()
    for cap in range(_last_capability() + 1):
        if lib.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            _check(-1, f"PR_CAPBSET_DROP {cap}")
    lib.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL on kernels without ambient caps


_CAP_HEADER = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
_NO_CAPABILITIES = (_CapData * 2)()  # built once, before the fork, and only read (by capset)


def _clear_capabilities() -> None:
    _check(libc().capset(ctypes.byref(_CAP_HEADER), _NO_CAPABILITIES), "capset")


_DEFAULT_SIGNALS = tuple(int(s) for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE))
_SIGXFSZ, _SIG_DFL, _SIG_IGN = int(signal.SIGXFSZ), int(signal.SIG_DFL), int(signal.SIG_IGN)


def prepare(*, parent: int, keep: tuple[int, ...], layers: Layers, limits: Limits, masks: list[str],
            rebinds: list[tuple[str, str]], session: bool, private_proc: str = "",
            hidden: tuple[str, ...] = ()) -> None:
    """Confine the calling (freshly forked, single-threaded) process. Raises OSError if a layer cannot be applied:
    the caller exits, and the server reports a sandbox error instead of running code with less isolation."""
    lib = libc()
    os.setsid()
    lib.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
    signal.set_wakeup_fd(-1)
    # _signal.signal: signal.signal's enum conversions would touch dozens of the zygote's pages, each one copied.
    for sig in _DEFAULT_SIGNALS:
        _signal.signal(sig, _SIG_DFL)
    _signal.signal(_SIGXFSZ, _SIG_IGN)  # past the file-size limit, writes fail with EFBIG instead
    if layers.cgroup is not None:
        layers.cgroup.join()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _close_all_but(keep)
    uid, gid = os.getuid(), os.getgid()
    privileged = os.geteuid() == 0
    if privileged and not layers.userns:
        _drop_bounding_and_ambient()
    if layers.uid is not None:
        os.setgroups([])
        os.setresgid(layers.uid, layers.uid, layers.uid)
        os.setresuid(layers.uid, layers.uid, layers.uid)  # the kernel clears permitted and effective here
        uid = gid = layers.uid
    if layers.userns:
        _enter_namespaces(uid, gid)
        for directory in masks:
            _mount_tmpfs(directory, limits.tmp_mb)
        if os.path.isdir("/dev/shm"):
            _mount_tmpfs("/dev/shm", limits.shm_mb)
        for source, path in rebinds:  # the Python install or this package, if they live under /tmp
            _bind_read_only(source, path)
        if private_proc:
            _bind_proc(private_proc)
        for directory in hidden:  # after joining its own group (above): the slot groups of every other call
            _hide(directory)
        _drop_bounding_and_ambient()  # with the namespace's own CAP_SETPCAP
    if layers.userns:
        os.chdir("/tmp")
    limit_as = address_space() + limits.memory_mb * _MB
    resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * _MB,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if layers.uid is not None:  # per uid: counts this call's threads and processes only
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    if privileged or layers.userns:
        _clear_capabilities()
    _check(lib.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    _check(lib.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    if layers.seccomp:
        single_use, head = layers.filters or (seccomp.Template(allow_fork=False), seccomp.Template(allow_fork=True))
        (head if session else single_use).install(os.getpid())


def _stat(pid: int | str) -> tuple[str, int, int] | None:
    """(state, process group, session) of `pid`, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None


def processes_of_session(sid: int) -> list[int]:
    """Every process in session `sid`: what a call left running. Model code cannot leave its session (seccomp
    refuses setsid), and every child starts one of its own, so the session id names a call's processes."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None and stat[2] == sid:
            found.append(int(entry))
    return found


def kill_session(sid: int, keep: int | None = None) -> int:
    """SIGKILL every process of a session but `keep`; returns how many were signalled."""
    victims = [pid for pid in processes_of_session(sid) if pid != keep]
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(victims)


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")  # a zombie holds no memory and runs nothing


def _live(pids: list[int]) -> list[int]:
    """Those of `pids` not yet dead."""
    return [pid for pid in pids if _alive(pid)]


def wait_stopped(pid: int, wait: float = 1.0) -> bool:
    """Wait until every thread of `pid` is stopped (or gone): a SIGSTOP takes effect as each thread next leaves the
    kernel, and until then it may still fork. False if one still runs after `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        states = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            return True  # gone
        if all(state in ("T", "t", "Z", "X") for state in states):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def _kill(pid: int, spare_group: int | None) -> None:
    """SIGKILL `pid` and its process group (unless that is `spare_group`). A group signal also reaches a fork in
    flight: the kernel restarts a fork it interrupts, so a group that never split up dies whole at once."""
    stat = _stat(pid)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    if stat is not None and stat[1] != spare_group:
        with contextlib.suppress(OSError):
            os.killpg(stat[1], signal.SIGKILL)


def sweep(sid: int, group: CallGroup | None = None, keep: int | None = None, wait: float = 2.0) -> int:
    """Kill everything of a call but `keep`: its session and its cgroup (which a setsid() does not leave), round
    after round. A round lists the call's processes, kills each with its process group, and waits until every one
    is dead. The call is empty when a round lists no process the earlier rounds did not see die: a process forked
    by one they killed exists by then, since its parent died after the fork. With a cgroup nothing in it can fork
    meanwhile, so that holds for every process; without one, a process forked and reaped between a round's listing
    and its look at each process is not seen, and a group signal (which no fork outruns) covers those that stayed in
    their group. Returns how many are still alive after `wait` seconds (0 unless one would not die)."""
    deadline = time.monotonic() + wait
    if group is not None and keep is None:
        group.kill()
    kept = _stat(keep) if keep is not None else None
    spare = kept[1] if kept is not None else None
    dead: set[int] = set()
    with group.forks_held() if group is not None else contextlib.nullcontext():
        while True:
            found = set(processes_of_session(sid)) | set(group.pids() if group is not None else ())
            new = sorted(pid for pid in found - {keep} if pid not in dead or _alive(pid))  # a pid reused is new
            if not new:
                return 0
            for pid in new:
                _kill(pid, spare)
            while alive := _live(new):
                if time.monotonic() > deadline:
                    return len(alive)
                time.sleep(0.0005)  # killed processes take a moment to exit
            dead.update(new)


def status() -> dict[str, object]:
    """What this process really has, read from /proc: for `retool-env doctor` and `require="strict"`."""
    fields: dict[str, object] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
                fields[key] = value.split()[0] if key in ("Uid", "Gid") else value.strip()
    for ns in ("user", "mnt", "pid", "net", "ipc"):
        with contextlib.suppress(OSError):
            fields[f"ns_{ns}"] = os.readlink(f"/proc/self/ns/{ns}")
    with contextlib.suppress(OSError), open("/proc/self/uid_map") as f:
        fields["uid_map"] = " ".join(f.read().split())
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        fields["cgroup"] = f.read().strip()
    fields["dumpable"] = libc().prctl(3, 0, 0, 0, 0)
    with contextlib.suppress(OSError):  # the server (pid 1) holds no call's data; any other pid is another process
        fields["visible_processes"] = len([e for e in os.listdir("/proc")
                                           if e.isdigit() and int(e) not in (1, os.getpid())])
    return fields
