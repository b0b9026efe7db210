"""RaySandbox on a real Ray cluster: three simulated nodes on this machine, each with one `sandbox` resource.

One cluster for the module (starting Ray costs seconds); the tests that lose actors or nodes run last.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from retool_adapters.trl import log_sandbox_metrics  # noqa: E402
from retool_env import Problem, ToolEnvironment  # noqa: E402
from retool_env.rollout import Generation, run_episodes, sandbox_postfix  # noqa: E402
from retool_env.sandbox import make_sandbox  # noqa: E402
from retool_env.sandbox.ray_pool import RaySandbox  # noqa: E402

SMALL = {"num_cpus": 1, "object_store_memory": 80 * 1024**2}
PROBLEMS = [Problem(f"What is {a} * {b}?", str(a * b), id=f"p{a}") for a, b in
            [(12, 34), (56, 78), (91, 23), (45, 67), (89, 10), (11, 12), (13, 14), (15, 16), (17, 18)]]


@pytest.fixture(scope="module")
def cluster():
    # Ray's default failure detection, as in production: a crashed node is declared dead only seconds later, the
    # window in which a replacement looked up by name used to be the crashed node's actor again.
    cluster = Cluster(initialize_head=True, head_node_args={**SMALL, "include_dashboard": False})
    for _ in range(3):
        cluster.add_node(**SMALL, resources={"sandbox": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def pool(cluster):
    pool = RaySandbox(resource="sandbox", resource_per_actor=1, max_in_flight=4, timeout=10, max_concurrency=4,
                      health_interval=0.5, health_timeout=5, call_margin=10, prefork=1)
    pool.start()
    yield pool
    pool.close()


class Solver:
    """A scripted policy: computes the product with the interpreter, then boxes what it printed.

    `cells=2` splits the work over two calls (`x = a * b`, then `print(x)`), which only a stateful session gets
    right. `sleep` slows every call, so calls are in flight when a node goes away. `between_cells` is awaited after
    an episode's first cell and before its second.
    """

    def __init__(self, tok, cells=1, sleep=0.0, between_cells=None):
        self.tok, self.cells, self.sleep, self.between_cells = tok, cells, sleep, between_cells

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=(), stop=(), sampling=None):
        text = self.tok.decode(prompt_ids)
        a, b = re.findall(r"What is (\d+) \* (\d+)\?", text)[-1]
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.DOTALL)
        nap = f"import time; time.sleep({self.sleep})\n" if self.sleep else ""
        if self.cells == 2 and len(results) == 1 and self.between_cells:
            await self.between_cells()
        if len(results) == self.cells:
            reply = f"The product is \\boxed{{{results[-1].strip()}}}.<|im_end|>"
        else:
            code = {0: f"{nap}x = {a} * {b}" if self.cells == 2 else f"{nap}print({a} * {b})", 1: "print(x)"}
            call = json.dumps({"name": "code_interpreter", "arguments": {"code": code[len(results)]}})
            reply = f"<tool_call>\n{call}\n</tool_call><|im_end|>"
        ids = self.tok.encode(reply, add_special_tokens=False)
        return Generation(ids, [-0.25] * len(ids), "stop")


def episodes(tok, pool, solver, problems=PROBLEMS, stateful=False, concurrency=6):
    make_env = lambda: ToolEnvironment(tok, problems, sandbox=pool, stateful=stateful, tool_timeout=10.0)  # noqa: E731
    return asyncio.run(run_episodes(problems, make_env, solver, concurrency=concurrency, episode_timeout=120,
                                    progress=False))


def test_make_sandbox_reads_options_from_the_spec():
    sandbox = make_sandbox("ray:resource=sandbox,resource_per_actor=1,actors=3,address=auto")
    assert isinstance(sandbox, RaySandbox) and sandbox.resource == "sandbox" and sandbox.target == 3
    assert sandbox.address == "auto" and sandbox._options["resources"] == {"sandbox": 1}


def test_one_actor_per_sandbox_node(cluster, pool):
    sandbox_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("sandbox")}
    assert sorted(pool.actor_nodes()) == sorted(sandbox_nodes) and len(sandbox_nodes) == 3


def test_episodes_land_on_several_nodes_with_the_right_results(tiny_tok, pool):
    before = {node: s["calls"] for node, s in pool.stats()["nodes"].items()}
    trajs = episodes(tiny_tok, pool, Solver(tiny_tok, sleep=0.2))
    assert all(t.correct and not t.aborted for t in trajs) and len(trajs) == len(PROBLEMS)
    stats = pool.stats()
    used = [node for node, s in stats["nodes"].items() if s["calls"] > before.get(node, 0)]
    assert len(used) >= 2, stats
    assert stats["in_flight"] == 0 and stats["queued"] == 0 and stats["errors"] == 0 and stats["retries"] == 0
    assert 0.2 < stats["p50"] <= stats["p99"] < 10


def test_stateful_episodes_keep_each_session_on_one_actor(tiny_tok, pool):
    trajs = episodes(tiny_tok, pool, Solver(tiny_tok, cells=2), stateful=True)
    assert all(t.correct and t.num_tool_calls == 2 for t in trajs)  # `print(x)` elsewhere would be a NameError
    assert not pool._sessions  # every episode closed its session

    async def one_turn_two_cells():  # a turn's tool calls run together; they must land on the same actor
        await asyncio.gather(pool.run("x = 1", session="turn"), pool.run("x = 1", session="turn"))
        result = await pool.run("print(x)", session="turn")
        await pool.close_session("turn")
        return result

    before = {node: s["calls"] for node, s in pool.stats()["nodes"].items()}
    assert asyncio.run(one_turn_two_cells()).stdout == "1\n"
    added = [s["calls"] - before.get(node, 0) for node, s in pool.stats()["nodes"].items()]
    assert sorted(n for n in added if n) == [3]  # all three on one node's actor


def test_processes_with_the_same_name_share_one_pool(tiny_tok, pool):
    other = RaySandbox(resource="sandbox", resource_per_actor=1, timeout=10)  # another rank or worker, say
    try:
        assert other.run_sync("print(6 * 7)").stdout == "42\n"
        assert sorted(other.actor_nodes()) == sorted(pool.actor_nodes())  # no second claim on the cluster
    finally:
        other.close()
    assert pool.run_sync("print(1)").ok  # closing a named pool leaves its actors to their creator
    env = ToolEnvironment(tiny_tok, PROBLEMS, sandbox="ray:resource=sandbox,resource_per_actor=1")  # a config's way
    assert isinstance(env.sandbox, RaySandbox) and env.sandbox.run_sync("print(2)").stdout == "2\n"
    assert sorted(env.sandbox.actor_nodes()) == sorted(pool.actor_nodes())
    env.sandbox.close()
    postfix = sandbox_postfix(ToolEnvironment(tiny_tok, PROBLEMS, sandbox=pool))
    assert postfix["in_flight"] == 0 and postfix["queued"] == 0 and postfix["p99"].endswith("s")
    logged = {}
    log_sandbox_metrics(SimpleNamespace(_log_metric=logged.__setitem__), pool)  # what the TRL adapter logs
    assert logged["retool/sandbox/in_flight"] == 0 and logged["retool/sandbox/calls"] >= 1
    assert {"retool/sandbox/queued", "retool/sandbox/p99", "retool/sandbox/retries"} <= set(logged)


def test_calls_beyond_the_limit_wait_in_the_queue(pool):
    async def main():
        calls = [asyncio.create_task(pool.run(f"import time; time.sleep(0.5); print({i})")) for i in range(10)]
        await asyncio.sleep(0.3)
        during = pool.stats()
        results = await asyncio.gather(*calls)
        return during, results

    during, results = asyncio.run(main())
    assert during["in_flight"] == 4 and during["queued"] == 6
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(10)]


def test_a_lost_session_answers_sandbox_error_and_its_episode_is_aborted(tiny_tok, pool):
    """Kill one actor after every episode ran its first cell: its episodes abort, the others finish right."""
    first_cells = asyncio.Event()
    waiting = []
    doomed: dict = {}

    async def between_cells():
        waiting.append(1)
        if len(waiting) == len(PROBLEMS):
            victim = next(iter(pool._sessions.values()))  # the actor holding some episode's variables
            doomed["sessions"] = sum(m is victim for m in pool._sessions.values())
            ray.kill(victim.handle)
            first_cells.set()
        await first_cells.wait()

    trajs = episodes(tiny_tok, pool, Solver(tiny_tok, cells=2, between_cells=between_cells), stateful=True,
                     concurrency=len(PROBLEMS))
    aborted = [t for t in trajs if t.aborted]
    assert len(aborted) == doomed["sessions"] >= 1
    assert all("stateful episode" in t.finish_reason and t.reward is None for t in aborted)
    assert all(t.correct for t in trajs if not t.aborted)  # nothing silently wrong
    assert pool.stats()["lost"] >= 1


@pytest.fixture()
def ray_call_threads(monkeypatch):
    """The thread each `ray.kill` and `ray.cancel` ran on (the real calls still run): a blocking Ray call on Ray's own
    callback thread never returns."""
    import retool_env.sandbox.ray_pool as ray_pool

    threads = []
    for name in ("kill", "cancel"):
        real = getattr(ray, name)

        def watched(*args, _real=real, **kwargs):
            threads.append(threading.current_thread().name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(ray_pool.ray, name, watched)
    return threads


def test_actors_that_cannot_start_fail_start_clearly_and_close_in_bounded_time(cluster, ray_call_threads):
    """A bad sandbox option (the actor's constructor raises) and a resource no node has: `start()` says so, and
    `close()` returns at once; it used to hang in `ray.kill`, called on Ray's own callback thread."""
    broken = RaySandbox(resource="CPU", resource_per_actor=0.1, actors=2, name=None, no_such_option=1)
    with pytest.raises(RuntimeError, match="failed to start"):
        broken.start()
    begin = time.monotonic()
    broken.close()
    assert time.monotonic() - begin < broken.close_timeout + 1
    assert ray_call_threads and set(ray_call_threads) == {"retool-ray-sandbox"}  # the pool's thread, never Ray's

    nowhere = RaySandbox(resource="no_such_resource", resource_per_actor=1, actors=2, name=None, start_timeout=2,
                         close_timeout=5)
    with pytest.raises(RuntimeError, match="did not all start within 2 s"):
        nowhere.run_sync("print(1)")  # a call starts the pool lazily
    begin = time.monotonic()
    nowhere.close()
    assert time.monotonic() - begin < nowhere.close_timeout + 1
    assert not nowhere._maintenance.is_alive()  # its chores (killing the pending actors) are done


def test_a_node_crashed_mid_run_costs_retries_not_results_and_capacity_comes_back(tiny_tok, cluster, pool):
    deadline = time.monotonic() + 60
    while len(pool.actor_nodes()) < 3 and time.monotonic() < deadline:  # the last test's replacement
        time.sleep(0.2)
    assert len(pool.actor_nodes()) == 3
    retries = pool.stats()["retries"]
    worker_nodes = [n for n in cluster.worker_nodes if n.node_id in pool.actor_nodes()]

    async def remove_a_node_midway():
        await asyncio.sleep(1.0)
        cluster.remove_node(worker_nodes[0], allow_graceful=False)  # a crash: its raylet and workers SIGKILLed

    async def main():
        make_env = lambda: ToolEnvironment(tiny_tok, PROBLEMS, sandbox=pool, tool_timeout=10.0)  # noqa: E731
        run = run_episodes(PROBLEMS * 2, make_env, Solver(tiny_tok, sleep=1.5), concurrency=6,
                           episode_timeout=120, progress=False)
        return (await asyncio.gather(run, remove_a_node_midway()))[0]

    trajs = asyncio.run(main())
    assert all(t.correct and not t.aborted for t in trajs) and len(trajs) == 2 * len(PROBLEMS)
    stats = pool.stats()
    assert stats["retries"] > retries and stats["nodes"][worker_nodes[0].node_id]["actors"] == 0

    cluster.add_node(**SMALL, resources={"sandbox": 1})  # the pending replacement finds room on the new node
    deadline = time.monotonic() + 60
    while len(pool.actor_nodes()) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(set(pool.actor_nodes())) == 3 and worker_nodes[0].node_id not in pool.actor_nodes()
    assert pool.run_sync("print(6 * 7)").stdout == "42\n"
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    replacements = [n for n in names if re.fullmatch(r"retool-sandbox-\d-[0-9a-f]{8}", n)]
    assert replacements  # a new actor, never the crashed one looked up again by its name


def test_close_after_a_crash_is_bounded(cluster, pool):
    # Until Ray's health checks declare the crashed node dead, an actor may still be scheduled there and never run.
    deadline = time.monotonic() + 120
    while any(n["Alive"] and n["NodeID"] not in alive_node_ids(cluster) for n in ray.nodes()):
        assert time.monotonic() < deadline, "Ray never declared the crashed node dead"
        time.sleep(0.5)
    begin = time.monotonic()
    private = RaySandbox(resource="CPU", resource_per_actor=0.1, actors=1, name=None, close_timeout=5)
    assert private.run_sync("print(3)").stdout == "3\n"
    private.close()
    assert time.monotonic() - begin < 60 and not private._maintenance.is_alive()


def alive_node_ids(cluster) -> set[str]:
    return {node.node_id for node in [cluster.head_node, *cluster.worker_nodes]}
