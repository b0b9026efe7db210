"""Live attacks, one per class the sandbox must contain, run as model code by `retool-env doctor`.

Each snippet prints `ESCAPED ...` if its attack worked; anything else (an exception, a refusal) means contained.
The test suite checks the same classes from outside the sandbox (canaries, victims, the process table).
"""

from __future__ import annotations

import os

_PRELUDE = """\
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def syscall(nr, *args):
    r = libc.syscall(nr, *args)
    return r, ctypes.get_errno()
"""

ATTACKS: dict[str, str] = {
    "capabilities": "s = open('/proc/self/status').read()\n"
                    "caps = [l for l in s.splitlines() if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]\n"
                    "if any(int(l.split()[1], 16) for l in caps): print('ESCAPED', caps)",
    "new mount API": "r, e = syscall(428, -100, b'/', 1 | 0x8000)\nif r >= 0: print('ESCAPED open_tree', r)",
    "open_by_handle_at": "r, e = syscall(304, -100, ctypes.create_string_buffer(64), 0)\n"
                         "if e not in (errno.EPERM, errno.ENOSYS): print('ESCAPED', errno.errorcode.get(e))",
    "root-only files": "open('/etc/shadow').read(1); print('ESCAPED /etc/shadow')",
    "trainer's home": "left = set(os.listdir({home!r})) - set({in_home!r})\n"
                      "if left: print('ESCAPED', sorted(left)[:5])",
    "signal the server": "os.kill(os.getppid(), 0); print('ESCAPED kill')",
    "pidfd": "r, e = syscall(434, os.getppid(), 0)\nif r >= 0: print('ESCAPED pidfd_open')",
    "prlimit another process": "import resource\nresource.prlimit(os.getppid(), resource.RLIMIT_NOFILE)\n"
                               "print('ESCAPED prlimit')",
    "process memory": "open(f'/proc/{{os.getppid()}}/mem', 'rb'); print('ESCAPED /proc/<server>/mem')",
    "fork": "pid = os.fork()\nif pid == 0: os._exit(0)\nprint('ESCAPED fork')",
    "exec": "os.execv('/bin/true', ['true'])",
    "leave the session": "pid = os.fork()\nif pid == 0:\n    try:\n        os.setsid(); os._exit(0)\n"
                         "    except OSError:\n        os._exit(1)\n"
                         "if os.WEXITSTATUS(os.waitpid(pid, 0)[1]) == 0: print('ESCAPED setsid')",
    "socket": "import socket\nsocket.socket(socket.AF_UNIX); print('ESCAPED socket')",
    "new namespaces": "r, e = syscall(272, 0x10000000)\nif r == 0: print('ESCAPED unshare')",
    "write the host": "open('/etc/retool-doctor-probe', 'w'); print('ESCAPED /etc')",
    "SCHED_FIFO": "os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)); print('ESCAPED SCHED_FIFO')",
    "nice -20": "os.setpriority(os.PRIO_PROCESS, 0, -20); print('ESCAPED nice')",
    "kernel log": "r = libc.klogctl(3, ctypes.create_string_buffer(256), 256)\nif r >= 0: print('ESCAPED syslog')",
    "device node": "import stat\nos.mknod('/tmp/null', stat.S_IFCHR | 0o600, os.makedev(1, 3)); print('ESCAPED mknod')",
    "other calls' files": "left = (set(os.listdir('/tmp')) - set({in_tmp!r})) | set(os.listdir('/dev/shm'))\n"
                          "if left: print('ESCAPED', sorted(left)[:5])\n"
                          "open('/tmp/mark', 'w').write('x'); open('/dev/shm/mark', 'w').write('x')",
    "other calls' processes": "import glob\n"
                              "seen = [e for e in os.listdir('/proc') "
                              "if e.isdigit() and int(e) not in (1, os.getpid())]\n"
                              "groups = glob.glob('/sys/fs/cgroup/**/cgroup.procs', recursive=True)\n"
                              "if seen or groups: print('ESCAPED', len(seen), 'processes,', len(groups), 'cgroups')",
    "other calls' output": "maps = [l for l in open('/proc/self/maps') if 'retool-output' in l]\n"
                           "if len(maps) > 1: print('ESCAPED', len(maps), 'output buffers mapped')",
}  # fmt: skip


def visible_entries(directory: str) -> list[str]:
    """What a child may see in `directory` (a home, /tmp): the first path parts of the Python install and this
    package, which are bound back into the tmpfs covering it. Anything else there would be an escape."""
    from .isolation import python_paths

    return sorted({p[len(directory) + 1 :].split("/")[0] for p in python_paths() if p.startswith(directory + "/")})


def code(name: str, *, home: str | None = None) -> str:
    """The attack `name` as model code, for a trainer whose home is `home` (default: this process's)."""
    home = home or os.path.expanduser("~")
    return _PRELUDE + ATTACKS[name].format(home=home, in_home=visible_entries(home), in_tmp=visible_entries("/tmp"))


def dataset_code(directory: str) -> str:
    """Model code that looks for a dataset file planted in `directory` (a host path, world-readable): by its path,
    then by walking the whole view. Prints what it read (the test looks for the planted secret) and a summary."""
    return f"""\
import os
target, found, seen = {directory!r}, [], 0
try:
    print(open(os.path.join(target, 'train.jsonl')).read())
except OSError as exc:
    print('by path:', type(exc).__name__)
for top, dirs, files in os.walk('/'):
    if top == '/':
        dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev')]
    seen += len(files)
    for name in files:
        if name.endswith('.jsonl') or 'retool-doctor-dataset' in top:
            found.append(os.path.join(top, name))
            try:
                print(open(found[-1]).read(4096))
            except OSError:
                pass
print(f'walked {{seen}} files in the view; dataset files found: {{found[:3]}}')
"""


def escaped(output: str) -> bool:
    """Whether a probe's output reports a working attack (a traceback quoting the probe's source does not)."""
    return any(line.startswith("ESCAPED") for line in output.splitlines())
