"""Each fork server's own block of uids, so two servers on one machine never give a call the same uid.

What the kernel counts or allows per uid belongs to the uid, not to the server that handed it out: `RLIMIT_NPROC`
(for children without a user namespace; with one, the count of their namespace, and the host's count above it),
pipe buffers, inotify watches and instances, key quotas, pending signals, message queue bytes, and the right to
signal a process. Two servers counting from the same first uid would share all of that, so a call in one could
exhaust what a call in the other needs.

As root, `UidBlock.acquire` takes one block of `BLOCK_SIZE` uids between `FIRST_UID` and `LAST_UID`, starting from
a random one (servers in separate containers, which see separate lock directories, then still rarely meet), and
holds it with an exclusive `flock` on `<LOCK_DIR>/<block>.lock`, a root-owned directory. The server inherits the
lock's descriptor and its zygote keeps it: the kernel drops the lock when the last process holding it dies, however
it dies, so a crash leaves no block taken. A block whose lock is free while some process still runs as one of its
uids (a call of a server that died a moment ago, not yet gone) is skipped. A server's two zygotes (server.py) take
half of its block each; the last uid of each half is that zygote's probe children's, the others are given to calls
and sessions.

Unprivileged there is nothing to allocate: an unprivileged user namespace maps one uid, so every child keeps the
user's uid, each in a user namespace of its own (where the kernel counts `RLIMIT_NPROC` apart).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import stat
from dataclasses import dataclass

FIRST_UID = 2_000_000_000  # far above any real account
LAST_UID = 2**31 - 1  # uids from 2**31 up are read as negative numbers by some tools
BLOCK_SIZE = 16384
BLOCKS = (LAST_UID + 1 - FIRST_UID) // BLOCK_SIZE
LOCK_DIRS = ("/run/retool-env/uid-blocks", "/tmp/retool-env-root/uid-blocks")  # the first this machine allows


@dataclass
class UidBlock:
    """Uids `first` .. `first + size - 1`, reserved while the lock on `fd` is held."""

    index: int
    fd: int

    @property
    def first(self) -> int:
        return FIRST_UID + self.index * BLOCK_SIZE

    @property
    def size(self) -> int:
        return BLOCK_SIZE

    def __contains__(self, uid: int) -> bool:
        return self.first <= uid < self.first + BLOCK_SIZE

    def close(self) -> None:
        """Close this process's descriptor: the lock is released once no process holds the file open."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @classmethod
    def take(cls, index: int, lock_dir: str | None = None) -> UidBlock | None:
        """Block `index` if its lock is free and no process runs as one of its uids; else None."""
        path = os.path.join(lock_dir or _lock_dir(), f"{index}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        block = cls(index, fd)
        if any(uid in block for uid in uids_in_use()):
            block.close()
            return None
        return block

    @classmethod
    def acquire(cls) -> UidBlock:
        """A free block, looked for from a random one on. Raises RuntimeError if every block is taken."""
        lock_dir = _lock_dir()
        start = random.randrange(BLOCKS)
        for offset in range(BLOCKS):
            block = cls.take((start + offset) % BLOCKS, lock_dir)
            if block is not None:
                return block
        raise RuntimeError(f"all {BLOCKS} uid blocks of {lock_dir} are held by running sandbox servers")


def uids_in_use() -> set[int]:
    """Every uid (real, effective, saved or filesystem) a process in this pid namespace runs as, from /proc."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, StopIteration, ValueError), open(f"/proc/{entry}/status") as f:
            line = next(line for line in f if line.startswith("Uid:"))
            found.update(int(uid) for uid in line.split()[1:])
    return found


def _lock_dir() -> str:
    """The first of `LOCK_DIRS` that is (or can be made) a directory only root can write to, all the way down."""
    problems = []
    for path in LOCK_DIRS:
        try:
            _make_root_directory(path)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        return path
    raise RuntimeError("no directory for the sandbox's uid-block locks (" + "; ".join(problems) + ")")


def _make_root_directory(path: str) -> None:
    """Create `path` (0755, root's) where missing; refuse one that another uid could write to or replace."""
    parent = os.path.dirname(path)
    if parent != path:
        if not os.path.isdir(parent):
            _make_root_directory(parent)
        else:
            _check_owned(parent, sticky_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755)
    _check_owned(path, sticky_ok=False)


def _check_owned(path: str, *, sticky_ok: bool) -> None:
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        raise OSError(errno.EPERM, f"{path} is not a directory owned by root")
    if info.st_mode & 0o022 and not (sticky_ok and info.st_mode & stat.S_ISVTX):
        raise OSError(errno.EPERM, f"{path} is writable by other users")
