"""A SandboxFusion-compatible HTTP server over `LocalSandbox`, so SandboxFusion tools (verl's) work without Docker.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies) for `POST /run_code` and `GET /v1/ping`.
SandboxFusion's statuses are coarser than ours: a timeout is `Failed` with `run_result.status = TimeLimitExceeded`,
any other failure `Failed` with the return code; our explanatory note travels in `message`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from .base import ExecResult, Sandbox

_LANGUAGES = {"python", "python3"}
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 411: "Length Required", 413: "Payload Too Large"}
MAX_BODY = 64 << 20


def to_fusion_response(result: ExecResult) -> dict[str, Any]:
    """Our result in SandboxFusion's `RunCodeResponse` shape."""
    if result.status == "sandbox_error":
        return {"status": "SandboxError", "message": result.note, "compile_result": None, "run_result": None}
    run_status = "TimeLimitExceeded" if result.status == "timeout" else "Finished"
    run = {
        "status": run_status,
        "execution_time": result.duration,
        "return_code": result.exit_code if result.exit_code is not None else -1,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
    status = "Success" if result.status == "ok" else "Failed"
    return {"status": status, "message": result.note, "compile_result": None, "run_result": run, "files": {}}


class FusionServer:
    """Serves `POST /run_code` from a sandbox; `serve_forever` or use `start()`/`close()` around a test."""

    def __init__(self, sandbox: Sandbox, host: str = "127.0.0.1", port: int = 8080) -> None:
        self.sandbox, self.host, self.port = sandbox, host, port
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        """Listen; returns the port (useful with port=0)."""
        self._server = await asyncio.start_server(self._connection, self.host, self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_line = await reader.readline()
                if not request_line.strip():
                    return
                method, path, _ = request_line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                keep_alive = headers.get("connection", "").lower() != "close"
                if "content-length" not in headers and method == "POST":
                    await self._respond(writer, 411, {"error": "Content-Length required"}, keep_alive=False)
                    return
                length = int(headers.get("content-length") or 0)
                if length > MAX_BODY:
                    await self._respond(writer, 413, {"error": "body too large"}, keep_alive=False)
                    return
                body = await reader.readexactly(length) if length else b""
                code, payload = await self._route(method, path.split("?")[0], body)
                await self._respond(writer, code, payload, keep_alive)
                if not keep_alive:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        if method == "GET" and path in ("/v1/ping", "/ping", "/health"):
            return 200, "pong"
        if method != "POST" or path.rstrip("/") != "/run_code":
            return 404, {"error": f"no route {method} {path}"}
        try:
            request = json.loads(body)
            code = request["code"]
        except (ValueError, KeyError, TypeError):
            return 400, {"error": "expected a JSON object with a 'code' field"}
        if request.get("language", "python") not in _LANGUAGES:
            note = f"language {request.get('language')!r} is not supported (only python)"
            return 200, {"status": "SandboxError", "message": note, "compile_result": None, "run_result": None}
        if request.get("files"):
            note = "'files' are not supported by retool-env sandbox serve"
            return 200, {"status": "SandboxError", "message": note, "compile_result": None, "run_result": None}
        memory = request.get("memory_limit_MB")
        result = await self.sandbox.run(
            code,
            timeout=float(request.get("run_timeout") or 10),
            stdin=request.get("stdin") or None,
            memory_mb=int(memory) if memory and int(memory) > 0 else None,
        )
        return 200, to_fusion_response(result)

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, code: int, payload: Any, keep_alive: bool) -> None:
        body = json.dumps(payload).encode("utf-8")
        head = (
            f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        await writer.drain()


async def serve(host: str, port: int, **sandbox_kwargs: Any) -> None:
    """Run the HTTP server over a fresh `LocalSandbox` until cancelled."""
    from .local import LocalSandbox

    async with LocalSandbox(**sandbox_kwargs) as sandbox:
        server = FusionServer(sandbox, host, port)
        await server.start()
        print(f"retool-env sandbox: SandboxFusion API on http://{host}:{server.port}/run_code", flush=True)
        await server.serve_forever()
