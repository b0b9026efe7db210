"""Hostile code: each case returns within its timeout plus a margin, and the sandbox keeps serving, leaking nothing.

All cases run concurrently against one sandbox (which also tests that they cannot hurt each other), once per module;
each test then checks one case's result.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import json
import mmap
import os
import socket
import struct
import subprocess
import sys
import time
import typing

import pytest

from retool_env.sandbox import ExecResult, LocalSandbox

pytestmark = pytest.mark.timeout(120)

SECRET = "retool-test-secret-8c1f2e"
TIMEOUT = 2.0
# Cases that test a limit other than time get room to finish beside the CPU burners running at the same moment.
CASE_TIMEOUTS = {"threads_500": 20.0}
MARGIN = 2.5  # seconds past the timeout a result may take on a loaded two-core machine

CASES: dict[str, str] = {
    "empty": "",
    "whitespace": "\n\n   \n",
    "megabyte_of_code": "# " + "c" * 500_000 + "\ntext = '" + "t" * 500_000 + "'\nprint(len(text) + 1)",
    "many_lines_of_code": "x = 1\n" * 10_000 + "print(x + 1)",
    "syntax_error": "def f(:\n    return 1",
    "busy_loop": "while True: pass",
    "sleep_forever": "import time\ntime.sleep(10**6)",
    "print_100mb_at_once": "print('x' * 100_000_000)",
    "print_100mb_in_lines": "line = 'y' * 999\nfor _ in range(100_000): print(line)",
    "allocate_10gb": "block = bytearray(10 * 1024**3)",
    "grow_until_full": "blocks = []\nwhile True: blocks.append(bytearray(50 * 1024**2))",
    "fork_1000": "import os\nfor _ in range(1000):\n    if os.fork() == 0:\n        import time; time.sleep(60)",
    "setsid_then_fork": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)",
    "setsid": "import os\nos.setsid()",
    "ignore_signals": (
        "import signal\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True: pass"
    ),
    "close_std_fds": "import os\nfor fd in (0, 1, 2): os.close(fd)\nprint('still here')",
    "kill_parent": "import os\nos.kill(os.getppid(), 9)",
    "kill_everyone": "import os, signal\nos.kill(-1, signal.SIGKILL)",
    "os_exit": "print('bye', flush=True)\nimport os\nos._exit(0)",
    "sys_exit_3": "import sys\nsys.exit(3)",
    "raise_system_exit": "raise SystemExit",
    "keyboard_interrupt": "raise KeyboardInterrupt",
    "threads_500": (
        "import threading, time\nthreads = [threading.Thread(target=time.sleep, args=(0.05,)) for _ in range(500)]\n"
        "for t in threads: t.start()\nfor t in threads: t.join()\nprint(len(threads))"
    ),
    "read_environ": "import os\nprint(dict(os.environ))",
    "read_proc_self_environ": "print(open('/proc/self/environ', 'rb').read())",
    "read_parent_environ": "import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())",
    "read_trainer_environ": "print(open('/proc/{trainer}/environ', 'rb').read())",
    "scan_all_environ": (
        "import os\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try: print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as e: print(pid, e)"
    ),
    "tcp_to_localhost": "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                        "print('connected')",
    "write_outside": "open('{outside}/escaped.txt', 'w').write('pwned')\nprint('wrote')",
    "write_next_to_workdir": "open('../neighbour.txt', 'w').write('x')\nopen('/tmp/loose.txt', 'w').write('x')",
    "ctypes_system": "import ctypes\nprint(ctypes.CDLL(None).system(b'touch {outside}/ctypes.txt'))",
    "ctypes_segfault": "import ctypes\nctypes.string_at(0)",
    "subprocess": "import subprocess\nprint(subprocess.run(['id'], capture_output=True))",
    "deep_recursion": "import sys\nsys.setrecursionlimit(10**6)\ndef f(n): return f(n + 1)\nf(0)",
    "huge_int": "x = 10**(10**8)",
    "non_utf8_print": "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe ok\\n')",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Start the sandbox with a secret in our environment, run every case at once, and keep the results."""
    outside = tmp_path_factory.mktemp("outside")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    os.environ["RETOOL_TEST_SECRET"] = SECRET
    try:
        sandbox = LocalSandbox(timeout=TIMEOUT, max_concurrency=8, prefork=4, memory_mb=512)
        sandbox.start()
    finally:
        del os.environ["RETOOL_TEST_SECRET"]
    port = listener.getsockname()[1]
    codes = {
        name: code.replace("{port}", str(port)).replace("{outside}", str(outside))
                  .replace("{trainer}", str(os.getpid()))
        for name, code in CASES.items()
    }

    async def timed(name: str, code: str) -> tuple[ExecResult, float]:
        start = time.perf_counter()
        result = await sandbox.run(code, timeout=CASE_TIMEOUTS.get(name))
        return result, time.perf_counter() - start

    async def main():
        baseline = await sandbox.info()
        pairs = await asyncio.gather(*(timed(name, code) for name, code in codes.items()))
        return baseline, dict(zip(codes, pairs, strict=True))

    baseline, results = asyncio.run(main())
    try:
        accepted = listener.accept()
        accepted[0].close()
        connected = True
    except BlockingIOError:
        connected = False
    listener.close()
    load = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))  # runnable processes per core during the run
    yield {"sandbox": sandbox, "results": results, "outside": outside, "connected": connected, "baseline": baseline,
           "load": load}
    sandbox.close()


def result(env, name: str) -> ExecResult:
    return env["results"][name][0]


@pytest.mark.parametrize("name", list(CASES))
def test_every_case_returns_within_its_timeout(env, name):
    res, elapsed = env["results"][name]
    assert res.status in ("ok", "error", "timeout", "memory", "killed"), res
    # All cases share 8 slots, so a case may wait for one: allow a few timeouts of queueing on top. Killing and
    # reaping slow down on a machine busier than its cores, so the margin grows with the load the run saw.
    margin, limit = MARGIN * env["load"], CASE_TIMEOUTS.get(name, TIMEOUT)
    assert elapsed < 3 * TIMEOUT + limit + margin, (name, elapsed, env["load"])
    assert res.duration < limit + margin, (name, res.duration, env["load"])


@pytest.mark.parametrize("name", ["empty", "whitespace"])
def test_empty_code(env, name):
    assert result(env, name).status == "ok" and result(env, name).output == ""


def test_large_code_runs(env):
    """Large code compiles and runs. On its own and with time to compile: among the shared cases its 2 s also cover
    queueing behind the busy loops, which a loaded machine can use up."""
    for name, expected in (("megabyte_of_code", "500001"), ("many_lines_of_code", "2")):
        res = env["sandbox"].run_sync(CASES[name], timeout=20)
        assert (res.status, res.output.strip()) == ("ok", expected), res


def test_syntax_error(env):
    res = result(env, "syntax_error")
    assert res.status == "error" and "SyntaxError" in res.output


@pytest.mark.parametrize("name", ["busy_loop", "sleep_forever", "ignore_signals", "huge_int"])
def test_runaway_code_times_out(env, name):
    res = result(env, name)
    assert res.status == "timeout" and "TimeoutError" in res.output


@pytest.mark.parametrize("name", ["print_100mb_at_once", "print_100mb_in_lines"])
def test_output_floods_are_capped(env, name):
    res = result(env, name)
    assert len(res.stdout) < 20_000
    if res.status == "ok":  # 100k prints may outlast the limit on a busy machine; the cap must hold either way
        assert res.stdout_truncated and "bytes truncated" in res.stdout


def test_memory_limit(env):
    res = result(env, "allocate_10gb")
    assert res.status == "memory" and "MemoryError" in res.output
    # Filling memory touches every page, which may outlast a 2 s limit on a busy machine: either stop is right.
    assert result(env, "grow_until_full").status in ("memory", "timeout")


@pytest.mark.parametrize("name", ["fork_1000", "setsid_then_fork", "subprocess", "ctypes_system"])
def test_no_new_processes(env, name):
    if not env["sandbox"]._config["use_seccomp"]:
        pytest.skip("seccomp is not available here")
    res = result(env, name)
    # glibc's system() answers 127 << 8 when it cannot start the shell.
    assert "Operation not permitted" in res.output or res.output.strip() in ("-1", "32512"), res.output


def test_std_fds_closed_still_prints(env):
    assert result(env, "close_std_fds").output.strip() == "still here"


@pytest.mark.parametrize("name", ["kill_parent", "kill_everyone"])
def test_cannot_signal_other_processes(env, name):
    if not env["sandbox"]._config["use_seccomp"]:
        pytest.skip("seccomp is not available here")
    assert "PermissionError" in result(env, name).output


def test_exits(env):
    assert result(env, "os_exit").status == "ok" and result(env, "os_exit").stdout == "bye\n"
    sys_exit = result(env, "sys_exit_3")
    assert sys_exit.status == "error" and sys_exit.exit_code == 3 and "SystemExit: 3" in sys_exit.output
    assert result(env, "raise_system_exit").status == "ok" and result(env, "raise_system_exit").exit_code == 0
    interrupt = result(env, "keyboard_interrupt")
    assert interrupt.status == "error" and "KeyboardInterrupt" in interrupt.output


def test_500_threads_fit_under_the_memory_limit(env):
    res = result(env, "threads_500")
    assert res.status == "ok" and res.output.strip() == "500", res.output


def test_secret_appears_in_no_output(env):
    # Without a pid namespace, a same-uid child can read the trainer's /proc/<pid>/environ: only namespaces stop that.
    needs_namespace = {"read_trainer_environ", "scan_all_environ"}
    for name, (res, _) in env["results"].items():
        if env["sandbox"].wrapper == "none" and name in needs_namespace:
            continue
        assert SECRET not in res.output, name
    assert "RETOOL_TEST_SECRET" not in result(env, "read_environ").output


def test_no_network(env):
    assert result(env, "tcp_to_localhost").status == "error"
    assert not env["connected"]


def test_host_files_are_out_of_reach(env):
    if env["sandbox"].wrapper != "namespaces" and not env["sandbox"]._config["uid_per_call"]:
        pytest.skip("a writable host filesystem needs the read-only view or a uid per call to protect it")
    assert not (env["outside"] / "escaped.txt").exists()
    assert not (env["outside"] / "ctypes.txt").exists()


def test_segfault_is_reported_as_killed(env):
    res = result(env, "ctypes_segfault")
    assert res.status == "killed" and "SIGSEGV" in res.output


def test_deep_recursion_is_contained(env):
    assert result(env, "deep_recursion").status in ("error", "memory", "timeout", "killed")


def test_undecodable_output_is_replaced(env):
    assert "ok" in result(env, "non_utf8_print").output


def test_sandbox_keeps_serving_and_leaks_nothing(env):
    sandbox = env["sandbox"]
    after = sandbox.run_sync("print('alive')")
    assert after.output == "alive\n"

    wrapper_processes = 0 if sandbox.wrapper == "none" else 1  # outside the namespaces, waiting for the server

    async def settle():
        # The pool refills in the background, and the last call's child may still be exiting on a busy machine:
        # wait (5 s at most) for the pool and the process table to settle; a leaked process never goes away.
        for _ in range(50):
            info = await sandbox.info()
            tree = _descendant_count(sandbox.server_pid)
            if (info["pool"] == env["baseline"]["pool"] and info["running"] == 0
                    and tree == wrapper_processes + len(info["zygotes"]) + info["pool"]):
                break
            await asyncio.sleep(0.1)
        return info, tree

    def steady(info: dict) -> dict:  # what must be as before: all but the count of children forked so far
        return {**info, "zygotes": {name: {**z, "forked": 0} for name, z in info["zygotes"].items()}}

    info, tree = asyncio.run(settle())
    assert steady(info) == steady(env["baseline"]), (info, env["baseline"])  # same pools, no sessions
    assert tree == wrapper_processes + len(info["zygotes"]) + info["pool"], tree  # the wrapper, zygotes, pools


def _descendant_count(pid: int) -> int:
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    count, frontier = 0, {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        count += len(frontier)
    return count


def test_isolation_report_is_consistent(env):
    layers = {layer.name: layer for layer in env["sandbox"].layers()}
    assert layers["clean environment"].active
    assert all(layer.detail for layer in layers.values())
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        assert layers["seccomp"].active


# -- statuses model code cannot forge ------------------------------------------------------------------------------


@pytest.mark.parametrize("exit_code", [70, 71])
def test_an_exit_that_looks_like_a_sandbox_failure_is_the_codes_error(env, exit_code):
    """Children exit 70/71 when they cannot confine themselves; code exiting so must not pass for that (a stateful
    episode is dropped on `sandbox_error`, which would spare the policy its penalty)."""
    code = f"print('bye', flush=True)\nimport os\nos._exit({exit_code})"

    async def main():
        sandbox = env["sandbox"]
        single = await sandbox.run(code, timeout=10)
        await sandbox.run("kept = 5", session="exit-70", timeout=10)
        in_session = await sandbox.run(code, session="exit-70", timeout=10)
        after = await sandbox.run("print(kept)", session="exit-70", timeout=10)
        await sandbox.close_session("exit-70")
        return single, in_session, after

    single, in_session, after = asyncio.run(main())
    for result in (single, in_session):
        assert (result.status, result.exit_code, result.stdout) == ("error", exit_code, "bye\n"), result
    assert (after.status, after.stdout) == ("ok", "5\n"), after  # the failed cell rolled back, the session lives


FORGE_HEAD_REPORTS = """
import os, stat, time
def forge(lines):  # on every socket and pipe (its own output buffer is its own to garble)
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode) or stat.S_ISFIFO(os.fstat(fd).st_mode): os.write(fd, lines)
        except OSError: pass
forge(b"T\\nR\\nX 0\\n")
time.sleep(1.5)
forge(b"C %d\\nT\\nR\\n" % os.getpid())
kept += 1
print("forger done")
"""


def test_a_cell_cannot_speak_for_its_head(env):
    """A cell writes its head's reports on every descriptor it holds, sleeps, and writes them again: its call still
    lasts as long as its code, and the next call runs its own code on the state the forger left."""

    async def main():
        sandbox = env["sandbox"]
        await sandbox.run("kept = 1", session="forger", timeout=10)
        start = time.perf_counter()
        forged = await sandbox.run(FORGE_HEAD_REPORTS, session="forger", timeout=10)
        elapsed = time.perf_counter() - start
        after = await sandbox.run("print('next', kept * 10)", session="forger", timeout=10)
        await sandbox.close_session("forger")
        return forged, elapsed, after

    forged, elapsed, after = asyncio.run(main())
    assert (forged.status, forged.stdout) == ("ok", "forger done\n"), forged
    assert elapsed >= 1.5, elapsed  # it came back when its code was done, not when it said so
    assert (after.status, after.stdout) == ("ok", "next 20\n"), after


# -- shared host state: page cache, locks, signal routing -----------------------------------------------------------

VICTIM_FILE = typing.__file__  # a host file every child can read (the Python install is in every view)


def _resident_fraction(path: str) -> float:
    """How much of `path` is in the page cache (mincore on a fresh mapping: it faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    anchor = ctypes.c_char.from_buffer(mapping)
    failed = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vector)
    del anchor
    mapping.close()
    assert failed == 0, ctypes.get_errno()
    return sum(v & 1 for v in vector) / pages


@pytest.mark.skipif(os.geteuid() != 0, reason="mincore reports a file it cannot write as cached (kernel >= 5.0)")
def test_calls_cannot_evict_host_files_from_the_page_cache(env):
    evict = (
        f"import mmap, os\nfd = os.open({VICTIM_FILE!r}, os.O_RDONLY)\n"
        "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\n"
        "m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)\n"
        "for advice in (20, 21): m.madvise(advice)  # MADV_COLD, MADV_PAGEOUT\n"
        "m.close()\nos.close(fd)\nprint('evicted')"
    )
    with open(VICTIM_FILE, "rb") as f:
        f.read()
    assert _resident_fraction(VICTIM_FILE) == 1.0
    result = env["sandbox"].run_sync(evict, timeout=10)
    assert (result.status, result.stdout) == ("ok", "evicted\n"), result  # inert, so code that hints still runs
    assert _resident_fraction(VICTIM_FILE) == 1.0
    fd = os.open(VICTIM_FILE, os.O_RDONLY)  # the control: the same hint from the host evicts it
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert _resident_fraction(VICTIM_FILE) < 1.0
    with open(VICTIM_FILE, "rb") as f:
        f.read()


def test_calls_cannot_lock_host_files(env):
    """A call takes flock, POSIX and open-file-description locks on a host file and holds them; the host sees none."""
    lock = (
        f"import fcntl, struct, time\nf = open({VICTIM_FILE!r}, 'rb')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
        "fcntl.lockf(f, fcntl.LOCK_SH)\n"
        "fcntl.fcntl(f, fcntl.F_OFD_SETLK, struct.pack('@hhqqi4x', fcntl.F_RDLCK, 0, 0, 0, 0))\n"
        "print('locked', flush=True)\ntime.sleep(2)"
    )

    async def main():
        call = asyncio.ensure_future(env["sandbox"].run(lock, timeout=10))
        seen = []
        with open(VICTIM_FILE, "rb") as f:
            while not call.done():
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                except BlockingIOError:
                    seen.append("flock")
                query = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack("@hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
                if struct.unpack("@hhqqi4x", query)[0] != fcntl.F_UNLCK:
                    seen.append("record lock")
                await asyncio.sleep(0.05)
        return await call, seen

    result, seen = asyncio.run(main())
    assert (result.status, result.stdout) == ("ok", "locked\n"), result
    assert seen == []


def test_calls_cannot_route_signals_to_other_processes(env):
    """F_SETOWN/F_SETSIG/O_ASYNC would have the kernel send SIGKILL to any pid when a pipe becomes readable."""
    victim = subprocess.Popen(["sleep", "60"])
    route = (
        "import ctypes, os, struct\nlibc = ctypes.CDLL(None, use_errno=True)\nr, w = os.pipe()\n"
        f"owner = struct.pack('ii', 1, {victim.pid})  # F_OWNER_PID\n"
        f"calls = [libc.fcntl(r, 8, {victim.pid}), libc.fcntl(r, 15, owner), libc.fcntl(r, 10, 9),\n"
        "         libc.fcntl(r, 4, os.O_ASYNC | os.O_NONBLOCK), libc.fcntl(r, 1024, 0), "
        "libc.fcntl(r, 1026, 0x80000001)]\n"
        "os.write(w, b'x')\nprint(calls)"
    )
    try:
        result = env["sandbox"].run_sync(route, timeout=10)
        time.sleep(0.5)
        assert victim.poll() is None, "the victim was killed"
        assert (result.status, result.stdout) == ("ok", "[-1, -1, -1, -1, -1, -1]\n"), result
    finally:
        victim.kill()
        victim.wait()


def test_a_thread_left_running_never_reaches_the_head(env):
    """Code leaves a thread that would end the interpreter during the next call: the cell cannot become the head
    with it (an `error` that says so, its state rolled back), and the next call runs undisturbed."""
    plant = ("import os, threading, time\nplanted = True\n"
             "threading.Thread(target=lambda: (time.sleep(1.0), os._exit(70)), daemon=True).start()")

    async def main():
        sandbox = env["sandbox"]
        planted = await sandbox.run(plant, session="planted", timeout=10)
        await asyncio.sleep(1.0)
        hit = await sandbox.run("import time\ntime.sleep(1)\nprint('survived', 'planted' in dir())",
                                session="planted", timeout=5)
        await sandbox.close_session("planted")
        return planted, hit

    planted, hit = asyncio.run(main())
    assert planted.status == "error" and "1 thread(s) running" in planted.note, planted
    assert (hit.status, hit.stdout) == ("ok", "survived False\n"), hit


# -- statuses code cannot forge: its own signals, threads, floods, stops (what each reports is judged from outside)

SELF_SIGNALS = (32, 33, 40, 63)  # real-time signals (glibc keeps 32 and 33): `signal.Signals` names none of them


def test_a_signal_the_code_sends_itself_is_its_own_death(env):
    """Code prints, then sends itself a real-time signal: `killed` with its output, never `sandbox_error`; in a
    session the state is as before the cell and the session goes on (the call was paused and swept)."""

    async def main():
        sandbox = env["sandbox"]
        singles = await asyncio.gather(*(sandbox.run(f"print('bye', flush=True)\nimport os\n"
                                                     f"os.kill(os.getpid(), {sig})", timeout=10)
                                         for sig in SELF_SIGNALS))
        await sandbox.run("kept = 5", session="self-signal", timeout=10)
        cells = [await sandbox.run(f"kept = {sig}\nprint('bye', flush=True)\nimport os\nos.kill(0, {sig})",
                                   session="self-signal", timeout=10) for sig in SELF_SIGNALS]
        after = await sandbox.run("print(kept)", session="self-signal", timeout=10)
        await sandbox.close_session("self-signal")
        return singles, cells, after

    singles, cells, after = asyncio.run(main())
    for result in singles + cells:
        assert (result.status, result.stdout) == ("killed", "bye\n"), result
        assert result.note.startswith("Killed: the process was terminated by signal"), result
    assert "SIGRTMIN+6" in singles[2].note, singles[2]
    assert (after.status, after.stdout) == ("ok", "5\n"), after


class SelfSignallingSolver:
    """A scripted policy: one tool call whose code prints and then kills its interpreter with a real-time signal,
    then a wrong final answer."""

    def __init__(self, tok):
        self.tok = tok

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=(), stop=(), sampling=None):
        from retool_env.rollout import Generation

        if "<tool_response>" in self.tok.decode(prompt_ids):
            reply = "It died, so I guess: \\boxed{41}.<|im_end|>"
        else:
            code = "print('trying', flush=True)\nimport os\nos.kill(0, 40)"
            reply = "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
            reply += "\n</tool_call><|im_end|>"
        ids = self.tok.encode(reply, add_special_tokens=False)
        return Generation(ids, [-0.5] * len(ids), "stop")


def test_an_episode_whose_code_signals_itself_is_graded_not_aborted(env, tiny_tok):
    """A stateful episode is aborted on `sandbox_error`; code that kills its own interpreter must not earn that
    escape from a wrong answer's penalty."""
    from retool_env import Problem, ToolEnvironment
    from retool_env.rollout import run_episode

    problem = Problem("What is 6 * 7?", "42", id="self-signal")
    episode = ToolEnvironment(tiny_tok, [problem], sandbox=env["sandbox"], stateful=True, tool_timeout=10.0)
    traj = asyncio.run(run_episode(episode, SelfSignallingSolver(tiny_tok), problem=problem))
    assert not traj.aborted, traj.finish_reason
    assert [call.status for call in traj.tool_calls] == ["killed"]
    assert not traj.correct and traj.reward == pytest.approx(-0.9)  # retool: min(-0.6, -1 + 0.1 * 1 call)


THREAD_FORGER = """
import os, socket, stat, threading, time
def forge():  # every report a head or a new head sends, on every socket it can reach, and on any channel it receives
    while True:
        for fd in range(3, 256):
            try:
                if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                    continue
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=os.dup(fd))
                sock.setblocking(False)
                try:
                    for received in socket.recv_fds(sock, 4096, 4)[1]:
                        os.write(received, b"R\\n")
                except OSError:
                    pass
                sock.close()
                os.write(fd, b"C 1\\nX 0\\nR\\n")
            except OSError:
                pass
        time.sleep(0.005)
threading.Thread(target=forge, daemon=True).start()
planted = True
"""


def test_a_thread_cannot_write_the_heads_reports(env):
    """A thread writes every report a head sends, and answers any hand-over it can catch: the cell is an `error`
    (it left a thread), its state rolled back, and the next cell, which fails, is reported as failing."""

    async def main():
        sandbox = env["sandbox"]
        await sandbox.run("kept = 1", session="thread-forger", timeout=10)
        forger = await sandbox.run(THREAD_FORGER, session="thread-forger", timeout=10)
        failing = await sandbox.run("kept = 2\n1 / 0", session="thread-forger", timeout=10)
        after = await sandbox.run("print(kept, 'planted' in dir())", session="thread-forger", timeout=10)
        await sandbox.close_session("thread-forger")
        return forger, failing, after

    forger, failing, after = asyncio.run(main())
    # Mostly the server finds the thread; under load the thread may first take the head's own messages, and the
    # head, its loop broken, exits: an `error` as well. Never `ok` or `killed`, and the state is rolled back.
    assert forger.status == "error" and ("thread(s) running" in forger.note or forger.exit_code == 70), forger
    assert failing.status == "error" and "ZeroDivisionError" in failing.stderr, failing
    assert (after.status, after.stdout) == ("ok", "1 False\n"), after


HANDLER_FORGER = """
import os, signal, stat
def forge(*_):  # what a head reports, on every socket, from inside whatever the process is doing
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode): os.write(fd, b"C 1\\nX 0\\nR\\n")
        except OSError: pass
for sig in (signal.SIGCONT, signal.SIGALRM, signal.SIGCHLD):  # the server resumes a head with SIGCONT each call
    signal.signal(sig, forge)
signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
planted = True
"""


def test_a_signal_handler_cannot_write_the_heads_reports(env):
    """A cell installs handlers (for the signal that resumes a head, a timer's, a child's exit) that write every
    report a head sends: the cell becomes the head without them, and its next cell, which fails, fails."""

    async def main():
        sandbox = env["sandbox"]
        planted = await sandbox.run(HANDLER_FORGER, session="handler-forger", timeout=10)
        failing = await sandbox.run("import os\nos.fork() or os._exit(0)\n1 / 0", session="handler-forger", timeout=10)
        after = await sandbox.run("print(planted)", session="handler-forger", timeout=10)
        await sandbox.close_session("handler-forger")
        return planted, failing, after

    planted, failing, after = asyncio.run(main())
    assert planted.status == "ok", planted
    assert failing.status == "error" and "ZeroDivisionError" in failing.stderr, failing
    assert (after.status, after.stdout) == ("ok", "True\n"), after


STATUS_FLOOD = """
import os, time
targets = [fd for fd in range(3, 256) if _is_channel(fd)]
for _ in range(4):  # writers that outlive the cell's code: only the end of the call stops them
    if os.fork() == 0:
        while True:
            for fd in targets:
                for message in (b"X 9\\n", b"", b"R\\n"):
                    try: os.write(fd, message)
                    except OSError: pass
time.sleep(1.0)
kept = 7
print('fine')
"""
CHANNEL_TEST = """
import os, stat
def _is_channel(fd):
    try: return stat.S_ISSOCK(os.fstat(fd).st_mode) or stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError: return False
"""


def test_a_flood_on_every_channel_cannot_fail_a_fine_cell(env):
    """Four processes a cell leaves write forged reports and empty messages (which read like a closed socket) as
    fast as they can on everything they hold: the cell, which runs fine, is `ok` and its state kept."""

    async def main():
        sandbox = env["sandbox"]
        await sandbox.run(CHANNEL_TEST, session="flood", timeout=10)
        flooded = await sandbox.run(STATUS_FLOOD, session="flood", timeout=10)
        after = await sandbox.run("print(kept)", session="flood", timeout=10)
        await sandbox.close_session("flood")
        return flooded, after

    flooded, after = asyncio.run(main())
    assert (flooded.status, flooded.stdout) == ("ok", "fine\n"), flooded
    assert (after.status, after.stdout) == ("ok", "7\n"), after


@pytest.mark.parametrize("stop", ["SIGSTOP", "SIGTSTP"])
def test_a_cell_that_stops_its_own_group_is_not_done(env, stop):
    """A stop is no hand-over: the cell runs into its time limit (it stopped itself), its state is rolled back,
    and the next call runs its own code."""
    code = f"kept = 2\nprint('stopping', flush=True)\nimport os, signal\nos.kill(0, signal.{stop})\nprint('resumed')"

    async def main():
        sandbox = env["sandbox"]
        await sandbox.run("kept = 1", session=f"stop-{stop}", timeout=10)
        start = time.perf_counter()
        stopped = await sandbox.run(code, session=f"stop-{stop}", timeout=2)
        elapsed = time.perf_counter() - start
        after = await sandbox.run("print('next', kept)", session=f"stop-{stop}", timeout=10)
        await sandbox.close_session(f"stop-{stop}")
        return stopped, elapsed, after

    stopped, elapsed, after = asyncio.run(main())
    assert (stopped.status, stopped.stdout) == ("timeout", "stopping\n"), stopped
    assert elapsed >= 2.0, elapsed
    assert (after.status, after.stdout) == ("ok", "next 1\n"), after
