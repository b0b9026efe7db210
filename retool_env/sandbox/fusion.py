"""`SandboxFusionSandbox`: a client for SandboxFusion's `POST /run_code`, for clusters that already run it."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import time
import urllib.parse
import weakref
from typing import Any

from .base import ExecResult, Sandbox, ToolStatus

_RETRY_STATUS = {500, 502, 503, 504}
TOKEN_ENV = "RETOOL_SANDBOX_TOKEN"
"""The environment variable both `retool-env sandbox serve` and `SandboxFusionSandbox` read the token from."""
AUTH_HEADER = "X-Retool-Auth"
"""Challenge-response authentication: the request's MAC from the client, the response's MAC from the server."""
CLOCK_SKEW = 60.0  # seconds a signed request stays valid (the server remembers its nonce that long)


def _digest(token: bytes, *parts: str | bytes) -> str:
    message = b"\n".join(p if isinstance(p, bytes) else p.encode() for p in parts)
    return hmac.new(token, message, hashlib.sha256).hexdigest()


def request_mac(token: bytes, nonce: str, stamp: str, method: str, path: str, body_sha256: str) -> str:
    """What proves a request came from a holder of the token, bound to its nonce, time, route and body (its SHA-256,
    sent beside the MAC so the server checks the MAC before it reads the body)."""
    return _digest(token, b"retool-request", nonce, stamp, method, path, body_sha256)


def response_mac(token: bytes, nonce: str, status: int, body: bytes) -> str:
    """What proves an answer came from a holder of the token, for this request (its nonce) and this body."""
    return _digest(token, b"retool-response", nonce, str(status), hashlib.sha256(body).hexdigest())


class EndpointFailure(Exception):
    """The endpoint itself failed (no connection, 5xx, an unreadable or unauthenticated answer): the code's own
    outcome never raises this, so a pool retries and ejects only on it. `transient`: trying the same endpoint again
    may help (no connection, 5xx), unlike a 4xx, an impostor or an unreadable answer."""

    def __init__(self, problem: str, *, transient: bool = True) -> None:
        super().__init__(problem)
        self.transient = transient


class SandboxFusionSandbox(Sandbox):
    """Sends each call to a SandboxFusion server (or `retool-env sandbox serve`).

    One HTTP connection pool per event loop (httpx pools cannot cross loops), reused across calls; transient failures
    (connection errors, read timeouts, 5xx) are retried with exponential back-off. The server is stateless, so
    `session` is ignored: each call starts fresh, as in verl's ReTool recipe.

    `token` (default: `$RETOOL_SANDBOX_TOKEN`) never travels: each request carries a fresh nonce and an HMAC of
    itself under the token (`X-Retool-Auth`), and the answer must carry the server's HMAC of that nonce and the body,
    so whoever listens on the URL (a port taken while the server restarts) learns nothing it can reuse and cannot
    forge a result (answered `sandbox_error`, the code's output discarded). `auth="bearer"` sends the token as
    `Authorization: Bearer <token>` instead, for a proxy in front of SandboxFusion that wants it (the server is then
    not authenticated). Without a token nothing is authenticated: SandboxFusion itself has no authentication.
    `unix_socket` reaches a server listening on one (the URL's host is then only a name); the socket must belong to
    `server_uid` (default: this process's uid), checked before anything is sent.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        memory_mb: int = 1024,
        retries: int = 3,
        backoff: float = 0.5,
        language: str = "python",
        http_margin: float = 10.0,
        token: str | None = None,
        auth: str = "hmac",
        unix_socket: str | None = None,
        server_uid: int | None = None,
    ) -> None:
        if auth not in ("hmac", "bearer"):
            raise ValueError(f"auth must be 'hmac' or 'bearer', got {auth!r}")
        self.url = url if url.rstrip("/").endswith("run_code") else url.rstrip("/") + "/run_code"
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.retries = retries
        self.backoff = backoff
        self.language = language
        self.http_margin = http_margin
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.auth = auth
        self.unix_socket = unix_socket
        self.server_uid = os.getuid() if server_uid is None else server_uid
        self._path = urllib.parse.urlsplit(self.url).path or "/"
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    def _client(self) -> Any:
        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            bearer = self.token and self.auth == "bearer"
            headers = {"Authorization": f"Bearer {self.token}"} if bearer else {}
            transport = httpx.AsyncHTTPTransport(uds=self.unix_socket) if self.unix_socket else None
            client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                                       headers=headers, transport=transport)
            self._clients[loop] = client
        return client

    def _check_socket_owner(self) -> None:
        """A unix socket must be the server's: another user's socket at that path could be an impostor."""
        try:
            owner = os.stat(self.unix_socket).st_uid  # type: ignore[arg-type]
        except OSError as exc:
            raise EndpointFailure(f"{type(exc).__name__}: {exc}") from None
        if owner != self.server_uid:
            raise EndpointFailure(f"the unix socket {self.unix_socket} belongs to uid {owner}, not the server's "
                                  f"uid {self.server_uid} (pass server_uid= if the server runs as another user)",
                                  transient=False)

    async def _run(
        self, code: str, *, timeout: float, session: str | None, stdin: str | None, memory_mb: int | None
    ) -> ExecResult:
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                return await self.attempt(code, timeout=timeout, stdin=stdin, memory_mb=memory_mb)
            except EndpointFailure as exc:
                problem = str(exc)
                if not exc.transient:
                    break
        return ExecResult.failure(ToolStatus.SANDBOX_ERROR,
                                  f"SandboxError: {self.url} failed {attempt + 1} times ({problem})")

    async def attempt(self, code: str, *, timeout: float, stdin: str | None = None,
                      memory_mb: int | None = None) -> ExecResult:
        """One try at the endpoint, without retries: the code's result, or `EndpointFailure` when the endpoint
        failed (a pool moves the call elsewhere on that, and only on that)."""
        import httpx

        payload = {
            "code": code,
            "language": self.language,
            "run_timeout": timeout,
            "compile_timeout": 10,
            "memory_limit_MB": memory_mb or self.memory_mb,
            "stdin": stdin or "",
            "files": {},
            "fetch_files": [],
        }
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        nonce = secrets.token_urlsafe(18)
        signed = bool(self.token) and self.auth == "hmac"
        if signed:
            stamp, digest = f"{time.time():.3f}", hashlib.sha256(body).hexdigest()
            mac = request_mac(self.token.encode(), nonce, stamp, "POST", self._path, digest)  # type: ignore[union-attr]
            headers[AUTH_HEADER] = f"nonce={nonce}, ts={stamp}, sha256={digest}, mac={mac}"
        if self.unix_socket:
            self._check_socket_owner()
        try:
            response = await self._client().post(self.url, content=body, headers=headers,
                                                  timeout=timeout + self.http_margin)
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            raise EndpointFailure(f"{type(exc).__name__}: {exc}") from None
        if response.status_code in _RETRY_STATUS:
            raise EndpointFailure(f"HTTP {response.status_code}")
        if response.status_code != 200:
            raise EndpointFailure(f"HTTP {response.status_code}: {response.text[:200]}", transient=False)
        proof = response_mac(self.token.encode(), nonce, 200, response.content) if signed else ""  # type: ignore[union-attr]
        if signed and not hmac.compare_digest(response.headers.get(AUTH_HEADER, ""), proof):
            raise EndpointFailure(f"the server at {self.url} did not prove it holds the token (no valid "
                                  f"{AUTH_HEADER} on its answer): an impostor, or a server other than retool-env "
                                  "sandbox serve; its answer was discarded", transient=False)
        try:
            return from_fusion_response(response.json(), timeout)
        except (ValueError, TypeError, AttributeError) as exc:
            raise EndpointFailure(f"unreadable response ({exc})", transient=False) from None

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        self._clients.clear()  # clients of other loops close with their loops


def from_fusion_response(body: dict[str, Any], run_timeout: float) -> ExecResult:
    """Map SandboxFusion's response onto an ExecResult (its statuses carry less detail than ours)."""
    run = body.get("run_result") or {}
    stdout, stderr = run.get("stdout") or "", run.get("stderr") or ""
    code = run.get("return_code")
    duration = float(run.get("execution_time") or 0.0)
    if body.get("status") == "SandboxError" or not run:
        return ExecResult.failure(ToolStatus.SANDBOX_ERROR, f"SandboxError: {body.get('message') or 'no run result'}")
    message = body.get("message") or ""  # `retool-env sandbox serve` puts its note here
    if run.get("status") == "TimeLimitExceeded":
        note = message or f"TimeoutError: execution exceeded the {run_timeout:g} s time limit"
        return ExecResult(ToolStatus.TIMEOUT, stdout, stderr, code, duration, note=note)
    if code == 0 and body.get("status") == "Success":
        return ExecResult(ToolStatus.OK, stdout, stderr, 0, duration)
    memory = message.startswith("MemoryError") or "MemoryError" in stderr[-300:]
    status = ToolStatus.MEMORY if memory else ToolStatus.ERROR
    if message.startswith("Killed"):
        status = ToolStatus.KILLED
    return ExecResult(status, stdout, stderr, code, duration, note=message)
