"""Which isolation layers this machine allows, probed once, and the command that starts the server inside them."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

from . import seccomp

NOBODY = 65534
SANDBOX_JOBS_DIR = "/tmp/retool-jobs"  # inside bubblewrap's private /tmp


@dataclass(frozen=True)
class Layer:
    name: str
    active: bool
    detail: str


def _probe(cmd: list[str], timeout: float = 10.0) -> str | None:
    """None if `cmd` exits 0, else a short reason."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if proc.returncode == 0:
        return None
    return (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]


def python_paths_under_tmp() -> list[str]:
    """Where the server's Python and this package live, if under /tmp: the private /tmp would hide them."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = {sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), package_root, *sys.path}
    found = sorted({os.path.realpath(p) for p in candidates if p} | {p for p in candidates if p})
    under_tmp = [p for p in found if p.startswith("/tmp/") and os.path.exists(p)]
    return [p for p in under_tmp if not any(p.startswith(q + "/") for q in under_tmp)]


def bwrap_args(keep_caps: bool) -> list[str]:
    """A read-only view of the host, private /tmp, /dev and /proc, and new pid/net/ipc/uts namespaces."""
    args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for path in python_paths_under_tmp():  # a checkout or venv under /tmp stays visible, read-only
        args += ["--ro-bind", path, path]
    args += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--new-session", "--hostname", "sandbox"]
    if keep_caps:  # the server needs these to drop its children to another uid; the children lose them
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_OVERRIDE", "CAP_KILL"):
            args += ["--cap-add", cap]
    return [*args, "--"]


def unshare_args() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "--ipc", "--uts", "--pid", "--fork", "--mount", "--mount-proc", "--"]


@functools.lru_cache(maxsize=1)
def _uid_drop_problem() -> str | None:
    if os.geteuid() != 0:
        return "not running as root (the server already runs unprivileged)"
    paths = [sysconfig.get_paths()["stdlib"], *(p for p in sys.path if p.endswith("site-packages"))]
    check = f"import os; os.setgroups([]); os.setresgid({NOBODY},{NOBODY},{NOBODY}); os.setresuid({NOBODY},{NOBODY},{NOBODY})\n"
    check += "".join(f"os.listdir({p!r})\n" for p in paths)
    if _probe([sys.executable, "-I", "-S", "-c", check]) is None:
        return None
    return f"the Python install ({sys.base_prefix}) is not readable by uid {NOBODY}, so children could not import modules"


@functools.cache
def _wrapper(name: str) -> tuple[list[str] | None, str]:
    """(argv prefix, description) if the wrapper works here, else (None, why not)."""
    if name == "bwrap":
        if not shutil.which("bwrap"):
            return None, "bubblewrap not installed (apt-get install -y bubblewrap)"
        prefix = bwrap_args(keep_caps=_uid_drop_problem() is None)
        about = "bubblewrap: read-only /, private /tmp, new pid/net/ipc/uts namespaces"
    elif name == "unshare":
        if not shutil.which("unshare"):
            return None, "util-linux unshare not found"
        prefix = unshare_args()
        about = "unshare: new pid/net/ipc/uts/mount namespaces (the filesystem stays writable)"
    else:
        raise RuntimeError(f"isolation={name!r} is not available here: use auto, bwrap, unshare or none")
    problem = _probe([*prefix, "/bin/true"])
    return (prefix, about) if problem is None else (None, f"{name} failed: {problem}")


def _wrapper_choice() -> tuple[str, list[str], str]:
    """(name, argv prefix, why) of the strongest namespace wrapper that works here."""
    reasons = []
    for name in ("bwrap", "unshare"):
        prefix, about = _wrapper(name)
        if prefix is not None:
            return name, prefix, about
        reasons.append(about)
    return "none", [], "; ".join(reasons)


def server_prefix(mode: str) -> tuple[str, list[str]]:
    """The wrapper to start the server in: `auto` picks the strongest available, `none` runs it bare."""
    if mode == "none":
        return "none", []
    if mode == "auto":
        name, prefix, _ = _wrapper_choice()
        return name, prefix
    prefix, about = _wrapper(mode)
    if prefix is None:
        raise RuntimeError(f"isolation={mode!r} is not available here: {about}")
    return mode, prefix


def uid_drop_available() -> bool:
    return _uid_drop_problem() is None


def report() -> list[Layer]:
    """Every layer with whether it is active and why (used by `retool-env doctor`)."""
    name, _, why = _wrapper_choice()
    seccomp_problem = seccomp.supported()
    uid_problem = _uid_drop_problem()
    fs = name == "bwrap"
    return [
        Layer("clean environment", True, "the server starts with an empty environment: no trainer secrets"),
        Layer("rlimits", True, "address space, CPU time, file size, open files, core dumps"),
        Layer("process group kill", True, "each call is its own session/process group, killed as a whole"),
        Layer("namespaces", name != "none", why),
        Layer("read-only filesystem", fs, "bubblewrap's read-only bind of /" if fs else "needs bubblewrap"),
        Layer("network isolation", name != "none", "empty network namespace" if name != "none" else "needs namespaces"),
        Layer(
            "seccomp",
            seccomp_problem is None,
            seccomp_problem or "no exec, fork, sockets, ptrace, mount, namespaces, or signals to other processes",
        ),
        Layer("uid drop", uid_problem is None, uid_problem or f"children run as uid {NOBODY}"),
    ]
