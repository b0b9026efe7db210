"""`retool-env sandbox serve` as SandboxFusion's clients see it: the official `sandbox-fusion` package, a verl-style
client, our own `SandboxFusionSandbox`, and raw HTTP for malformed requests, authentication and slow clients."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import httpx
import pytest
import requests
from sandbox_fusion import RunCodeRequest, SummaryMapping, run_code, summary_run_code_result

from retool_env.sandbox import LocalSandbox, SandboxFusionSandbox
from retool_env.sandbox.fusion import TOKEN_ENV
from retool_env.sandbox.http_server import FusionServer, parse_run_request, server_token

pytestmark = pytest.mark.timeout(120)
TOKEN = "test-token-" + "x" * 20


class Served:
    """A FusionServer on its own event loop in a thread, as a real server runs beside synchronous clients."""

    def __init__(self) -> None:
        self.sandbox = LocalSandbox(timeout=5, max_concurrency=2, echo=False)
        self.sandbox.start()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[FusionServer] = []

    def start(self, **kwargs) -> FusionServer:
        kwargs.setdefault("token", TOKEN)
        server = FusionServer(self.sandbox, "127.0.0.1", 0, **kwargs)
        asyncio.run_coroutine_threadsafe(server.start(), self.loop).result(30)
        self.servers.append(server)
        return server

    def close(self) -> None:
        for server in self.servers:
            asyncio.run_coroutine_threadsafe(server.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.sandbox.close()


@pytest.fixture(scope="module")
def served():
    served = Served()
    yield served
    served.close()


@pytest.fixture(scope="module")
def server(served) -> FusionServer:
    return served.start(read_timeout=2.0)


def base(server: FusionServer, token: str | None = TOKEN) -> str:
    """The server's URL, the token as Basic-auth password: how clients that cannot set headers authenticate."""
    return f"http://retool:{token}@127.0.0.1:{server.port}" if token else f"http://127.0.0.1:{server.port}"


def post(server: FusionServer, body: dict | str, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(f"http://127.0.0.1:{server.port}/run_code", content=content, headers=headers, timeout=30)


# ------------------------------------------------------------------------------------- the official client
MAPPING = SummaryMapping(Success="ok", Failed="failed", RunFailed="runtime error", RunTimeout="timeout")


@pytest.mark.parametrize(
    ("code", "run_timeout", "summary", "stdout"),
    [
        ("print(6 * 7)", 5, "ok", "42\n"),
        ("def main():\n    print('hi')\n    return 0\n\nmain()", 5, "ok", "hi\n"),  # no echo of main()'s 0
        ("x = 41\nx + 1", 5, "ok", ""),
        ("print('partial')\nraise ValueError('bad')", 5, "runtime error", "partial\n"),
        ("import sys; sys.exit(3)", 5, "runtime error", ""),
        ("print('partial', flush=True)\nwhile True: pass", 1, "timeout", "partial\n"),
        ("print('bye', flush=True)\nimport os\nos.kill(os.getpid(), 40)", 5, "runtime error", "bye\n"),
    ],
    ids=["print", "main-returns-0", "trailing-expression", "exception", "exit-3", "timeout", "own-realtime-signal"],
)
def test_official_client_run_code(server, code, run_timeout, summary, stdout):
    request = RunCodeRequest(code=code, language="python", run_timeout=run_timeout)
    result = run_code(request, endpoint=base(server), max_attempts=1, client_timeout=30)
    assert summary_run_code_result(result, MAPPING) == summary
    assert result.run_result.stdout == stdout
    assert result.status == ("Success" if summary == "ok" else "Failed")


def test_official_client_stdin_and_errors(server):
    echoed = run_code(RunCodeRequest(code="print(input()[::-1])", language="python", stdin="abc\n"),
                      endpoint=base(server), max_attempts=1)
    assert echoed.run_result.stdout == "cba\n" and echoed.run_result.return_code == 0
    with pytest.raises(Exception, match=r"400.*run_timeout"):
        run_code(RunCodeRequest(code="1", language="python", run_timeout=-5), endpoint=base(server), max_attempts=1)
    with pytest.raises(Exception, match=r"Sandbox responded with error: language 'cpp'"):
        run_code(RunCodeRequest(code="int main(){}", language="cpp"), endpoint=base(server), max_attempts=1)
    with pytest.raises(Exception, match=r"Sandbox responded with error: 'files' is not supported"):
        request = RunCodeRequest(code="print(open('a.txt').read())", language="python",
                                 files={"a.txt": base64.b64encode(b"data").decode()})
        run_code(request, endpoint=base(server), max_attempts=1)
    with pytest.raises(Exception, match=r"401"):
        run_code(RunCodeRequest(code="1", language="python"), endpoint=base(server, token=None), max_attempts=1)


# ------------------------------------------------------------------------------------- a verl-style client
def verl_style_check(url: str, code: str, stdin: str, expected: str, timeout: int = 5) -> bool | int:
    """How verl's sandbox_fusion reward helper reads a response (written from its documented contract): True or
    False for a program that ran, -1 for an API or sandbox error, -2 runtime error, -3 time limit."""
    payload = {"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin,
               "language": "python", "files": {}, "fetch_files": []}
    try:
        response = requests.post(url, data=json.dumps(payload), timeout=2 * timeout + 10,
                                  headers={"Content-Type": "application/json", "Accept": "application/json"})
        response.raise_for_status()
        body = response.json()
    except (requests.RequestException, ValueError):
        return -1
    run = body.get("run_result") or {}
    if body.get("status") == "SandboxError":
        return -1
    if body.get("status") == "Failed":
        return -3 if run.get("status") == "TimeLimitExceeded" else -2
    return str(run.get("stdout")).rstrip("\n") == expected.rstrip("\n")


def test_verl_style_client(server):
    url = base(server) + "/run_code"
    program = "def main():\n    n = int(input())\n    print(n * n)\n    return 0\n\nmain()"
    assert verl_style_check(url, program, "7\n", "49") is True
    assert verl_style_check(url, program, "7\n", "48") is False
    assert verl_style_check(url, "raise SystemExit(1)", "", "") == -2
    assert verl_style_check(url, "while True: pass", "", "", timeout=1) == -3
    assert verl_style_check(url.replace(TOKEN, "wrong"), program, "7\n", "49") == -1
    assert verl_style_check(url, program, 5, "25") == -1  # type: ignore[arg-type]  # stdin 5: HTTP 400


# ------------------------------------------------------------------------------------- malformed requests
@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("run_timeout", "-5"), ("run_timeout", "NaN"), ("run_timeout", '"abc"'), ("run_timeout", "Infinity"),
        ("run_timeout", "0"), ("compile_timeout", "[]"), ("memory_limit_MB", '"abc"'), ("memory_limit_MB", "[1]"),
        ("memory_limit_MB", "1.5"), ("memory_limit_MB", "true"), ("stdin", "5"), ("code", "null"), ("code", "7"),
        ("language", '"klingon"'), ("language", "3"), ("files", "[1]"), ("files", '{"a": 1}'),
        ("fetch_files", '"a.txt"'), ("fetch_files", "[1]"),
    ],
)  # fmt: skip
def test_each_malformed_field_gets_a_400_naming_it(server, field, raw):
    fields = {"code": '"print(1)"', "language": '"python"', field: raw}
    body = "{" + ", ".join(f'"{name}": {value}' for name, value in fields.items()) + "}"
    response = post(server, body)
    assert response.status_code == 400
    assert [error["loc"] for error in response.json()["detail"]] == [["body", field]]


def test_several_malformed_fields_are_all_named(server):
    response = post(server, {"code": 1, "language": "python", "run_timeout": "abc", "stdin": 5})
    assert response.status_code == 400
    assert sorted(e["loc"][1] for e in response.json()["detail"]) == ["code", "run_timeout", "stdin"]
    assert post(server, "not json").status_code == 400 and post(server, "[1]").status_code == 400


def test_accepted_forms_of_numbers(server):
    for extra in ({"run_timeout": "5", "memory_limit_MB": "512"}, {"run_timeout": 5, "memory_limit_MB": 512.0},
                  {"memory_limit_MB": -1, "stdin": None, "files": {}, "fetch_files": []}):
        response = post(server, {"code": "print(1)", "language": "python", **extra})
        assert response.status_code == 200 and response.json()["run_result"]["stdout"] == "1\n", extra


def test_parse_run_request_without_http():
    request = parse_run_request(b'{"code": "1", "language": "python", "memory_limit_MB": 0}')
    assert request.memory_mb is None and request.run_timeout == 10 and request.stdin is None
    assert parse_run_request(b'{"code": "1", "run_timeout": 1e400}')[0]["loc"] == ["body", "run_timeout"]


@pytest.mark.parametrize("language", ["cpp", "nodejs", "lean", "python_gpu"])
def test_other_languages_get_sandbox_fusions_error_shape(server, language):
    response = post(server, {"code": "x", "language": language})
    assert response.status_code == 200
    assert response.json() == {"status": "SandboxError", "message": response.json()["message"], "compile_result": None,
                               "run_result": None, "executor_pod_name": None, "files": {}}
    assert "python only" in response.json()["message"]


@pytest.mark.parametrize("field", ["files", "fetch_files"])
def test_files_are_refused_not_ignored(server, field):
    value = {"../../etc/passwd": "eA=="} if field == "files" else ["/etc/passwd"]
    body = post(server, {"code": "print(1)", "language": "python", field: value}).json()
    assert body["status"] == "SandboxError" and f"'{field}' is not supported" in body["message"]


# ------------------------------------------------------------------------------------- authentication
def test_authentication(server):
    assert post(server, {"code": "print(1)", "language": "python"}, token=None).status_code == 401
    assert post(server, {"code": "print(1)", "language": "python"}, token="wrong").status_code == 401
    assert post(server, {"code": "print(1)", "language": "python"}, token=TOKEN[:-1]).status_code == 401
    unauthorized = post(server, {"code": "print(1)"}, token=None)
    assert unauthorized.headers["www-authenticate"] == "Bearer" and TOKEN_ENV in unauthorized.json()["detail"]
    basic = httpx.post(f"http://127.0.0.1:{server.port}/run_code", json={"code": "print(2)"}, auth=("any", TOKEN))
    assert basic.status_code == 200 and basic.json()["run_result"]["stdout"] == "2\n"
    assert httpx.get(f"http://127.0.0.1:{server.port}/v1/ping").json() == "pong"  # health checks need no token


def test_no_auth_only_where_only_local_users_reach(served):
    with pytest.raises(ValueError, match="refusing to serve without a token"):
        FusionServer(served.sandbox, "0.0.0.0", 0, token=None)
    open_server = served.start(token=None)
    assert post(open_server, {"code": "print(3)"}, token=None).json()["run_result"]["stdout"] == "3\n"


def test_where_the_server_token_comes_from(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("from-file\n")
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert server_token(str(tmp_path / "token")) == ("from-file", str(tmp_path / "token"))
    assert server_token() == ("from-env", TOKEN_ENV)
    monkeypatch.delenv(TOKEN_ENV)
    (first, source), (second, _) = server_token(), server_token()
    assert source == "generated" and len(first) >= 32 and first != second


def test_our_client_sends_the_token(server, monkeypatch):
    url = f"http://127.0.0.1:{server.port}/run_code"
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert SandboxFusionSandbox(url, token=TOKEN).run_sync("print(4)").stdout == "4\n"
    refused = SandboxFusionSandbox(url).run_sync("print(4)")
    assert refused.status == "sandbox_error" and "HTTP 401" in refused.note
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert SandboxFusionSandbox(url).run_sync("print(5)").stdout == "5\n"


def test_unix_socket(served, tmp_path):
    path = str(tmp_path / "sandbox.sock")
    served.start(unix_socket=path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    result = SandboxFusionSandbox("http://sandbox/run_code", unix_socket=path, token=TOKEN).run_sync("print(6)")
    assert result.status == "ok" and result.stdout == "6\n"


# ------------------------------------------------------------------------------------- slow and large clients
def raw_exchange(port: int, data: bytes) -> bytes:
    """Send `data`, then read until the server closes (a socket timeout guards the test, it asserts nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_slow_client_is_cut_off(served):
    server = served.start(read_timeout=2.0, header_timeout=1.0)
    head = f"POST /run_code HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n{{".encode()
    assert raw_exchange(server.port, head).startswith(b"HTTP/1.1 408")  # the body never comes
    assert raw_exchange(server.port, b"POST /run_code HTTP/1.1\r\nHost: x\r\n").startswith(b"HTTP/1.1 408")
    assert raw_exchange(server.port, b"") == b""  # connected, never sent: closed without an answer


def test_memory_of_requests_in_flight_is_bounded(served):
    limited = served.start(read_timeout=5.0, max_body=600, max_inflight_bytes=1000)
    assert post(limited, {"code": "#" * 700}).status_code == 413
    with socket.create_connection(("127.0.0.1", limited.port), timeout=20) as holder:
        holder.sendall(f"POST /run_code HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                       "Content-Length: 590\r\n\r\n".encode()
                       + b"#" * 500)  # 500 bytes of it arrived: those are held
        time.sleep(0.3)
        assert raw_exchange(limited.port, b"GET /v1/ping HTTP/1.1\r\nConnection: close\r\n\r\n").endswith(b'"pong"')
        busy = post(limited, {"code": "#" * 550})  # 500 held + this one > 1000
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert post(limited, {"code": "print(7)" + " " * 500}).status_code == 200  # released when the holder went away


def hold_body(port: int, declared: int, sent: int, source: str = "127.0.0.1") -> socket.socket:
    """A client with the token that declares a body of `declared` bytes, sends `sent` of them, and waits."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(source, 0))
    sock.sendall(f"POST /run_code HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {declared}\r\n\r\n"
                 .encode() + b" " * sent)
    return sock


def test_declared_bodies_that_never_come_lock_nobody_out(served):
    limited = served.start(read_timeout=30.0, max_body=600, max_inflight_bytes=2400)
    holders = [hold_body(limited.port, 600, 5) for _ in range(4)]  # 4 x max_body declared: the whole bound
    try:
        time.sleep(0.3)
        start = time.monotonic()
        assert post(limited, {"code": "print(5)"}).json()["run_result"]["stdout"] == "5\n"
        assert time.monotonic() - start < 10  # answered at once, not after the holders' timeout
    finally:
        for holder in holders:
            holder.close()


def test_a_body_must_arrive_within_the_body_timeout(served):
    limited = served.start(read_timeout=30.0, body_timeout=0.5)
    start = time.monotonic()
    with hold_body(limited.port, 100, 1) as holder:
        assert holder.recv(65536).startswith(b"HTTP/1.1 408")  # the body's time, not the idle wait's 30 s
    assert time.monotonic() - start < 10


def test_one_address_holds_at_most_its_share_of_body_bytes(served):
    limited = served.start(read_timeout=30.0, max_body=600, max_inflight_bytes=4000, max_inflight_bytes_per_peer=1000)
    with hold_body(limited.port, 600, 590):
        time.sleep(0.3)
        with hold_body(limited.port, 600, 500) as second:  # 1,090 bytes from 127.0.0.1: over its 1,000
            assert second.recv(65536).startswith(b"HTTP/1.1 503")
        with hold_body(limited.port, 600, 500, source="127.0.0.2") as other:  # another address has its own share
            other.sendall(b" " * 100)
            assert b'"detail"' in other.recv(65536)  # read whole and answered (400: spaces are not JSON), not 503
    assert post(limited, {"code": "print(8)"}).status_code == 200


# ------------------------------------------------------------------------------------- the command line
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_serve_prints_a_token_and_stops_on_a_signal(stop_signal):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "retool_env.cli", "sandbox", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE, text=True, env=env,
        # as a background job (`serve &`) starts it: with SIGINT ignored, which Python then keeps
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    try:
        assert "run_code" in proc.stdout.readline()
        token = proc.stdout.readline().split("token ", 1)[1].split()[0]
        url = f"http://127.0.0.1:{port}/run_code"
        body = {"code": "print(sum(range(10)))\nsum(range(10))", "language": "python", "run_timeout": 5}
        assert httpx.post(url, json=body, timeout=30).status_code == 401
        response = httpx.post(url, json=body, timeout=30, headers={"Authorization": f"Bearer {token}"}).json()
        assert response["status"] == "Success" and response["run_result"]["stdout"] == "45\n"  # no echo
        assert response["run_result"]["status"] == "Finished" and response["run_result"]["return_code"] == 0
    finally:
        proc.send_signal(stop_signal)
        assert proc.wait(timeout=15) == 0


def test_cli_serve_token_from_the_environment_and_no_auth_rules(tmp_path):
    from retool_env.cli import main

    assert main(["sandbox", "serve", "--host", "0.0.0.0", "--no-auth"]) == 2
    (tmp_path / "empty").write_text("\n")
    assert main(["sandbox", "serve", "--token-file", str(tmp_path / "empty")]) == 2
    assert main(["sandbox", "serve", "--token-file", str(tmp_path / "missing")]) == 2
    port = free_port()
    env = {**os.environ, TOKEN_ENV: TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "retool_env.cli", "sandbox", "serve", "--port", str(port), "--echo"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert "run_code" in proc.stdout.readline()
        assert proc.stdout.readline().strip().endswith(f"token from {TOKEN_ENV}")
        result = SandboxFusionSandbox(f"http://127.0.0.1:{port}", token=TOKEN).run_sync("6 * 7")
        assert result.stdout == "42\n"  # --echo: the environment's Jupyter-like echo, on request
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_cli_serve_workers_share_one_port(tmp_path):
    from retool_env.cli import main

    assert main(["sandbox", "serve", "--workers", "2", "--port", "0"]) == 2  # a shared port must be fixed
    port = free_port()
    env = {**os.environ, TOKEN_ENV: TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "retool_env.cli", "sandbox", "serve", "--port", str(port),
                             "--workers", "2", "--max-concurrency", "2", "--nonce-dir", str(tmp_path / "nonces")],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert "(2 workers)" in proc.stdout.readline()
        deadline = time.time() + 60  # the second worker's sandbox may still be starting
        workers = []
        while time.time() < deadline and len(workers) < 2:
            workers = [p for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == proc.pid]
            time.sleep(0.2)
        assert len(workers) == 2

        async def calls():
            client = SandboxFusionSandbox(f"http://127.0.0.1:{port}", token=TOKEN)
            return await asyncio.gather(*(client.run(f"print({i} * 3)") for i in range(12)))

        results = asyncio.run(calls())
        assert [r.stdout for r in results] == [f"{i * 3}\n" for i in range(12)]
        auth, body = capture_signed_request("print(14)")  # a signed request runs once, whichever worker gets it
        url = f"http://127.0.0.1:{port}/run_code"
        codes = [httpx.post(url, content=body, headers={"X-Retool-Auth": auth}, timeout=30).status_code
                 for _ in range(8)]  # a new connection each: the kernel spreads them over both workers
        assert codes == [200] + [401] * 7
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert not [p for p in workers if os.path.exists(f"/proc/{p}")]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


# ------------------------------------------------------------------------------------- before authentication
@pytest.fixture()
def cli_server():
    """`retool-env sandbox serve` in its own process, as deployed: its memory and descriptors are its own."""
    import resource

    def usual_open_file_limit():  # what most machines give a process: the server must raise it itself
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "retool_env.cli", "sandbox", "serve", "--port", str(port),
                             "--max-concurrency", "2"], stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, TOKEN_ENV: TOKEN}, preexec_fn=usual_open_file_limit)
    assert "run_code" in proc.stdout.readline()
    yield proc, port
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_connections_that_never_finish_their_headers_hold_little_memory(cli_server):
    proc, port = cli_server
    assert SandboxFusionSandbox(f"http://127.0.0.1:{port}", token=TOKEN).run_sync("print(1)").ok  # warm
    before = rss_mb(proc.pid)
    sockets = []
    for _ in range(30):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\n")
        with contextlib.suppress(OSError):  # the server cuts it off at its head cap: send what it takes
            for i in range(100):  # distinct headers, each under the old 64 KiB line limit, 100 of them allowed
                sock.sendall(b"X-Filler-%d: " % i + b"a" * 60_000 + b"\r\n")
        sockets.append(sock)
    time.sleep(1.0)
    grown = rss_mb(proc.pid) - before
    for sock in sockets:
        sock.close()
    assert grown < 40, f"30 unfinished heads grew the server by {grown:.0f} MB"  # was 196 MB


def test_too_long_request_lines_and_heads_are_refused(server):
    assert raw_exchange(server.port, b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 431")
    head = b"POST /run_code HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 4000) for i in range(10))
    assert raw_exchange(server.port, head + b"\r\n").startswith(b"HTTP/1.1 431")  # 40 KB of headers in all


def test_a_thousand_idle_connections_do_not_lock_out_a_caller_with_the_token(cli_server):
    import resource

    proc, port = cli_server
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))  # this test's own 1,100 sockets
    idle = []
    try:
        for _ in range(1100):  # more than the old 1,024 open files, and than the cap
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        begin = time.monotonic()
        sandbox = SandboxFusionSandbox(f"http://127.0.0.1:{port}", token=TOKEN, retries=0, timeout=5)
        result = sandbox.run_sync("print(8)")
        took = time.monotonic() - begin
        assert result.stdout == "8\n", result
        assert took < 5, f"the call took {took:.1f} s beside 1,100 idle connections"
        assert proc.poll() is None
    finally:
        for sock in idle:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ------------------------------------------------------------------------------------- the client checks the server
class Impostor:
    """A listener on the server's address that is not the server (a port taken while it restarts): it records
    what it receives and answers a success it made up."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length")))
                    while len(body) < length:
                        body += conn.recv(65536)
                    self.received += head + b"\r\n\r\n" + body
                    answer = json.dumps({"status": "Success", "message": "", "run_result": {
                        "status": "Finished", "return_code": 0, "stdout": "forged\n", "stderr": "",
                        "execution_time": 0.0}}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Retool-Auth: 00\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(answer), answer))

    def close(self) -> None:
        self.sock.close()


def test_the_client_never_sends_its_token_and_refuses_a_forged_answer():
    impostor = Impostor()
    try:
        result = SandboxFusionSandbox(f"http://127.0.0.1:{impostor.port}", token=TOKEN, retries=2,
                                      backoff=0.01).run_sync("print(1)")
    finally:
        impostor.close()
    assert result.status == "sandbox_error" and "did not prove" in result.note and "forged" not in result.output
    assert impostor.received.count(b"POST /run_code") == 1  # not retried: an impostor is not a transient failure
    assert TOKEN.encode() not in impostor.received  # neither as a bearer token nor in Basic auth
    assert base64.b64encode(TOKEN.encode()) not in impostor.received


def test_a_captured_signed_request_cannot_be_replayed_or_altered(server):
    impostor = Impostor()
    try:
        SandboxFusionSandbox(f"http://127.0.0.1:{impostor.port}", token=TOKEN, retries=0).run_sync("print(3)")
    finally:
        impostor.close()
    head, _, body = impostor.received.partition(b"\r\n\r\n")
    auth = next(line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                if line.lower().startswith(b"x-retool-auth"))

    def send(content: bytes) -> httpx.Response:
        return httpx.post(f"http://127.0.0.1:{server.port}/run_code", content=content, timeout=30,
                          headers={"X-Retool-Auth": auth, "Content-Type": "application/json"})

    first = send(body)  # the relayed original runs once (it is the client's own code)...
    assert first.status_code == 200 and first.json()["run_result"]["stdout"] == "3\n"
    assert send(body).status_code == 401  # ...and never again
    altered = body.replace(b"print(3)", b"print(4)")  # another capture's MAC over other code
    fresh = Impostor()
    try:
        SandboxFusionSandbox(f"http://127.0.0.1:{fresh.port}", token=TOKEN, retries=0).run_sync("print(3)")
    finally:
        fresh.close()
    head, _, body = fresh.received.partition(b"\r\n\r\n")
    auth = next(line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                if line.lower().startswith(b"x-retool-auth"))
    assert send(altered).status_code == 401


def test_a_unix_socket_of_another_user_gets_nothing(served, tmp_path):
    path = str(tmp_path / "other.sock")
    served.start(unix_socket=path)
    assert SandboxFusionSandbox("http://s/run_code", unix_socket=path, token=TOKEN).run_sync("print(2)").ok
    os.chown(path, 54321, -1) if os.getuid() == 0 else pytest.skip("needs root to give the socket away")
    refused = SandboxFusionSandbox("http://s/run_code", unix_socket=path, token=TOKEN).run_sync("print(2)")
    assert refused.status == "sandbox_error" and "belongs to uid 54321" in refused.note
    allowed = SandboxFusionSandbox("http://s/run_code", unix_socket=path, token=TOKEN, server_uid=54321)
    assert allowed.run_sync("print(2)").stdout == "2\n"


def capture_signed_request(code: str) -> tuple[str, bytes]:
    """What an impostor on the server's address keeps of one signed request: its `X-Retool-Auth` and its body."""
    impostor = Impostor()
    try:
        SandboxFusionSandbox(f"http://127.0.0.1:{impostor.port}", token=TOKEN, retries=0).run_sync(code)
    finally:
        impostor.close()
    head, _, body = impostor.received.partition(b"\r\n\r\n")
    auth = next(line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                if line.lower().startswith(b"x-retool-auth"))
    return auth, body


def replay(server: FusionServer, auth: str, body: bytes) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{server.port}/run_code", content=body, timeout=30,
                      headers={"X-Retool-Auth": auth, "Content-Type": "application/json"})


def test_a_signed_request_runs_once_across_restarts_and_workers(served, tmp_path):
    store = str(tmp_path / "nonces")
    first = served.start(nonce_dir=store)
    auth, body = capture_signed_request("print(11)")
    assert replay(first, auth, body).json()["run_result"]["stdout"] == "11\n"
    asyncio.run_coroutine_threadsafe(first.close(), served.loop).result(30)
    served.servers.remove(first)
    restarted = served.start(nonce_dir=store)  # the same server after a restart: its nonces survived it
    assert replay(restarted, auth, body).status_code == 401
    worker_a, worker_b = served.start(), served.start()  # `serve --workers 2`: the default store is per token
    auth, body = capture_signed_request("print(12)")
    assert replay(worker_a, auth, body).status_code == 200
    assert replay(worker_b, auth, body).status_code == 401


def test_a_new_nonce_store_refuses_requests_signed_before_it(served, tmp_path):
    auth, body = capture_signed_request("print(13)")  # captured, then the store is lost (a reboot cleared /tmp)
    time.sleep(0.01)
    assert replay(served.start(nonce_dir=str(tmp_path / "fresh")), auth, body).status_code == 401
    os.makedirs(tmp_path / "open", mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(PermissionError, match="mode 0700"):
        served.start(nonce_dir=str(tmp_path / "open"))
