"""The server's config (what the client decides), what its two zygotes preload, and which one a call needs.

The entry point (start.py) and the server (server.py) both read it; it imports neither, nor asyncio.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from .zygote import ZygoteConfig

PRELOAD = [
    "math", "cmath", "fractions", "decimal", "itertools", "functools", "collections", "statistics", "random", "re",
    "string", "heapq", "bisect", "operator", "copy", "json", "datetime", "time", "typing", "dataclasses", "numbers",
    "array", "textwrap", "pprint", "enum", "sympy", "numpy",
]  # fmt: skip
# Names that import a module without naming it in the code: a call using one gets the full zygote.
_DYNAMIC = frozenset({"__import__", "importlib", "exec", "eval", "__builtins__", "builtins", "runpy", "pkgutil"})
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SCAN_LIMIT = 32768  # characters; longer code gets the full zygote unscanned


def lean_preload(preload: list[str]) -> list[str]:
    """What the lean zygote preloads: the standard library's part of `preload`."""
    return [name for name in preload if name.partition(".")[0] in sys.stdlib_module_names]


def needs_full(code: str, heavy: frozenset[str]) -> bool:
    """Whether `code` should run in a child of the full zygote: it mentions a module in `heavy` (top-level names:
    what only the full zygote preloads, and every package outside the standard library), or a way to import by a
    computed name. One linear scan of the
    identifier-like words anywhere in it (comments and strings too: `__import__("sympy")` names sympy); only the
    speed depends on it, never the result."""
    if len(code) > SCAN_LIMIT:
        return True
    words = set(_WORD.findall(code))
    return not (words.isdisjoint(heavy) and words.isdisjoint(_DYNAMIC))


@dataclass(kw_only=True)
class Config(ZygoteConfig):
    """What the client decides; sent to the server as JSON on its standard input."""

    listen_fd: int
    lifeline_fd: int
    max_concurrency: int
    prefork: int
    max_sessions: int
    session_memory_mb: int  # what idle sessions may hold in all; 0: half the memory available at start
    preload: list[str]
    lean_zygote: bool  # a second zygote, without the preloads beyond the standard library
    uid_block_fd: int = -1  # held for life (and by the zygote): the lock on this server's uid block (uids.py)
