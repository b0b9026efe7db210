"""The procedural generator: reproducible, split-disjoint, and every answer confirmed by an independent computation.

The checkers read the numbers back out of the question text, so a question that does not say what its answer means
fails too; they use sympy, numpy brute force or a different algorithm, never the generator's code.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import numpy as np
import pytest
import sympy
from sympy.ntheory import digits as sympy_digits

from retool_env.data import LEVELS, arith_split, generate_arith, load_problems


def square_and_multiply(base: int, exp: int, mod: int) -> int:
    result, base = 1, base % mod
    for bit in bin(exp)[2:]:
        result = result * result % mod
        if bit == "1":
            result = result * base % mod
    return result


def digit_sum(n: int) -> int:
    return sum(sympy_digits(n, 10)[1:])


@functools.cache
def power_sum_formula(power: int) -> sympy.Expr:
    k, n = sympy.symbols("k n", integer=True, positive=True)
    return sympy.Lambda(n, sympy.summation(k ** power, (k, 1, n)))


def count_divisible(limit: int, a: int, b: int, c: int) -> int:
    x = np.arange(1, limit + 1)
    return int((((x % a == 0) | (x % b == 0)) & (x % c != 0)).sum())


def count_digit_sums(digits: int, total: int) -> int:
    x = sympy.symbols("x")
    first = sum(x ** d for d in range(1, 10))
    rest = sum(x ** d for d in range(10))
    return int(sympy.Poly(sympy.expand(first * rest ** (digits - 1)), x).coeff_monomial(x ** total))


def count_subsets(size: int, mod: int) -> int:
    masks = np.arange(1, 2 ** size)
    sums = ((masks[:, None] >> np.arange(size)) & 1) @ np.arange(1, size + 1)
    return int((sums % mod == 0).sum())


def to_base(n: int, base: int) -> str:
    return "".join(map(str, sympy_digits(n, base)[1:]))


N = r"(\d+)"
CHECKERS: list[tuple[str, Callable[..., object]]] = [
    (rf"What is {N} ([+*-]) {N}\?", lambda a, op, b: sympy.sympify(f"{a} {op} {b}")),
    (rf"Compute {N}\^\{{{N}\}} mod {N}\.", lambda b, e, m: square_and_multiply(int(b), int(e), int(m))),
    (rf"What is the sum of the digits of {N}\^\{{{N}\}}\?", lambda b, e: digit_sum(int(b) ** int(e))),
    (rf"How many positive divisors does {N} have\?", lambda n: sympy.divisor_count(int(n))),
    (rf"What is the greatest common divisor of {N} and {N}\?", lambda a, b: sympy.gcd(int(a), int(b))),
    (rf"What is the least common multiple of {N}, {N}, and {N}\?", lambda a, b, c: sympy.ilcm(int(a), int(b), int(c))),
    (rf"Write the decimal number {N} in base {N}\.", lambda n, b: to_base(int(n), int(b))),
    (rf"What is the base-10 value of the base-{N} number {N}\?", lambda b, s: int(s, int(b))),
    (rf"Compute the sum of k\^\{{{N}\}} for k from 1 to {N}\.", lambda p, n: power_sum_formula(int(p))(int(n))),
    (rf"What is the sum of the first {N} prime numbers\?",
     lambda n: sum(sympy.primerange(2, sympy.prime(int(n)) + 1))),
    (rf"Compute the sum of floor\({N}/k\) for k from 1 to {N}\.",
     lambda big, n: int((int(big) // np.arange(1, int(n) + 1)).sum())),
    (rf"How many integers from 1 to {N} are divisible by {N} or {N} but not by {N}\?",
     lambda limit, a, b, c: count_divisible(int(limit), int(a), int(b), int(c))),
    (rf"How many {N}-digit positive integers have digits that sum to {N}\?",
     lambda d, s: count_digit_sums(int(d), int(s))),
    (rf"How many nonempty subsets of \{{1, 2, \.\.\., {N}\}} have a sum divisible by {N}\?",
     lambda size, m: count_subsets(int(size), int(m))),
    (rf"What is the sum of the digits of {N} \* {N}\?", lambda a, b: digit_sum(int(a) * int(b))),
    (rf"Let N be the number of positive divisors of {N}\. Compute {N}\^N mod {N}\.",
     lambda n, b, m: square_and_multiply(int(b), int(sympy.divisor_count(int(n))), int(m))),
    (rf"What is the greatest common divisor of {N}\^\{{{N}\}} - 1 and {N}\^\{{{N}\}} - 1\?",
     lambda b1, m, b2, n: sympy.gcd(int(b1) ** int(m) - 1, int(b2) ** int(n) - 1)),
]


def independent_answer(question: str) -> str:
    matches = [(pattern, check) for pattern, check in CHECKERS if re.fullmatch(pattern, question)]
    assert len(matches) == 1, f"no single checker understands {question!r}"
    pattern, check = matches[0]
    return str(check(*re.fullmatch(pattern, question).groups()))


def test_every_answer_matches_an_independent_computation():
    problems = generate_arith(30 * len(LEVELS), seed=11)
    for problem in problems:
        assert problem.answer == independent_answer(problem.question), problem.id
    kinds = {pattern for p in problems for pattern, _ in CHECKERS if re.fullmatch(pattern, p.question)}
    assert len(kinds) == len(CHECKERS)  # every template was exercised


def test_same_seed_same_problems_and_prefix_stable():
    assert generate_arith(40, seed=3) == generate_arith(40, seed=3)
    assert [p.id for p in generate_arith(40, seed=3)] == [p.id for p in generate_arith(40, seed=3)]
    assert generate_arith(80, seed=3)[:40] == generate_arith(40, seed=3)
    other = {p.question for p in generate_arith(40, seed=4)}
    assert len(other & {p.question for p in generate_arith(40, seed=3)}) < 5


def test_ids_levels_and_needs_code_flags():
    problems = generate_arith(3 * len(LEVELS), seed=2)
    assert [p.level for p in problems] == list(LEVELS) * 3
    for i, problem in enumerate(problems):
        assert problem.id == f"arith-{problem.level}-2-{i}"
        assert problem.source == "arith"
        assert problem.metadata["needs_code"] == LEVELS[problem.level].needs_code
    assert not LEVELS["easy"].needs_code
    assert all(level.needs_code for name, level in LEVELS.items() if name != "easy")


def test_easy_problems_are_head_arithmetic():
    for problem in generate_arith(100, seed=0, levels=["easy"]):
        a, _, b = re.fullmatch(r"What is (\d+) ([+*-]) (\d+)\?", problem.question).groups()
        assert int(a) < 100 and int(b) < 100 and 0 <= int(problem.answer) < 200


def test_hard_levels_need_big_numbers():
    for problem in generate_arith(50, seed=0, levels=["multiply", "digitsum", "modpow"]):
        numbers = [int(n) for n in re.findall(r"\d+", problem.question)]
        if problem.level == "multiply":
            assert int(problem.answer) >= 10 ** 6
        else:  # a power far beyond mental arithmetic
            assert numbers[0] ** min(numbers[1], 100) >= 10 ** 20


def test_level_selection_and_bad_arguments():
    problems = generate_arith(10, seed=1, levels=["modpow", "base"])
    assert {p.level for p in problems} == {"modpow", "base"}
    with pytest.raises(ValueError, match="nope"):
        generate_arith(3, levels=["nope"])
    with pytest.raises(ValueError):
        generate_arith(-1)


def test_splits_are_fixed_disjoint_and_duplicate_free():
    train, test = arith_split("train"), arith_split("test")
    assert len(train) > len(test) > 0
    assert not {p.question for p in train} & {p.question for p in test}
    for split in (train, test):
        assert len({p.question for p in split}) == len(split)
        assert len({p.id for p in split}) == len(split)
    assert load_problems("arith", split="test", limit=25) == test[:25]
    assert load_problems("arith", limit=25) == train[:25]
    with pytest.raises(ValueError, match="valid"):
        arith_split("valid")
