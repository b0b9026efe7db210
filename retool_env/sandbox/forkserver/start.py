"""The sandbox server's entry point: it warms up the preloads, forks the two zygotes, then serves.

`main` warms up the standard library's part of the preloads and forks the lean zygote, then imports the server
(asyncio and all), warms up the rest (sympy, numpy) and forks the full zygote, then serves (server.py). The lean
zygote's heap is a fraction of the full one's, and a child costs in proportion to it (its fork, the pages it copies,
its exit), so a stateless call whose code needs nothing else gets a lean child (`needs_full`). The choice is only
about speed: a lean child that imports sympy after all imports it from disk, slower, with the same result and the
same confinement (the zygote's code, limits and layers are the same; each probes its layers, and the server uses
the lean one only if they match the full one's). Sessions always use the full zygote.

Nothing here imports asyncio: the lean zygote is forked from this module before the server is imported.
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import json
import os
import socket
import sys
from dataclasses import replace

from . import confine
from .child import warm_up_cell
from .config import Config, lean_preload
from .zygote import ZygoteConfig
from .zygote import run as run_zygote

_PR_SET_DUMPABLE = 4
_M_ARENA_MAX = -8


def warm_up(preload: list[str]) -> None:
    """Import and exercise the libraries model code uses, then freeze them out of the GC (copy-on-write friendly)."""
    for name in preload:
        with contextlib.suppress(Exception):
            __import__(name)
    if "sympy" in sys.modules:
        import sympy

        x, y = sympy.symbols("x y")
        sympy.factor(x**4 - 1), sympy.solve([x + y - 3, x - y - 1], [x, y])
        sympy.simplify(sympy.sin(x) ** 2 + sympy.cos(x) ** 2), sympy.expand((x + 1) ** 5), sympy.Rational(3, 4) + 1
        sympy.isprime(97), sympy.factorint(360), sympy.N(sympy.pi, 30)
        sympy.nsimplify(0.5), sympy.sqrt(8), sympy.binomial(10, 3), sympy.diff(x**3, x), sympy.integrate(x**2, x)
        sympy.Matrix([[1, 2], [3, 4]]).det(), sympy.summation(x, (x, 1, 10)), sympy.limit(1 / x, x, sympy.oo)
        str(sympy.latex(x**2 / 3)), sympy.gcd(12, 18), sympy.divisors(12), sympy.totient(10), sympy.primerange(1, 20)
    if "numpy" in sys.modules:
        import numpy as np

        a = np.arange(16.0).reshape(4, 4) + np.eye(4)
        np.linalg.solve(a, np.ones(4)), np.linalg.det(a), np.random.default_rng(0).random(3), str(a), np.sort(a)
    warm_up_cell()
    sys.set_int_max_str_digits(0)
    _thread.stack_size(512 * 1024)  # so hundreds of threads fit under the address-space limit
    with contextlib.suppress(Exception):
        confine.libc().mallopt(_M_ARENA_MAX, 2)  # glibc reserves 64 MB of address space per malloc arena otherwise
    gc.collect()
    gc.freeze()


def _third_party() -> frozenset[str]:
    """Top-level modules importable from outside the standard library: most build on numpy or sympy (scipy,
    pandas, networkx), which only the full zygote holds, so code that names one gets a full child. Not names of
    one or two letters (pytest's `py`), which name variables and file suffixes far more often."""
    import pkgutil

    return frozenset(m.name for m in pkgutil.iter_modules()
                     if m.name not in sys.stdlib_module_names and len(m.name) > 2)


def _start_zygote(config: ZygoteConfig, close: list[int]) -> tuple[socket.socket, int]:
    """Fork a zygote of this process as it is now: (the server's end of its socket, its pid). It closes `close`
    (descriptors only the server may hold)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()  # before any request: the zygote's memory holds no code and no output, ever
    if pid == 0:
        ours.close()
        run_zygote(theirs, config, close=close)
    theirs.close()
    return ours, pid


def main() -> None:
    """Entry point: `python -c ... start.main()`, the JSON config on standard input (not on the command line,
    which any process may read).

    The lean zygote is forked once the standard library's preloads are warm, before the server's own modules
    (asyncio) are imported; the full one after the rest. Each takes half of the server's uids (its last one for its
    probes) and names its cgroups apart."""
    config = Config(**json.loads(sys.stdin.readline()))
    libc = confine.libc()
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    close = [config.listen_fd, config.lifeline_fd, 0]
    lean: tuple[socket.socket, int] | None = None
    heavy, full_config = frozenset[str](), config
    if config.lean_zygote and lean_preload(config.preload) != config.preload:
        half = config.uid_count // 2
        full_config = replace(config, uid_count=half)
        lean_config = replace(config, uid_base=config.uid_base + half, uid_count=config.uid_count - half,
                              group_prefix="lean-")
        warm_up(lean_preload(config.preload))
        lean_modules = set(sys.modules)
        lean = _start_zygote(lean_config, close)
        close.append(lean[0].fileno())
    import asyncio  # and the rest of the server: not in the lean zygote

    from .server import Server, ZygoteLink

    warm_up(config.preload)
    if lean is not None:
        heavy = frozenset(name.partition(".")[0] for name in sys.modules.keys() - lean_modules) | _third_party()
    full = ZygoteLink("full", *_start_zygote(full_config, close))
    asyncio.run(Server(config, full, None if lean is None else ZygoteLink("lean", *lean), heavy).serve())
