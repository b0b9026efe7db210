"""An allowlist seccomp filter, assembled by hand as classic BPF and loaded with prctl (no libseccomp needed).

Default deny: a system call that is not on the list fails with ENOSYS (so a newer kernel's calls are denied and
glibc's fallbacks still work), the calls model code must not make fail with EPERM (Python raises
`PermissionError` and the model sees why), and any entry point but x86-64's (i386 `int 0x80`) kills the process.
Dual-use calls are allowed with their arguments checked: `clone` without namespace flags (and only threads, except
in session heads, which snapshot state by forking), `kill`/`tgkill` to itself, `ioctl`, `prctl` and `personality`
for queries, `setpriority` only to be nicer, `prlimit64` on itself, `socketpair` for AF_UNIX (a connected pair
inside the process: asyncio's self-pipe); `socket` never. Session heads also `recvmsg`: the server hands each
head the channel it reports on through its code socket (server.py's `_run_cell`).

Nothing may act on a host object it can merely read (the view is read-only, but page cache, locks and signal
routing are shared): `fadvise64`, `fsync`, `fdatasync` and `msync` succeed without doing anything, as do `flock`,
`fcntl`'s record locks and `madvise`'s page-cache advice (COLD, PAGEOUT, KSM, COLLAPSE); `fcntl` signal routing
(F_SETOWN, F_SETOWN_EX, F_SETSIG, O_ASYNC), leases, directory notification, pipe sizes, seals and write-life hints
are refused. Not listed, so ENOSYS: readahead, sync_file_range, sync, syncfs, inotify, fanotify, mlock.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import platform
import struct

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000

# x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl); tests check them against the kernel headers.
SYSCALLS = {
    "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6, "poll": 7, "lseek": 8,
    "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14,
    "rt_sigreturn": 15, "ioctl": 16, "pread64": 17, "pwrite64": 18, "readv": 19, "writev": 20, "access": 21,
    "pipe": 22, "select": 23, "sched_yield": 24, "mremap": 25, "msync": 26, "mincore": 27, "madvise": 28,
    "dup": 32, "dup2": 33, "pause": 34, "nanosleep": 35, "getitimer": 36, "alarm": 37, "setitimer": 38,
    "getpid": 39, "sendfile": 40, "socket": 41, "recvmsg": 47, "socketpair": 53, "clone": 56, "fork": 57, "vfork": 58,
    "execve": 59, "exit": 60, "wait4": 61, "kill": 62, "uname": 63, "fcntl": 72, "flock": 73, "fsync": 74,
    "fdatasync": 75, "truncate": 76, "ftruncate": 77, "getdents": 78, "getcwd": 79, "chdir": 80, "fchdir": 81,
    "rename": 82, "mkdir": 83, "rmdir": 84, "creat": 85, "link": 86, "unlink": 87, "symlink": 88, "readlink": 89,
    "chmod": 90, "fchmod": 91, "umask": 95, "gettimeofday": 96, "getrlimit": 97, "getrusage": 98, "sysinfo": 99,
    "times": 100, "ptrace": 101, "getuid": 102, "syslog": 103, "getgid": 104, "geteuid": 107, "getegid": 108,
    "setpgid": 109, "getppid": 110, "getpgrp": 111, "setsid": 112, "getgroups": 115, "getresuid": 118,
    "getresgid": 120, "getpgid": 121, "getsid": 124, "capget": 125, "rt_sigpending": 127,
    "rt_sigtimedwait": 128, "rt_sigqueueinfo": 129, "rt_sigsuspend": 130, "sigaltstack": 131, "utime": 132,
    "mknod": 133, "personality": 135, "statfs": 137, "fstatfs": 138, "getpriority": 140, "setpriority": 141,
    "sched_setparam": 142, "sched_getparam": 143, "sched_setscheduler": 144, "sched_getscheduler": 145,
    "sched_get_priority_max": 146, "sched_get_priority_min": 147, "sched_rr_get_interval": 148, "prctl": 157,
    "arch_prctl": 158, "setrlimit": 160, "mount": 165, "gettid": 186, "getxattr": 191, "lgetxattr": 192,
    "fgetxattr": 193, "listxattr": 194, "llistxattr": 195, "flistxattr": 196, "tkill": 200, "time": 201,
    "futex": 202, "sched_getaffinity": 204, "epoll_create": 213, "getdents64": 217, "set_tid_address": 218,
    "restart_syscall": 219, "fadvise64": 221, "timer_create": 222, "timer_settime": 223, "timer_gettime": 224,
    "timer_getoverrun": 225, "timer_delete": 226, "clock_gettime": 228, "clock_getres": 229,
    "clock_nanosleep": 230, "exit_group": 231, "epoll_wait": 232, "epoll_ctl": 233, "tgkill": 234, "utimes": 235,
    "waitid": 247, "openat": 257, "mkdirat": 258, "mknodat": 259, "futimesat": 261, "newfstatat": 262,
    "unlinkat": 263, "renameat": 264, "linkat": 265, "symlinkat": 266, "readlinkat": 267, "fchmodat": 268,
    "faccessat": 269, "pselect6": 270, "ppoll": 271, "unshare": 272, "set_robust_list": 273,
    "get_robust_list": 274, "splice": 275, "tee": 276, "utimensat": 280, "epoll_pwait": 281, "signalfd": 282,
    "timerfd_create": 283, "eventfd": 284, "fallocate": 285, "timerfd_settime": 286, "timerfd_gettime": 287,
    "signalfd4": 289, "eventfd2": 290, "epoll_create1": 291, "dup3": 292, "pipe2": 293, "preadv": 295,
    "pwritev": 296, "rt_tgsigqueueinfo": 297, "prlimit64": 302, "open_by_handle_at": 304, "getcpu": 309,
    "sched_setattr": 314, "renameat2": 316, "getrandom": 318, "memfd_create": 319, "copy_file_range": 326,
    "preadv2": 327, "pwritev2": 328, "statx": 332, "rseq": 334, "pidfd_send_signal": 424, "open_tree": 428,
    "fsopen": 430, "pidfd_open": 434, "clone3": 435, "close_range": 436, "pidfd_getfd": 438, "faccessat2": 439,
    "epoll_pwait2": 441, "mount_setattr": 442, "futex_waitv": 449, "futex_wake": 454, "futex_wait": 455,
    "futex_requeue": 456,
}  # fmt: skip

# What a Python interpreter running numpy and sympy needs, with no argument that could reach beyond itself.
ALLOWED = frozenset([
    "read", "write", "open", "close", "stat", "fstat", "lstat", "poll", "lseek", "mmap", "mprotect", "munmap", "brk",
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "pread64", "pwrite64", "readv", "writev", "access", "pipe",
    "select", "sched_yield", "mremap", "msync", "mincore", "madvise", "dup", "dup2", "pause", "nanosleep", "getitimer",
    "alarm", "setitimer", "getpid", "sendfile", "exit", "wait4", "uname", "fcntl", "flock", "fsync", "fdatasync",
    "truncate", "ftruncate", "getdents", "getcwd", "chdir", "fchdir", "rename", "mkdir", "rmdir", "creat", "link",
    "unlink", "symlink", "readlink", "chmod", "fchmod", "umask", "gettimeofday", "getrlimit", "getrusage", "sysinfo",
    "times", "getuid", "getgid", "geteuid", "getegid", "getppid", "getpgrp", "getgroups", "getresuid", "getresgid",
    "getpgid", "getsid", "capget", "rt_sigpending", "rt_sigtimedwait", "rt_sigsuspend", "sigaltstack", "utime",
    "statfs", "fstatfs", "getpriority", "sched_getparam", "sched_getscheduler", "sched_get_priority_max",
    "sched_get_priority_min", "sched_rr_get_interval", "arch_prctl", "setrlimit", "gettid", "getxattr", "lgetxattr",
    "fgetxattr", "listxattr", "llistxattr", "flistxattr", "time", "futex", "sched_getaffinity", "epoll_create",
    "getdents64", "set_tid_address", "restart_syscall", "fadvise64", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete", "clock_gettime", "clock_getres", "clock_nanosleep", "exit_group", "epoll_wait",
    "epoll_ctl", "utimes", "waitid", "openat", "mkdirat", "futimesat", "newfstatat", "unlinkat", "renameat", "linkat",
    "symlinkat", "readlinkat", "fchmodat", "faccessat", "pselect6", "ppoll", "set_robust_list", "get_robust_list",
    "splice", "tee", "utimensat", "epoll_pwait", "signalfd", "timerfd_create", "eventfd", "fallocate",
    "timerfd_settime", "timerfd_gettime", "signalfd4", "eventfd2", "epoll_create1", "dup3", "pipe2", "preadv",
    "pwritev", "getcpu", "renameat2", "getrandom", "memfd_create", "copy_file_range", "preadv2", "pwritev2", "statx",
    "rseq", "close_range", "faccessat2", "epoll_pwait2", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue"
])
# Named refusals (EPERM, so the model reads "Operation not permitted"); anything else unlisted gets ENOSYS.
REFUSED = frozenset([
    "socket", "socketpair", "fork", "vfork", "execve", "ptrace", "syslog", "setsid", "setpgid", "mknod", "mknodat",
    "mount", "unshare", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sched_setparam", "sched_setscheduler",
    "sched_setattr", "open_by_handle_at", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "open_tree", "fsopen",
    "mount_setattr"
])

_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
# ioctl requests for terminals and descriptors that Python asks about (isatty, non-blocking, close-on-exec).
_IOCTLS = (0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)  # TCGETS TIOCGWINSZ FIONREAD FIONBIO FIONCLEX FIOCLEX
# prctl options that only read, or name the caller: GET_DUMPABLE, GET_KEEPCAPS, SET/GET_NAME, GET_SECCOMP,
# CAPBSET_READ, GET_TIMERSLACK, GET_NO_NEW_PRIVS, GET_THP_DISABLE, SET_VMA (glibc names its mappings).
_PRCTLS = (3, 7, 15, 16, 21, 23, 30, 39, 42, 0x53564D41)
# fcntl commands that only touch the descriptor or the caller's own file description (and F_GETLK, a query);
# record locks would reach a host file's inode, shared with the trainer: they succeed and do nothing.
_FCNTL_OWN = (0, 1, 2, 3, 4, 5, 9, 11, 16, 36, 1025, 1030, 1032, 1034)  # DUPFD GETFD SETFD GETFL SETFL GETLK GETOWN
# GETSIG GETOWN_EX OFD_GETLK GETLEASE DUPFD_CLOEXEC GETPIPE_SZ GET_SEALS
_FCNTL_INERT = (6, 7, 37, 38)  # SETLK SETLKW OFD_SETLK OFD_SETLKW
_F_SETFL, _O_ASYNC = 4, 0x2000  # O_ASYNC sends SIGIO (or F_SETSIG's signal) to the file's owner
# madvise advice on the caller's own mappings; COLD, PAGEOUT (which reclaim page-cache pages), MERGEABLE,
# UNMERGEABLE (KSM, shared across the machine) and COLLAPSE succeed without effect.
_MADVISE_OWN = (0, 1, 2, 3, 4, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19, 22, 23, 24)
_MADVISE_INERT = (12, 13, 20, 21, 25)
_PERSONALITY_QUERY = 0xFFFFFFFF
_AF_UNIX = 1

_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_LD_ABS, _JEQ, _JGT, _JSET, _JGE, _RET = 0x20, 0x15, 0x25, 0x45, 0x35, 0x06
_NR, _ARCH, _ARG0, _ARG1, _ARG2 = 0, 4, 16, 24, 32  # offsets in struct seccomp_data (low 32 bits, little-endian)
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def _errno(code: int) -> int:
    return 0x00050000 | code


_INERT = _errno(0)  # the call returns 0 without running


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k & 0xFFFFFFFF)


def _load(offset: int) -> bytes:
    return _insn(_LD_ABS, offset)


def _one_of(values: tuple[int, ...], deny: int) -> list[bytes]:
    """Allow when the loaded value is one of `values`, else return `deny`."""
    checks = [_insn(_JEQ, v, len(values) - i, 0) for i, v in enumerate(values)]
    return [*checks, _insn(_RET, deny), _insn(_RET, _RET_ALLOW)]


def _allow_inert_or(allow: tuple[int, ...], inert: tuple[int, ...], deny: int) -> list[bytes]:
    """Allow when the loaded value is in `allow`, succeed without running the call when it is in `inert`, else
    return `deny`."""
    n, m = len(allow), len(inert)
    checks = [_insn(_JEQ, v, n + m + 1 - i, 0) for i, v in enumerate(allow)]
    checks += [_insn(_JEQ, v, m - i, 0) for i, v in enumerate(inert)]
    return [*checks, _insn(_RET, deny), _insn(_RET, _INERT), _insn(_RET, _RET_ALLOW)]


def supported() -> str | None:
    """None when a filter can be built here, else the reason it cannot."""
    if platform.system() != "Linux":
        return "not Linux"
    if platform.machine() != "x86_64":
        return f"no syscall table for {platform.machine()} (only x86_64)"
    return None


def build_filter(self_pid: int, *, allow_fork: bool) -> bytes:
    """The BPF program. `allow_fork` is for session heads, which snapshot state by forking (their cells, whose pids
    differ, may signal only their own process group); `self_pid` is the pid a single-use child may signal."""
    eperm, enosys = _errno(errno.EPERM), _errno(errno.ENOSYS)
    own = self_pid if self_pid > 0 and not allow_fork else 0
    checked: dict[str, list[bytes]] = {
        # Threads always; processes only in sessions; never into new namespaces.
        "clone": [_load(_ARG0), _insn(_JSET, _CLONE_NAMESPACES, 0, 1), _insn(_RET, eperm)]
        + ([_insn(_RET, _RET_ALLOW)] if allow_fork else
           [_insn(_JSET, _CLONE_THREAD, 1, 0), _insn(_RET, eperm), _insn(_RET, _RET_ALLOW)]),
        "kill": [_load(_ARG0), *_one_of((0, own, -own) if own else (0,), eperm)],
        "tgkill": [_load(_ARG0), *_one_of((own,), eperm)] if own else [_insn(_RET, eperm)],
        "ioctl": [_load(_ARG1), *_one_of(_IOCTLS, _errno(errno.ENOTTY))],
        "prctl": [_load(_ARG0), *_one_of(_PRCTLS, eperm)],
        "personality": [_load(_ARG0), *_one_of((_PERSONALITY_QUERY, 0), eperm)],
        # PRIO_PROCESS of itself, to a nice value of 0..19 (without capabilities the kernel refuses lower ones too).
        "setpriority": [_load(_ARG0), _insn(_JEQ, 0, 0, 4), _load(_ARG1), _insn(_JEQ, 0, 0, 2), _load(_ARG2),
                        _insn(_JGT, 19, 0, 1), _insn(_RET, eperm), _insn(_RET, _RET_ALLOW)],
        "prlimit64": [_load(_ARG0), *_one_of((0, own) if own else (0,), eperm)],
        "socketpair": [_load(_ARG0), *_one_of((_AF_UNIX,), eperm)],  # asyncio's self-pipe; reaches nothing outside
        # F_SETFL without O_ASYNC; then the commands on the descriptor itself.
        "fcntl": [_load(_ARG1), _insn(_JEQ, _F_SETFL, 0, 4), _load(_ARG2), _insn(_JSET, _O_ASYNC, 0, 1),
                  _insn(_RET, eperm), _insn(_RET, _RET_ALLOW), *_allow_inert_or(_FCNTL_OWN, _FCNTL_INERT, eperm)],
        "madvise": [_load(_ARG2), *_allow_inert_or(_MADVISE_OWN, _MADVISE_INERT, eperm)],
        **{name: [_insn(_RET, _INERT)] for name in ("fadvise64", "flock", "fsync", "fdatasync", "msync")},
    }  # fmt: skip
    if allow_fork:
        checked["setpgid"] = [_insn(_RET, _RET_ALLOW)]  # a head puts each cell in its own group
        checked["recvmsg"] = [_insn(_RET, _RET_ALLOW)]  # a head receives its report channel
    prog = [
        _load(_ARCH),
        _insn(_JEQ, _AUDIT_ARCH_X86_64, 1, 0),
        _insn(_RET, _RET_KILL_PROCESS),  # i386 (int 0x80) and any other entry point
        _load(_NR),
        _insn(_JGE, _X32_BIT, 0, 1),
        _insn(_RET, eperm),  # the x32 ABI would bypass every number below
    ]
    for name, block in checked.items():
        prog += [_insn(_JEQ, SYSCALLS[name], 0, len(block)), *block, _load(_NR)]
    allowed = sorted(SYSCALLS[name] for name in ALLOWED if name not in checked)
    refused = sorted(SYSCALLS[name] for name in REFUSED if name not in checked)
    # clone3 hides its flags behind a pointer: ENOSYS makes glibc fall back to clone, whose flags we can read.
    prog += [_insn(_JEQ, SYSCALLS["clone3"], 0, 1), _insn(_RET, enosys)]
    for i, nr in enumerate(allowed):  # jump to the final ALLOW
        prog.append(_insn(_JEQ, nr, len(allowed) - i + len(refused) + 1, 0))
    for i, nr in enumerate(refused):  # jump to the final EPERM
        prog.append(_insn(_JEQ, nr, len(refused) - i, 0))
    prog += [_insn(_RET, enosys), _insn(_RET, eperm), _insn(_RET, _RET_ALLOW)]
    return b"".join(prog)


_PID_SENTINEL = 0x7EADBEEF  # stands for the child's pid in a filter built once, before the fork
_K = struct.Struct("<I")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Template:
    """A filter built once (in the zygote) for a pid not yet known, loaded ready to install: a child writes its pid
    into its own copy of the buffer (a page of copy-on-write) and installs it, instead of rebuilding the program.
    Every Python object a fresh child touches costs it a page copied from the zygote, so the child's part is short."""

    def __init__(self, *, allow_fork: bool) -> None:
        self.program = build_filter(_PID_SENTINEL, allow_fork=allow_fork)
        ks = [_K.unpack_from(self.program, offset + 4)[0] for offset in range(0, len(self.program), 8)]
        self.pid_at = tuple(8 * i + 4 for i, k in enumerate(ks) if k == _PID_SENTINEL)
        self.negated_pid_at = tuple(8 * i + 4 for i, k in enumerate(ks) if k == -_PID_SENTINEL & 0xFFFFFFFF)
        self.buffer = ctypes.create_string_buffer(self.program, len(self.program))
        self.fprog = _SockFprog(len(self.program) // 8, ctypes.addressof(self.buffer))
        _libc()  # loaded here, so children find it

    def install(self, pid: int) -> None:
        """Load the filter for `pid` into the calling process (after the fork: the zygote's copy is never written)."""
        for offset in self.pid_at:
            _K.pack_into(self.buffer, offset, pid & 0xFFFFFFFF)
        for offset in self.negated_pid_at:
            _K.pack_into(self.buffer, offset, -pid & 0xFFFFFFFF)
        _load_program(self.fprog)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _load_program(fprog: _SockFprog) -> None:
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def install(program: bytes) -> None:
    """Load `program` into the calling thread (and every thread and child it creates later). Irreversible."""
    buf = ctypes.create_string_buffer(program, len(program))
    _load_program(_SockFprog(len(program) // 8, ctypes.addressof(buf)))
