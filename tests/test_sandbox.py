"""The sandbox's behaviour: results, echo, errors, timeouts, output caps, sessions, event loops, restarts, HTTP."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from retool_env.sandbox import (
    ExecResult,
    LocalSandbox,
    Sandbox,
    SandboxFusionPool,
    SandboxFusionSandbox,
    ToolStatus,
    make_sandbox,
)
from retool_env.sandbox.forkserver import isolation, probes

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sandbox():
    with LocalSandbox(timeout=5, max_concurrency=4, max_sessions=3, traceback_lines=6) as sb:
        sb.start()
        yield sb


def run(sb: Sandbox, code: str, **kw) -> ExecResult:
    return sb.run_sync(code, **kw)


# Without the view, a child as root runs as its own uid and must reach Python itself: not where it lives under a
# 0700 directory (pyenv under /root), where the "bare" tests use the view instead.
BARE = "none" if os.geteuid() != 0 or isolation.python_reachable_by_others() else "auto"


def descendants(pid: int) -> list[int]:
    """Host pids below `pid`, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        kids = children.get(queue.pop(0), [])
        found += kids
        queue += kids
    return found


def server_host_pid(sb: LocalSandbox) -> int:
    """The fork server itself (below bubblewrap or unshare, if any): the first Python process in the tree."""
    for pid in [sb.server_pid, *descendants(sb.server_pid)]:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        if argv[0] == sys.executable.encode() and b"retool_env.sandbox.forkserver.start" in b" ".join(argv):
            return pid
    raise AssertionError("no server process found")


# -- the result type ------------------------------------------------------------------------------------------------


def test_output_joins_stdout_errors_and_note():
    result = ExecResult("timeout", stdout="partial", stderr="",
                        note="TimeoutError: execution exceeded the 5 s time limit")
    assert result.output == "partial\nTimeoutError: execution exceeded the 5 s time limit"
    assert ExecResult("ok").output == ""
    failed = ExecResult("error", stdout="a\n", stderr="Traceback\nValueError: x\n")
    assert failed.output == "a\nTraceback\nValueError: x"
    assert result.to_dict()["status"] == "timeout" and result.to_dict()["stdout"] == "partial"


def test_make_sandbox_specs():
    assert isinstance(make_sandbox("local"), LocalSandbox)
    fusion = make_sandbox("sandbox_fusion:http://h:1/run_code")
    assert isinstance(fusion, SandboxFusionSandbox) and fusion.url == "http://h:1/run_code"
    assert make_sandbox("http://h:2").url == "http://h:2/run_code"
    sb = LocalSandbox()
    assert make_sandbox(sb) is sb
    with pytest.raises(ValueError, match="unknown sandbox"):
        make_sandbox("docker")


# -- running code -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("x = 5", ""),
        ("x = 5\nx", "5"),
        ("for i in range(3):\n    print(i)", "0\n1\n2"),
        ("1 + 1  # a trailing comment", "2"),
        ("print(3); 4", "3\n4"),
        ("4;", ""),
        ("import math", ""),
        ("'text'", "'text'"),
        ("None", ""),
        ("from fractions import Fraction\nFraction(1, 3) + Fraction(1, 6)", "Fraction(1, 2)"),
        ("import sympy as sp\nx = sp.Symbol('x')\nsp.factor(x**2 - 1)", "(x - 1)*(x + 1)"),
        ("import numpy as np\nint(np.arange(10).sum())", "45"),
        ("print(len(str(2**20000)))", "6021"),
        ("if __name__ == '__main__':\n    print('main')", "main"),
    ],
)
def test_echo_of_trailing_expression(sandbox, code, expected):
    result = run(sandbox, code)
    assert result.status == "ok", result
    assert result.output.strip() == expected


def test_bare_fallback_echo_off_and_cleanup():
    """Without a view (where it can start) or seccomp: escaped processes are still reaped; echo can be off; close
    removes cgroups."""
    sb = LocalSandbox(echo=False, prefork=1, isolation=BARE, require="none", seccomp=False, timeout=3)
    sb.start()
    cgroups = sb._process.cgroup.parents if sb._process.cgroup else ()
    try:
        assert sb.wrapper == ("none" if BARE == "none" else "namespaces")
        assert run(sb, "x = 5\nx").output == ""
        assert run(sb, "print(7)").output.strip() == "7"
        assert run(sb, "x = 5\nx", echo=True).output.strip() == "5"
        escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
        assert run(sb, escape).output.strip() == "parent done"
        def settled() -> bool:  # the pools are refilled and nothing else is alive: each zygote and its one child
            inner = 0 if sb.wrapper == "none" else 1  # the server below the process outside its namespaces
            info = asyncio.run(sb.info())
            return info["pool"] == len(info["zygotes"]) == 2 and len(descendants(sb.server_pid)) == 4 + inner

        deadline = time.time() + 5
        while time.time() < deadline and not settled():
            time.sleep(0.05)
        assert settled()
    finally:
        sb.close()
    assert not any(os.path.exists(d) for d in cgroups)


def test_error_keeps_stdout_then_trimmed_traceback(sandbox):
    code = "print('before')\ndef f(n):\n    return 1 / n if n == 0 else f(n - 1)\nf(30)"
    result = run(sandbox, code)
    assert result.status == "error" and result.exit_code == 1
    assert result.stdout == "before\n"
    lines = result.output.splitlines()
    assert lines[0] == "before" and lines[-1] == "ZeroDivisionError: division by zero"
    assert len(result.stderr.splitlines()) <= 6  # traceback_lines=6
    assert "server.py" not in result.stderr and "cell.py" not in result.stderr


def test_syntax_error_names_the_line(sandbox):
    result = run(sandbox, "x = 1\ndef f(:\n    pass")
    assert result.status == "error"
    assert "SyntaxError" in result.output and 'line 2' in result.output
    assert "server.py" not in result.output


def test_timeout_keeps_partial_output_and_names_the_limit(sandbox):
    start = time.perf_counter()
    result = run(sandbox, "import time\nprint('started', flush=True)\nwhile True: time.sleep(0.01)", timeout=1)
    elapsed = time.perf_counter() - start
    assert result.status == "timeout"
    assert result.stdout == "started\n"
    assert result.output.endswith("TimeoutError: execution exceeded the 1 s time limit")
    assert 1.0 <= elapsed < 3.0


def test_huge_output_keeps_head_and_tail(sandbox):
    result = run(sandbox, "print('HEAD')\nfor i in range(200000): print(i)\nprint('TAIL')")
    assert result.status == "ok" and result.stdout_truncated
    assert result.stdout.startswith("HEAD\n0\n1\n") and result.stdout.endswith("199999\nTAIL\n")
    assert "bytes truncated" in result.stdout and len(result.stdout) < 20000


def test_stderr_and_stdin(sandbox):
    result = run(sandbox, "import sys\nprint('warn', file=sys.stderr)\nprint(sys.stdin.read().upper())", stdin="abc")
    assert result.status == "ok" and result.stdout == "ABC\n" and result.stderr == "warn\n"


def test_per_call_memory_limit(sandbox):
    code = "x = bytearray(300 * 1024 * 1024)\nprint('allocated')"
    assert run(sandbox, code).status == "ok"
    limited = run(sandbox, code, memory_mb=100)
    assert limited.status == "memory" and "MemoryError" in limited.output


def test_bad_code_is_an_error_result_not_an_exception(sandbox):
    for code in (b"print(1)", b"\xff\xfe", "print('\udcff')", None):
        result = run(sandbox, code)  # type: ignore[arg-type]
        assert result.status == "error" and result.output


# -- concurrency and event loops ----------------------------------------------------------------------------------


def test_many_concurrent_calls(sandbox):
    async def main():
        return await asyncio.gather(*(sandbox.run(f"print({i} * {i})") for i in range(24)))

    results = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(24)]


def test_usable_from_several_loops_and_threads(sandbox):
    assert run(sandbox, "print(1)").stdout == "1\n"
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(sandbox.run("print(2)")).stdout == "2\n"
    finally:
        loop.close()
    outputs = []
    threads = [threading.Thread(target=lambda i=i: outputs.append(run(sandbox, f"print({i})").stdout))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outputs) == [f"{i}\n" for i in range(4)]


def test_run_sync_inside_a_loop_raises(sandbox):
    async def main():
        with pytest.raises(RuntimeError, match="inside a running event loop"):
            sandbox.run_sync("print(1)")

    asyncio.run(main())


# -- sessions ---------------------------------------------------------------------------------------------------------


def test_session_state_persists_and_failures_roll_back(sandbox):
    async def main():
        s = "episode-1"
        assert (await sandbox.run("x = 10\ny = [1]", session=s)).status == "ok"
        assert (await sandbox.run("x += 1\nx", session=s)).output.strip() == "11"
        failed = await sandbox.run("x = 999\ny.append(2)\n1 / 0", session=s)
        assert failed.status == "error" and "ZeroDivisionError" in failed.output
        assert (await sandbox.run("x, y", session=s)).output.strip() == "(11, [1])"
        timed_out = await sandbox.run("x = -1\nwhile True: pass", session=s, timeout=1)
        assert timed_out.status == "timeout"
        crashed = await sandbox.run("x = -2\nimport ctypes\nctypes.string_at(0)", session=s)
        assert crashed.status == "killed"
        assert (await sandbox.run("x", session=s)).output.strip() == "11"
        assert (await sandbox.run("x", session="other")).status == "error"  # sessions are separate
        await sandbox.close_session(s)
        assert (await sandbox.run("x", session=s)).status == "error"  # closed: a fresh namespace
        await sandbox.close_session(s)
        await sandbox.close_session("other")

    asyncio.run(main())


def test_session_survives_an_old_head_that_is_slow_to_exit():
    """On a loaded machine the head a cell replaces may take seconds to exit; the new head waits for it (it used to
    give up after a second, and the session's next call answered `sandbox_error`). Without seccomp a cell can stop
    its own head, which stands in for that machine (a process of its own group resumes it: the cell itself is
    stopped once its code is done). The cell moves that process to its group itself, as a shell does: on a busy core
    the cell could otherwise stop itself, and its not-yet-moved child with it, first, and nothing would resume the
    head."""
    stall = ("import os, signal, time\nhead = os.getppid()\nos.kill(head, signal.SIGSTOP)\npid = os.fork()\n"
             "if pid == 0:\n    os.setpgid(0, 0)\n    time.sleep(1.5)\n    os.kill(head, signal.SIGCONT)\n"
             "    os._exit(0)\nos.setpgid(pid, pid)\nx = 1")

    async def main():
        with LocalSandbox(seccomp=False, timeout=10) as sb:
            took_over = await sb.run(stall, session="slow")
            after = await sb.run("x + 1", session="slow")
            await sb.close_session("slow")
        return took_over, after

    took_over, after = asyncio.run(main())
    assert took_over.status == "ok", took_over
    assert (after.status, after.output.strip()) == ("ok", "2"), after


def test_session_cells_cannot_forge_the_heads_reports(sandbox):
    """A cell can write to the pipe its head reports on; the server must not act on forged pids."""
    forge = "import os\nfor fd in range(3, 64):\n    try: os.write(fd, b'C 1\\nT\\nX 0\\n')\n    except OSError: pass"

    async def main():
        await sandbox.run("kept = 1", session="forger")
        forged = await sandbox.run(forge + "\nwhile True: pass", session="forger", timeout=1)
        after = await sandbox.run("print('fine')")
        await sandbox.close_session("forger")
        return forged, after

    forged, after = asyncio.run(main())
    # A cell can at worst confuse its own session (it holds the same pipes as its head); it cannot make the server
    # signal another process: pid 1's group was the bait, and the server still serves.
    assert forged.status in ("ok", "timeout", "sandbox_error", "error")
    assert after.output == "fine\n"


def test_calls_of_one_session_arriving_together_share_it(sandbox):
    async def main():
        first = await asyncio.gather(*(sandbox.run(f"v{i} = {i}", session="together") for i in range(3)))
        return first, await sandbox.run("print(v0 + v1 + v2)", session="together")

    first, total = asyncio.run(main())
    assert all(r.ok for r in first) and total.stdout == "3\n", (first, total)
    asyncio.run(sandbox.close_session("together"))


def test_concurrent_sessions_stay_apart(sandbox):
    async def episode(i: int) -> list[str]:
        outputs = []
        for _ in range(3):
            result = await sandbox.run(f"acc = acc + {i} if 'acc' in dir() else {i}\nacc", session=f"ep{i}")
            outputs.append(result.output.strip())
        await sandbox.close_session(f"ep{i}")
        return outputs

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(1, 4)))  # max_sessions=3

    assert asyncio.run(main()) == [[str(i), str(2 * i), str(3 * i)] for i in range(1, 4)]


def test_sessions_are_bounded(sandbox):
    async def main():
        for i in range(4):  # max_sessions=3: the least recently used is closed
            await sandbox.run(f"v = {i}", session=f"s{i}")
        assert (await sandbox.info())["sessions"] == 3
        assert (await sandbox.run("v", session="s0")).status == "error"
        assert (await sandbox.run("v", session="s3")).output.strip() == "3"
        for i in range(4):
            await sandbox.close_session(f"s{i}")
        assert (await sandbox.info())["sessions"] == 0

    asyncio.run(main())


# -- the server's life --------------------------------------------------------------------------------------------


def test_namespaces_and_unknown_isolation():
    from retool_env.sandbox.forkserver import isolation

    with LocalSandbox(isolation="unshare", prefork=1) as sb:  # the old wrapper's name means the namespaces
        code = "import os\nprint(os.getpid() < 100, [l.split(':')[0].strip() for l in open('/proc/net/dev')][2:])"
        result = run(sb, code)  # a fresh pid namespace, and a network namespace with only loopback
        assert sb.wrapper == "namespaces" and result.output.strip() == "True ['lo']"
    with pytest.raises(RuntimeError, match="not available"):
        isolation.mode("firecracker")


def test_server_death_gives_sandbox_error_then_restarts():
    with LocalSandbox(timeout=5, prefork=1) as sb:
        assert run(sb, "print(1)").ok

        async def main():
            slow = asyncio.ensure_future(sb.run("import time; time.sleep(30)"))
            await asyncio.sleep(0.5)
            os.kill(server_host_pid(sb), signal.SIGKILL)
            start = time.perf_counter()
            result = await slow
            return result, time.perf_counter() - start

        result, waited = asyncio.run(main())
        assert result.status == "sandbox_error" and waited < 3
        assert run(sb, "print('back')").stdout == "back\n"


def test_unclosed_sandbox_leaves_nothing_when_the_trainer_exits():
    script = textwrap.dedent(
        f"""
        import sys
        from retool_env.sandbox import LocalSandbox
        wrapped, bare = LocalSandbox(prefork=1), LocalSandbox(prefork=1, isolation={BARE!r}, require="none")
        assert wrapped.run_sync("print(1)").ok and bare.run_sync("print(1)").ok
        for sandbox in (wrapped, bare):  # a session whose head took over, stopped between calls
            sandbox.run_sync("a = 1", session="s"), sandbox.run_sync("b = 2", session="s")
        cgroup = wrapped._process.cgroup.parents[0] if wrapped._process.cgroup else "/nonexistent"
        print(wrapped.server_pid, bare.server_pid, cgroup, "torch" in sys.modules, flush=True)
        import os; os._exit(0)  # no close(), no atexit: as if the trainer crashed
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=True)
    wrapped_pid, bare_pid, cgroup, torch_imported = out.stdout.split()
    assert torch_imported == "False"
    leftovers = [f"/proc/{wrapped_pid}", f"/proc/{bare_pid}"]
    deadline = time.time() + 10
    while time.time() < deadline and any(os.path.exists(p) for p in leftovers):
        time.sleep(0.1)
    assert not any(os.path.exists(p) for p in leftovers)
    if os.path.isdir(cgroup):  # nothing left running in any of the crashed trainer's call groups
        while time.time() < deadline and any(Path(slot, "cgroup.procs").read_text().strip()
                                             for slot in Path(cgroup).iterdir() if slot.is_dir()):
            time.sleep(0.1)
        assert not any(Path(slot, "cgroup.procs").read_text().strip()
                       for slot in Path(cgroup).iterdir() if slot.is_dir())
    # A crashed trainer's empty parent cgroup is removed by the next sandbox that starts.
    with LocalSandbox(prefork=0) as sb:
        sb.start()
    assert not os.path.exists(cgroup)


# -- the SandboxFusion client (its server: test_http_server.py) ------------------------------------------------


def test_fusion_client_retries_transient_failures():
    calls = []

    async def flaky(reader, writer):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            request = json.loads(await reader.readexactly(length))
            calls.append(request)
            if len(calls) < 3:
                body, status = b"{}", b"503 Service Unavailable"
            else:
                run_result = {"status": "Finished", "stdout": "hi\n", "stderr": "", "return_code": 0,
                              "execution_time": 0.01}
                body, status = json.dumps({"status": "Success", "run_result": run_result}).encode(), b"200 OK"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()

    async def main():
        server = await asyncio.start_server(flaky, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = SandboxFusionSandbox(f"http://127.0.0.1:{port}", backoff=0.01)
        try:
            result = await client.run("print('hi')", timeout=3)
        finally:
            await client.aclose()
            server.close()
        refused = await SandboxFusionSandbox("http://127.0.0.1:9/run_code", retries=1, backoff=0.01).run("1")
        return result, refused

    result, refused = asyncio.run(main())
    assert result.status == "ok" and result.stdout == "hi\n" and len(calls) == 3
    assert calls[0]["language"] == "python" and calls[0]["run_timeout"] == 3 and calls[0]["memory_limit_MB"] == 1024
    assert refused.status == "sandbox_error" and "failed 2 times" in refused.output


def test_cli_doctor_reports_layers(capsys):
    from retool_env.cli import main

    code = main(["doctor"])
    out = capsys.readouterr().out
    for layer in ("seccomp", "namespaces", "uid per call", "user namespace", "capabilities dropped", "cgroup"):
        assert layer in out
    attacks = out.split("Attacks")[1]
    assert "ESCAPED" not in attacks and code == 0, out


def test_doctor_probes_see_an_escape_when_isolation_is_off():
    """The positive control: with every layer off, the same probes report the attacks that then work."""

    with LocalSandbox(isolation=BARE, require="none", seccomp=False, userns=False, prefork=1) as sb:
        escaped = {name for name in ("fork", "leave the session", "socket", "other calls' files")
                   if probes.escaped(run(sb, probes.code(name)).output)}
        run(sb, probes.code("other calls' files"))  # leaves a mark for the next
        again = run(sb, probes.code("other calls' files"))
        escaped |= {"shared /tmp"} if probes.escaped(again.output) else set()
    for mark in ("/tmp/mark", "/dev/shm/mark"):  # what the unconfined probes wrote on the host
        with contextlib.suppress(FileNotFoundError):
            os.unlink(mark)
    assert {"fork", "leave the session", "socket", "shared /tmp"} <= escaped, escaped


def test_strict_refuses_to_start_without_a_layer():
    with pytest.raises(RuntimeError, match=r"refuses to start: missing .*seccomp"):
        LocalSandbox(seccomp=False, require="strict", prefork=0).start()
    with pytest.raises(ValueError, match="require"):
        LocalSandbox(require="maybe")


def test_cli_is_import_light():
    code = (
        "import sys, retool_env; before = set(sys.modules); import retool_env.cli\n"
        "print(sorted(m for m in ('sympy', 'numpy', 'httpx', 'torch') if m in set(sys.modules) - before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_path_under_tmp_given_in_extra_paths_stays_visible_read_only(monkeypatch):
    """Each call's private /tmp would hide a path the view binds under /tmp (a CI clone's data, say); a sys.path
    entry outside the install is not bound at all."""
    checkout = Path(tempfile.mkdtemp(dir="/tmp"))
    checkout.chmod(0o755)  # as a clone would be (mkdtemp makes it private to its owner)
    on_path = Path(tempfile.mkdtemp(dir="/tmp"))
    on_path.chmod(0o755)
    try:
        (checkout / "sub").mkdir()
        (checkout / "sub" / "mark.txt").write_text("visible")
        (on_path / "mark.txt").write_text("hidden")
        monkeypatch.setattr(sys, "path", [*sys.path, str(on_path)])
        with LocalSandbox(prefork=1, extra_paths=[str(checkout / "sub")]) as sb:
            code = (f"import os\nprint(open('{checkout}/sub/mark.txt').read(), os.path.exists('{on_path}'), "
                    f"os.listdir('/tmp'))\nopen('{checkout}/sub/written.txt', 'w')")
            result = run(sb, code)
        assert result.status == "error" and result.stdout.count(" ") >= 2, result
        text, seen, listed = result.stdout.split(" ", 2)
        package = Path(isolation.__file__).resolve().parents[2]  # bound too: a checkout under /tmp shows its top
        own = {package.relative_to("/tmp").parts[0]} if package.is_relative_to("/tmp") else set()
        assert text == "visible" and seen == "False" and set(ast.literal_eval(listed)) == {checkout.name} | own, result
        assert "Read-only file system" in result.output and not (checkout / "sub" / "written.txt").exists()
    finally:
        shutil.rmtree(checkout)
        shutil.rmtree(on_path)


def test_the_package_is_bound_back_not_the_checkout_around_it(monkeypatch):
    """A checkout in a private directory (mktemp -d makes it 0700) would stay closed to a call's uid if bound whole."""
    from retool_env.sandbox.forkserver import isolation

    package = Path(isolation.__file__).resolve().parents[2]  # retool_env/sandbox/forkserver/isolation.py
    monkeypatch.setattr(sys, "path", [str(package.parent), *sys.path])  # as pytest or `python -c` in it would
    paths = isolation.python_paths()
    assert str(package) in paths or any(str(package).startswith(p + "/") for p in paths)
    assert str(package.parent) not in paths


def test_idle_sessions_are_held_to_a_memory_budget():
    """Three sessions each keep 120 MB under a 300 MB budget: the third, which grew past it, is closed (each holds
    more than its 100 MB share), and says so at its next call; the first two keep their state."""
    hold = "block = b'x' * (120 << 20)\nlen(block)"

    async def main():
        with LocalSandbox(timeout=20, memory_mb=512, session_memory_mb=300) as sb:
            for name in ("first", "second", "third"):
                assert (await sb.run(hold, session=name)).status == "ok"
            info = await sb.info()
            first = await sb.run("len(block)", session="first")
            third = await sb.run("len(block)", session="third")
            return info, first, third

    info, first, third = asyncio.run(main())
    assert info["session_memory_budget_mb"] == 300
    assert info["sessions_evicted"] == 1 and info["session_memory_mb"] <= 300, info
    assert (first.status, first.stdout) == ("ok", f"{120 << 20}\n"), first
    assert third.status == "error" and third.note.startswith("SessionReset: ") and "NameError" in third.output, third


# ------------------------------------------------------------------------------------------ the one contract
class EchoBackend(Sandbox):
    """A backend written as the contract asks: `_run` only. It echoes the checked arguments it was given."""

    timeout = 7.0

    async def _run(self, code, *, timeout, session, stdin, memory_mb):
        return ExecResult(ToolStatus.OK, stdout=json.dumps([timeout, session, stdin, memory_mb]))


def test_the_base_run_checks_and_normalises_arguments_for_every_backend():
    backend = EchoBackend()
    assert json.loads(run(backend, "x").stdout) == [7.0, None, None, None]  # the backend's default timeout
    assert json.loads(run(backend, "x", timeout=2, session="s", stdin="in", memory_mb=64).stdout) == [2.0, "s", "in",
                                                                                                      64]
    assert run(backend, b"print(1)").status == "error"  # model output never raises
    for bad in ({"timeout": 0}, {"timeout": -1}, {"timeout": float("nan")}, {"timeout": float("inf")},
                {"timeout": "5"}, {"timeout": True}, {"memory_mb": 0}, {"memory_mb": 1.5}, {"session": 3},
                {"stdin": b"x"}):
        with pytest.raises(ValueError):
            run(backend, "x", **bad)


def test_every_backend_refuses_a_timeout_of_zero_the_same_way():
    """The copies used to disagree (local and Ray refused, fusion and the pool sent it on): one check now."""
    from retool_env.sandbox.ray_pool import RaySandbox

    closed_port = "http://127.0.0.1:9/run_code"  # never reached: the check comes first
    backends = [LocalSandbox(), SandboxFusionSandbox(closed_port), SandboxFusionPool([closed_port]),
                RaySandbox(actors=1, name=None)]
    for backend in backends:
        for timeout in (0, -2.5):
            with pytest.raises(ValueError, match="timeout must be a finite positive number"):
                run(backend, "print(1)", timeout=timeout)
        backend.close()
    assert all(getattr(b, "_process", None) is None for b in backends)  # nothing was started for a refused call


def test_statuses_are_one_str_enum():
    result = ExecResult("sandbox_error", note="x")  # a plain string (the server's JSON) becomes the enum
    assert result.status is ToolStatus.SANDBOX_ERROR and result.status == "sandbox_error"
    assert json.loads(json.dumps(result.to_dict()))["status"] == "sandbox_error"
    assert f"{result.status}" == "sandbox_error"
    assert ExecResult("ok").ok and not ExecResult("error").ok
    with pytest.raises(ValueError):
        ExecResult("forged")
    from retool_env.trajectory import ToolStatus as RecordStatus

    assert RecordStatus is ToolStatus  # one enum for the sandbox and the episode's records


def test_the_server_takes_every_setting_the_client_decides_from_the_client():
    """LocalSandbox's arguments are the one place its defaults live: the server's config fills in none of them, so
    a setting the client leaves out fails loudly instead of running with a second default."""
    from retool_env.sandbox.forkserver.config import Config

    sent = LocalSandbox(memory_mb=300, max_sessions=5)._config
    config = Config(**sent, listen_fd=3, lifeline_fd=4)
    assert (config.memory_mb, config.max_sessions) == (300, 5)
    for name in sent:
        with pytest.raises(TypeError, match=name):
            Config(**{k: v for k, v in sent.items() if k != name}, listen_fd=3, lifeline_fd=4)
