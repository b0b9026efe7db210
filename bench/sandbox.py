"""Sandbox latency and throughput: LocalSandbox vs slime's baseline vs the floor, side by side in one run.

- `retool`: `LocalSandbox()` with its defaults (the strongest isolation this machine allows).
- `baseline`: what slime does per call: write the code to a temp file wrapped to set RLIMIT_AS, then run
  `python3 file` as a subprocess (here without blocking the event loop, which flatters it).
- `floor`: a bare `fork()` of a process warmed exactly like the fork server (same imports, warm-up, `gc.freeze()`)
  running the snippet, with no isolation and no IPC: the least any fork-based design can cost.

Rows with a `gap` pause each caller that long between its calls, as an RL loop does while the model generates the
next turn: the server then has its next children forked and confined before the calls arrive, so the row measures a
call itself; back-to-back rows (gap 0) measure how fast children can be made. The floor forks in every call either way.

Each retool row also says where its CPU went, per call (from /proc, as root or as the sandbox's user): the server,
the zygote (its forks), the children it reaped (confining, running, exiting), and this client; and the page faults
of each (most are copy-on-write copies of the zygote's pages). These are CPU times, so they hold under load better
than latencies do.

Usage: `python bench/sandbox.py [--calls 64] [--baseline-calls 16] [--concurrency 1 4 16 64] [--gap-ms 0 25]`
Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from retool_env.sandbox import LocalSandbox

SNIPPETS = {
    "print": "print(1 + 1)",
    "sympy": "import sympy as sp\nx = sp.Symbol('x')\nprint(sp.factor(x**6 - 1))",
    "numpy": "import numpy as np\na = np.arange(100.0).reshape(10, 10)\nprint(float(np.linalg.norm(a @ a.T)))",
}

# slime's wrapper (examples/retool/tool_sandbox.py), reduced to what costs time: rlimit, capture, run.
BASELINE_WRAPPER = """\
import resource, io, sys
resource.setrlimit(resource.RLIMIT_AS, (4 * 1024**3, -1))
_buf = io.StringIO(); _old = sys.stdout; sys.stdout = _buf
try:
{body}
finally:
    sys.stdout = _old
print(_buf.getvalue(), end="")
"""

FLOOR_WORKER = """
import json, os, sys, time
from retool_env.sandbox.forkserver.server import PRELOAD, warm_up
warm_up(PRELOAD)  # the same imports, warm-up and gc.freeze() as the fork server
code, concurrency, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
devnull = os.open(os.devnull, os.O_WRONLY)
started, latencies, launched = {}, [], 0
t0 = time.perf_counter()
while len(latencies) < calls:
    while launched < calls and len(started) < concurrency:
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.dup2(devnull, 1)
            exec(code, {"__name__": "__main__"})
            sys.stdout.flush()
            os._exit(0)
        started[pid] = start
        launched += 1
    pid, _ = os.wait()
    latencies.append(time.perf_counter() - started.pop(pid))
print(json.dumps({"latencies": latencies, "wall": time.perf_counter() - t0}))
"""


async def _drive(call, concurrency: int, calls: int, gap: float = 0.0) -> dict:
    """Run `calls` calls with `concurrency` in flight, each worker pausing `gap` seconds between its calls (as an RL
    loop does while the model generates); per-call latency and overall calls/s."""
    latencies: list[float] = []
    remaining = calls

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - start)
            if gap:
                await asyncio.sleep(gap)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"latencies": latencies, "wall": time.perf_counter() - start}


def _stat(pid: int) -> list[int]:
    """minflt, cminflt, utime, stime, cutime, cstime (clock ticks) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return [int(fields[i]) for i in (7, 8, 11, 12, 13, 14)]


def _server_and_zygote(sandbox: LocalSandbox) -> tuple[int, int] | None:
    """(server, zygote): the zygote is the descendant with the most children (the pool), the server its parent."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{entry}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    if sandbox.server_pid is None:
        return None
    level, depth = [sandbox.server_pid], 0
    found: list[tuple[int, int, int, int]] = []  # (its children, depth, pid, parent)
    while level:
        depth += 1
        found += [(len(children.get(c, [])), depth, c, pid) for pid in level for c in children.get(pid, [])]
        level = [c for pid in level for c in children.get(pid, [])]
    if not found:
        return None
    _, _, zygote, server = max(found)
    return server, zygote


def _cpu_snapshot(pids: tuple[int, int] | None) -> dict | None:
    if pids is None:
        return None
    with contextlib.suppress(OSError):
        server, zygote = _stat(pids[0]), _stat(pids[1])
        usage = resource.getrusage(resource.RUSAGE_SELF)
        tick = 1000 / os.sysconf("SC_CLK_TCK")
        return {
            "cpu_ms": {"server": (server[2] + server[3]) * tick, "zygote": (zygote[2] + zygote[3]) * tick,
                       "children": (zygote[4] + zygote[5]) * tick, "client": (usage.ru_utime + usage.ru_stime) * 1e3},
            "faults": {"server": server[0], "zygote": zygote[0], "children": zygote[1]},
        }  # fmt: skip
    return None


def _per_call(before: dict | None, after: dict | None, calls: int) -> dict | None:
    if before is None or after is None:
        return None
    out = {kind: {k: round((after[kind][k] - before[kind][k]) / calls, 2) for k in before[kind]} for kind in before}
    out["cpu_ms"]["total"] = round(sum(out["cpu_ms"].values()), 2)
    return out


async def bench_retool(sandbox: LocalSandbox, code: str, concurrency: int, calls: int, gap: float = 0.0) -> dict:
    async def call() -> None:
        result = await sandbox.run(code, timeout=60)
        assert result.ok, result

    await _drive(call, concurrency, min(calls, 2 * concurrency))  # warm the pool and the caches
    pids = _server_and_zygote(sandbox)
    before = _cpu_snapshot(pids)
    raw = await _drive(call, concurrency, calls, gap)
    await asyncio.sleep(0.2)  # the last children exit and are reaped (their CPU counts once they are)
    raw["per_call"] = _per_call(before, _cpu_snapshot(pids), calls)
    return raw


async def bench_baseline(code: str, concurrency: int, calls: int, gap: float = 0.0) -> dict:
    body = textwrap.indent(code, "    ")

    async def call() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "code.py")
            Path(path).write_text(BASELINE_WRAPPER.format(body=body))
            proc = await asyncio.create_subprocess_exec(
                sys.executable, path, cwd=tmp, env=os.environ.copy(),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), 900)
            assert proc.returncode == 0, err

    return await _drive(call, concurrency, calls, gap)


def bench_floor(code: str, concurrency: int, calls: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", FLOOR_WORKER, code, str(concurrency), str(calls)],
        capture_output=True, text=True, check=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )  # fmt: skip
    return json.loads(out.stdout)


def summarize(raw: dict) -> dict:
    lat = sorted(raw["latencies"])
    p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
    return {
        "calls": len(lat),
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": p99 * 1e3,
        "calls_per_s": len(lat) / raw["wall"],
        **({"per_call": raw["per_call"]} if raw.get("per_call") else {}),
    }


def machine() -> dict:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    load = os.getloadavg()
    return {
        "cpu": model, "cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in load],
    }  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=64, help="calls per cell for retool and the floor")
    parser.add_argument("--baseline-calls", type=int, default=16, help="calls per cell for the baseline (at least c)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--gap-ms", type=float, nargs="+", default=[0.0],
                        help="pause between one caller's calls (0: back to back)")
    parser.add_argument("--snippets", nargs="+", default=list(SNIPPETS), choices=list(SNIPPETS))
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()

    info = machine()
    command = "python " + " ".join([os.path.relpath(__file__), *sys.argv[1:]])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"sandbox-{time.strftime('%Y%m%d-%H%M%S')}.json"
    rows = []
    async with LocalSandbox() as sandbox:
        info["retool_wrapper"] = sandbox.wrapper
        info["isolation"] = {layer.name: layer.active for layer in sandbox.layers()}
        info["retool_max_concurrency"] = sandbox._config["max_concurrency"]
        for name in args.snippets:
            code = SNIPPETS[name]
            for c, gap_ms in itertools.product(args.concurrency, args.gap_ms):
                gap = gap_ms / 1000
                cell = {
                    "retool": summarize(await bench_retool(sandbox, code, c, max(args.calls, c), gap)),
                    "floor": summarize(bench_floor(code, c, max(args.calls, c))),
                    "baseline": summarize(await bench_baseline(code, c, max(args.baseline_calls, c), gap)),
                }
                rows.append({"snippet": name, "concurrency": c, "gap_ms": gap_ms, **cell})
                print_row(rows[-1], header=len(rows) == 1)
                info["load_average_now"] = [round(x, 2) for x in os.getloadavg()]
                path.write_text(json.dumps({"command": command, "machine": info, "rows": rows}, indent=2))
    print(f"\nmachine: {json.dumps(info)}\nwrote {path}")


def print_row(row: dict, header: bool) -> None:
    if header:
        print(
            "| snippet | c | gap ms | retool p50 / p99 ms | retool calls/s | floor p50 / p99 ms | floor calls/s "
            "| baseline p50 / p99 ms | baseline calls/s | baseline/retool p50 | retool/floor p50 |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    r, f, b = row["retool"], row["floor"], row["baseline"]
    print(
        f"| {row['snippet']} | {row['concurrency']} | {row['gap_ms']:g} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} "
        f"| {r['calls_per_s']:.0f} "
        f"| {f['p50_ms']:.1f} / {f['p99_ms']:.1f} | {f['calls_per_s']:.0f} "
        f"| {b['p50_ms']:.1f} / {b['p99_ms']:.1f} | {b['calls_per_s']:.1f} "
        f"| {b['p50_ms'] / r['p50_ms']:.1f}x | {r['p50_ms'] / f['p50_ms']:.2f}x |",
        flush=True,
    )
    per_call = r.get("per_call")
    if per_call:
        cpu, faults = per_call["cpu_ms"], per_call["faults"]
        print(f"  retool CPU ms per call: {cpu['total']:.1f} (server {cpu['server']:.1f}, zygote {cpu['zygote']:.1f}, "
              f"children {cpu['children']:.1f}, client {cpu['client']:.1f}); page faults per call: server "
              f"{faults['server']:.0f}, zygote {faults['zygote']:.0f}, children {faults['children']:.0f}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
