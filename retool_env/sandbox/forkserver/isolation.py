"""The server's own namespaces and filesystem view, built with mount(2) (nothing to install), and the layer report.

Before it imports anything else, the server (`enter`, called by its bootstrap) unshares mount, pid, network, IPC,
UTS and cgroup namespaces (and, unprivileged, a user namespace mapping its uid to itself), forks so that it is pid 1
of the new pid namespace, and builds an allowlist root on a tmpfs with bind mounts, then `pivot_root`s into it:

- read-only: the interpreter's install and every `sys.path` entry of the server (a fresh `python -s` with an empty
  environment: no working directory, script directory, PYTHONPATH or user site), this package (`retool_env/`, not
  the checkout around it; the problem files it ships read as empty), the system libraries (`/usr/lib*`, `/lib*`),
  `/etc/ld.so.cache` and `extra_paths`;
- a minimal `/etc` (passwd, group, hosts, nsswitch.conf written for the view), a `/dev` of null, zero, full,
  random, urandom and tty, the new pid namespace's own `/proc` (with `/proc/sys` read-only), and tmpfs mounts at
  `/tmp` and `/dev/shm` that each child covers again with its own; a second `/proc` at `PRIVATE_PROC` mounted
  `hidepid=invisible` (a child, which is not dumpable, sees only itself there), which each child binds over its
  `/proc`;
- the server's cgroup parents, writable (it makes one group per slot in them; each child covers them), and
  nothing else of the host.

Every directory the view creates is 0755, so a child that switched to its own uid can reach a Python install that
lives under a 0700 directory (pyenv or conda under `/root`). As root the server then keeps only the capabilities it
needs to give each child its own uid and to signal it. Each child confines itself further (confine.py); `layers()`
reports both, from what the server measured in a confined child (`LocalSandbox.layers()`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import signal
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any

from . import confine, seccomp

MODES = ("auto", "namespaces", "none")
_LEGACY_MODES = {"bwrap": "namespaces", "unshare": "namespaces"}  # the wrappers this module replaced
REBIND_DIR = "/run/retool-host"  # inside the view: second views of Python paths under /tmp, for children
PRIVATE_PROC = "/run/retool-proc"  # inside the view: the /proc children see (hidepid=invisible)
_SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32", "/lib", "/lib64", "/lib32", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/usr/share/zoneinfo")
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")
_ETC = {
    "passwd": "root:x:0:0:root:/:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    "hostname": "sandbox\n",
}
# As root: switch each child to its own uid (SETUID, SETGID), drop its bounding set where it has no user
# namespace (SETPCAP), and signal children of other uids (KILL). Nothing else.
_SERVER_CAPS = {"CAP_SETUID": 7, "CAP_SETGID": 6, "CAP_SETPCAP": 8, "CAP_KILL": 5}

_CLONE_NEWNS, _CLONE_NEWCGROUP, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 1 << 18
_MNT_DETACH, _AT_FDCWD, _AT_RECURSIVE = 2, -100, 0x8000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_SYS_MOUNT_SETATTR = 442  # the same number on every architecture
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 24, 38
_IN_SERVER = False


@dataclass(frozen=True)
class Layer:
    name: str
    active: bool
    detail: str


def mode(name: str) -> str:
    """`auto`, `namespaces` or `none` (`bwrap` and `unshare`, the wrappers this replaced, mean `namespaces`)."""
    name = _LEGACY_MODES.get(name, name)
    if name not in MODES:
        raise RuntimeError(f"isolation={name!r} is not available: use auto, namespaces or none")
    return name


# -- what the view holds ------------------------------------------------------------------------------------------


def _outermost(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not any(p.startswith(q + "/") for q in paths))


def _package() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.cache
def _interpreter_sys_path() -> tuple[str, ...]:
    """`sys.path` of this interpreter started as the server is (`-s`, an empty environment, no script): the
    trainer's working directory, script directory and PYTHONPATH are not in it."""
    if _IN_SERVER:
        return tuple(sys.path)
    import subprocess  # here: the server imports this module, and subprocess imports threading (see start.warm_up)

    code = "import json, sys; print(json.dumps(sys.path))"
    out = subprocess.run([sys.executable, "-s", "-c", code], capture_output=True, text=True, check=True, cwd="/",
                         env={"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1"}, timeout=60).stdout
    return tuple(json.loads(out))


def python_paths() -> list[str]:
    """What the interpreter needs to see: its install, the venv, its own `sys.path` and this package.

    The package itself (`retool_env/`), never the checkout around it (nor a directory above it): the checkout
    holds the datasets, `.env` files and scripts a policy must not find. A prefix of `/usr` or `/usr/local` is not
    bound whole: its Python directories are on `sys.path`, its libraries in the system's."""
    package = _package()
    checkout = os.path.dirname(package)
    above: set[str] = set()
    if os.path.basename(checkout) not in ("site-packages", "dist-packages"):  # an installed package: no checkout
        above = {checkout}
        while (parent := os.path.dirname(min(above, key=len))) not in above:
            above.add(parent)
    prefixes = {p for p in (sys.prefix, sys.base_prefix) if p not in ("/", "/usr", "/usr/local")}
    candidates = {*prefixes, os.path.dirname(sys.executable), sys.executable, package}
    candidates |= set(filter(None, _interpreter_sys_path()))
    candidates.add(os.path.realpath(sys.executable))
    libdir, library = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and library:
        candidates.add(os.path.join(libdir, library))
    found = {os.path.realpath(p) for p in candidates} | {os.path.abspath(p) for p in candidates}
    return _outermost({p for p in found if os.path.exists(p) and p not in above and p != "/"})


_DATASET_SUFFIXES = (".jsonl", ".parquet", ".csv")


def package_datasets() -> list[str]:
    """The problem files shipped inside this package (`data/math_sample.jsonl`, gold answers included): the view
    binds the package for its code, and covers each of these with an empty file."""
    package = _package()
    found = {os.path.join(top, name) for root in {package, os.path.realpath(package)}
             for top, _, names in os.walk(root) for name in names if name.endswith(_DATASET_SUFFIXES)}
    return sorted(found)


def view_paths(extra_paths: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Every host path the view binds read-only: Python, the system libraries, and `extra_paths`."""
    system = [p for p in (*_SYSTEM_LIBRARIES, *_SYSTEM_FILES) if os.path.lexists(p)]
    missing = [p for p in extra_paths if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(f"extra_paths: {missing} do not exist")
    extra = {os.path.abspath(p) for p in extra_paths} | {os.path.realpath(p) for p in extra_paths}
    return [*python_paths(), *system, *sorted(extra)]


def hidden_python_paths(under: tuple[str, ...] | list[str]) -> list[str]:
    """The Python paths that a tmpfs over one of `under` would hide."""
    return [p for p in python_paths() if any(p == d or p.startswith(d + "/") for d in under)]


def child_masks(wrapper: str) -> list[str]:
    """Where each child mounts a private tmpfs. Without the view, /tmp is kept if Python lives under it."""
    if wrapper == "namespaces" or not hidden_python_paths(["/tmp"]):
        return ["/tmp"]
    return []


# -- building it --------------------------------------------------------------------------------------------------


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc().mount(_bytes(source), target.encode(), _bytes(fstype), flags, _bytes(data)), f"mount {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _lock_down(path: str, flags: int, *, recursive: bool = True) -> None:
    """Set `flags` (read-only, nosuid, nodev) on `path` and every mount below it (the new mount API's
    `mount_setattr`, kernel 5.12+); older kernels remount the top mount only."""
    attr = _MountAttr(attr_set=flags)
    libc = _libc()
    result = libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE if recursive else 0,
                          ctypes.byref(attr), ctypes.sizeof(attr))
    if result != 0 and ctypes.get_errno() == 38:  # ENOSYS
        legacy = (_MS_RDONLY * bool(flags & _MOUNT_ATTR_RDONLY) | _MS_NOSUID
                  | _MS_NODEV * bool(flags & _MOUNT_ATTR_NODEV))
        result = libc.mount(None, path.encode(), None, _MS_REMOUNT | _MS_BIND | legacy, None)
    _check(result, f"make {path} read-only")


def _make_parents(path: str) -> None:
    """Create the directories above `path` in the view, each 0755 whatever the host's are."""
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        _make_parents(parent)
        os.mkdir(parent)
        os.chmod(parent, 0o755)


def _bind(source: str, target: str, *, writable: bool = False, devices: bool = False) -> None:
    """Bind `source` (a host path under the old root) at `target` in the view."""
    _make_parents(target)
    if os.path.islink(source):
        if not os.path.lexists(target):
            os.symlink(os.readlink(source), target)
        return
    if not os.path.lexists(target):
        if os.path.isdir(source):
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(source, target, None, _MS_BIND | _MS_REC)
    flags = _MOUNT_ATTR_NOSUID | (0 if devices else _MOUNT_ATTR_NODEV) | (0 if writable else _MOUNT_ATTR_RDONLY)
    _lock_down(target, flags)


def _tmpfs(target: str, size: str, mode: int, flags: int = _MS_NOSUID | _MS_NODEV) -> None:
    _make_parents(target)
    os.makedirs(target, exist_ok=True)
    _mount("tmpfs", target, "tmpfs", flags, f"size={size},mode={mode:o}")


def _pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(38, f"pivot_root: unknown system call number on {os.uname().machine}")
    _check(_libc().syscall(number, new_root.encode(), put_old.encode()), "pivot_root")


def _private_proc() -> None:
    """Mount the /proc children see: `hidepid=invisible` hides every process the reader may not ptrace, and no
    child may ptrace another (none is dumpable). Kernels before 5.8 share one set of proc options per pid
    namespace, which would hide the children from the server too: there it is left out (the layer then reports
    it missing)."""
    os.makedirs(PRIVATE_PROC, mode=0o755, exist_ok=True)
    _mount("proc", PRIVATE_PROC, "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=invisible")
    if "hidepid" in _proc_options("/proc"):  # one superblock: put the server's options back
        _check(_libc().umount2(PRIVATE_PROC.encode(), _MNT_DETACH), f"umount {PRIVATE_PROC}")
        _mount(None, "/proc", None, _MS_REMOUNT | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=0")
        return
    for name in _PROC_READ_ONLY:
        if os.path.exists(f"{PRIVATE_PROC}/{name}"):
            _bind(f"/proc/{name}", f"{PRIVATE_PROC}/{name}")


def _proc_options(target: str) -> str:
    """The superblock options of the proc mounted at `target` (mountinfo's last field)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == target and " - proc " in line:
                return fields[-1]
    return ""


def private_proc_mounted() -> bool:
    """Whether the view holds the hidepid /proc for children."""
    return "hidepid" in _proc_options(PRIVATE_PROC)


def build_view(read_only: list[str], writable: list[str], *, tmp_mb: int, shm_mb: int) -> list[tuple[str, str]]:
    """Replace this mount namespace's root with the allowlist view (the caller has unshared it). Returns what each
    child binds back over its own /tmp: (a second view of a path under /tmp, the path)."""
    old = "/.host"
    covered = package_datasets()
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host's namespace
    # /tmp as the new root's mount point: pivot_root moves it away, so the host's /tmp stays reachable under old.
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=16m,mode=755")
    os.mkdir("/tmp" + old, 0o700)
    _pivot_root("/tmp", "/tmp" + old)
    os.chdir("/")
    _tmpfs("/tmp", f"{tmp_mb}m", 0o1777)
    _tmpfs("/run", "1m", 0o755)
    for path in read_only:
        if os.path.lexists(old + path):
            _bind(old + path, path)
    for path in covered:
        if os.path.isfile(path):
            _bind(old + os.devnull, path, devices=True)  # reads as empty
    rebinds = [(f"{REBIND_DIR}/{i}", path) for i, path in enumerate(
        p for p in read_only if (p == "/tmp" or p.startswith("/tmp/")) and os.path.lexists(old + p))]
    for copy, path in rebinds:  # each child's own /tmp covers the first, so the copy covers the problem files too
        _bind(old + path, copy)
        for data in covered:
            if data.startswith(path + "/") and os.path.isfile(old + data):
                _bind(old + os.devnull, copy + data[len(path):], devices=True)
    for path in writable:
        _bind(old + path, path, writable=True)
    _tmpfs("/dev", "1m", 0o755, _MS_NOSUID)
    for name in _DEVICES:
        if os.path.exists(f"{old}/dev/{name}"):
            _bind(f"{old}/dev/{name}", f"/dev/{name}", writable=True, devices=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{name}")
    _tmpfs("/dev/shm", f"{shm_mb}m", 0o1777)
    os.makedirs("/proc", mode=0o755, exist_ok=True)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for name in _PROC_READ_ONLY:
        if os.path.exists(f"/proc/{name}"):
            _bind(f"/proc/{name}", f"/proc/{name}")
    _private_proc()
    os.makedirs("/etc", mode=0o755, exist_ok=True)
    for name, text in _ETC.items():
        if not os.path.lexists(f"/etc/{name}"):
            with open(f"/etc/{name}", "w") as f:
                f.write(text)
    _check(_libc().umount2(old.encode(), _MNT_DETACH), "umount the host's root")
    os.rmdir(old)
    for path in ("/", "/dev", "/run"):  # the tmpfs mounts the view wrote, each alone (not what is mounted on them)
        _lock_down(path, _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | (0 if path == "/dev" else _MOUNT_ATTR_NODEV),
                   recursive=False)
    os.chdir("/")
    return rebinds


def _unshare() -> None:
    libc = _libc()
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    flags = (_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS
             | (0 if root else _CLONE_NEWUSER))
    if libc.unshare(flags | _CLONE_NEWCGROUP) != 0:
        _check(libc.unshare(flags), "unshare")  # a kernel without cgroup namespaces
    if not root:
        for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def _wait_and_exit(pid: int, devnull: int) -> None:
    """The outer process: holds nothing, waits for the server (pid 1 inside) and exits as it did. It shares the
    mount namespace, so the view replaces its root too (pivot_root): `devnull` was opened before."""
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.closerange(3, 1 << 16)
    if os.geteuid() == 0:  # it only waits: no capability at all
        confine._drop_bounding_and_ambient()
        confine._clear_capabilities()
    _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _drop_server_capabilities() -> None:
    """Root in the view keeps only `_SERVER_CAPS` (bounding, effective, permitted; nothing inheritable)."""
    libc = _libc()
    keep = set(_SERVER_CAPS.values())
    for cap in range(confine._last_capability() + 1):
        if cap not in keep:
            _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"PR_CAPBSET_DROP {cap}")
    mask = sum(1 << cap for cap in keep)
    data = (confine._CapData * 2)()
    data[0].effective = data[0].permitted = mask
    header = confine._CapHeader(confine._LINUX_CAPABILITY_VERSION_3, 0)
    _check(libc.capset(ctypes.byref(header), data), "capset")


def enter(config: dict[str, Any]) -> dict[str, Any]:
    """Run by the server's bootstrap before anything else: namespaces and the view (config["view"]); returns the
    config for the server with what each child needs, and prints `view <report>` for the client."""
    global _IN_SERVER
    _IN_SERVER = True  # started as `python -s` with an empty environment: its own sys.path is the clean one
    spec = config.pop("view")
    report: dict[str, Any] = {"wrapper": "none", "missing": {}}
    rebinds: list[tuple[str, str]] = []
    wanted = spec["mode"]
    if wanted == "none":
        report["missing"]["namespaces"] = "isolation='none'"
    else:
        try:
            read_only = view_paths(spec["extra_paths"])
            _unshare()
        except OSError as exc:
            if wanted == "namespaces":
                raise
            report["missing"]["namespaces"] = f"cannot create namespaces here ({exc})"
        else:
            devnull = os.open(os.devnull, os.O_RDWR)
            confine._last_capability()  # read /proc before the view replaces this process's root too
            pid = os.fork()
            if pid != 0:
                _wait_and_exit(pid, devnull)
            os.close(devnull)
            _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            try:
                rebinds = build_view(read_only, list(spec["cgroup_dirs"]), tmp_mb=spec["tmp_mb"],
                                     shm_mb=spec["shm_mb"])
                report["wrapper"] = "namespaces"
                report["paths"] = read_only
            except OSError as exc:
                if wanted == "namespaces":
                    raise
                report["missing"]["read-only filesystem"] = f"cannot build the view ({exc})"
                report["wrapper"] = "namespaces-no-view"
            _libc().sethostname(b"sandbox", 7)
            if os.geteuid() == 0:
                _drop_server_capabilities()  # or the server does not start
            _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    config["masks"] = child_masks(report["wrapper"])
    config["rebinds"] = rebinds
    if report["wrapper"] == "namespaces":
        config["private_proc"] = PRIVATE_PROC if private_proc_mounted() else ""
        config["hidden"] = list(spec["cgroup_dirs"])
    print("view " + json.dumps(report), flush=True)
    return config


# -- the report ---------------------------------------------------------------------------------------------------


def _caps_empty(child: dict) -> bool:
    return all(child.get(key) == "0" * 16 for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))


def layers(wrapper: str, measured: dict, *, root: bool) -> list[Layer]:
    """Every layer, active or not, from the view the server built and what it measured in a child
    (`measured`: {"missing": {layer: why}, "child": /proc/self/status fields of a confined child})."""
    missing, child = measured.get("missing", {}), measured.get("child", {})
    spaces = wrapper in ("namespaces", "namespaces-no-view")
    view = wrapper == "namespaces"
    uid = child.get("Uid", "?")
    rows = [
        Layer("clean environment", True, "the server and every child start with an empty environment"),
        Layer("namespaces", spaces, "private mount, pid, network, IPC, UTS and cgroup namespaces" if spaces else
              missing.get("namespaces", "not created")),
        Layer("read-only filesystem", view, "an allowlist view, read-only: the Python install, this package, system "
              "libraries, a minimal /etc and /dev; no home, working directory, checkout, cache or dataset" if view
              else missing.get("read-only filesystem", "needs namespaces: " + missing.get("namespaces", "?"))),
        Layer("network isolation", spaces, "empty network namespace; sockets refused" if spaces else
              "needs namespaces"),
        Layer("user namespace", "user namespace" not in missing and bool(child),
              missing.get("user namespace", "each call in its own, its mounts locked; private /tmp and /dev/shm")),
        Layer("uid per call", "uid per call" not in missing and root and uid not in ("0", "?"),
              missing.get("uid per call", f"a probe child ran as uid {uid}; each live call or session gets its "
                          "own, from this server's block, which no other server on the machine uses") if root
              else "needs root: children keep the server's uid (each in its own user namespace)"),
        Layer("capabilities dropped", _caps_empty(child), "all five sets empty" if _caps_empty(child) else
              "a child still holds capabilities: " + ", ".join(f"{k}={child.get(k)}" for k in ("CapEff", "CapBnd"))),
        Layer("no_new_privs", child.get("NoNewPrivs") == "1", f"NoNewPrivs={child.get('NoNewPrivs', '?')}"),
        Layer("seccomp", "seccomp" not in missing and child.get("Seccomp") == "2",
              missing.get("seccomp", seccomp.supported() or "allowlist filter (default deny) in every child")),
        Layer("cgroup", "cgroup" not in missing and bool(measured.get("cgroup")),
              missing.get("cgroup", measured.get("cgroup_detail", "no cgroup delegated"))),
        Layer("private /proc", child.get("visible_processes") == 0,
              "a child sees only its own processes in /proc (hidepid), and no cgroup files of other calls"
              if child.get("visible_processes") == 0 else f"a child sees {child.get('visible_processes', '?')} other "
              "processes in /proc: needs the view, on Linux 5.8+ (per-mount proc options)"),
        Layer("not dumpable", child.get("dumpable") == 0, "no ptrace, no /proc/<pid>/mem between calls"),
        Layer("rlimits", True, "address space, CPU time, file size, open files, core dumps, processes"),
    ]
    return rows


SAFE = ("read-only filesystem", "uid per call")  # what `require="safe"` (the default) insists on


def required(rows: list[Layer], *, root: bool, level: str = "strict") -> list[Layer]:
    """The layers `require=level` insists on: `safe` a read-only view and (as root) a uid per call; `strict`
    every layer (a uid per call and cgroups only where root makes them possible); `none` nothing."""
    optional = set() if root else {"uid per call", "cgroup"}
    wanted = {"strict": {row.name for row in rows}, "safe": set(SAFE), "none": set()}[level]
    return [row for row in rows if row.name in wanted and row.name not in optional]


def fix_for(missing: list[Layer], *, root: bool) -> str:
    """One sentence naming how to get the missing layers."""
    names = {row.name for row in missing}
    if names & {"read-only filesystem", "namespaces"}:
        who = ("root with CAP_SYS_ADMIN (a container needs --cap-add SYS_ADMIN or a seccomp profile that allows "
               "unshare and mount)") if root else ("unprivileged user namespaces (sysctl kernel.unprivileged_userns_"
                                                    "clone=1 / user.max_user_namespaces > 0, or an AppArmor profile "
                                                    "that allows them)")
        return f"the view needs mount namespaces, which need {who}"
    if "uid per call" in names:
        return ("a child could not run as its own uid: make the Python install readable by every uid, or let the "
                "server build its view (isolation='auto')")
    return "see `retool-env doctor`"


def python_reachable_by_others() -> bool:
    """Whether a uid other than the owner could import this interpreter's standard library without a view."""
    for path in (os.path.dirname(os.__file__), _package()):
        current = "/"
        for part in path.strip("/").split("/"):
            current = os.path.join(current, part)
            with contextlib.suppress(OSError):
                if not os.stat(current).st_mode & 0o001:
                    return False
    return True
