"""The namespace wrapper the server starts in, and the report of every isolation layer.

The server runs inside bubblewrap where it is installed: a read-only view of the host in which the homes (`/root`,
`/home`, `$HOME`), `/tmp`, `/var/tmp` and `/run` are empty tmpfs mounts (only the Python install and this package
are bound back, read-only), with private pid, network, IPC and UTS namespaces. As root it keeps only the
capabilities it needs to give each child its own uid and to signal it; unprivileged, bubblewrap maps the user into
a user namespace. Each child then confines itself further (confine.py); `layers()` reports both, from what the
server measured in a confined child (`LocalSandbox.layers()`).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from . import seccomp

_MASKED = ("/root", "/home", "/tmp", "/var/tmp", "/run")
REBIND_DIR = "/run/retool-host"  # inside the server: second views of Python paths under /tmp
# As root: switch each child to its own uid (SETUID, SETGID), drop its bounding set where it has no user
# namespace (SETPCAP), and signal children of other uids (KILL). Nothing else.
_SERVER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL")


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


def _outermost(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not any(p.startswith(q + "/") for q in paths))


def python_paths() -> list[str]:
    """What the server's interpreter needs to see: its install, the venv, sys.path and this package.

    The package itself (`retool_env/`), not the checkout around it: a checkout in a private directory (`mktemp -d`
    makes it 0700) would be bound back with its mode, which a child's uid could not traverse; bubblewrap creates the
    directories above a bound path with mode 0755."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkout = os.path.dirname(package)
    entries = [p for p in sys.path if p and os.path.abspath(p) != checkout]
    candidates = {sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), package, *entries}
    candidates.add(os.path.dirname(os.path.realpath(sys.executable)))
    found = {os.path.realpath(p) for p in candidates if p} | {os.path.abspath(p) for p in candidates if p}
    return _outermost({p for p in found if os.path.exists(p) and p != "/"})


def masked_dirs() -> list[str]:
    home = os.path.expanduser("~")
    dirs = {d for d in (*_MASKED, home) if d not in ("", "/") and os.path.isdir(d)}
    return _outermost({os.path.realpath(d) for d in dirs})


def hidden_python_paths(under: tuple[str, ...] | list[str]) -> list[str]:
    """The Python paths that a tmpfs over one of `under` would hide."""
    return [p for p in python_paths() if any(p == d or p.startswith(d + "/") for d in under)]


def _bind_into_tmpfs(path: str, dest: str, top: str) -> list[str]:
    """bubblewrap would create the directories above `dest` with mode 0700, which only root could traverse."""
    parts = os.path.relpath(dest, top).split(os.sep)[:-1]
    dirs = [arg for i in range(len(parts)) for arg in ("--perms", "0755", "--dir", os.path.join(top, *parts[: i + 1]))]
    return [*dirs, "--ro-bind", path, dest]


def child_rebinds(wrapper: str) -> list[tuple[str, str]]:
    """(a copy visible inside the server, path) for each Python path that a child's private /tmp covers: the
    child binds the copy back (it cannot reach the original once its tmpfs is mounted)."""
    if wrapper != "bwrap":
        return []
    return [(f"{REBIND_DIR}/{i}", path) for i, path in enumerate(hidden_python_paths(["/tmp"]))]


def child_masks(wrapper: str) -> list[str]:
    """Where each child mounts a private tmpfs. Without bubblewrap, /tmp is kept if Python lives under it."""
    if wrapper == "bwrap" or not hidden_python_paths(["/tmp"]):
        return ["/tmp"]
    return []


def bwrap_args(cgroup_dirs: tuple[str, ...] = ()) -> list[str]:
    args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    masked = masked_dirs()
    for directory in masked:
        args += ["--tmpfs", directory]
    for path in hidden_python_paths(masked):
        args += _bind_into_tmpfs(path, path, next(d for d in masked if path == d or path.startswith(d + "/")))
    for source, dest in child_rebinds("bwrap"):
        args += _bind_into_tmpfs(dest, source, "/run")
    for directory in cgroup_dirs:  # the server's own cgroups, where it creates one per call
        args += ["--bind", directory, directory]
    args += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--new-session", "--hostname", "sandbox"]
    if os.geteuid() == 0:
        args += ["--cap-drop", "ALL"]
        for cap in _SERVER_CAPS:
            args += ["--cap-add", cap]
    else:
        args += ["--unshare-user"]
    return [*args, "--"]


def unshare_args() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "--ipc", "--uts", "--pid", "--fork", "--mount", "--mount-proc", "--"]


@functools.cache
def _wrapper(name: str) -> tuple[bool, str]:
    """(works here, description or why not)."""
    if name == "bwrap":
        if not shutil.which("bwrap"):
            return False, "bubblewrap not installed (apt-get install -y bubblewrap)"
        prefix = bwrap_args()
        about = "bubblewrap: read-only /, homes, /tmp and /run hidden, private pid/net/ipc/uts namespaces"
    elif name == "unshare":
        if not shutil.which("unshare"):
            return False, "util-linux unshare not found"
        prefix = unshare_args()
        about = "unshare: private pid/net/ipc/uts/mount namespaces (the host's files stay visible)"
    else:
        raise RuntimeError(f"isolation={name!r} is not available here: use auto, bwrap, unshare or none")
    problem = _probe([*prefix, "/bin/true"])
    return (True, about) if problem is None else (False, f"{name} failed: {problem}")


def choose_wrapper(mode: str) -> str:
    """`auto` picks the strongest wrapper that works here; `none` runs the server bare."""
    if mode == "none":
        return "none"
    if mode == "auto":
        return next((name for name in ("bwrap", "unshare") if _wrapper(name)[0]), "none")
    works, about = _wrapper(mode)
    if not works:
        raise RuntimeError(f"isolation={mode!r} is not available here: {about}")
    return mode


def wrapper_prefix(name: str, cgroup_dirs: tuple[str, ...] = ()) -> list[str]:
    return {"bwrap": lambda: bwrap_args(cgroup_dirs), "unshare": unshare_args, "none": list}[name]()


def _caps_empty(child: dict) -> bool:
    return all(child.get(key) == "0" * 16 for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))


def layers(wrapper: str, measured: dict, *, root: bool) -> list[Layer]:
    """Every layer, active or not, from the wrapper in use and what the server measured in a child
    (`measured`: {"missing": {layer: why}, "child": /proc/self/status fields of a confined child})."""
    missing, child = measured.get("missing", {}), measured.get("child", {})
    wrapped = wrapper != "none"
    bwrap = wrapper == "bwrap"
    uid = child.get("Uid", "?")
    rows = [
        Layer("clean environment", True, "the server and every child start with an empty environment"),
        Layer("namespaces", wrapped, _wrapper(wrapper)[1] if wrapped else "no wrapper: bubblewrap or unshare"),
        Layer("read-only filesystem", bwrap, "the host is read-only; homes, /tmp, /run hidden" if bwrap else
              "needs bubblewrap"),
        Layer("network isolation", wrapped, "empty network namespace; sockets refused" if wrapped else
              "needs namespaces"),
        Layer("user namespace", "user namespace" not in missing and bool(child),
              missing.get("user namespace", "each call in its own, its mounts locked; private /tmp and /dev/shm")),
        Layer("uid per call", "uid per call" not in missing and root and uid not in ("0", "?"),
              missing.get("uid per call", f"a probe child ran as uid {uid}; each live call or session gets its "
                          "own from 2000000000 up") if root
              else "needs root: children keep the server's uid (each in its own user namespace)"),
        Layer("capabilities dropped", _caps_empty(child), "all five sets empty" if _caps_empty(child) else
              "a child still holds capabilities: " + ", ".join(f"{k}={child.get(k)}" for k in ("CapEff", "CapBnd"))),
        Layer("no_new_privs", child.get("NoNewPrivs") == "1", f"NoNewPrivs={child.get('NoNewPrivs', '?')}"),
        Layer("seccomp", "seccomp" not in missing and child.get("Seccomp") == "2",
              missing.get("seccomp", seccomp.supported() or "allowlist filter (default deny) in every child")),
        Layer("cgroup", "cgroup" not in missing and bool(measured.get("cgroup")),
              missing.get("cgroup", measured.get("cgroup_detail", "no cgroup delegated"))),
        Layer("not dumpable", child.get("dumpable") == 0, "no ptrace, no /proc/<pid>/mem between calls"),
        Layer("rlimits", True, "address space, CPU time, file size, open files, core dumps, processes"),
    ]
    return rows


def required(rows: list[Layer], *, root: bool) -> list[Layer]:
    """The layers `require="strict"` insists on (a uid per call and cgroups only where root makes them possible)."""
    optional = set() if root else {"uid per call", "cgroup"}
    return [row for row in rows if row.name not in optional]

