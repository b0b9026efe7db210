"""A SandboxFusion-compatible HTTP server over `LocalSandbox`, so SandboxFusion tools (verl's) work without Docker.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies) for `POST /run_code` and `GET /v1/ping`, and
answers as SandboxFusion does: a timeout is `Failed` with `run_result.status = TimeLimitExceeded`, any other failure
`Failed` with the return code, our explanatory note in `message`; a trailing expression is not echoed (the server's
sandbox is built with `echo=False`); a language SandboxFusion knows but this server does not run gets
`status: SandboxError`; a malformed request gets HTTP 400 with FastAPI's `{"detail": [{"loc": ["body", field],
"msg": ...}]}` naming each bad field. `files` and `fetch_files` must be empty: each call's scratch directory is
private to the sandbox, so they are refused with a `SandboxError` that says so, never ignored.

Model code run here is an adversary, so the server guards itself: a bearer token on every call but the ping
(`Authorization: Bearer <token>`, or HTTP Basic auth with the token as password, which is what clients that cannot
set headers send for a URL like `http://retool:<token>@127.0.0.1:8080`), 127.0.0.1 or a mode-0600 unix socket by
default, a read timeout against slow clients, a body timeout, a bound on the bytes of request bodies held at once (all
together, and per address); before a connection authenticates, a short header timeout, caps on head bytes and on
connections (see `FusionServer`). A signed request runs once: its nonce is claimed in a `NonceStore` on disk,
shared by the workers of `serve --workers N` and kept across restarts.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import json
import math
import os
import resource
import secrets
import stat
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .base import ExecResult, Sandbox, ToolStatus
from .fusion import AUTH_HEADER, CLOCK_SKEW, TOKEN_ENV, request_mac, response_mac

# SandboxFusion's `Language` literal: known languages other than Python get its SandboxError shape, unknown ones 400.
FUSION_LANGUAGES = frozenset([
    "python", "python2", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql", "rust",
    "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script", "jest",
    "verilog", "python_gpu", "lean", "swift", "racket", "gtest", "react",
])  # fmt: skip
_RUNS = {"python", "python3"}
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 408: "Request Timeout",
            411: "Length Required", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}
MAX_BODY = 64 << 20
MAX_INFLIGHT_BYTES = 256 << 20
READ_TIMEOUT = 30.0
BODY_TIMEOUT = 10.0  # seconds for a whole body once its head is in: 64 MiB at 6.7 MB/s; code bodies are KBs
HEADER_TIMEOUT = 10.0
MAX_LINE = 8 << 10  # bytes of the request line, and of any one header line
MAX_HEAD = 32 << 10  # bytes of the request line and all headers together
MAX_CONNECTIONS = 1024
MAX_CONNECTIONS_PER_PEER = 256  # not yet authenticated, from one address
_MAX_HEADERS = 100
_BODY_CHUNK = 1 << 20


def to_fusion_response(result: ExecResult) -> dict[str, Any]:
    """Our result in SandboxFusion's `RunCodeResponse` shape."""
    if result.status is ToolStatus.SANDBOX_ERROR:
        return fusion_error(result.note)
    run_status = "TimeLimitExceeded" if result.status is ToolStatus.TIMEOUT else "Finished"
    run = {
        "status": run_status,
        "execution_time": result.duration,
        "return_code": result.exit_code if result.exit_code is not None else -1,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
    status = "Success" if result.status is ToolStatus.OK else "Failed"
    return {"status": status, "message": result.note, "compile_result": None, "run_result": run,
            "executor_pod_name": None, "files": {}}


def fusion_error(message: str) -> dict[str, Any]:
    """SandboxFusion's own error shape (`status: SandboxError`, no results); its clients raise on it."""
    return {"status": "SandboxError", "message": message, "compile_result": None, "run_result": None,
            "executor_pod_name": None, "files": {}}


# ------------------------------------------------------------------------------------------------ the request
@dataclass(frozen=True)
class RunRequest:
    code: str
    language: str
    run_timeout: float
    memory_mb: int | None
    stdin: str | None
    files: dict[str, Any]
    fetch_files: list[Any]


def _error(field: str, message: str) -> dict[str, Any]:
    return {"loc": ["body", field], "msg": message, "type": "value_error"}


def _seconds(request: dict[str, Any], field: str, errors: list[dict[str, Any]]) -> float:
    value = request.get(field, 10)
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError
        seconds = float(value)
    except (TypeError, ValueError):
        errors.append(_error(field, f"must be a number of seconds, got {value!r}"))
        return 0.0
    if not math.isfinite(seconds) or seconds <= 0:
        errors.append(_error(field, f"must be a finite number of seconds above 0, got {value!r}"))
    return seconds


def _megabytes(request: dict[str, Any], errors: list[dict[str, Any]]) -> int | None:
    value = request.get("memory_limit_MB", -1)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(_error("memory_limit_MB",
                             f"must be an integer number of megabytes (-1: the default), got {value!r}"))
        return None
    return value if value > 0 else None


def parse_run_request(body: bytes) -> RunRequest | list[dict[str, Any]]:
    """The request, or the list of what is wrong with it (each naming its field), as FastAPI reports it."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return [{"loc": ["body"], "msg": f"not valid JSON: {exc}", "type": "json_invalid"}]
    if not isinstance(request, dict):
        return [{"loc": ["body"], "msg": "must be a JSON object", "type": "dict_type"}]
    errors: list[dict[str, Any]] = []
    code, language = request.get("code"), request.get("language", "python")
    if not isinstance(code, str):
        errors.append(_error("code", "field required" if code is None else f"must be a string, got {code!r}"))
    if not isinstance(language, str) or language not in FUSION_LANGUAGES | _RUNS:
        errors.append(_error("language", f"must be one of SandboxFusion's languages, got {language!r}"))
    run_timeout = _seconds(request, "run_timeout", errors)
    _seconds(request, "compile_timeout", errors)  # unused for Python, checked as SandboxFusion checks it
    memory_mb = _megabytes(request, errors)
    stdin = request.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        errors.append(_error("stdin", f"must be a string or null, got {stdin!r}"))
    files, fetch_files = request.get("files") or {}, request.get("fetch_files") or []
    if not isinstance(files, dict) or not all(isinstance(v, (str, type(None))) for v in files.values()):
        errors.append(_error("files", "must be an object from path to base64 content"))
    if not isinstance(fetch_files, list) or not all(isinstance(p, str) for p in fetch_files):
        errors.append(_error("fetch_files", "must be a list of paths"))
    if errors or not isinstance(code, str):
        return errors
    return RunRequest(code, language, run_timeout, memory_mb, stdin, files, fetch_files)


# ------------------------------------------------------------------------------------------------ access
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_token(token_file: str | None = None) -> tuple[str, str]:
    """(token, where it came from): the file, else `RETOOL_SANDBOX_TOKEN`, else a new random one."""
    if token_file:
        with open(token_file) as f:
            token = f.read().strip()
        if not token:
            raise ValueError(f"the token file {token_file} is empty")
        return token, token_file
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV], TOKEN_ENV
    return secrets.token_urlsafe(32), "generated"


def _presented_token(authorization: str) -> str:
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":  # http://user:<token>@host: clients that cannot set headers send this
        with contextlib.suppress(binascii.Error, UnicodeDecodeError):
            return base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
    return ""


def default_nonce_dir(token: bytes) -> str:
    """One directory per token and user on this machine (named by an HMAC: it reveals nothing of the token), so the
    workers of a server, and the server after a restart, find the same store."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    store = hmac.new(token, b"retool-nonce-store", hashlib.sha256).hexdigest()[:16]
    return os.path.join(base, f"retool-sandbox-nonces-{os.geteuid()}-{store}")


class NonceStore:
    """The nonces of signed requests already run, one empty file each (`O_EXCL` makes a claim atomic across
    processes), kept `2 * CLOCK_SKEW` seconds: as long as a request stamped with it could still be fresh.

    A store records when it was made (`.since`): a request stamped before that is refused, so a store that was lost
    (a reboot cleared /tmp) never lets a capture from before it run again.
    """

    def __init__(self, directory: str, ttl: float = 2 * CLOCK_SKEW) -> None:
        self.directory, self.ttl = directory, ttl
        self._since = self._open()
        self._next_sweep = 0.0

    def _open(self) -> float:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        info = os.lstat(self.directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise PermissionError(f"the nonce store {self.directory} must be a directory of uid {os.geteuid()} with "
                                  "mode 0700 (another user could replay or block signed requests); remove it or "
                                  "pass another nonce_dir")
        since, draft = os.path.join(self.directory, ".since"), os.path.join(self.directory, f".since.{os.getpid()}")
        with open(draft, "w") as f:
            f.write(repr(time.time()))
        with contextlib.suppress(FileExistsError):
            os.link(draft, since)  # atomic: the workers starting together all read the first one's time
        os.unlink(draft)
        with open(since) as f:
            return float(f.read())

    def claim(self, nonce: str, stamp: float) -> bool:
        """Whether a request with this nonce and time may run: stamped after the store began, and the nonce's first
        claim by any process sharing the store. Fails closed when the store cannot be written."""
        now = time.time()
        if now >= self._next_sweep:
            self._sweep(now)
        if stamp < self._since:
            return False
        path = os.path.join(self.directory, hashlib.sha256(nonce.encode()).hexdigest()[:32])
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileNotFoundError:  # the store was removed: begin a new one, which refuses what came before
            with contextlib.suppress(OSError):
                self._since = self._open()
            return False
        except OSError:  # FileExistsError: a replay; anything else: no record, so no run
            return False
        return True

    def _sweep(self, now: float) -> None:
        """Forget nonces past their time (any process's: one left by a process that died included)."""
        self._next_sweep = now + self.ttl / 4
        with contextlib.suppress(OSError), os.scandir(self.directory) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if not entry.name.startswith(".") and entry.stat().st_mtime + self.ttl < now:
                        os.unlink(entry.path)


class _HTTPError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------------------------------------ the server
@dataclass(eq=False)
class _Connection:
    peer: str
    transport: Any
    authenticated: bool = False
    counted: bool = True


class FusionServer:
    """Serves `POST /run_code` from a sandbox; `serve_forever` or use `start()`/`close()` around a test.

    `token` is required: a string that every call must present, or None for no authentication, which is refused
    unless the server listens on a loopback address or a unix socket (then any local user can run code through it).
    A call proves it holds the token by an HMAC of itself (`X-Retool-Auth`, what `SandboxFusionSandbox` sends: the
    token never travels, and the answer carries the server's HMAC so the client knows it reached this server), or by
    presenting the token itself (Bearer or Basic auth, what SandboxFusion's own clients can send).

    Before a connection has authenticated it is held to little: `header_timeout` for each request's head (request
    line and headers, at most `MAX_LINE` bytes a line and `MAX_HEAD` in all), at most `max_connections_per_peer`
    such connections from one address, and when `max_connections` are open a new one closes the oldest
    unauthenticated one (so idle connections never lock out a caller with the token). The open-file limit is raised
    at `start()` to fit. `read_timeout` bounds an authenticated connection's idle wait, `body_timeout` (at most
    `read_timeout`) a body's arrival. `max_inflight_bytes` bounds the body bytes held at once, counted as they
    arrive (a declared length reserves nothing, so bodies that never come hold nothing), and one address holds at
    most `max_inflight_bytes_per_peer` of them (default: a quarter, at least `max_body`): 413 for one body over
    `max_body`, 503 when a bound is reached. Signed requests' nonces go to a `NonceStore` in `nonce_dir` (default:
    `default_nonce_dir(token)`, which every server with this token on this machine shares).
    """

    def __init__(
        self,
        sandbox: Sandbox,
        host: str = "127.0.0.1",
        port: int = 8080,
        *,
        token: str | None,
        unix_socket: str | None = None,
        read_timeout: float = READ_TIMEOUT,
        header_timeout: float = HEADER_TIMEOUT,
        max_body: int = MAX_BODY,
        max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
        max_connections: int = MAX_CONNECTIONS,
        max_connections_per_peer: int = MAX_CONNECTIONS_PER_PEER,
        reuse_port: bool = False,
        body_timeout: float = BODY_TIMEOUT,
        max_inflight_bytes_per_peer: int | None = None,
        nonce_dir: str | None = None,
    ) -> None:
        if token is None and unix_socket is None and not is_loopback(host):
            raise ValueError(f"refusing to serve without a token on {host}: anyone who reaches it could run code; "
                             "pass a token, or listen on 127.0.0.1 or a unix socket")
        if token is not None and not token:
            raise ValueError("the token is empty")
        self.sandbox, self.host, self.port, self.unix_socket = sandbox, host, port, unix_socket
        self._token = None if token is None else token.encode()
        self.read_timeout, self.header_timeout = read_timeout, header_timeout
        self.body_timeout = min(body_timeout, read_timeout)
        self.max_body, self.max_inflight_bytes = max_body, max_inflight_bytes
        self.max_inflight_bytes_per_peer = (max(max_body, max_inflight_bytes // 4)
                                            if max_inflight_bytes_per_peer is None else max_inflight_bytes_per_peer)
        self.max_connections, self.max_connections_per_peer = max_connections, max_connections_per_peer
        self._inflight_bytes = 0
        self._inflight_per_peer: dict[str, int] = {}
        self._open = 0  # connections counted against max_connections
        self._waiting: OrderedDict[_Connection, None] = OrderedDict()  # not yet authenticated, oldest first
        self._per_peer: dict[str, int] = {}
        self._live: set[_Connection] = set()
        self._nonces = None if self._token is None else NonceStore(nonce_dir or default_nonce_dir(self._token))
        self.reuse_port = reuse_port  # several worker processes on one port, the kernel spreading connections
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        """Listen; returns the port (useful with port=0; 0 on a unix socket)."""
        raise_open_file_limit(2 * self.max_connections + 256)
        if self.unix_socket is not None:
            old_umask = os.umask(0o177)  # the socket is born mode 0600: no window where another user can connect
            try:
                self._server = await asyncio.start_unix_server(self._connection, self.unix_socket, backlog=1024,
                                                               limit=MAX_LINE)
            finally:
                os.umask(old_umask)
            return 0
        self._server = await asyncio.start_server(self._connection, self.host, self.port, backlog=1024,
                                                  reuse_port=self.reuse_port or None, limit=MAX_LINE)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"unix:{self.unix_socket}" if self.unix_socket else f"http://{self.host}:{self.port}/run_code"

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        """Stop listening and end every open connection (idle keep-alive ones included)."""
        if self._server is not None:
            self._server.close()
            for connection in list(self._live):
                connection.transport.abort()
            await asyncio.sleep(0.05)  # let their handlers see it and finish
            await self._server.wait_closed()
        if self.unix_socket is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.unix_socket)

    @property
    def connections(self) -> dict[str, int]:
        """Open connections, and those not yet authenticated: for tests and monitoring."""
        return {"open": self._open, "unauthenticated": len(self._waiting)}

    # -------------------------------------------------------------------------------------------- admission
    def _admit(self, writer: asyncio.StreamWriter) -> _Connection | None:
        peername = writer.get_extra_info("peername")
        peer = peername[0] if isinstance(peername, tuple) and peername else "unix"
        if self._per_peer.get(peer, 0) >= self.max_connections_per_peer:
            self._evict(peer)
        if self._open >= self.max_connections and not self._evict(None):
            return None  # every open connection has authenticated: this one waits for a free place elsewhere
        connection = _Connection(peer, writer.transport)
        self._live.add(connection)
        self._open += 1
        self._waiting[connection] = None
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        return connection

    def _evict(self, peer: str | None) -> bool:
        """Close the oldest unauthenticated connection (of `peer`, or of anyone); whether there was one."""
        for connection in self._waiting:
            if peer is None or connection.peer == peer:
                self._release(connection)
                connection.transport.abort()
                return True
        return False

    def _authenticated(self, connection: _Connection) -> None:
        if not connection.authenticated:
            connection.authenticated = True
            self._unwait(connection)

    def _unwait(self, connection: _Connection) -> None:
        if self._waiting.pop(connection, False) is None:
            self._per_peer[connection.peer] -= 1
            if not self._per_peer[connection.peer]:
                del self._per_peer[connection.peer]

    def _release(self, connection: _Connection) -> None:
        self._live.discard(connection)
        self._unwait(connection)
        if connection.counted:
            connection.counted = False
            self._open -= 1

    # -------------------------------------------------------------------------------------------- one connection
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = self._admit(writer)
        if connection is None:
            writer.transport.abort()
            return
        try:
            while True:
                # Idle: an authenticated connection may wait for its next request; any other has little time.
                idle = self.read_timeout if connection.authenticated else self.header_timeout
                try:
                    request_line = await asyncio.wait_for(reader.readline(), idle)
                except asyncio.TimeoutError:
                    return
                except (ValueError, asyncio.LimitOverrunError):
                    await self._respond(writer, 431, {"detail": f"request line over {MAX_LINE} bytes"}, False)
                    return
                if not request_line.strip():
                    return
                keep_alive = await self._request(connection, request_line, reader, writer)
                if not keep_alive:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            return
        finally:
            self._release(connection)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _request(self, connection: _Connection, request_line: bytes, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> bool:
        """Read, route and answer one request; returns whether the connection stays open."""
        held = [0]  # body bytes this request holds, released when it ends
        try:
            try:
                method, path, headers = await asyncio.wait_for(self._read_head(request_line, reader),
                                                               self.header_timeout)
                keep_alive = headers.get("connection", "").lower() != "close"
                if method == "GET" and path in ("/v1/ping", "/ping", "/health"):
                    await self._respond(writer, 200, "pong", keep_alive)
                    return keep_alive
                signed = self._signed(headers, method, path)
                if signed is None and not self._authorized(headers):
                    raise _HTTPError(401, f"missing or wrong token: send 'Authorization: Bearer <token>' (the token "
                                          f"`retool-env sandbox serve` printed, or ${TOKEN_ENV}), or put it in the URL "
                                          "as http://retool:<token>@host:port")
                self._authenticated(connection)
                length = self._content_length(method, headers)
                if headers.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = b""
                if length:
                    body = await asyncio.wait_for(self._read_body(connection.peer, reader, length, held),
                                                  self.body_timeout)
                if signed is not None and not hmac.compare_digest(hashlib.sha256(body).hexdigest(), signed[1]):
                    raise _HTTPError(401, f"the body does not match the SHA-256 signed in {AUTH_HEADER}")
            except asyncio.TimeoutError:
                await self._respond(writer, 408, {"detail": "the request did not arrive in time"}, keep_alive=False)
                return False
            except (ValueError, asyncio.LimitOverrunError):
                await self._respond(writer, 431, {"detail": "request line or headers too long"}, keep_alive=False)
                return False
            except _HTTPError as exc:
                await self._respond(writer, exc.code, {"detail": str(exc)}, keep_alive=False)
                return False
            try:
                code, payload = await self._route(method, path, body)
            except Exception as exc:  # a bug here must answer, not drop the connection
                code, payload = 500, {"detail": f"{type(exc).__name__}: {exc}"}
            await self._respond(writer, code, payload, keep_alive, nonce=signed[0] if signed else None)
            return keep_alive
        finally:
            self._hold(connection.peer, -held[0])

    async def _read_body(self, peer: str, reader: asyncio.StreamReader, length: int, held: list[int]) -> bytes:
        """The body, its bytes counted as they arrive: 503 when they would pass the server's bound or the peer's."""
        chunks: list[bytes] = []
        while held[0] < length:
            chunk = await reader.read(min(length - held[0], _BODY_CHUNK))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", length)
            if (self._inflight_bytes + len(chunk) > self.max_inflight_bytes
                    or self._inflight_per_peer.get(peer, 0) + len(chunk) > self.max_inflight_bytes_per_peer):
                raise _HTTPError(503, "the server holds as many request bytes as it may; retry shortly")
            self._hold(peer, len(chunk))
            held[0] += len(chunk)
            chunks.append(chunk)
        return b"".join(chunks)

    def _hold(self, peer: str, size: int) -> None:
        self._inflight_bytes += size
        total = self._inflight_per_peer.get(peer, 0) + size
        if total:
            self._inflight_per_peer[peer] = total
        else:
            self._inflight_per_peer.pop(peer, None)

    async def _read_head(self, request_line: bytes, reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
        parts = request_line.decode("latin-1").split()
        if len(parts) != 3:
            raise _HTTPError(400, "malformed request line")
        headers: dict[str, str] = {}
        size = len(request_line)
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            size += len(line)
            if len(headers) >= _MAX_HEADERS or size > MAX_HEAD:
                raise _HTTPError(431, f"over {_MAX_HEADERS} headers or {MAX_HEAD} bytes of headers")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return parts[0], parts[1].split("?")[0], headers

    def _signed(self, headers: dict[str, str], method: str, path: str) -> tuple[str, str] | None:
        """(nonce, body SHA-256) of a request whose `X-Retool-Auth` MAC is right, fresh and not seen before."""
        value = headers.get(AUTH_HEADER.lower())
        if self._token is None or not value:
            return None
        fields = dict(item.strip().partition("=")[::2] for item in value.split(","))
        nonce, stamp, digest, mac = (fields.get(k, "") for k in ("nonce", "ts", "sha256", "mac"))
        try:
            age = abs(time.time() - float(stamp))
        except ValueError:
            return None
        if not (nonce and digest and age <= CLOCK_SKEW):
            return None
        if not hmac.compare_digest(request_mac(self._token, nonce, stamp, method, path, digest), mac):
            return None
        if self._nonces is None or not self._nonces.claim(nonce, float(stamp)):
            return None  # a replay: here, on another worker, or before a restart
        return nonce, digest

    def _authorized(self, headers: dict[str, str]) -> bool:
        if self._token is None:
            return True
        presented = _presented_token(headers.get("authorization", "")).encode()
        return hmac.compare_digest(presented, self._token)

    def _content_length(self, method: str, headers: dict[str, str]) -> int:
        if method != "POST":
            return 0
        value = headers.get("content-length", "")
        if not value.isdigit():
            raise _HTTPError(411, "a Content-Length header is required (chunked bodies are not supported)")
        if int(value) > self.max_body:
            raise _HTTPError(413, f"the body is over {self.max_body} bytes")
        return int(value)

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        if method != "POST" or path.rstrip("/") != "/run_code":
            return 404, {"detail": f"no route {method} {path}"}
        request = parse_run_request(body)
        if isinstance(request, list):
            return 400, {"detail": request}
        if request.language not in _RUNS:
            return 200, fusion_error(f"language {request.language!r} is not supported by retool-env sandbox serve "
                                     "(it runs python only)")
        for field in ("files", "fetch_files"):
            if getattr(request, field):
                return 200, fusion_error(f"'{field}' is not supported by retool-env sandbox serve: each call's scratch "
                                         "directory is private to the sandbox; pass data in the code or stdin")
        result = await self.sandbox.run(request.code, timeout=request.run_timeout, stdin=request.stdin,
                                        memory_mb=request.memory_mb)
        return 200, to_fusion_response(result)

    async def _respond(self, writer: asyncio.StreamWriter, code: int, payload: Any, keep_alive: bool,
                       nonce: str | None = None) -> None:
        body = json.dumps(payload).encode("utf-8")
        extra = "WWW-Authenticate: Bearer\r\n" if code == 401 else "Retry-After: 1\r\n" if code == 503 else ""
        if nonce is not None and self._token is not None:  # proof for the client that this server answered
            extra += f"{AUTH_HEADER}: {response_mac(self._token, nonce, code, body)}\r\n"
        head = (
            f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        await asyncio.wait_for(writer.drain(), self.read_timeout)  # a client that never reads is dropped


def raise_open_file_limit(wanted: int) -> int:
    """Raise this process's soft open-file limit towards `wanted` (up to the hard limit); returns the soft limit.
    A server at 1,024 descriptors stops accepting (EMFILE) before its connection cap can act."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


async def serve(
    host: str,
    port: int,
    *,
    token: str | None,
    token_source: str = "given",
    unix_socket: str | None = None,
    echo: bool = False,
    read_timeout: float = READ_TIMEOUT,
    max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
    nonce_dir: str | None = None,
    worker: tuple[int, int] = (0, 1),
    **sandbox_kwargs: Any,
) -> None:
    """Run the HTTP server over a fresh `LocalSandbox` until cancelled; prints where it listens and the token.
    `worker` = (index, count): one of `count` processes sharing the port, each with a sandbox of its own."""
    from .local import LocalSandbox

    index, count = worker
    async with LocalSandbox(echo=echo, **sandbox_kwargs) as sandbox:
        server = FusionServer(sandbox, host, port, token=token, unix_socket=unix_socket, read_timeout=read_timeout,
                              max_inflight_bytes=max_inflight_bytes, reuse_port=count > 1, nonce_dir=nonce_dir)
        await server.start()
        if index:  # the first worker speaks for all
            await server.serve_forever()
            return
        workers = f" ({count} workers)" if count > 1 else ""
        print(f"retool-env sandbox: SandboxFusion API on {server.url}{workers}", flush=True)
        if token is None:
            print("retool-env sandbox: no authentication (--no-auth): every local user can run code here", flush=True)
        elif token_source == "generated":
            url = "" if unix_socket else f", or use the URL http://retool:{token}@{host}:{server.port}/run_code"
            print(f"retool-env sandbox: token {token} (send 'Authorization: Bearer <token>' or set {TOKEN_ENV} for "
                  f"SandboxFusionSandbox{url})", flush=True)
        else:
            print(f"retool-env sandbox: token from {token_source}", flush=True)
        await server.serve_forever()
