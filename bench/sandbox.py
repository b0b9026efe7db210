"""Sandbox latency and throughput: LocalSandbox vs slime's baseline vs the floor, side by side in one run.

- `retool`: `LocalSandbox()` with its defaults (the strongest isolation this machine allows).
- `baseline`: what slime does per call: write the code to a temp file wrapped to set RLIMIT_AS, then run
  `python3 file` as a subprocess (here without blocking the event loop, which flatters it).
- `floor`: a bare `fork()` of a process warmed exactly like the zygote the row's calls used (the same imports,
  warm-up and `gc.freeze()`: the lean one's, the standard library's preloads only, or the full one's, with sympy
  and numpy), running the snippet, with no isolation and no IPC: the least any fork-based design can cost.

Rows with a `gap` pause each caller that long between its calls, as an RL loop does while the model generates the
next turn: the server then has its next children forked and confined before the calls arrive, so the row measures a
call itself; back-to-back rows (gap 0) measure how fast children can be made. The floor forks in every call either way.

Each retool row names the zygote its calls used (the server's count of children each forked) and says where its
CPU went, per call (from /proc, as root or as the sandbox's user): the server, that zygote (its forks), the children
it reaped (confining, running, exiting), the other zygote, and this client; and the page faults of each (most are
copy-on-write copies of the zygote's pages). These are CPU times, so they hold under load better
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
import json, os, sys, time, types
# As the server imports its package (local.py's bootstrap): not retool_env/__init__.py, which imports gymnasium.
for name, path in (("retool_env", sys.argv[5]), ("retool_env.sandbox", sys.argv[6])):
    module = types.ModuleType(name); module.__path__ = [path]; sys.modules[name] = module
from retool_env.sandbox.forkserver import isolation  # as the server imports it first
from retool_env.sandbox.forkserver.config import PRELOAD, lean_preload
from retool_env.sandbox.forkserver.start import warm_up
# The same imports, warm-up and gc.freeze() as the zygote (start.main): the lean one's, then the rest for the full.
warm_up(lean_preload(PRELOAD))
if sys.argv[4] == "full":
    warm_up(PRELOAD)
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


def _inner_pid(pid: int) -> int:
    """A host pid's number in its innermost pid namespace (the server's, for its zygotes)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("NSpid:")).split()[-1])


def _server_and_zygotes(sandbox: LocalSandbox, zygotes: dict[str, int]) -> tuple[int, dict[str, int]] | None:
    """(server, {zygote name: host pid}): the server's zygotes are the descendants whose pids in its namespace are
    those it reports (`zygotes`), the server their parent."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{entry}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    if sandbox.server_pid is None:
        return None
    level, found, server = [sandbox.server_pid], {}, 0
    while level and len(found) < len(zygotes):
        for pid in level:
            for child in children.get(pid, []):
                with contextlib.suppress(OSError, StopIteration):
                    name = next((n for n, inner in zygotes.items() if inner == _inner_pid(child)), None)
                    if name is not None and children.get(child):  # a zygote has its pool below it
                        found[name], server = child, pid
        level = [c for pid in level for c in children.get(pid, [])]
    return (server, found) if len(found) == len(zygotes) else None


def _cpu_snapshot(pids: tuple[int, dict[str, int]] | None, used: str) -> dict | None:
    """CPU ms and page faults so far: the server, the zygote `used` and its children, the other zygotes and theirs."""
    if pids is None:
        return None
    with contextlib.suppress(OSError):
        server = _stat(pids[0])
        zygotes = {name: _stat(pid) for name, pid in pids[1].items()}
        zygote, others = zygotes.pop(used), list(zygotes.values())
        usage = resource.getrusage(resource.RUSAGE_SELF)
        tick = 1000 / os.sysconf("SC_CLK_TCK")
        return {
            "cpu_ms": {"server": (server[2] + server[3]) * tick, "zygote": (zygote[2] + zygote[3]) * tick,
                       "children": (zygote[4] + zygote[5]) * tick,
                       "other_zygote": sum(z[2] + z[3] + z[4] + z[5] for z in others) * tick,
                       "client": (usage.ru_utime + usage.ru_stime) * 1e3},
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

    forked = {name: z["forked"] for name, z in (await sandbox.info())["zygotes"].items()}
    await _drive(call, concurrency, min(calls, 2 * concurrency))  # warm the pool and the caches
    info = (await sandbox.info())["zygotes"]
    used = max(info, key=lambda name: info[name]["forked"] - forked[name])  # the one whose children the calls took
    pids = _server_and_zygotes(sandbox, {name: z["pid"] for name, z in info.items()})
    before = _cpu_snapshot(pids, used)
    raw = await _drive(call, concurrency, calls, gap)
    await asyncio.sleep(0.2)  # the last children exit and are reaped (their CPU counts once they are)
    raw["per_call"] = _per_call(before, _cpu_snapshot(pids, used), calls)
    raw["zygote"] = used
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


def bench_floor(code: str, concurrency: int, calls: int, zygote: str = "full") -> dict:
    """The floor for a row whose calls used `zygote` ("full" or "lean"): a process warmed like it."""
    sandbox_dir = os.path.dirname(sys.modules[LocalSandbox.__module__].__file__ or "")
    package_root = os.path.dirname(os.path.dirname(sandbox_dir))
    out = subprocess.run(
        [sys.executable, "-c", FLOOR_WORKER, code, str(concurrency), str(calls), zygote, package_root, sandbox_dir],
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
        **({"zygote": raw["zygote"]} if raw.get("zygote") else {}),
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
                retool = summarize(await bench_retool(sandbox, code, c, max(args.calls, c), gap))
                cell = {
                    "retool": retool,
                    "floor": summarize(bench_floor(code, c, max(args.calls, c), retool.get("zygote", "full"))),
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
        print(f"  {r.get('zygote', 'full')} zygote (the floor is warmed like it); retool CPU ms per call: "
              f"{cpu['total']:.1f} (server {cpu['server']:.1f}, zygote {cpu['zygote']:.1f}, "
              f"children {cpu['children']:.1f}, other zygote {cpu['other_zygote']:.1f}, client {cpu['client']:.1f}); "
              "page faults per call: server "
              f"{faults['server']:.0f}, zygote {faults['zygote']:.0f}, children {faults['children']:.0f}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
