"""The pools' shared parts (the cross-loop gate) and SandboxFusionPool against two real `retool-env sandbox serve`
processes, one of them killed mid-run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from retool_env.sandbox import make_sandbox
from retool_env.sandbox.pool import Gate, SandboxFusionPool


def test_gate_is_fifo_and_hands_on_a_cancelled_slot():
    async def main():
        gate, order = Gate(1), []

        async def call(name):
            await gate.acquire()
            order.append(name)
            await asyncio.sleep(0.01)
            gate.release()

        await gate.acquire()
        tasks = [asyncio.create_task(call(n)) for n in "abc"]
        await asyncio.sleep(0.01)
        assert gate.waiting == 3
        tasks[1].cancel()
        gate.release()
        await asyncio.gather(*tasks, return_exceptions=True)
        return order, gate.active

    assert asyncio.run(main()) == (["a", "c"], 0)


def test_gate_serves_callers_on_different_event_loops():
    gate = Gate(1)

    async def hold_then_release():
        await gate.acquire()
        await asyncio.sleep(0.2)
        gate.release()

    async def wait_for_it():
        await asyncio.sleep(0.05)
        await asyncio.wait_for(gate.acquire(), 5)
        gate.release()

    thread = threading.Thread(target=asyncio.run, args=(hold_then_release(),))
    thread.start()
    asyncio.run(wait_for_it())
    thread.join()
    assert gate.active == 0


TOKEN = "pool-test-token"


def start_server(port=0):
    proc = subprocess.Popen([sys.executable, "-m", "retool_env.cli", "sandbox", "serve", "--port", str(port),
                             "--max-concurrency", "4"], stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "RETOOL_SANDBOX_TOKEN": TOKEN})
    line = proc.stdout.readline()
    assert "run_code" in line, line
    return proc, line.split()[-1]


@pytest.fixture()
def servers():
    procs = [start_server() for _ in range(2)]
    yield procs
    for proc, _ in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_make_sandbox_builds_a_pool_from_a_list_or_a_file(tmp_path):
    pool = make_sandbox("sandbox_fusion:http://a:1/run_code,http://b:2")
    assert isinstance(pool, SandboxFusionPool)
    assert [e.client.url for e in pool.endpoints] == ["http://a:1/run_code", "http://b:2/run_code"]
    (tmp_path / "urls.txt").write_text("# sandbox nodes\nhttp://a:1/run_code\n\nhttp://c:3/run_code  # spare\n")
    pool = make_sandbox(f"sandbox_fusion:@{tmp_path / 'urls.txt'}")
    assert [e.client.url for e in pool.endpoints] == ["http://a:1/run_code", "http://c:3/run_code"]


def test_a_server_killed_mid_run_costs_retries_not_results(servers):
    (first, first_url), (_, second_url) = servers
    pool = SandboxFusionPool([first_url, second_url], per_endpoint=4, timeout=10, health_interval=0.5, token=TOKEN)

    async def kill_first_midway():
        await asyncio.sleep(1.0)
        os.killpg(first.pid, signal.SIGKILL)

    async def main():
        calls = [pool.run(f"import time; time.sleep(0.2); print({i})") for i in range(60)]
        results, _ = await asyncio.gather(asyncio.gather(*calls), kill_first_midway())
        during = pool.stats()
        await pool.aclose()
        return results, during

    results, stats = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(60)]  # none lost, none wrong
    assert stats["nodes"][first_url]["calls"] > 0 and stats["nodes"][second_url]["calls"] > 0  # both served
    assert stats["retries"] >= 1 and stats["nodes"][first_url]["lost"] == 1 and stats["actors"] == 1
    assert stats["in_flight"] == 0 and stats["queued"] == 0 and stats["p50"] <= stats["p99"]

    restarted, _ = start_server(int(first_url.rsplit(":", 1)[1].split("/")[0]))  # the node comes back
    try:
        async def until_both_up():
            for _ in range(100):
                await asyncio.gather(*(pool.run("print(1)") for _ in range(4)))
                if pool.stats()["actors"] == 2:
                    break
                await asyncio.sleep(0.1)
            await pool.aclose()

        asyncio.run(until_both_up())
        assert pool.stats()["actors"] == 2  # a probe passed, and it is routed to again
    finally:
        os.killpg(restarted.pid, signal.SIGTERM)
        restarted.wait(timeout=30)


def test_calls_beyond_the_limit_queue_and_a_down_pool_says_so(servers):
    (_, url), _ = servers
    pool = SandboxFusionPool([url], per_endpoint=2, timeout=10, token=TOKEN)

    async def main():
        calls = [asyncio.create_task(pool.run(f"import time; time.sleep(0.4); print({i})")) for i in range(6)]
        await asyncio.sleep(0.2)
        during = pool.stats()
        results = await asyncio.gather(*calls)
        await pool.aclose()
        return during, results

    during, results = asyncio.run(main())
    assert during["in_flight"] == 2 and during["queued"] == 4 and all(r.ok for r in results)
    dead = SandboxFusionPool(["http://127.0.0.1:9/run_code"], health_interval=0.1)
    result = dead.run_sync("print(1)")
    assert result.status == "sandbox_error" and dead.stats()["actors"] == 0


class FusionStub:
    """A real HTTP endpoint on 127.0.0.1 that answers every call as SandboxFusion does when its executor reports a
    failure (`status: SandboxError`): an answer, not an endpoint failure. It counts the calls it gets."""

    def __init__(self) -> None:
        self.calls = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/run_code"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    self.calls += 1
                    answer = json.dumps({"status": "SandboxError", "message": "the code did not run",
                                         "run_result": None}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                                 b"Connection: close\r\n\r\n%s" % (len(answer), answer))


def test_a_failure_the_code_reports_is_answered_once_and_ejects_nothing(servers):
    """`print(...); os._exit(70)` once came back `sandbox_error` and the pool ran it twice and took both endpoints
    out of routing: an answer is the code's outcome, whatever status it carries."""
    (_, first_url), (_, second_url) = servers
    pool = SandboxFusionPool([first_url, second_url], per_endpoint=4, timeout=10, token=TOKEN)
    forged = pool.run_sync("import os\nprint('x', flush=True)\nos._exit(70)")
    stats = pool.stats()
    assert forged.status == "error" and forged.stdout == "x\n", forged  # the code's own exit, never `sandbox_error`
    assert stats["calls"] == 1 and stats["retries"] == 0 and stats["actors"] == 2
    assert all(node["lost"] == 0 for node in stats["nodes"].values())

    stub = FusionStub()  # an endpoint whose executor says it failed: no second run elsewhere, still routed to
    try:
        pool = SandboxFusionPool([stub.url, first_url], per_endpoint=1, timeout=10)
        reported = pool.run_sync("print(1)")
        assert reported.status == "sandbox_error" and "the code did not run" in reported.note
        assert stub.calls == 1 and pool.stats()["retries"] == 0 and pool.stats()["actors"] == 2
    finally:
        stub.sock.close()


def test_an_endpoint_that_fails_is_retried_elsewhere_and_ejected(servers):
    (_, url), _ = servers
    impostor = socket.create_server(("127.0.0.1", 0))  # accepts, then resets: a transport failure
    dead = f"http://127.0.0.1:{impostor.getsockname()[1]}/run_code"

    def reset_all():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = impostor.accept()
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()

    threading.Thread(target=reset_all, daemon=True).start()
    try:
        pool = SandboxFusionPool([dead, url], per_endpoint=1, timeout=10, token=TOKEN, health_interval=60)
        results = [pool.run_sync(f"print({i})") for i in range(4)]
        stats = pool.stats()
    finally:
        impostor.close()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert stats["nodes"][dead]["lost"] == 1 and stats["nodes"][dead]["actors"] == 0 and stats["retries"] == 1
