"""`SandboxFusionSandbox`: a client for SandboxFusion's `POST /run_code`, for clusters that already run it."""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any

from .base import ExecResult, Sandbox, ToolStatus

_RETRY_STATUS = {500, 502, 503, 504}
TOKEN_ENV = "RETOOL_SANDBOX_TOKEN"
"""The environment variable both `retool-env sandbox serve` and `SandboxFusionSandbox` read the token from."""


class SandboxFusionSandbox(Sandbox):
    """Sends each call to a SandboxFusion server (or `retool-env sandbox serve`).

    One HTTP connection pool per event loop (httpx pools cannot cross loops), reused across calls; transient failures
    (connection errors, read timeouts, 5xx) are retried with exponential back-off. The server is stateless, so
    `session` is ignored: each call starts fresh, as in verl's ReTool recipe.

    `token` (default: `$RETOOL_SANDBOX_TOKEN`) is sent as `Authorization: Bearer <token>`, as
    `retool-env sandbox serve` requires; `unix_socket` reaches a server listening on one (the URL's host is then
    only a name).
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
        unix_socket: str | None = None,
    ) -> None:
        self.url = url if url.rstrip("/").endswith("run_code") else url.rstrip("/") + "/run_code"
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.retries = retries
        self.backoff = backoff
        self.language = language
        self.http_margin = http_margin
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.unix_socket = unix_socket
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    def _client(self) -> Any:
        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            transport = httpx.AsyncHTTPTransport(uds=self.unix_socket) if self.unix_socket else None
            client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                                       headers=headers, transport=transport)
            self._clients[loop] = client
        return client

    async def _run(
        self, code: str, *, timeout: float, session: str | None, stdin: str | None, memory_mb: int | None
    ) -> ExecResult:
        import httpx

        run_timeout = timeout
        payload = {
            "code": code,
            "language": self.language,
            "run_timeout": run_timeout,
            "compile_timeout": 10,
            "memory_limit_MB": memory_mb or self.memory_mb,
            "stdin": stdin or "",
            "files": {},
            "fetch_files": [],
        }
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = await self._client().post(self.url, json=payload, timeout=run_timeout + self.http_margin)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in _RETRY_STATUS:
                problem = f"HTTP {response.status_code}"
                continue
            if response.status_code != 200:
                return ExecResult.failure(ToolStatus.SANDBOX_ERROR, f"SandboxError: HTTP {response.status_code}: {response.text[:200]}")
            try:
                return from_fusion_response(response.json(), run_timeout)
            except (ValueError, TypeError, AttributeError) as exc:
                return ExecResult.failure(ToolStatus.SANDBOX_ERROR, f"SandboxError: unreadable response ({exc})")
        return ExecResult.failure(ToolStatus.SANDBOX_ERROR, f"SandboxError: {self.url} failed {self.retries + 1} times ({problem})")

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
    status = ToolStatus.MEMORY if message.startswith("MemoryError") or "MemoryError" in stderr[-300:] else ToolStatus.ERROR
    if message.startswith("Killed"):
        status = ToolStatus.KILLED
    return ExecResult(status, stdout, stderr, code, duration, note=message)
