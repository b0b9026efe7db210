"""Inside the sandboxed child: capture output into shared memory and run one cell, Jupyter-style.

Output goes to a shared memory file (a memfd private to one call: the server maps it, the call's child maps it, no
other process holds it) rather than a pipe so that whatever was printed before a SIGKILL survives it, and so that a
100 MB print costs the server nothing: each stream keeps its first `head` bytes and a ring of its last `tail`
bytes, plus a count of everything written.
"""

from __future__ import annotations

import ast
import io
import linecache
import mmap
import os
import struct
import sys
import traceback
from typing import Any

CELL = "<cell>"
# Header: status word, then the byte counts written to stdout and stderr.
_HEADER = struct.Struct("<IIQQ")
STATUS_UNSET, STATUS_OK, STATUS_ERROR, STATUS_MEMORY = 0, 1, 2, 3


class OutputBuffer:
    """A shared mapping of a memfd holding a status word and two head+tail captured streams."""

    def __init__(self, cap: int, fd: int | None = None) -> None:
        """A new buffer (`fd` None: see `fd` to hand it to the child), or the child's view of an existing one."""
        self.head = cap // 2
        self.tail = cap - self.head
        self.stream_size = self.head + self.tail
        size = _HEADER.size + 2 * self.stream_size
        self.fd = os.memfd_create("retool-output", os.MFD_CLOEXEC) if fd is None else fd
        if fd is None:
            os.ftruncate(self.fd, size)
        self.mem = mmap.mmap(self.fd, size)  # MAP_SHARED: the server reads what the child wrote, even after a kill

    def release_fd(self) -> None:
        """Close the descriptor once it has been handed over; the mapping stays."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def reset(self) -> None:
        _HEADER.pack_into(self.mem, 0, STATUS_UNSET, 0, 0, 0)

    def set_status(self, status: int) -> None:
        struct.pack_into("<I", self.mem, 0, status)

    def status(self) -> int:
        return _HEADER.unpack_from(self.mem, 0)[0]

    def _count(self, stream: int) -> int:
        return _HEADER.unpack_from(self.mem, 0)[2 + stream]

    def write(self, stream: int, data: bytes) -> None:
        base = _HEADER.size + stream * self.stream_size
        pos = self._count(stream)
        total = pos + len(data)
        if pos < self.head:
            n = min(self.head - pos, len(data))
            self.mem[base + pos : base + pos + n] = data[:n]
            data, pos = data[n:], pos + n
        if len(data) > self.tail:  # only the last `tail` bytes can survive
            pos += len(data) - self.tail
            data = data[-self.tail :]
        ring = base + self.head
        while data:
            offset = (pos - self.head) % self.tail
            n = min(self.tail - offset, len(data))
            self.mem[ring + offset : ring + offset + n] = data[:n]
            data, pos = data[n:], pos + n
        struct.pack_into("<Q", self.mem, 8 + 8 * stream, total)

    def read(self, stream: int) -> tuple[str, bool]:
        """The captured text and whether anything was dropped from the middle."""
        base = _HEADER.size + stream * self.stream_size
        total = self._count(stream)
        head = bytes(self.mem[base : base + min(total, self.head)])
        if total <= self.head:
            return head.decode("utf-8", "replace"), False
        ring = bytes(self.mem[base + self.head : base + self.stream_size])
        if total <= self.stream_size:
            return (head + ring[: total - self.head]).decode("utf-8", "replace"), False
        start = (total - self.head) % self.tail
        tail = ring[start:] + ring[:start]
        dropped = total - self.stream_size
        marker = f"\n... [{dropped} bytes truncated] ...\n"
        return head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace"), True

    def close(self) -> None:
        self.release_fd()
        self.mem.close()


class _StreamRaw(io.RawIOBase):
    def __init__(self, buffer: OutputBuffer, stream: int) -> None:
        self._buffer, self._stream = buffer, stream

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        self._buffer.write(self._stream, data)
        return len(data)


def capture(buffer: OutputBuffer) -> None:
    """Point sys.stdout/sys.stderr at the shared buffer, unbuffered so nothing is lost to a kill."""
    sys.stdout = io.TextIOWrapper(_StreamRaw(buffer, 0), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
    sys.stderr = io.TextIOWrapper(_StreamRaw(buffer, 1), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)


def split_trailing_expression(tree: ast.Module, source: str) -> ast.expr | None:
    """Pop and return the last statement if it is a bare expression not silenced by a trailing `;` (Jupyter rule)."""
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return None
    last = tree.body[-1]
    lines = source.splitlines()
    if last.end_lineno is not None and last.end_col_offset is not None and last.end_lineno <= len(lines):
        rest = lines[last.end_lineno - 1].encode("utf-8")[last.end_col_offset :].decode("utf-8", "replace")
        if rest.lstrip().startswith(";"):
            return None
    tree.body.pop()
    return last.value


def _format_exception(exc: BaseException, max_lines: int) -> str:
    """The traceback from the first frame of the cell on, cut to its last `max_lines` lines."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL:
        tb = tb.tb_next
    if isinstance(exc, SyntaxError):
        tb = None
    lines = "".join(traceback.format_exception(type(exc), exc, tb)).splitlines()
    if max_lines > 0 and len(lines) > max_lines:
        lines = (["Traceback (most recent call last):", "  ...", *lines[-(max_lines - 2) :]] if max_lines > 2
                 else lines[-max_lines:])
    return "\n".join(lines) + "\n"


def run_cell(source: str, namespace: dict[str, Any], *, echo: bool, traceback_lines: int) -> tuple[int, int]:
    """Execute `source` in `namespace`; return (status, exit code). Never raises."""
    # Each line as a file's would be, newline included: a traceback's carets under the last line are otherwise
    # one column off.
    lines = [line if line.endswith("\n") else line + "\n" for line in source.splitlines(True)]
    linecache.cache[CELL] = (len(source), None, lines, CELL)
    try:
        try:
            tree = ast.parse(source, CELL, "exec")
            last = split_trailing_expression(tree, source) if echo else None
            exec(compile(tree, CELL, "exec"), namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last), CELL, "eval"), namespace)
                if value is not None:
                    print(repr(value))
            return STATUS_OK, 0
        except SystemExit as exc:
            code = exc.code
            if code is None or code == 0:
                return STATUS_OK, 0
            if isinstance(code, int):
                return STATUS_ERROR, code & 0xFF
            print(code, file=sys.stderr)
            return STATUS_ERROR, 1
        except MemoryError as exc:
            sys.stderr.write(_format_exception(exc, traceback_lines))
            return STATUS_MEMORY, 1
        except BaseException as exc:
            sys.stderr.write(_format_exception(exc, traceback_lines))
            return STATUS_ERROR, 1
    except BaseException:  # the reporting itself failed (e.g. out of memory while formatting)
        return STATUS_ERROR, 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
