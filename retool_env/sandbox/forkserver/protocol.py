"""How the sandbox's processes talk.

- Client and server (and server and child, for the code): one request per connection, each message a 4-byte
  big-endian length and JSON.
- Server and zygote: a SOCK_SEQPACKET pair, one JSON message per packet, descriptors passed alongside.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not imported at run time: the lean zygote (start.py) holds no asyncio
    import asyncio

_FRAME = struct.Struct(">I")
_MAX_FDS = 4
_FD = array.array("i")


def pack(obj: Any) -> bytes:
    data = json.dumps(obj).encode("utf-8")
    return _FRAME.pack(len(data)) + data


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame_blocking(fd: int) -> Any | None:
    header = _read_exact(fd, _FRAME.size)
    if header is None:
        return None
    body = _read_exact(fd, _FRAME.unpack(header)[0])
    return None if body is None else json.loads(body)


def read_frame_with_fds(sock: socket.socket) -> tuple[Any | None, list[int]]:
    """A frame and the descriptors sent with it (on a stream socket they arrive with its first bytes); (None, [])
    once the peer is gone."""
    header, fds, _, _ = socket.recv_fds(sock, _FRAME.size, _MAX_FDS)
    rest = _read_exact(sock.fileno(), _FRAME.size - len(header)) if header else None
    body = None if rest is None else _read_exact(sock.fileno(), _FRAME.unpack(header + rest)[0])
    if body is None:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(body), fds


async def read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    return json.loads(await reader.readexactly(size))


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode("utf-8")], list(fds))


def recv_message(sock: socket.socket, flags: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """(message, descriptors), or (None, []) when the peer is gone. With `socket.MSG_DONTWAIT` in `flags`, raises
    BlockingIOError when no message is waiting."""
    # socket.recv_fds, with the flags it ignores before Python 3.12.
    data, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_LEN(_MAX_FDS * _FD.itemsize), flags)
    received = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
    fds = received.tolist()
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds
