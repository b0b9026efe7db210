"""A seccomp filter, assembled by hand as classic BPF and loaded with prctl (no libseccomp needed).

It denies what untrusted math code never needs: exec, new processes, sockets, ptrace, mounts and namespaces,
kernel keyrings and modules, and signals to any process but itself. Denied calls fail with EPERM, so Python raises
`PermissionError` and the model sees why.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_AUDIT_ARCH_X86_64 = 0xC000003E
# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
_DENY_X86_64 = {
    "socket": 41, "socketpair": 53, "fork": 57, "vfork": 58, "execve": 59, "ptrace": 101, "chroot": 161,
    "pivot_root": 155, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
    "init_module": 175, "delete_module": 176, "kexec_load": 246, "add_key": 248, "request_key": 249,
    "keyctl": 250, "unshare": 272, "perf_event_open": 298, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "finit_module": 313, "bpf": 321, "execveat": 322, "userfaultfd": 323,
    "io_uring_setup": 425, "tkill": 200,
}  # fmt: skip
_SETSID, _SETPGID = 112, 109
_CLONE, _CLONE3, _KILL, _TGKILL = 56, 435, 62, 234
_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET

_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_LD_ABS, _JEQ, _JSET, _JGE, _RET = 0x20, 0x15, 0x45, 0x35, 0x06
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def _errno(code: int) -> int:
    return 0x00050000 | code


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k & 0xFFFFFFFF)


def supported() -> str | None:
    """None when a filter can be built here, else the reason it cannot."""
    if platform.system() != "Linux":
        return "not Linux"
    if platform.machine() != "x86_64":
        return f"no syscall table for {platform.machine()} (only x86_64)"
    return None


def build_filter(self_pid: int, *, allow_fork: bool) -> bytes:
    """The BPF program. `allow_fork` is for session heads, which snapshot state by forking."""
    arg0 = 16  # offsetof(struct seccomp_data, args[0]); the low 32 bits on little-endian
    prog = [
        _insn(_LD_ABS, 4),
        _insn(_JEQ, _AUDIT_ARCH_X86_64, 1, 0),
        _insn(_RET, _RET_KILL_PROCESS),
        _insn(_LD_ABS, 0),
        _insn(_JGE, 0x40000000, 0, 1),  # the x32 ABI would bypass every number below
        _insn(_RET, _errno(errno.EPERM)),
    ]
    denied = dict(_DENY_X86_64)
    if allow_fork:
        denied.pop("fork")
        denied.pop("vfork")
    else:
        denied.update(setsid=_SETSID, setpgid=_SETPGID)
    for nr in denied.values():
        prog += [_insn(_JEQ, nr, 0, 1), _insn(_RET, _errno(errno.EPERM))]
    prog += [_insn(_JEQ, _CLONE3, 0, 1), _insn(_RET, _errno(errno.ENOSYS))]  # glibc then falls back to clone
    # clone: threads always; processes only for session heads, and never into new namespaces.
    if allow_fork:
        clone = [_insn(_LD_ABS, arg0), _insn(_JSET, _CLONE_NAMESPACES, 1, 0), _insn(_RET, _RET_ALLOW)]
    else:
        clone = [_insn(_LD_ABS, arg0), _insn(_JSET, _CLONE_THREAD, 0, 1), _insn(_RET, _RET_ALLOW)]
    clone.append(_insn(_RET, _errno(errno.EPERM)))
    prog += [_insn(_JEQ, _CLONE, 0, len(clone)), *clone]
    # kill: only its own process group (0) or itself; tgkill only within itself.
    own = self_pid if self_pid > 0 else 0
    kill = [
        _insn(_LD_ABS, arg0),
        _insn(_JEQ, 0, 3, 0),
        _insn(_JEQ, own, 2, 0),
        _insn(_JEQ, -own, 1, 0),
        _insn(_RET, _errno(errno.EPERM)),
        _insn(_RET, _RET_ALLOW),
    ]
    prog += [_insn(_JEQ, _KILL, 0, len(kill)), *kill]
    tgkill = [_insn(_LD_ABS, arg0), _insn(_JEQ, own, 1, 0), _insn(_RET, _errno(errno.EPERM)), _insn(_RET, _RET_ALLOW)]
    prog += [_insn(_JEQ, _TGKILL, 0, len(tgkill)), *tgkill]
    prog.append(_insn(_RET, _RET_ALLOW))
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(program: bytes) -> None:
    """Load `program` into the calling thread (and every thread and child it creates later). Irreversible."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
