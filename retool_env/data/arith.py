"""Procedural math tasks, generated offline and seeded, where running code beats mental arithmetic.

The default dataset of `ReTool-Arith-v0`: no machine here reaches a model hub, and a tool-use environment needs tasks
an interpreter genuinely helps with. Each level is a small function from a `random.Random` to a question and its exact
answer; "easy" is head arithmetic (a control where code should not be needed), every other level needs code.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from retool_env.data.problem import Problem

_SMALL_PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]


@dataclass(frozen=True)
class Level:
    """A family of procedural problems: `make(rng)` returns (question, exact answer as a string)."""

    name: str
    needs_code: bool
    description: str
    make: Callable[[random.Random], tuple[str, str]]


def _easy(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
    a, b = max(a, b), min(a, b)
    return f"What is {a} {op} {b}?", str({"+": a + b, "-": a - b, "*": a * b}[op])


def _multiply(rng: random.Random) -> tuple[str, str]:
    a = rng.randint(10 ** (rng.randint(3, 5)), 10 ** 6 - 1)
    b = rng.randint(10 ** (rng.randint(3, 5)), 10 ** 6 - 1)
    return f"What is {a} * {b}?", str(a * b)


def _modpow(rng: random.Random) -> tuple[str, str]:
    base, exp = rng.randint(2, 999), rng.randint(100, 10 ** 6)
    mod = rng.choice([1000, 10 ** 9 + 7, rng.randint(101, 99_999)])
    return f"Compute {base}^{{{exp}}} mod {mod}.", str(pow(base, exp, mod))


def _digitsum(rng: random.Random) -> tuple[str, str]:
    base, exp = rng.choice([b for b in range(2, 100) if b % 10]), rng.randint(30, 400)
    return f"What is the sum of the digits of {base}^{{{exp}}}?", str(sum(map(int, str(base ** exp))))


def _number_with_divisors(rng: random.Random) -> tuple[int, int]:
    """A number up to 10^12 built from small prime powers, and its divisor count."""
    primes = sorted(rng.sample(_SMALL_PRIMES, rng.randint(2, 5)))
    exps = [rng.randint(1, 4) for _ in primes]
    while math.prod(p ** e for p, e in zip(primes, exps, strict=True)) > 10 ** 12:
        exps[exps.index(max(exps))] -= 1
    return math.prod(p ** e for p, e in zip(primes, exps, strict=True)), math.prod(e + 1 for e in exps)


def _divisors(rng: random.Random) -> tuple[str, str]:
    n, count = _number_with_divisors(rng)
    return f"How many positive divisors does {n} have?", str(count)


def _gcdlcm(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        g = rng.randint(2, 999)
        a, b = g * rng.randint(100, 99_999), g * rng.randint(100, 99_999)
        return f"What is the greatest common divisor of {a} and {b}?", str(math.gcd(a, b))
    a, b, c = (rng.randint(100, 9999) for _ in range(3))
    return f"What is the least common multiple of {a}, {b}, and {c}?", str(math.lcm(a, b, c))


def _to_base(n: int, base: int) -> str:
    digits = ""
    while n:
        n, d = divmod(n, base)
        digits = str(d) + digits
    return digits or "0"


def _base(rng: random.Random) -> tuple[str, str]:
    n, base = rng.randint(1000, 10 ** 7), rng.randint(2, 9)
    if rng.random() < 0.5:
        return f"Write the decimal number {n} in base {base}.", _to_base(n, base)
    return f"What is the base-10 value of the base-{base} number {_to_base(n, base)}?", str(n)


@functools.cache
def _primes_up_to(limit: int) -> list[int]:
    sieve = bytearray([1]) * (limit + 1)
    sieve[:2] = b"\x00\x00"
    for p in range(2, math.isqrt(limit) + 1):
        if sieve[p]:
            sieve[p * p::p] = bytearray(len(range(p * p, limit + 1, p)))
    return [p for p in range(limit + 1) if sieve[p]]


def _series(rng: random.Random) -> tuple[str, str]:
    kind, n = rng.randrange(3), rng.randint(100, 2000)
    if kind == 0:
        power = rng.randint(2, 5)
        return f"Compute the sum of k^{{{power}}} for k from 1 to {n}.", str(sum(k ** power for k in range(1, n + 1)))
    if kind == 1:
        return f"What is the sum of the first {n} prime numbers?", str(sum(_primes_up_to(20_000)[:n]))
    big = rng.randint(10 ** 4, 10 ** 6)
    return (f"Compute the sum of floor({big}/k) for k from 1 to {n}.", str(sum(big // k for k in range(1, n + 1))))


def _count(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(3)
    if kind == 0:
        limit = rng.randint(10 ** 4, 10 ** 6)
        a, b, c = rng.sample([2, 3, 5, 7, 11, 13], 3)

        def multiples(*ds: int) -> int:  # inclusion-exclusion counts of multiples of lcm(ds) up to limit
            return limit // math.lcm(*ds)

        either = multiples(a) + multiples(b) - multiples(a, b)
        either_and_c = multiples(a, c) + multiples(b, c) - multiples(a, b, c)
        return (f"How many integers from 1 to {limit} are divisible by {a} or {b} but not by {c}?",
                str(either - either_and_c))
    if kind == 1:
        digits = rng.randint(3, 6)
        total = rng.randint(5, 9 * digits - 5)
        ways = [1] + [0] * total  # ways[s]: digit strings so far with digit sum s
        for position in range(digits):
            first = 1 if position == 0 else 0
            ways = [sum(ways[s - d] for d in range(first, 10) if s - d >= 0) for s in range(total + 1)]
        return f"How many {digits}-digit positive integers have digits that sum to {total}?", str(ways[total])
    size, mod = rng.randint(8, 16), rng.randint(3, 11)
    residues = [1] + [0] * (mod - 1)  # residues[r]: subsets so far with sum = r (mod mod)
    for x in range(1, size + 1):
        residues = [residues[r] + residues[(r - x) % mod] for r in range(mod)]
    return (f"How many nonempty subsets of {{1, 2, ..., {size}}} have a sum divisible by {mod}?",
            str(residues[0] - 1))


def _compose(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(10 ** 5, 10 ** 7), rng.randint(10 ** 5, 10 ** 7)
        return f"What is the sum of the digits of {a} * {b}?", str(sum(map(int, str(a * b))))
    if kind == 1:
        n, count = _number_with_divisors(rng)
        base, mod = rng.randint(2, 99), rng.randint(101, 9999)
        return (f"Let N be the number of positive divisors of {n}. Compute {base}^N mod {mod}.",
                str(pow(base, count, mod)))
    base, m, n = rng.randint(2, 9), rng.randint(20, 200), rng.randint(20, 200)
    return (f"What is the greatest common divisor of {base}^{{{m}}} - 1 and {base}^{{{n}}} - 1?",
            str(base ** math.gcd(m, n) - 1))


LEVELS: dict[str, Level] = {level.name: level for level in [
    Level("easy", False, "1-2 digit sums, differences and times tables", _easy),
    Level("multiply", True, "products of two 4-6 digit numbers", _multiply),
    Level("modpow", True, "modular exponentiation with large exponents", _modpow),
    Level("digitsum", True, "digit sums of large powers", _digitsum),
    Level("divisors", True, "divisor counts of numbers up to 10^12", _divisors),
    Level("gcdlcm", True, "gcd of two and lcm of three multi-digit numbers", _gcdlcm),
    Level("base", True, "conversion between base 10 and bases 2-9", _base),
    Level("series", True, "power sums, sums of primes, sums of floors", _series),
    Level("count", True, "inclusion-exclusion, digit-sum and subset-sum counts", _count),
    Level("compose", True, "two-step compositions of the above", _compose),
]}

# Default split sizes and seeds for `load_problems("arith", split=...)`; train never repeats a test question.
ARITH_SPLITS: dict[str, tuple[int, int]] = {"train": (0, 5000), "test": (1, 500)}


def iter_arith(seed: int = 0, levels: Sequence[str] | None = None) -> Iterator[Problem]:
    """An endless, reproducible stream of problems cycling through `levels` (all by default).

    Problem i depends only on (seed, level, i), so a shorter run is a prefix of a longer one.
    """
    names = list(levels) if levels is not None else list(LEVELS)
    unknown = [name for name in names if name not in LEVELS]
    if unknown or not names:
        raise ValueError(f"unknown arith levels {unknown or names}; choose from {list(LEVELS)}")
    i = 0
    while True:
        level = LEVELS[names[i % len(names)]]
        question, answer = level.make(random.Random(f"arith:{seed}:{level.name}:{i}"))
        yield Problem(question, answer, f"arith-{level.name}-{seed}-{i}", "arith", level.name,
                      {"needs_code": level.needs_code, "seed": seed})
        i += 1


def generate_arith(n: int, seed: int = 0, levels: Sequence[str] | None = None) -> list[Problem]:
    """`n` procedural problems with exact answers, round-robin over `levels`; same seed, same problems."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return list(islice(iter_arith(seed, levels), n))


def arith_split(split: str = "train", limit: int | None = None, levels: Sequence[str] | None = None) -> list[Problem]:
    """The fixed train or test split: different seeds, duplicates dropped, train disjoint from test by question."""
    if split not in ARITH_SPLITS:
        raise ValueError(f"unknown arith split {split!r}; choose from {list(ARITH_SPLITS)}")
    seed, size = ARITH_SPLITS[split]
    n = size if limit is None else min(limit, size)
    seen: set[str] = set()
    if split != "test":
        test_seed, test_size = ARITH_SPLITS["test"]
        seen = {p.question for p in generate_arith(test_size, test_seed, levels)}
    problems: list[Problem] = []
    for problem in iter_arith(seed, levels):
        if len(problems) >= n:
            break
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    return problems
