"""RaySandbox against LocalSandbox on one machine: the Ray path's overhead, throughput against simulated nodes, the
driver's cost per call (for a capacity model), and failure injection.

- overhead: one call at a time, `print(1 + 1)`, LocalSandbox vs a one-actor RaySandbox; the difference is what Ray
  adds (two hops between processes, pickling, the driver's routing).
- nodes: `ray.cluster_utils.Cluster` with 1..N nodes (one `sandbox` resource each, one actor each) on this machine;
  they share its cores, so this measures the pool's scaling machinery, not more hardware.
- driver: the driver process's CPU seconds per call at saturation (Ray's own threads included): the rate one
  driver can route is about 1 / that.
- failures: stateless calls with an actor killed mid-run; every call must come back with its own output.

Usage: `python bench/sandbox_ray.py [--calls 400] [--nodes 1 2 3] [--concurrency 32]`; writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from retool_env.sandbox import LocalSandbox
from retool_env.sandbox.ray_pool import RaySandbox

SNIPPETS = {
    "print": "print(1 + 1)",
    "sympy": "import sympy as sp\nx = sp.Symbol('x')\nprint(sp.factor(x**6 - 1))",
}
NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024**2}


async def drive(sandbox, code: str, calls: int, concurrency: int) -> dict:
    """`calls` calls, `concurrency` in flight: latencies, calls/s, and the driver's CPU seconds per call."""
    latencies: list[float] = []
    outputs: list[str] = []
    todo = iter(range(calls))

    async def worker() -> None:
        for i in todo:
            start = time.perf_counter()
            result = await sandbox.run(f"{code}\nprint({i})")
            latencies.append(time.perf_counter() - start)
            outputs.append(result.stdout.rsplit("\n", 2)[-2] == str(i) and result.ok)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    ordered = sorted(latencies)
    return {"calls": calls, "p50_ms": 1e3 * ordered[len(ordered) // 2],
            "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "calls_per_s": calls / wall, "driver_cpu_ms_per_call": 1e3 * cpu / calls, "wrong": outputs.count(False)}


def overhead(calls: int) -> dict:
    """Alternate one LocalSandbox call and one RaySandbox call, so both see the same load on a shared machine."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=NODE["object_store_memory"])
    local, pool = LocalSandbox(), RaySandbox(resource="CPU", resource_per_actor=1, actors=1)
    local.start()
    pool.start()

    async def timed(sandbox) -> float:
        start = time.perf_counter()
        assert (await sandbox.run(SNIPPETS["print"])).ok
        return 1e3 * (time.perf_counter() - start)

    async def paired() -> list[tuple[float, float]]:
        for _ in range(20):
            await timed(local), await timed(pool)
        return [(await timed(local), await timed(pool)) for _ in range(calls)]

    pairs = asyncio.run(paired())
    local.close()
    pool.close()
    ray.shutdown()

    def quantiles(values: list[float]) -> dict:
        ordered = sorted(values)
        return {"p50_ms": ordered[len(ordered) // 2],
                "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}

    return {"calls": calls, "local": quantiles([a for a, _ in pairs]), "ray": quantiles([b for _, b in pairs]),
            "difference": quantiles([b - a for a, b in pairs])}


def nodes_and_failures(node_counts: list[int], calls: int, concurrency: int) -> tuple[list[dict], dict]:
    rows, failures = [], {}
    with LocalSandbox() as local:  # the same machine without Ray: 4 calls executing at once (2 per core)
        for name, code in SNIPPETS.items():
            asyncio.run(drive(local, code, 2 * concurrency, concurrency))
            rows.append({"nodes": "LocalSandbox", "snippet": name, "concurrency": concurrency,
                         **asyncio.run(drive(local, code, calls, concurrency))})
            print(json.dumps(rows[-1]), flush=True)
    for n in node_counts:
        cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
        for _ in range(n):
            cluster.add_node(**NODE, resources={"sandbox": 1})
        ray.init(address=cluster.address, log_to_driver=False)
        pool = RaySandbox(resource="sandbox", resource_per_actor=1, max_concurrency=4)
        pool.start()
        for name, code in SNIPPETS.items():
            asyncio.run(drive(pool, code, 2 * concurrency, concurrency))
            row = {"nodes": n, "snippet": name, "concurrency": concurrency,
                   **asyncio.run(drive(pool, code, calls, concurrency))}
            rows.append(row)
            print(json.dumps(row), flush=True)
        if n == max(node_counts) and n > 1:
            failures = inject_failure(pool, calls, concurrency)
            print(json.dumps(failures), flush=True)
        pool.close()
        ray.shutdown()
        cluster.shutdown()
    return rows, failures


def inject_failure(pool: RaySandbox, calls: int, concurrency: int) -> dict:
    async def kill_one_actor_midway() -> None:
        await asyncio.sleep(0.5)
        ray.kill(pool._members[0].handle)

    async def main() -> dict:
        code = "import time; time.sleep(0.05)"
        return (await asyncio.gather(drive(pool, code, calls, concurrency), kill_one_actor_midway()))[0]

    before = pool.stats()
    row = asyncio.run(main())
    after = pool.stats()
    return {"calls": calls, "wrong_or_lost": row["wrong"], "retries": after["retries"] - before["retries"],
            "actors_lost": after["lost"] - before["lost"], "p99_ms": row["p99_ms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    result = {"command": "python bench/sandbox_ray.py " + " ".join(sys.argv[1:]), "cpus": os.cpu_count(),
              "load_average_at_start": os.getloadavg(), "overhead": overhead(args.calls)}
    print(json.dumps(result["overhead"]), flush=True)
    result["nodes"], result["failures"] = nodes_and_failures(args.nodes, args.calls, args.concurrency)
    result["load_average_at_end"] = os.getloadavg()
    path = Path(args.out) / "sandbox_ray.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
