"""The two zygotes: which one a call's child comes from, that both give the same results under the same isolation,
and that losing either one is recovered. Routing is checked from outside, by the server's count of children each
zygote forked (a call takes a child from one pool, which that zygote then refills)."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from retool_env.sandbox import LocalSandbox
from retool_env.sandbox.forkserver import probes
from retool_env.sandbox.forkserver.config import PRELOAD, SCAN_LIMIT, lean_preload, needs_full

pytestmark = pytest.mark.timeout(240)
ROOT = os.geteuid() == 0
HEAVY = frozenset({"sympy", "numpy", "mpmath"})
TO_FULL = "\n# numpy"  # a comment that names a heavy module: the same code, in a child of the full zygote


@pytest.fixture(scope="module")
def sandbox():
    with LocalSandbox(timeout=6, max_concurrency=4, prefork=2, memory_mb=256, max_sessions=4) as sb:
        sb.start()
        yield sb


def run_all(sb: LocalSandbox, *codes: str, **kw):
    async def main():
        return await asyncio.gather(*(sb.run(code, **kw) for code in codes))

    return asyncio.run(main())


def forked(sb: LocalSandbox) -> dict[str, int]:
    """Children forked so far by each zygote, once both pools are full again (refills follow the responses)."""
    deadline = time.monotonic() + 20
    while True:
        info = asyncio.run(sb.info())
        if info["running"] == 0 and all(z["pool"] == 2 for z in info["zygotes"].values()):
            return {name: z["forked"] for name, z in info["zygotes"].items()}
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def routed(sb: LocalSandbox, *codes: str, **kw):
    """Run `codes` at once; (their results, how many children each zygote forked meanwhile)."""
    before = forked(sb)
    results = run_all(sb, *codes, **kw)
    after = forked(sb)
    return results, {name: after[name] - before[name] for name in after}


# -- the choice ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "full"),
    [
        ("print(1 + 1)", False),
        ("import math, fractions\nprint(fractions.Fraction(1, 3) + math.pi)", False),
        ("import numpyish\nx_sympy = 1", False),  # whole words only
        ("import sympy", True),
        ("from sympy.ntheory import factorint", True),
        ("import numpy as np", True),
        ("__import__('numpy')", True),  # its name is in the code
        ("__import__('num' + 'py')", True),  # computed: the dynamic import itself
        ("import importlib\nimportlib.import_module('os')", True),
        ("exec('x = 1')", True),
        ("eval('1')", True),
        ("x = 1  # sympy would do this", True),  # only speed depends on it: a mention is enough
    ],
)
def test_the_choice(code, full):
    assert needs_full(code, HEAVY) is full


def test_the_choice_is_bounded_and_linear():
    assert needs_full("x = 1\n" * (SCAN_LIMIT // 6 + 1), HEAVY)  # past the limit: the full zygote, unscanned
    hostile = ("a" * 4000 + " ") * (SCAN_LIMIT // 4001) + "(" * 1000
    start = time.perf_counter()
    for _ in range(20):
        assert not needs_full(hostile[:SCAN_LIMIT], HEAVY)
    assert (time.perf_counter() - start) / 20 < 0.02


def test_lean_preload_is_the_standard_librarys_part():
    lean = lean_preload(PRELOAD)
    assert "sympy" not in lean and "numpy" not in lean
    assert set(lean) == set(PRELOAD) - {"sympy", "numpy"}


def test_each_call_gets_the_zygote_its_code_needs(sandbox):
    loaded = "import sys\nprint(('sym' + 'p' + 'y') in sys.modules)"  # what its zygote preloaded
    (lean,), counts = routed(sandbox, loaded)
    assert lean.stdout == "False\n" and counts == {"lean": 1, "full": 0}, (lean, counts)
    (full,), counts = routed(sandbox, "import sympy\n" + loaded)
    assert full.stdout == "True\n" and counts == {"lean": 0, "full": 1}, (full, counts)
    (dynamic,), counts = routed(sandbox, "m = __import__('num' + 'py')\nprint(m.arange(4).sum())")
    assert dynamic.stdout == "6\n" and counts == {"lean": 0, "full": 1}, (dynamic, counts)
    # Any package outside the standard library (most build on numpy): gymnasium is installed, and not preloaded.
    (package,), counts = routed(sandbox, "import gymnasium\nprint(gymnasium.spaces.Discrete(3).n)")
    assert package.stdout == "3\n" and counts == {"lean": 0, "full": 1}, (package, counts)


def test_the_lean_zygote_holds_no_threading(sandbox):
    """threading's after-fork hook runs in every child of a zygote that imported it, copying some 80 of its pages:
    the lean zygote never imports it (the server imports it with asyncio, after the lean fork), so a call that
    names it gets a full child, where it is preloaded."""
    loaded = "import sys\nprint([name in sys.modules for name in ('thr' + 'eading', 'subpro' + 'cess')])"
    (lean,), counts = routed(sandbox, loaded)
    assert lean.stdout == "[False, False]\n" and counts == {"lean": 1, "full": 0}, (lean, counts)
    (full,), counts = routed(sandbox, "import threading\n" + loaded + "\nprint(threading.active_count())")
    assert full.stdout == "[True, True]\n1\n" and counts == {"lean": 0, "full": 1}, (full, counts)


def test_a_lean_child_still_imports_what_it_needs(sandbox):
    """An import the scan cannot see (no module name, no dynamic import by name): the lean child imports sympy
    from disk, slower, with the same result."""
    code = ("import sys\nb = sys.modules['bui' + 'ltins']\nsp = getattr(b, '__imp' + 'ort__')('sy' + 'mpy')\n"
            "x = sp.Symbol('x')\nprint(sp.factor(x**6 - 1))")
    (result,), counts = routed(sandbox, code, timeout=60)
    assert counts == {"lean": 1, "full": 0}, (result, counts)
    assert result.status == "ok" and result.stdout == "(x - 1)*(x + 1)*(x**2 - x + 1)*(x**2 + x + 1)\n", result


def test_sessions_use_the_full_zygote(sandbox):
    before = forked(sandbox)
    assert sandbox.run_sync("import sys\nprint(('sym' + 'p' + 'y') in sys.modules)", session="s").stdout == "True\n"
    asyncio.run(sandbox.close_session("s"))
    after = forked(sandbox)
    assert after["lean"] == before["lean"] and after["full"] == before["full"] + 1


# -- the same results ---------------------------------------------------------------------------------------------

SAME = [
    "print(1 + 1)",
    "x = 6 * 7\nx",  # the echo of a trailing expression
    "import fractions, decimal\nprint(fractions.Fraction(2, 6), decimal.Decimal('1.10') + 1)",
    "print('before')\ndef f(n):\n    return 1 / n if n == 0 else f(n - 1)\nf(5)",  # a trimmed traceback
    "x = 1\ndef f(:\n    pass",  # a syntax error
    "import sys\nprint(sys.stdin.read().upper())",
    "import sys\nprint('out'); print('err', file=sys.stderr); sys.exit(3)",
    "print('y' * 100000)",  # cut to the output cap
    "print('ünï', '\\u2603')\nprint(len(str(2**20000)))",
    "import os\nos._exit(70)",
    "import zipfile, io\nb = io.BytesIO()\nzipfile.ZipFile(b, 'w').close()\nprint(len(b.getvalue()))",  # from disk
    "import time\ntime.sleep(30)",  # a timeout
    "x = bytearray(400 << 20)",  # past memory_mb
]


def _comparable(result):
    out = result.to_dict()
    out.pop("duration")
    return out


def test_both_zygotes_give_the_same_results(sandbox):
    lean, counts_lean = routed(sandbox, *SAME, stdin="shout", timeout=2)
    full, counts_full = routed(sandbox, *(code + TO_FULL for code in SAME), stdin="shout", timeout=2)
    assert counts_lean == {"lean": len(SAME), "full": 0} and counts_full == {"lean": 0, "full": len(SAME)}
    for code, a, b in zip(SAME, lean, full, strict=True):
        assert _comparable(a) == _comparable(b), (code, a, b)
    assert [r.status for r in lean][-2:] == ["timeout", "memory"]


# -- the same isolation, for calls that land on the lean zygote ---------------------------------------------------


def test_lean_calls_are_as_contained(sandbox):
    """Attacks from the isolation suite, each routed to the lean zygote; their outcomes seen from outside. (Not in
    pytest's tmp_path: a path naming pytest, a package, would route the code to the full zygote.)"""
    token = secrets.token_hex(16)
    tmp_path = Path(tempfile.mkdtemp(prefix="lean-canary-"))
    canary = tmp_path / "secret"
    canary.write_text(token)
    canary.chmod(0o600)
    home = Path(os.path.expanduser("~")) / f".retool-canary-{token[:8]}"
    home.mkdir(mode=0o700)
    (home / "token").write_text(token)
    targets = [Path("/etc") / f"escaped-{token[:8]}", tmp_path / "escaped", home / "escaped"]
    try:
        reads = "\n".join(f"try: print(open({str(p)!r}).read())\nexcept Exception as e: print(type(e).__name__)"
                          for p in (canary, home / "token"))
        writes = "\n".join(f"try: open({str(t)!r}, 'w').write('x')\nexcept Exception as e: print(type(e).__name__)"
                           for t in targets)
        who = "import os, time\ntime.sleep(0.3)\nprint(os.getuid(), os.readlink('/proc/self/ns/user'))"
        attacks = [probes.code(name) for name in probes.ATTACKS]
        codes = [reads, writes, who, who, *attacks]
        assert not any(needs_full(code, HEAVY) for code in codes)
        results, counts = routed(sandbox, *codes)
        assert counts == {"lean": len(codes), "full": 0}, counts
        assert all(token not in r.output for r in results)
        assert not [t for t in targets if t.exists()]
        uids = [r.stdout.split()[0] for r in results[2:4]]
        namespaces = {r.stdout.split()[1] for r in results[2:4]}
        assert len(namespaces) == 2 and os.readlink("/proc/self/ns/user") not in namespaces
        if ROOT:
            assert len(set(uids)) == 2 and "0" not in uids, uids
            assert all(int(u) in sandbox.uid_block for u in uids)
        for name, result in zip(probes.ATTACKS, results[4:], strict=True):
            assert not probes.escaped(result.output), (name, result.output)
        assert canary.read_text() == token and (home / "token").read_text() == token  # the positive control
    finally:
        for path in (canary, home / "token"):
            path.unlink(missing_ok=True)
        home.rmdir()
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_lean_and_full_children_never_share_a_uid(sandbox):
    if not ROOT:
        pytest.skip("unprivileged, every child keeps the user's uid (in a user namespace of its own)")
    who = "import os, time\ntime.sleep(0.5)\nprint(os.getuid())"
    results = run_all(sandbox, who, who, who + TO_FULL, who + TO_FULL)
    uids = [int(r.stdout) for r in results]
    assert len(set(uids)) == 4 and all(u in sandbox.uid_block for u in uids), uids


# -- losing a zygote ----------------------------------------------------------------------------------------------


def _host_pid(sb: LocalSandbox, inner: int) -> int:
    """The host pid of the server's process numbered `inner` in its own pid namespace (a zygote)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        nspids = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[1:]
        if len(nspids) > 1 and int(nspids[-1]) == inner and _below(int(entry), sb.server_pid):
            return int(entry)
    raise AssertionError(f"no process {inner} below the server")


def _below(pid: int, ancestor: int | None) -> bool:
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        if pid == ancestor:
            return True
    return False


@pytest.mark.parametrize("which", ["lean", "full"])
def test_a_killed_zygote_is_recovered(which):
    with LocalSandbox(timeout=5, prefork=1) as sb:
        assert sb.run_sync("print(1)").ok
        zygotes = asyncio.run(sb.info())["zygotes"]
        target = _host_pid(sb, zygotes[which]["pid"])
        suffix = TO_FULL if which == "full" else ""

        async def main():
            slow = asyncio.ensure_future(sb.run("import time\ntime.sleep(30)" + suffix))
            await asyncio.sleep(0.5)
            os.kill(target, signal.SIGKILL)
            start = time.perf_counter()
            result = await slow
            return result, time.perf_counter() - start

        result, waited = asyncio.run(main())
        assert result.status != "ok" and waited < 10, result
        for code in ("print('back')", "print('back')" + TO_FULL):  # both zygotes, in the restarted server
            assert sb.run_sync(code).stdout == "back\n"
        assert set(asyncio.run(sb.info())["zygotes"]) == {"lean", "full"}


def test_one_zygote_when_asked_or_nothing_is_heavy():
    for kwargs in ({"lean_zygote": False}, {"preload": ["math", "json"]}):
        with LocalSandbox(prefork=1, **kwargs) as sb:
            assert sb.run_sync("print(2)").stdout == "2\n"
            assert list(asyncio.run(sb.info())["zygotes"]) == ["full"]


def test_the_lean_zygote_is_used_only_with_the_full_ones_layers():
    """What the server compares before it uses the lean zygote: the missing layers and what a probe child had,
    not what differs per child (its uid, cgroup and namespaces)."""
    from retool_env.sandbox.forkserver.server import _confinement

    child = {"Uid": "2000000001", "CapEff": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1",
             "Seccomp": "2", "dumpable": 0, "ns_user": "user:[1]", "cgroup": "a"}
    full = {"missing": {}, "child": child}
    same = {"missing": {}, "child": {**child, "Uid": "2000008193", "ns_user": "user:[2]", "cgroup": "b"}}
    assert _confinement(same) == _confinement(full)
    for weaker in ({"missing": {"seccomp": "no"}, "child": child}, {"missing": {}, "child": {**child, "Seccomp": "0"}},
                   {"missing": {}, "child": {k: v for k, v in child.items() if k != "ns_user"}}):
        assert _confinement(weaker) != _confinement(full)


def test_a_cell_reaped_while_its_stat_is_read_counts_as_gone(monkeypatch):
    """The server checks a cell pid its head reports in /proc/<pid>/stat; a quick cell may be reaped between the
    open and the read (ProcessLookupError), which is a cell that has gone, not a forged report."""
    from retool_env.sandbox.forkserver import server

    class Reaped:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(server, "open", lambda *a, **k: Reaped(), raising=False)
    assert server.Server._is_cell(None, 51, None, gone_ok=True)  # type: ignore[arg-type]
    assert not server.Server._is_cell(None, 51, None)  # type: ignore[arg-type]  # without gone_ok: not a cell


_DRAIN_CHECK = """
import ctypes, json, sys
from retool_env.sandbox.forkserver import zygote
lib = ctypes.CDLL(None)
lib.mallinfo2.restype = zygote._MallInfo2
lib.malloc.restype, lib.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
lib.free.argtypes = [ctypes.c_void_p]
held = [lib.malloc(n) for n in range(24, 600, 8) for _ in range(40)]  # below the top chunk, never freed again
for p in held[::2]:  # free chunks strewn between used ones, as a warm-up leaves them
    lib.free(p)
before = lib.mallinfo2()
taken = zygote.drain_free_chunks()
after = lib.mallinfo2()
lib.sbrk.restype, lib.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
top_start = lib.sbrk(0) - after.keepcost
below_top = sum(lib.malloc(16) < top_start for _ in range(200))
print(json.dumps({"free_before": before.fordblks - before.keepcost, "free_after": after.fordblks - after.keepcost,
                  "taken": taken, "top_before": before.keepcost, "top_after": after.keepcost, "below_top": below_top}))
"""


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"), reason="glibc >= 2.33 only")
def test_the_zygote_drains_the_free_chunks_children_would_reuse():
    """Before it forks, a zygote takes every free chunk of its heap, so a child's allocations come from the top of
    the heap (fresh pages) and not from chunks strewn over pages it shares with the zygote; the top stays whole."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "PYTHONMALLOC": "malloc", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", _DRAIN_CHECK], capture_output=True, text=True, env=env, check=True)
    report = json.loads(out.stdout)
    assert report["free_before"] > 100_000, report  # the check made free chunks to drain
    # None left but the few chunks the drain's own Python objects freed as it returned.
    assert report["free_after"] < 1024, report
    assert report["taken"] > 0 and report["below_top"] <= 10, report  # what comes next comes from the top
    # The top chunk gives at most what the per-thread cache's step takes where that cache is empty (7 chunks of each
    # of its 64 sizes): the bins' chunks are drained 32 bytes at a time, and the drain stops at the top.
    assert report["top_after"] >= report["top_before"] - 7 * sum(range(16, 1040, 16)), report


def test_the_server_module_does_not_import_its_entry_point():
    """start.py forks the lean zygote before it imports the server (asyncio): the server reads its config and the
    zygote choice from config.py, so the two modules form no import circle."""
    import subprocess
    import sys

    code = ("import sys, retool_env.sandbox.forkserver.server\n"
            "print('retool_env.sandbox.forkserver.start' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.strip() == "False"
