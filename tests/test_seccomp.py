"""The allowlist seccomp filter: its table, what the standard library, numpy and sympy need, and what it refuses."""

from __future__ import annotations

import os
import re

import pytest

from retool_env.sandbox import LocalSandbox
from retool_env.sandbox.forkserver import seccomp

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(seccomp.supported() is not None, reason="no seccomp filter on this machine"),
]
HEADER = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"


@pytest.fixture(scope="module")
def sandbox():
    with LocalSandbox(timeout=10, prefork=2, max_sessions=2) as sb:
        yield sb


@pytest.mark.skipif(not os.path.exists(HEADER), reason="no kernel headers")
def test_syscall_numbers_match_the_kernel_headers():
    with open(HEADER) as f:
        real = {name: int(nr) for name, nr in re.findall(r"#define __NR_(\w+) (\d+)", f.read())}
    wrong = {name: (nr, real[name]) for name, nr in seccomp.SYSCALLS.items() if name in real and real[name] != nr}
    assert wrong == {}
    assert set(seccomp.SYSCALLS) >= seccomp.ALLOWED | seccomp.REFUSED


SNIPPETS = {
    "sympy": "import sympy as sp\nx = sp.Symbol('x')\n"
             "print(sp.solve(x**2 - 4, x), sp.integrate(sp.sin(x), (x, 0, sp.pi)))",
    "numpy": "import numpy as np\na = np.random.default_rng(0).random((50, 50))\n"
             "print(round(float(np.linalg.det(a @ a.T)) > 0), np.fft.fft(np.ones(4)).real.tolist())",
    "threads": "from concurrent.futures import ThreadPoolExecutor\n"
               "with ThreadPoolExecutor(4) as pool: print(sum(pool.map(lambda n: n * n, range(10))))",
    "asyncio": "import asyncio\nasync def f(): await asyncio.sleep(0.01); return 7\nprint(asyncio.run(f()))",
    "files": "import json, os, shutil, tempfile\nwith tempfile.TemporaryDirectory() as d:\n"
             "    p = os.path.join(d, 'a.json'); json.dump([1], open(p, 'w')); shutil.copy(p, p + '.bak')\n"
             "    print(sorted(os.listdir(d)), os.statvfs(d).f_bsize > 0)",
    "sqlite": "import sqlite3\ndb = sqlite3.connect(':memory:')\nprint(db.execute('select 6 * 7').fetchone()[0])",
    "time and signals": "import signal, time, resource\nsignal.alarm(5); signal.alarm(0)\ntime.sleep(0.01)\n"
                        "print(time.process_time() >= 0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0)",
    "stdlib": "import decimal, fractions, itertools, math, os, pickle, platform, random, secrets, statistics\n"
              "print(math.comb(10, 3), fractions.Fraction(1, 3) * 3, len(secrets.token_hex(4)), platform.system(),\n"
              "      pickle.loads(pickle.dumps({1: 2})), len(os.sched_getaffinity(0)) >= 1)",
    "mmap and ctypes": "import ctypes, mmap\nm = mmap.mmap(-1, 4096); m[:3] = b'abc'\n"
                       "print(m[:3], ctypes.c_int(5).value, ctypes.CDLL(None).abs(-3))",
}  # fmt: skip


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_what_math_code_needs_keeps_working(sandbox, name):
    result = sandbox.run_sync(SNIPPETS[name])
    assert result.status == "ok", result.output


# Each is refused by the filter itself (or, for i386, kills the process), whatever else is in place.
REFUSED = {
    "x32 entry": "import ctypes\nprint(ctypes.CDLL(None, use_errno=True).syscall(0x40000000 | 39), ctypes.get_errno())",
    "clone into a user namespace": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n"
        "if r == 0: os._exit(0)\nprint(r, ctypes.get_errno())"
    ),
    "clone a process outside sessions": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.syscall(56, 17, 0, 0, 0, 0)\n"
        "if r == 0: os._exit(0)\nprint(r, ctypes.get_errno())"
    ),
    "socket": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "print(libc.socket(1, 1, 0), ctypes.get_errno())",
    "inet socketpair": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                       "print(libc.socketpair(2, 1, 0, (ctypes.c_int * 2)()), ctypes.get_errno())",
    "TIOCSTI": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "print(libc.ioctl(0, 0x5412, b'x'), ctypes.get_errno())",
    "prctl PR_SET_DUMPABLE": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                             "print(libc.prctl(4, 1, 0, 0, 0), ctypes.get_errno())",
    "personality READ_IMPLIES_EXEC": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                                     "print(libc.personality(0x0400000), ctypes.get_errno())",
    "kill another pid": "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                        "print(libc.kill(os.getpid() + 1, 0), ctypes.get_errno())",
    "setpriority -5": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                      "print(libc.setpriority(0, 0, -5), ctypes.get_errno())",
    **{f"fcntl {name}": "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nr, w = os.pipe()\n"
                        f"print(libc.fcntl(r, {cmd}, {arg}), ctypes.get_errno())"
       for name, cmd, arg in [("F_SETOWN", 8, "os.getpid()"), ("F_SETOWN_EX", 15, "b'\\1\\0\\0\\0\\1\\0\\0\\0'"),
                              ("F_SETSIG", 10, 9), ("F_SETFL O_ASYNC", 4, "os.O_ASYNC"), ("F_SETLEASE", 1024, 0),
                              ("F_NOTIFY", 1026, 1), ("F_SETPIPE_SZ", 1031, 1 << 20), ("F_ADD_SEALS", 1033, 1),
                              ("F_SET_RW_HINT", 1036, "b'\\2' + bytes(7)")]},
    "madvise MADV_HWPOISON": "import ctypes, mmap\nm = mmap.mmap(-1, 4096)\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                             "a = ctypes.addressof(ctypes.c_char.from_buffer(m))\n"
                             "print(libc.madvise(ctypes.c_void_p(a), 4096, 100), ctypes.get_errno())",
}  # fmt: skip


# Succeed without running: the hints and locks that would reach a host file's shared state; what needs them still runs.
INERT = {
    "fadvise DONTNEED": "import os\nfd = os.open(os.__file__, os.O_RDONLY)\n"
                        "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)",
    "flock": "import fcntl, os\nfcntl.flock(open(os.__file__, 'rb'), fcntl.LOCK_EX | fcntl.LOCK_NB)",
    "fsync and msync": "import mmap, os\nfd = os.open('/tmp/f', os.O_RDWR | os.O_CREAT)\nos.write(fd, bytes(4096))\n"
                       "os.fsync(fd)\nos.fdatasync(fd)\nm = mmap.mmap(fd, 4096)\nm.flush()",
    "madvise PAGEOUT": "import mmap, os\nm = mmap.mmap(os.open(os.__file__, os.O_RDONLY), 0, prot=mmap.PROT_READ)\n"
                       "m.madvise(21)\nm.madvise(20)  # MADV_PAGEOUT, MADV_COLD",
    "sqlite on a file": "import sqlite3\ndb = sqlite3.connect('/tmp/x.db')\ndb.execute('create table t (x)')\n"
                        "db.execute('insert into t values (6)')\ndb.commit()\n"
                        "assert db.execute('select x * 7 from t').fetchone() == (42,)",
}  # fmt: skip


@pytest.mark.parametrize("name", list(INERT))
def test_calls_on_shared_host_state_are_inert(sandbox, name):
    result = sandbox.run_sync(INERT[name] + "\nprint('ran')")
    assert (result.status, result.stdout) == ("ok", "ran\n"), result


@pytest.mark.parametrize("name", list(REFUSED))
def test_dual_use_calls_are_refused_by_argument(sandbox, name):
    result = sandbox.run_sync(REFUSED[name])
    value, err = result.stdout.split()
    assert value == "-1" and int(err) in (1, 25, 38), result  # EPERM, ENOTTY or ENOSYS


def test_the_i386_entry_point_kills_the_process(sandbox):
    code = (
        "import ctypes, mmap\n"
        "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "page.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')  # mov eax, 20 (getpid); int 0x80; ret\n"
        "address = ctypes.addressof(ctypes.c_char.from_buffer(page))\n"
        "print(ctypes.CFUNCTYPE(ctypes.c_int)(address)())"
    )
    result = sandbox.run_sync(code)
    assert result.status == "killed" and "SIGSYS" in result.output, result


def test_sessions_may_fork_but_not_leave(sandbox):
    code = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nos.setsid()"
    result = sandbox.run_sync(code, session="forker")
    assert result.status == "error" and "PermissionError" in result.output, result
