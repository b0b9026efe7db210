"""Isolation, checked from outside the sandbox: canaries, victims, the process table, memory, /tmp and /dev/shm.

Each attack class the sandbox must contain (model code trying to reach the host's files, the server, other calls
and their output, or to keep running after its call), as root and, through scripts/test_unprivileged.sh, as an
unprivileged user. Where a check could pass vacuously, a positive control shows the detector would have fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

from retool_env.sandbox import LocalSandbox
from retool_env.sandbox.forkserver import isolation, probes, uids

pytestmark = pytest.mark.timeout(180)
ROOT = os.geteuid() == 0
CHECKOUT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sandbox():
    with LocalSandbox(timeout=4, max_concurrency=6, prefork=2, memory_mb=256, max_sessions=8) as sb:
        sb.start()
        yield sb


def run_all(sb: LocalSandbox, *codes: str, **kw):
    async def main():
        return await asyncio.gather(*(sb.run(code, **kw) for code in codes))

    return asyncio.run(main())


def tree(pid: int) -> dict[int, str]:
    """pid -> state of every process below `pid` on the host."""
    parents, states = {}, {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(entry)], states[int(entry)] = int(fields[1]), fields[0]
    found, frontier = {}, {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= {p: states[p] for p in frontier}
    return found


def test_every_required_layer_is_on(sandbox):
    """As root every layer; unprivileged all but a uid per call and cgroups (which need root)."""
    rows = sandbox.layers()
    assert [row for row in isolation.required(rows, root=ROOT) if not row.active] == []


# -- the host's files ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def canaries(tmp_path_factory):
    """Secret files the trainer can read and model code must not: in its home (mode 600, like a hub token), in
    its /tmp, in /dev/shm, and (as root) a root-only file outside any home."""
    token = secrets.token_hex(16)
    home = Path(os.path.expanduser("~")) / f".retool-canary-{token[:8]}"
    home.mkdir(mode=0o700)
    paths = [home / "token", tmp_path_factory.mktemp("canary") / "secret", Path(f"/dev/shm/retool-canary-{token[:8]}")]
    if ROOT:
        paths.append(Path(f"/var/lib/retool-canary-{token[:8]}"))
    for path in paths:
        path.write_text(token)
        path.chmod(0o600)
    yield token, paths
    for path in paths:
        path.unlink(missing_ok=True)
    shutil.rmtree(home, ignore_errors=True)


def test_canaries_stay_unread(sandbox, canaries):
    token, paths = canaries
    reads = "\n".join(f"try: print(open({str(p)!r}).read())\nexcept Exception as e: print(type(e).__name__)"
                      for p in paths)
    via_proc = (
        "import os\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n"
        + "".join(f"    try: print(open(f'/proc/{{pid}}/root{p}').read())\n    except Exception: pass\n" for p in paths)
        + "    try: print(open(f'/proc/{pid}/environ').read())\n    except Exception: pass\n"
    )
    by_handle = probes.code("open_by_handle_at")
    results = run_all(sandbox, reads, via_proc, by_handle)
    assert all(r.status in ("ok", "error") for r in results), results
    for result in results:
        assert token not in result.output
    # The positive control: the same read, run by the trainer, finds every canary.
    assert all(p.read_text() == token for p in paths)


def test_host_writes_are_refused(sandbox, tmp_path):
    targets = [CHECKOUT / f"escaped-{secrets.token_hex(4)}", Path("/etc") / f"escaped-{secrets.token_hex(4)}",
               Path(os.path.expanduser("~")) / f"escaped-{secrets.token_hex(4)}", tmp_path / "escaped"]
    writes = "\n".join(f"try: open({str(t)!r}, 'w').write('x')\nexcept Exception as e: print(type(e).__name__)"
                       for t in targets)
    mount_api = probes.code("new mount API")
    results = run_all(sandbox, writes, mount_api)
    assert not any(probes.escaped(r.output) for r in results), results
    assert not [t for t in targets if t.exists()]


# -- the server and other calls -----------------------------------------------------------------------------------

VICTIM = """\
import time
secret = 'VICTIM-' + {tag!r}
open('/tmp/victim.txt', 'w').write(secret)
total = 0
for i in range(30):
    total += i
    time.sleep(0.05)
print(total, open('/tmp/victim.txt').read())
"""

ATTACKER = """\
import ctypes, os, resource, signal
libc = ctypes.CDLL(None, use_errno=True)
me = os.getpid()
for pid in [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != me]:
    for attempt in (
        lambda: os.kill(pid, signal.SIGKILL),
        lambda: libc.syscall(434, pid, 0) >= 0 and print('pidfd', pid),
        lambda: libc.syscall(129, pid, signal.SIGKILL, ctypes.create_string_buffer(128)) == 0 and print('sigqueue'),
        lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (0, 0)),
        lambda: libc.syscall(438, libc.syscall(434, pid, 0), 3, 0) >= 0 and print('pidfd_getfd'),
        lambda: print(open(f'/proc/{pid}/cwd/victim.txt').read()),
        lambda: print(open(f'/proc/{pid}/root/tmp/victim.txt').read()),
        lambda: print(os.listdir(f'/proc/{pid}/map_files')),
        lambda: open(f'/proc/{pid}/mem', 'r+b').write(b'x'),
    ):
        try:
            attempt()
        except Exception:
            pass
print('attacker done')
"""


def test_victims_survive_attackers_beside_them(sandbox):
    tag = secrets.token_hex(8)
    results = run_all(sandbox, VICTIM.format(tag=tag), ATTACKER, ATTACKER, VICTIM.format(tag=tag), ATTACKER)
    victims, attackers = [results[0], results[3]], [results[1], results[2], results[4]]
    for victim in victims:
        assert victim.status == "ok" and victim.stdout == f"435 VICTIM-{tag}\n", victim
    for attacker in attackers:
        assert attacker.stdout.endswith("attacker done\n") and tag not in attacker.output, attacker
    assert sandbox.run_sync("print('still serving')").stdout == "still serving\n"


def test_a_session_victim_keeps_its_state(sandbox):
    async def main():
        await sandbox.run("secret = 41", session="victim")
        await asyncio.gather(*(sandbox.run(ATTACKER, session=f"attacker-{i}") for i in range(2)))
        return await sandbox.run("secret + 1", session="victim")

    assert asyncio.run(main()).stdout == "42\n"


def test_children_have_their_own_uid_and_namespaces(sandbox):
    code = "import os, time\ntime.sleep(0.3)\nprint(os.getuid(), os.readlink('/proc/self/ns/user'))"
    results = run_all(sandbox, *[code] * 4)
    uids = [r.stdout.split()[0] for r in results]
    namespaces = {r.stdout.split()[1] for r in results}
    assert len(namespaces) == 4 and os.readlink("/proc/self/ns/user") not in namespaces
    if ROOT:
        assert len(set(uids)) == 4 and "0" not in uids, uids
    else:
        assert set(uids) == {str(os.getuid())}


def test_no_code_or_output_left_in_memory_for_later_calls(sandbox):
    secret_code, secret_output = f"CODE{secrets.token_hex(12)}", f"OUT{secrets.token_hex(12)}"
    assert sandbox.run_sync(f"marker = {secret_code!r}\nprint({secret_output!r} * 100)").ok
    # Searched for reversed, so the scanner's own code does not contain what it looks for.
    # Every writable anonymous region (heap, arenas, stack): where freed buffers would linger. Each secret is given
    # in two halves and matched by a regex (which holds neither the text nor the bytes of the whole), so the
    # scanner's own memory holds no copy of what it looks for.
    scan = """\
import ctypes, re
patterns = [re.compile(re.escape(a.encode()) + b'(?:)' + re.escape(b.encode())) for a, b in {halves!r}]
found = set()
for line in open('/proc/self/maps').read().splitlines():
    parts = line.split()
    start, end = (int(x, 16) for x in parts[0].split('-'))
    if not parts[1].startswith('rw') or (len(parts) > 5 and parts[5] not in ('[heap]', '[stack]')):
        continue
    chunk = ctypes.string_at(start, end - start)
    found |= {{i for i, p in enumerate(patterns) if p.search(chunk)}}
print('FOUND', len(found))
"""

    def halves(*texts: str) -> list[tuple[str, str]]:
        return [(t[: len(t) // 2], t[len(t) // 2 :]) for t in texts]

    mine = secrets.token_hex(8)
    control = f"here = 'MINE' + {mine!r}\n" + scan.format(halves=halves("MINE" + mine))
    assert "FOUND 1" in sandbox.run_sync(control, timeout=60).output  # the scan does find what is in memory
    for result in run_all(sandbox, *[scan.format(halves=halves(secret_code, secret_output))] * 4, timeout=60):
        assert result.stdout.strip() == "FOUND 0", result


# -- what a call leaves behind ------------------------------------------------------------------------------------


def test_nothing_a_session_starts_outlives_its_call(sandbox):
    code = """\
import os, time
for _ in range(3):
    if os.fork() == 0:
        try:
            os.setsid()
        except OSError:
            pass
        while True:
            pass
for fd in range(3, 64):
    try:
        os.write(fd, b'T\\n')
    except OSError:
        pass
print('returned')
"""
    server = sandbox.server_pid
    before = tree(server)
    result = sandbox.run_sync(code, session="fork-bomb")
    assert result.status in ("ok", "error", "sandbox_error"), result  # a forged report may cut its output short
    time.sleep(0.5)
    after = tree(server)
    # One new process at most (the session's head, stopped between calls); nothing left running.
    alive = {pid: state for pid, state in after.items() if state != "Z"}  # killed, reaped when the head resumes
    assert len(alive) <= len(before) + 1, (before, after)
    assert [pid for pid, state in after.items() if state == "R"] == []
    # The cell forged its head's reports: that may cost its own session (a session is as trusted as its code),
    # never a hang, and a fresh session follows.
    forged = sandbox.run_sync("print('next')", session="fork-bomb", timeout=2)
    assert forged.status in ("ok", "error", "sandbox_error", "timeout"), forged
    again = sandbox.run_sync("print('again')", session="fork-bomb")
    assert again.stdout == "again\n", (result, forged, again)
    asyncio.run(sandbox.close_session("fork-bomb"))


def _sandbox_processes(namespaces: set[str] | None = None) -> list[int]:
    """Processes running as one of the sandboxes' per-call uids in the host's pid namespace or in `namespaces`
    (another sandbox on this machine, in a pid namespace of its own, is none of this test's business)."""
    wanted = {os.readlink("/proc/self/ns/pid"), *(namespaces or ())}
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as f:
                uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
            namespace = os.readlink(f"/proc/{entry}/ns/pid")
        except (OSError, StopIteration, ValueError):
            continue
        if uid >= uids.FIRST_UID and namespace in wanted:
            found.append(int(entry))
    return found


def test_close_leaves_no_process():
    sb = LocalSandbox(timeout=3, prefork=1)
    sb.run_sync("import os\nif os.fork() == 0:\n    while True: pass", session="s")
    for i in range(4):  # sessions whose heads took over and were stopped between calls
        sb.run_sync("a = 1", session=f"t{i}")
        sb.run_sync("b = 2", session=f"t{i}")
    server = sb.server_pid
    assert tree(server)
    namespaces = set()
    for pid in tree(server):
        with contextlib.suppress(OSError):  # unprivileged: not dumpable, not ours to read
            namespaces.add(os.readlink(f"/proc/{pid}/ns/pid"))
    before = set(_sandbox_processes(namespaces)) - set(tree(server))
    sb.close()
    deadline = time.time() + 10
    while time.time() < deadline and (tree(server) or os.path.exists(f"/proc/{server}")):
        time.sleep(0.1)
    assert not tree(server) and not os.path.exists(f"/proc/{server}")
    if ROOT:
        assert set(_sandbox_processes(namespaces)) <= before


def test_tmp_and_shm_are_private_and_bounded(sandbox):
    fill = "block = b'x' * (48 << 20)\nfor i in range(32):\n    open(f'/tmp/fill{i}', 'wb').write(block)"
    filled = sandbox.run_sync(fill)
    assert filled.status in ("error", "memory", "killed"), filled  # 1.5 GB of files against 256 MB
    assert "No space left" in filled.output or filled.status in ("memory", "killed")
    mark = f"mark-{secrets.token_hex(4)}"
    marks = f"open('/tmp/{mark}', 'w').write('m'); open('/dev/shm/{mark}', 'w').write('m')"
    look = "import os\nprint(sorted(os.listdir('/tmp')), os.listdir('/dev/shm'))"
    assert sandbox.run_sync(marks).ok
    # Only what is bound back (a checkout or venv under /tmp, read-only) is there.
    assert sandbox.run_sync(look).stdout == f"{probes.visible_entries('/tmp')} []\n"
    assert not os.path.exists(f"/dev/shm/{mark}")


def test_every_doctor_attack_is_contained(sandbox):
    codes = [probes.code(name) for name in probes.ATTACKS]
    for name, result in zip(probes.ATTACKS, run_all(sandbox, *codes), strict=True):
        assert not probes.escaped(result.output), (name, result.output)


def test_nothing_accumulates_over_many_calls():
    """Single-use calls, session cells that take over, timeouts, twice over: afterwards the same processes, no
    session, and a second round needs no more cgroup slots than the first (slots are reused, not leaked)."""
    with LocalSandbox(timeout=3, max_concurrency=4, prefork=2) as sb:
        sb.start()
        settled = len(tree(sb.server_pid))

        async def one(i: int) -> str:
            if i % 5 == 0:
                result = await sb.run(f"v = {i}\nv", session=f"s{i % 6}")
            elif i % 17 == 0:
                result = await sb.run("while True: pass", timeout=0.3)
            else:
                result = await sb.run(f"print({i} * 2)")
            return result.status

        async def round_of_calls() -> list[str]:
            statuses = await asyncio.gather(*(one(i) for i in range(240)))
            for i in range(6):
                await sb.close_session(f"s{i}")
            return statuses

        def slots() -> int:
            if sb._process.cgroup is None:
                return 0
            return len([d for d in os.listdir(sb._process.cgroup.parents[0]) if d.startswith(("slot", "lean-slot"))])

        counts = []
        for _ in range(2):
            statuses = asyncio.run(round_of_calls())
            # A 0.3 s call on a loaded machine may end before its child confirms it is about to run the code:
            # `sandbox_error` then (the code did not run), never for a call that started.
            slow = [status for i, status in enumerate(statuses) if i % 17 == 0 and i % 5 != 0]
            rest = [status for i, status in enumerate(statuses) if not (i % 17 == 0 and i % 5 != 0)]
            assert set(slow) <= {"timeout", "sandbox_error"} and len(slow) == 12, statuses
            assert set(rest) == {"ok"}, statuses
            deadline = time.time() + 10
            while time.time() < deadline and len(tree(sb.server_pid)) != settled:
                time.sleep(0.1)
            assert len(tree(sb.server_pid)) == settled
            info = asyncio.run(sb.info())
            assert info["sessions"] == 0 and info["running"] == 0
            assert [z["pool"] for z in info["zygotes"].values()] == [2, 2]  # each zygote's pool
            counts.append(slots())
        # A slot is made only when more calls are live (or still dying) at once than ever before, so the second
        # round's peak may exceed the first's by a few (+5 seen under load, with children made faster); a leak on
        # any one path (12 timeouts, 48 session cells, 180 single-use calls a round) would add 12 or more.
        assert counts[1] <= counts[0] + 8, counts


# -- the view: an allowlist, not the host ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def host_data():
    """World-readable files where a trainer keeps what a policy must not read: a `.env` in the working directory,
    a dataset with gold answers in a /workspace-like checkout and under /data (as root), an HF_HOME outside the
    home, a file in the host's /etc. Mode 0644 in 0755 directories: only the view keeps them out of reach (a
    uid of its own would not). As root, a 0600 root-owned file outside any home too, like /etc/shadow."""
    token = secrets.token_hex(16)
    tag = token[:8]
    base = Path(tempfile.mkdtemp(prefix="retool-host-"))
    base.chmod(0o755)
    places = [base / "hf_home" / "hub" / "datasets" / "train.jsonl", base / "workspace" / "project" / "data.jsonl"]
    if os.access(Path.cwd(), os.W_OK):
        places.append(Path.cwd() / f".env.retool-canary-{tag}")
    if ROOT:
        places += [Path(f"/workspace-retool-{tag}/checkout/data/aime.jsonl"), Path(f"/data/retool-canary-{tag}.jsonl"),
                   Path(f"/etc/retool-canary-{tag}"), Path(f"/var/lib/retool-shadow-{tag}")]
    made = []
    for path in places:
        for parent in reversed(path.parents):
            if not parent.exists():
                parent.mkdir(mode=0o755)
                made.append(parent)
        path.write_text(f'{{"answer": "{token}"}}\n')
        path.chmod(0o600 if "shadow" in path.name else 0o644)
    yield token, places
    for path in places:
        path.unlink(missing_ok=True)
    for directory in [*reversed(made), base]:
        shutil.rmtree(directory, ignore_errors=True)


def _finder(paths: list[Path], *, walk: bool = True) -> str:
    """Model code that reads each path, then walks the whole filesystem for files named like them."""
    names = sorted({p.name for p in paths})
    reads = "".join(f"try: print(open({str(p)!r}).read())\nexcept OSError as e: print(type(e).__name__)\n"
                    for p in paths)
    if not walk:
        return reads
    return (
        "import os\n" + reads
        + f"names = set({names!r})\n"
        "for top, dirs, files in os.walk('/'):\n"
        "    if top == '/': dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev')]\n"
        "    for name in names & set(files):\n"
        "        try: print(open(os.path.join(top, name)).read())\n"
        "        except OSError: pass\n"
        "print('walked')\n"
    )


def test_host_data_is_invisible(sandbox, host_data):
    token, paths = host_data
    finder = _finder(paths)
    result = sandbox.run_sync(finder, timeout=120)
    assert result.status == "ok" and result.stdout.endswith("walked\n"), result
    assert token not in result.output
    # The positive control: the trainer reads every one, and every one but the 0600 file is open to any uid
    # (each directory above it searchable, the file readable by others): a uid of its own would not stop a call.
    assert all(p.read_text().count(token) == 1 for p in paths)
    for path in (p for p in paths if "shadow" not in p.name):
        assert path.stat().st_mode & 0o004 and all(d.stat().st_mode & 0o001 for d in path.parents), path


def test_the_problems_shipped_in_the_package_read_as_empty(sandbox):
    """The view binds the package for its code; its problem files (gold answers: the bare `gym.make`'s default
    dataset) read as empty, by path and by a walk."""
    shipped = [Path(p) for p in isolation.package_datasets()]
    assert any(p.name == "math_sample.jsonl" for p in shipped)
    assert shipped and all(p.read_text().count('"answer"') > 0 for p in shipped)  # the trainer reads them
    code = ("import os\nfor path in {paths!r}:\n    print(path, repr(open(path).read()))\n"
            "print(sum(os.path.getsize(os.path.join(t, n)) for t, _, ns in os.walk({package!r}) for n in ns "
            "if n.endswith('.jsonl')))")
    result = sandbox.run_sync(code.format(paths=[str(p) for p in shipped], package=str(shipped[0].parent.parent)))
    assert result.status == "ok", result
    assert '"answer"' not in result.output and result.stdout.splitlines()[-1] == "0", result.output
    assert all(f"{p} ''" in result.stdout for p in shipped)


PROBE_PACKAGE_UNDER_TMP = """
import json
from retool_env.sandbox import LocalSandbox
from retool_env.sandbox.forkserver import isolation
shipped = isolation.package_datasets()
code = "for path in %r:\\n    print(repr(open(path).read()))" % (shipped,)
with LocalSandbox(timeout=4, memory_mb=256) as sb:
    result = sb.run_sync(code)
print(json.dumps({"shipped": shipped, "status": result.status, "output": result.output}))
"""


def test_the_problems_shipped_read_as_empty_when_the_package_lives_under_tmp(tmp_path):
    """A checkout under /tmp (a CI clone, `mktemp -d`): each child binds the package back over its own /tmp, and
    the problem files read as empty there as well."""
    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip("pytest's temporary directory is not under /tmp")
    checkout = tmp_path / "checkout"
    shutil.copytree(Path(isolation.__file__).parents[2], checkout / "retool_env",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", PROBE_PACKAGE_UNDER_TMP], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["shipped"] and all(p.startswith(str(checkout)) for p in seen["shipped"]), seen
    assert seen["status"] == "ok" and seen["output"].splitlines() == ["''"] * len(seen["shipped"]), seen


def test_the_view_holds_only_the_allowlist(sandbox):
    """Top-level entries, /etc, /dev and the trainer's working directory, seen from a call."""
    code = ("import os, json\nprint(json.dumps([sorted(os.listdir('/')), sorted(os.listdir('/etc')), "
            "sorted(os.listdir('/dev')), os.path.isdir({cwd!r}) and os.listdir({cwd!r}), dict(os.environ)]))")
    result = sandbox.run_sync(code.format(cwd=str(Path.cwd())))
    top, etc, dev, cwd_seen, env = json.loads(result.stdout)
    assert set(top) <= {"dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sys", "tmp", "usr",
                        *{p.strip("/").split("/")[0] for p in isolation.python_paths()}}, top
    assert set(etc) <= {"ld.so.cache", "passwd", "group", "hosts", "nsswitch.conf", "hostname"}, etc
    assert set(dev) <= {"null", "zero", "full", "random", "urandom", "tty", "shm", "fd", "stdin", "stdout",
                        "stderr"}, dev
    assert "HF_HOME" not in env and not set(env) - {"PATH", "HOME", "TMPDIR", "LANG"}, env
    if not any(str(Path.cwd()).startswith(p) for p in isolation.python_paths()):
        # Of the trainer's working directory (the checkout), only the venv and the package inside it, if any.
        assert set(cwd_seen or []) <= set(probes.visible_entries(str(Path.cwd()))), cwd_seen


def test_host_tmp_is_untouched_and_private_per_call(sandbox):
    name = f"retool-canary-{secrets.token_hex(4)}"
    write = f"open('/tmp/{name}', 'w').write('left'); open('/dev/shm/{name}', 'w').write('left'); print('wrote')"
    read = f"import os\nprint(os.path.exists('/tmp/{name}'), os.path.exists('/dev/shm/{name}'))"
    assert sandbox.run_sync(write).stdout == "wrote\n"
    assert sandbox.run_sync(read).stdout == "False False\n"  # a later call does not find it
    assert not Path(f"/tmp/{name}").exists() and not Path(f"/dev/shm/{name}").exists()  # nor the host


def test_extra_paths_are_read_only(tmp_path):
    data = tmp_path / "shared"
    data.mkdir()
    data.chmod(0o755)
    tmp_path.chmod(0o755)
    (data / "table.txt").write_text("42")
    (data / "table.txt").chmod(0o644)
    code = f"print(open('{data}/table.txt').read())\nopen('{data}/written', 'w')"
    with LocalSandbox(prefork=0, extra_paths=[str(data)]) as sb:
        result = sb.run_sync(code)
    assert result.stdout == "42\n" and "Read-only file system" in result.output, result
    assert not (data / "written").exists()
    with pytest.raises(FileNotFoundError, match="extra_paths"):
        LocalSandbox(prefork=0, extra_paths=[str(tmp_path / "missing")])


# -- fail closed --------------------------------------------------------------------------------------------------


def test_no_view_refuses_to_start_by_default():
    with pytest.raises(RuntimeError, match=r"refuses to start: missing .*read-only filesystem.*Fix: "):
        LocalSandbox(isolation="none", prefork=0).start()
    if ROOT:
        with pytest.raises(ValueError, match="uid 0"):
            LocalSandbox(drop_uid=False)


def test_degrading_is_explicit_and_never_runs_code_as_root():
    """require="none" starts without the view; as root, still never as uid 0: it refuses where a child could
    not run as its own uid (a Python under a 0700 directory, as pyenv under /root)."""
    sb = LocalSandbox(isolation="none", require="none", prefork=0)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sb.start()
    except RuntimeError as exc:
        assert ROOT and not isolation.python_reachable_by_others(), exc
        assert "uid per call" in str(exc) and "pass require='none'" not in str(exc)  # no way around it
        return
    assert any("read-only filesystem" in str(w.message) for w in caught), caught
    with sb:
        uid = sb.run_sync("import os; print(os.getuid())").stdout.strip()
    assert uid != "0" if ROOT else uid == str(os.getuid())


def test_no_bubblewrap_anywhere(sandbox):
    """The view is the sandbox's own (mount(2)): no process of its tree is bubblewrap, wherever it is installed."""
    names = set()
    for pid in [sandbox.server_pid, *tree(sandbox.server_pid)]:
        with open(f"/proc/{pid}/comm") as f:
            names.add(f.read().strip())
    assert "bwrap" not in names and sandbox.wrapper == "namespaces", names


@pytest.mark.skipif(not ROOT or isolation.python_reachable_by_others(),
                    reason="needs root and a Python under a directory other uids cannot search (pyenv under /root)")
def test_a_python_under_a_private_directory_still_gets_a_uid_per_call(sandbox):
    """The cause of a uid layer silently dropped: a child as its own uid could not import from under /root (0700).
    The view's directories are 0755, so each call keeps its own non-zero uid and can still import lazily."""
    result = sandbox.run_sync("import os, fractions, sqlite3\nprint(os.getuid(), fractions.__file__)")
    uid, path = result.stdout.split()
    assert int(uid) >= uids.FIRST_UID and path.startswith(os.path.dirname(os.__file__)), result


# -- no channel between calls, no session affects another ----------------------------------------------------------

SPEAKER = """\
import ctypes, time
tag = {tag!r}
ctypes.CDLL(None).prctl(15, tag.encode(), 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/comm
try:
    open('/proc/self/comm', 'w').write(tag)
except OSError:  # not dumpable: its /proc entries are root's
    pass
time.sleep({hold})
print('spoke')
"""

LISTENER = """\
import glob, os, time
tag, me, heard, pids = {tag!r}, os.getpid(), [], set()
deadline = time.time() + {hold}
while time.time() < deadline:
    for entry in filter(str.isdigit, os.listdir('/proc')):
        pids.add(int(entry))
        for name in ('comm', 'cmdline', 'statm', 'status'):
            try:
                text = open(f'/proc/{{entry}}/{{name}}', 'rb').read()
            except OSError:
                continue
            if tag.encode() in text:
                heard.append(name)
    time.sleep(0.05)
groups = [p for p in glob.glob('/sys/fs/cgroup/**/memory.*', recursive=True)]
print('pids', sorted(pids - {{me}}), 'heard', sorted(set(heard)), 'groups', groups[:3])
"""


def test_concurrent_calls_see_neither_each_other_nor_their_cgroup_files(sandbox):
    """A call names itself (PR_SET_NAME); another, at the same time, reads every /proc entry and looks for slot
    cgroup files: it finds no process but its own, no name and no memory figure of another call."""
    tag = f"t{secrets.token_hex(6)}"[:15]
    speaker = sandbox.run(SPEAKER.format(tag=tag, hold=2.5), timeout=6)
    seen_on_host: list[str] = []

    async def main():
        spoke = asyncio.ensure_future(speaker)
        await asyncio.sleep(0.8)
        for pid in tree(sandbox.server_pid):  # the control: the name really is there, read from the host
            with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
                seen_on_host.append(f.read().strip())
        listeners = await asyncio.gather(
            sandbox.run(LISTENER.format(tag=tag, hold=1.0), timeout=6),
            sandbox.run(LISTENER.format(tag=tag, hold=1.0), timeout=6, session="listener"),
        )
        return await spoke, listeners

    spoke, listeners = asyncio.run(main())
    assert spoke.stdout == "spoke\n", spoke
    assert tag in seen_on_host, seen_on_host
    for listener in listeners:
        assert listener.stdout == "pids [] heard [] groups []\n", listener
    asyncio.run(sandbox.close_session("listener"))


CHAIN = """\
import ctypes, os, time
def link():
    while True:  # each generation leaves its group and forks as it exits: a pass over /proc finds the next late
        if os.fork():
            os._exit(0)
        os.setpgid(0, 0)
        prctl(15, b'chainlink', 0, 0, 0)  # PR_SET_NAME: how the host tells them apart
prctl = ctypes.CDLL(None).prctl
for _ in range(12):
    if os.fork() == 0:
        link()
time.sleep(0.2)
print('returned')
"""


def test_a_chain_that_forks_as_it_exits_does_not_outlive_its_call(sandbox):
    """Processes that change group and fork as they exit, generation after generation: when the call returns,
    nothing of them runs (seen from the host, a second later, three times over)."""
    server = sandbox.server_pid
    for attempt in range(3):
        result = sandbox.run_sync(CHAIN, session="chain", timeout=4)
        assert result.stdout.startswith("returned"), result
        time.sleep(1.0)
        alive = []
        for pid, state in tree(server).items():
            with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "chainlink" and state != "Z":
                    alive.append((pid, state))
        assert alive == [], (attempt, alive)
    asyncio.run(sandbox.close_session("chain"))


def test_a_session_over_its_share_is_the_one_closed_and_is_told():
    """A sibling holds its state while an attacker's session holds more than the whole budget: the attacker's
    session is the one closed, and its next call says so in its output (not a bare NameError)."""
    hold = "block = b'x' * ({mb} << 20)\nlen(block)"

    async def main():
        with LocalSandbox(timeout=20, memory_mb=512, session_memory_mb=300, max_sessions=4) as sb:
            assert (await sb.run("secret = 41", session="victim")).ok
            assert (await sb.run(hold.format(mb=80), session="victim")).ok
            grown = await sb.run(hold.format(mb=400), session="attacker")
            info = await sb.info()
            victim = await sb.run("secret + 1 + 0 * len(block)", session="victim")
            attacker = await sb.run("len(block)", session="attacker")
            again = await sb.run("print('fresh')", session="attacker")
            return grown, info, victim, attacker, again

    grown, info, victim, attacker, again = asyncio.run(main())
    assert grown.ok, grown
    assert info["sessions_evicted"] == 1 and info["session_memory_mb"] <= 300, info
    assert (victim.status, victim.stdout) == ("ok", "42\n"), victim
    assert attacker.status == "error" and "memory budget" in attacker.output, attacker
    assert (again.stdout, again.note) == ("fresh\n", ""), again


def test_a_call_group_holds_its_forks_during_a_sweep():
    """`CallGroup.forks_held`, which the sweep runs inside: a process in the group cannot fork there, and can again
    after, under the limit it had."""
    from retool_env.sandbox.forkserver.cgroups import Delegation

    delegation, why = Delegation.create()
    if delegation is None:
        pytest.skip(f"no cgroup here: {why}")
    group = delegation.group("held")
    try:
        group.create(memory_mb=256, pids=16, cpus=1.0)
        ask, answer = os.pipe(), os.pipe()
        member = os.fork()
        if member == 0:  # forks once per byte it reads, and writes back whether the fork worked
            os.close(ask[1])
            group.join()
            while os.read(ask[0], 1):
                try:
                    child = os.fork()
                except OSError:
                    os.write(answer[1], b"n")
                    continue
                if child == 0:
                    os._exit(0)
                os.waitpid(child, 0)
                os.write(answer[1], b"y")
            os._exit(0)

        os.close(ask[0])

        def forks() -> bytes:
            os.write(ask[1], b".")
            return os.read(answer[0], 1)

        assert forks() == b"y"
        limit = f"{group.dirs[0 if group.version == 2 else 1]}/pids.max"
        with group.forks_held():
            assert forks() == b"n"
        assert forks() == b"y" and Path(limit).read_text().strip() == "16"
        os.close(ask[1])
        os.waitpid(member, 0)
    finally:
        delegation.remove()


def test_the_sweep_kills_a_chain_that_one_pass_misses(tmp_path):
    """The mechanism, on the host where forks are fast: processes in one session that fork as they exit. One pass
    over /proc often leaves some of them running; `confine.sweep` leaves none. Each link also stops at a flag the
    test raises at its end, so the host keeps no chain whatever the sweep did."""
    from retool_env.sandbox.forkserver import confine

    stop = str(tmp_path / "stop")
    leader = os.fork()
    if leader == 0:
        os.setsid()
        for _ in range(8):
            if os.fork() == 0:
                while not os.path.exists(stop):
                    if os.fork():
                        os._exit(0)
                os._exit(0)
        while not os.path.exists(stop):
            time.sleep(0.1)
        os._exit(0)
    try:
        time.sleep(0.5)
        assert confine.sweep(leader) == 0
        time.sleep(0.3)
        assert confine._live(confine.processes_of_session(leader)) == []
    finally:
        open(stop, "w").close()
        confine.sweep(leader)
        os.waitpid(leader, 0)
