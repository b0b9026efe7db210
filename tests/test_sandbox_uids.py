"""Each sandbox server's own uid block (uids.py), checked from outside: the uids its processes run as, per-uid
kernel counts between servers, and a block freed by the kernel when the server holding it dies."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from retool_env.sandbox import LocalSandbox
from retool_env.sandbox.forkserver import uids

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per call (and so a uid block) needs root"),
]


def _tree_uids(pid: int) -> set[int]:
    """The real uids of every process below `pid`, read from the host's /proc."""
    parents, found = {}, {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/status") as f:
                found[int(entry)] = int(next(line for line in f if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    below, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        below |= frontier
    return {found[p] for p in below if p in found}


def test_two_servers_run_their_calls_as_disjoint_uids():
    """Seen from the host while both run: every process of each server's tree but the server and its zygote runs
    as a uid of that server's own block (waiting children and stopped session heads alike), the blocks do not
    overlap, and the uid a call reports lies in its server's block."""
    with LocalSandbox(prefork=3) as first, LocalSandbox(prefork=3) as second:
        servers = (first, second)
        for sandbox in servers:
            for name in ("a", "b"):  # a stopped session head keeps its uid between calls
                sandbox.run_sync("x = 1", session=name)
        said = [int(sb.run_sync("import os\nprint(os.getuid())").stdout) for sb in servers]
        time.sleep(1.0)  # the pools refill
        blocks = [sb.uid_block for sb in servers]
        seen = [_tree_uids(sb.server_pid) for sb in servers]
    assert set(blocks[0]).isdisjoint(blocks[1]), blocks
    for block, uids_seen, uid in zip(blocks, seen, said, strict=True):
        calls = uids_seen - {0}
        assert len(calls) >= 5, seen  # 3 waiting children and 2 session heads, each its own uid
        assert all(u in block for u in calls), (blocks, seen)
        assert uid in block and uid >= uids.FIRST_UID, (said, blocks)


_EXHAUST = (
    "import threading\nstop = threading.Event()\nn = 0\n"
    "try:\n    while True:\n        threading.Thread(target=stop.wait, daemon=True).start()\n        n += 1\n"
    "except RuntimeError:\n    pass\nprint(n)"
)
_FORK = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('forked')"


def test_a_call_that_exhausts_its_process_limit_does_not_stop_another_servers_forks():
    """RLIMIT_NPROC counts per uid. Without a user namespace the count is the host's: before uid blocks, both servers
    gave their first session the same uid, and the second one's fork failed with EAGAIN while the first session's
    cell held the whole limit. The greedy cell holds its threads while the victim forks; a session keeps no thread
    between calls, so afterwards the cell is an `error` and its limit is free again."""

    async def main():
        kw = {"prefork": 1, "userns": False, "timeout": 60, "max_sessions": 4}
        with LocalSandbox(**kw) as greedy, LocalSandbox(**kw) as victim:
            holding = asyncio.ensure_future(greedy.run(_EXHAUST + "\nimport time\ntime.sleep(6)", session="greedy"))
            await asyncio.sleep(3)  # the greedy cell has made its threads and holds them
            forked = await victim.run(_FORK, session="victim")
            threaded = await victim.run("import threading\nt = threading.Thread(target=print, args=('thread',))\n"
                                        "t.start()\nt.join()")
            exhausted = await holding
            again = await greedy.run(_FORK, session="greedy")
            await greedy.close_session("greedy")
            await victim.close_session("victim")
        return exhausted, forked, threaded, again

    exhausted, forked, threaded, again = asyncio.run(main())
    assert exhausted.status == "error" and int(exhausted.stdout) >= 900, exhausted
    assert "thread(s) running" in exhausted.note, exhausted
    assert (forked.status, forked.stdout) == ("ok", "forked\n"), forked
    assert (threaded.status, threaded.stdout) == ("ok", "thread\n"), threaded
    assert (again.status, again.stdout) == ("ok", "forked\n"), again  # its threads went with the cell


def test_a_block_is_taken_once_and_freed_when_its_holder_dies():
    """The lock lives in the holder's open file: killing the holder (no cleanup runs) frees the block."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "from retool_env.sandbox.forkserver import uids\nimport sys, time\n"
         "block = uids.UidBlock.acquire()\nprint(block.index, flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        index = int(holder.stdout.readline())
        assert uids.UidBlock.take(index) is None  # held elsewhere
        mine = uids.UidBlock.acquire()
        assert mine.index != index
        mine.close()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    block = uids.UidBlock.take(index)
    assert block is not None and block.index == index
    block.close()


def test_a_block_with_a_process_still_running_as_one_of_its_uids_is_skipped():
    """A server that died a moment ago may leave a call still dying: its block is not handed out until it is gone."""
    probe = uids.UidBlock.acquire()
    index, uid = probe.index, probe.first + 7
    probe.close()
    straggler = subprocess.Popen(["sleep", "600"], user=uid, group=uid)
    try:
        deadline = time.time() + 10
        while uid not in uids.uids_in_use() and time.time() < deadline:
            time.sleep(0.05)
        assert uids.UidBlock.take(index) is None
    finally:
        straggler.kill()
        straggler.wait()
    block = uids.UidBlock.take(index)
    assert block is not None
    block.close()


def test_the_lock_directory_is_root_owned_and_closed_to_others():
    path = uids._lock_dir()
    info = os.lstat(path)
    assert info.st_uid == 0 and not info.st_mode & 0o022, oct(info.st_mode)
