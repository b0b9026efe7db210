"""Grading: extraction, the equivalence table, verl's strict box check, MATH-500 golds, threads and event loops."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retool_env import grading
from retool_env.grading import (
    Grade,
    agrade,
    extract_answer,
    grade,
    grading_stats,
    is_equivalent,
    stated_values,
    strict_box_correct,
)

FIXTURES = Path(__file__).parent / "fixtures" / "grading"


def _expand(value: str | list) -> str:
    """Fixture strings may be written as [text, n] for text * n (the 50 KB hostile answer)."""
    return value[0] * value[1] if isinstance(value, list) else value


CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]
MATH500 = json.loads((FIXTURES / "math500_answers.json").read_text())
INTEGERS = json.loads((FIXTURES / "integer_answers.json").read_text())
RESPONSES = json.loads((FIXTURES / "responses.json").read_text())["cases"]


@pytest.fixture(autouse=True, scope="module")
def warm_pool() -> None:
    """Start every worker slot up front, so time limits below measure comparisons, not interpreter start-up."""
    size = grading.pool.default_pool_size()
    with ThreadPoolExecutor(size) as pool:
        list(pool.map(lambda n: is_equivalent(f"\\sqrt{{{n}}}", "x"), range(size)))


# ------------------------------------------------------------------------------------------------ the case table
def test_case_table_is_broad() -> None:
    categories = {case["category"] for case in CASES}
    assert len(CASES) >= 100
    assert sum(not case["expected"] for case in CASES) >= 50
    assert {
        "dapo_integer",
        "aime_padding",
        "fraction",
        "interval",
        "tuple",
        "text",
        "matrix",
        "pi",
        "hostile",
    } <= categories


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c['category']}" for i, c in enumerate(CASES)])
def test_case_table(case: dict) -> None:
    pred, gold = _expand(case["pred"]), _expand(case["gold"])
    timeout = 1.0 if case["category"] == "hostile" else grading.DEFAULT_TIMEOUT  # towers of powers time out
    start = time.monotonic()
    assert is_equivalent(pred, gold, timeout=timeout) is case["expected"], case.get("note", "")
    assert time.monotonic() - start < timeout + 1.0


def test_integer_answers_never_reach_math_verify() -> None:
    """DAPO/AIME golds, right or wrong, are decided in-process in microseconds."""
    before = grading_stats()
    golds = INTEGERS["aime24"] + INTEGERS["aime25"] + INTEGERS["dapo"]
    # The zero-padded copy lists problems in another order; the same 30 values sorted pair up.
    for gold, padded in zip(
        sorted(INTEGERS["aime24"], key=int), sorted(INTEGERS["aime24_zero_padded"], key=int), strict=True
    ):
        assert is_equivalent(padded, gold) and is_equivalent(gold, padded)
    for gold in golds:
        assert is_equivalent(f" {gold}.", gold)
        assert not is_equivalent(str(int(gold) + 1), gold)
    after = grading_stats()
    assert after["math_verify_calls"] == before["math_verify_calls"]
    assert after["fast_path"] - before["fast_path"] == 60 + 2 * len(golds)


# ------------------------------------------------------------------------------------------------ extraction
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{204}.", "204"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("first \\boxed{1}, finally \\boxed{2}", "1, 2"),  # several boxes are one answer, as in math-verify
        ("\\boxed{5}. Checking: yes, \\boxed{ 5 }.", "5"),  # a repeat counts once
        ("\\boxed{\\boxed{9}}", "\\boxed{9}"),
        ("\\boxed{ \\boxed{5}", "5"),  # inside an unclosed box
        ("Final Answer: The largest $n$ is 34.", "34"),
        ("Answer: The answer is 34", "34"),
        ("Final Answer: The final answer is 7.78. I hope it is correct.", "7.78"),
        ("So \\boxed{255} is the interest. Final Answer: The final answer is $10,455$.", "10,455"),
        ("Answer: 5\n\nNo, recomputing: \\boxed{6}", "6"),
        ("\\boxed{42}. This completes the answer: we are done.", "42"),
        ("\\boxed{42}\n**Answer:** 43", "43"),
        ("\\boxed{5} and then a truncated \\boxed{6", "5"),
        ("<answer>\n\\boxed{'42'}\n</answer>", "'42'"),
        ("<answer>\nThe answer is \\boxed{3}\n</answer> \\boxed{4} was wrong", "3"),
        ("<answer>42</answer>", "42"),
        ("The final answer is \\fbox{7}", "7"),
        ("\\boxed {7}", "7"),
        ("Answer: \\boxed{x=5}", "x=5"),
        ("Answer: 34", "34"),
        ("**Answer:** $34$", "34"),
        ("Answer: $\\$18.90$", "\\$18.90"),
        ("Answer: 34<|im_end|>", "34"),
        ("no final answer here", None),
        ("", None),
        ("\\boxed{", None),
        ("```python\nprint('\\\\boxed{42}')\n```\nDone.", None),
        ("<code>\nx = '\\\\boxed{42}'\n</code> so I think", None),
        ("<interpreter>\n\\boxed{42}\n</interpreter> I am not sure.", None),
        ("```python\nprint(1)\n```\nSo \\boxed{41}.", "41"),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


HOSTILE_TEXT = [
    "\\boxed{" * 8000,
    "{" * 50_000 + "\\boxed{1}",
    "x" * 50_000,
    "Answer:" * 5000,
    "Answer: " + "$" * 50_000 + "x",
    "5 " + "a" * 40 + "!",  # exponential backtracking in a naive "number + unit words" pattern
    "$" * 999 + "x",  # cubic backtracking in a naive "$...$" pattern
    "$\\$" * 300,
    "\\text{" * 300 + "}" * 300,
    "x = " * 250,  # relations, brackets, environments and unit tails: stated_values scans each once
    "(" * 500 + "a = 1, " * 70,
    "\\begin{" * 140,
    "1 \\text{a}" + " }" * 490,
]


@pytest.mark.parametrize("text", HOSTILE_TEXT, ids=range(len(HOSTILE_TEXT)))
def test_hostile_text_is_handled_in_linear_time(text: str) -> None:
    """Model output runs these regexes in the trainer's process: a blow-up would stall training, not one call."""
    start = time.perf_counter()
    extract_answer(text)
    extract_answer("\\boxed{" + text[:990] + "}")
    grading.normalize_answer(text[:1000])
    stated_values(text[:1000], "42")
    assert time.perf_counter() - start < 0.5


# ------------------------------------------------------------------------------------------------ whole responses
@pytest.mark.parametrize("case", RESPONSES, ids=[f"{i}-{c['category']}" for i, c in enumerate(RESPONSES)])
def test_response_suite(case: dict) -> None:
    """The reward path on whole responses, in the style of math-verify's own tests (cases written for this suite)."""
    verdict = grade(case["response"], case["gold"]).correct
    if case.get("known_miss"):
        assert verdict is False and case["expected"], case["known_miss"]  # a miss is never a false positive
    else:
        assert verdict is case["expected"], case.get("note", "")


def test_response_suite_is_broad_and_mostly_right() -> None:
    assert len(RESPONSES) >= 106 and sum(not c["expected"] for c in RESPONSES) >= 30
    assert sum(bool(c.get("known_miss")) for c in RESPONSES) <= 2
    assert {"boxes", "answer_line", "order", "thousands"} <= {c["category"] for c in RESPONSES}


def test_grade_and_agrade_agree() -> None:
    async def all_async() -> list[Grade]:
        return list(await asyncio.gather(*(agrade(c["response"], c["gold"]) for c in RESPONSES)))

    assert asyncio.run(all_async()) == [grade(c["response"], c["gold"]) for c in RESPONSES]


@pytest.mark.parametrize(("pred", "gold"), [("111", "0,111"), ("0,111", "111"), ("0\\,111", "111"), ("12", "0,012")])
def test_a_leading_zero_group_is_no_thousands_separator(pred: str, gold: str) -> None:
    assert not is_equivalent(pred, gold)
    assert is_equivalent("1,111", "1111") and is_equivalent("10\\,455", "10455")


# ------------------------------------------------------------------------------------------------ hedges
HEDGES = [
    "42 \\lor 43", "42 \\vee 43", "42 \\approx 43", "42 \\sim 43", "42 \\to 43", "42 \\Rightarrow 43", "42 \\mid 43",
    "42 \\equiv 43", "42 \\parallel 43", "42 \\sqsubset 43", "42 \\cup 43", "42 | 43", "\\frac{84}{2} = 43",
    "x = 41 = 42",
    "x = 42 = 43", "\\begin{cases} 42 \\\\ 43 \\end{cases}", "\\begin{aligned} 42 \\\\ 43 \\end{aligned}",
    "\\substack{42 \\\\ 43}", "42 \\\\ 43", "42 \\text{ (or } 43\\text{)}", "\\text{42 or 43}", "42 \\text{ else } 43",
    "1, 2, \\ldots, 42", "40, 41, \\ldots, 43", "(\\frac{84}{2} = 43, 5)", "(x = 41 = 42, 5)",
    "42 \\text{ (possibly 43)}", "43 \\text{ (} 42 \\text{)}", "42 \\text{ (maybe } 43\\text{)}",
]  # fmt: skip


@pytest.mark.parametrize("pred", HEDGES)
def test_an_answer_that_lists_or_relates_alternatives_is_right_for_no_gold(pred: str) -> None:
    """One side read (math-verify takes the last number of what it cannot parse, the value of `\\approx`'s left side,
    the right side of a false equation), the hedge would pay: it pays for neither value."""
    golds = ["42", "43", "(42, 5)", "(43, 5)"]
    assert [gold for gold in golds if grade(f"The answer is \\boxed{{{pred}}}.", gold).correct] == []


@pytest.mark.parametrize("pred", ["y = 2x + 3 = 3x + 2", "y = 3x + 2 = 2x + 3", "y = 2x + 3 \\\\ y = 3x + 2",
                                  "x = 1 = 2"])
def test_against_an_equation_gold_a_chain_pays_for_neither_side(pred: str) -> None:
    golds = ["y = 2x + 3", "y = 3x + 2", "x = 1", "x = 2"]
    assert [gold for gold in golds if grade(f"\\boxed{{{pred}}}", gold).correct] == []
    assert grade("\\boxed{y = 2x + 3}", "y=2x+3").correct and grade("\\boxed{x = 2}", "x=2").correct


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("x = 42", "42"), ("x \\approx 42", "42"), ("\\frac{84}{2} = 42", "42"), ("x = \\frac{84}{2} = 42", "42"),
        ("f(x) = 2x + 1", "2x+1"), ("\\text{Area} = 42", "42"), ("a = 1, b = 2", "1, 2"), ("(x, y) = (1, 2)", "(1,2)"),
        ("(x = 1, y = 2)", "(1,2)"), ("y = 2x + 3", "y=2x+3"), ("\\{x \\mid x > 0\\}", "\\{x \\mid x > 0\\}"),
        ("\\lim_{x \\to 0} \\frac{\\sin x}{x} = 1", "1"), ("\\sum_{k=1}^{10} k = 55", "55"), ("x \\in [1,3)", "[1,3)"),
        ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"), ("42^\\circ", "42"),
        ("42 \\text{ cm}", "42"), ("\\text{north}", "\\text{North}"), ("0.333\\ldots", "0.333\\ldots"),
        ("\\begin{cases} 1 \\\\ 2 \\end{cases}", "\\begin{cases} 1 \\\\ 2 \\end{cases}"),
        ("5 \\text{ cm}^{2}", "5"), ("\\text{204}", "204"), ("n \\approx 10,\\!080", "10,\\!080"),
    ],
)  # fmt: skip
def test_one_value_stated_once_or_named_stays_right(pred: str, gold: str) -> None:
    assert grade(f"\\boxed{{{pred}}}", gold).correct


@pytest.mark.parametrize(
    ("pred", "right_for"),
    [("42\\%", "42"), ("4200\\%", "4200"), ("0.42", "0.42"), ("42", "42"), ("\\frac{4200}{100}\\%", "42")],
)
def test_a_percent_sign_is_read_one_way_and_never_pays_for_two_golds(pred: str, right_for: str) -> None:
    """`%` is a unit on both sides (math-verify's reading of integers: 9% = 9): `42\\%` is 42, never 0.42."""
    golds = ["42", "0.42", "4200", "42\\%", "0.42\\%", "4200\\%"]
    right = [gold for gold in golds if grade(f"\\boxed{{{pred}}}", gold).correct]
    assert right == [right_for, right_for + "\\%"]


def test_a_hedge_is_graded_wrong_by_name_in_every_path() -> None:
    assert stated_values("x = 41 = 42", "42") == ["41", "42"]  # each must equal the gold
    assert stated_values("42 \\lor 43", "42") is None and stated_values("x = 42", "42") == ["42"]
    assert grade("\\boxed{42 \\lor 43}", "43") == Grade(False, "42 \\lor 43", "alternatives")
    assert asyncio.run(agrade("\\boxed{x = 41 = 42}", "42")).method == "numeric"
    assert not is_equivalent("\\frac{84}{2} = 43", "43") and is_equivalent("\\frac{84}{2} = 42", "42")


# ------------------------------------------------------------------------------------------------ verl's strict box
@pytest.mark.parametrize(
    ("text", "gold", "expected"),
    [
        ("\\boxed{204}", "204", True),
        ("\\boxed{ 204 }", "204", False),
        ("\\boxed{204.}", "204", False),
        ("\\boxed{\\text{204}}", "204", False),
        ("\\boxed{x=204}", "204", False),
        ("\\boxed{'204'}", "204", False),
        ("\\boxed{\\frac12}", "\\frac{1}{2}", False),
        ("\\boxed{204}" + " " * 94, "204", False),  # the box starts before the last 100 characters
        ("\\boxed{204}" + " " * 89, "204", True),
        ("\\boxed{1} then \\boxed{2", "1", False),  # verl takes the last "\boxed{" even when it is unclosed
        ("no box", "[INVALID]", True),  # verl's placeholder compares equal to itself
        ("\\fbox{204}", "204", False),
        ("\\boxed{204}", 204, True),
    ],
)
def test_strict_box_matches_verl(text: str, gold: str, expected: bool) -> None:
    assert strict_box_correct(text, gold) is expected


def test_grade_reports_strict_beside_real_verdict() -> None:
    result = grade("Thus \\boxed{ 204 }.", "204")
    assert (result.correct, result.strict_correct, result.pred, result.method) == (True, False, "204", "exact")
    assert result.to_dict() == {
        "correct": True,
        "pred": "204",
        "method": "exact",
        "strict_correct": False,
        "timed_out": False,
    }
    assert grade("I give up.", "204") == Grade(False, None, "none")
    assert grade("\\boxed{\\sqrt{8}}", "2\\sqrt{2}").method == "math_verify"
    assert grade("\\boxed{1/2}", "0.5").method == "numeric"


def test_interpreter_output_never_earns_reward() -> None:
    text = "<code>\n```python\nprint('\\\\boxed{42}')\n```\n</code>\n<interpreter>\n\\boxed{42}\n</interpreter>\nHmm."
    assert not grade(text, "42").correct


# ------------------------------------------------------------------------------------------------ MATH-500 golds
def _bump_first_digit(answer: str) -> str | None:
    digit = re.search(r"\d", answer)
    if digit is None:
        return None
    i = digit.start()
    return answer[:i] + str((int(answer[i]) + 1) % 10) + answer[i + 1 :]


def test_math500_golds_against_themselves_and_rewritten() -> None:
    assert len(MATH500) == 500
    for gold in MATH500:
        for text in (
            f"The answer is $\\boxed{{{gold}}}$.",
            f"<answer>\n\\boxed{{ {gold} }}\n</answer>",
            f"so \\boxed{{{gold.replace(chr(92) + 'frac', chr(92) + 'dfrac')}}}",
            f"Answer: ${gold}$",
        ):
            assert grade(text, gold).correct, (text, gold)


def test_math500_golds_against_wrong_variants() -> None:
    """No false positive when one digit of the gold changes (4210_6 vs 4210_5 included)."""
    pairs = [(bumped, gold) for gold in MATH500 if (bumped := _bump_first_digit(gold)) is not None]
    assert len(pairs) > 400
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda pair: is_equivalent(*pair), pairs))
    assert [pair for pair, verdict in zip(pairs, verdicts, strict=True) if verdict] == []


# ------------------------------------------------------------------------------------------------ concurrency
MIXED = [
    ("\\boxed{204}", "204", True),
    ("\\boxed{205}", "204", False),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
    ("\\boxed{(2,1)}", "(1,2)", False),
    ("\\boxed{[1,3)}", "[1, 3)", True),
    ("\\boxed{x^2+1}", "(x+1)^2", False),
]


def test_grade_from_threads() -> None:
    """math-verify's signal timeouts fail off the main thread; the pool must give the same verdicts there."""
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda case: grade(case[0], case[1]).correct, MIXED * 4))
    assert results == [expected for _, _, expected in MIXED * 4]
    assert threading.current_thread() is threading.main_thread()


def test_grade_from_event_loop() -> None:
    async def main() -> tuple[list[bool], bool]:
        concurrent = await asyncio.gather(*(agrade(text, gold) for text, gold, _ in MIXED))
        blocking = grade(*MIXED[2][:2])  # a blocking call inside a running loop is allowed too
        return [g.correct for g in concurrent], blocking.correct

    concurrent, blocking = asyncio.run(main())
    assert concurrent == [expected for _, _, expected in MIXED]
    assert blocking


def test_agrade_does_not_block_the_loop() -> None:
    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        result = await agrade("\\boxed{10^{10^{10}}}", "5", timeout=0.5)
        task.cancel()
        assert result.timed_out and not result.correct
        return ticks

    assert asyncio.run(main()) >= 10


# ------------------------------------------------------------------------------------------------ timeouts
def test_timeout_is_counted_not_raised() -> None:
    before = grading_stats()["timeouts"]
    start = time.monotonic()
    result = grade("\\boxed{10^{10^{10}}}", "5", timeout=0.5)
    assert time.monotonic() - start < 0.5 + 1.0  # margin for a loaded machine
    assert result == Grade(False, "10^{10^{10}}", "timeout", timed_out=True)
    assert grading_stats()["timeouts"] == before + 1


def test_hung_worker_is_killed_and_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the worker's own alarm cannot fire in time, the caller kills it; the next call gets a fresh worker."""
    monkeypatch.setattr(grading.pool, "_SOFT_TIMEOUT_FRACTION", 20.0)
    before = grading_stats()
    start = time.monotonic()
    assert not is_equivalent("9!!!!!!!!", "5", timeout=0.3)
    assert time.monotonic() - start < 0.3 + 1.0  # the kill and the replacement's launch, not its start-up
    monkeypatch.undo()
    assert is_equivalent("\\sqrt{8}", "2\\sqrt{2}")
    after = grading_stats()
    assert after["timeouts"] == before["timeouts"] + 1
    assert after["worker_starts"] >= before["worker_starts"] + 1


def test_parent_never_imports_math_verify() -> None:
    """The trainer process stays free of sympy; workers are fresh interpreters, not forks of it."""
    code = (
        "import sys; from retool_env.grading import is_equivalent, close_grading_pool\n"
        "assert is_equivalent('\\\\sqrt{8}', '2\\\\sqrt{2}') and is_equivalent('025', '25')\n"
        "assert 'sympy' not in sys.modules and 'math_verify' not in sys.modules\n"
        "close_grading_pool()\n"
    )
    env = {**os.environ, "RETOOL_GRADING_WORKERS": "1"}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)


# ------------------------------------------------------------------------------------------------ fuzz
TOKENS = [*"0123456789+-*/^_{}()[],.=x \\$%!", "\\frac", "\\boxed{", "\\sqrt", "\\pi", "\\text{", "10^{10^{",
          "\\begin{", "\\end{", "\\begin{cases}", "\\begin{pmatrix}", "\\\\", "\\approx", "\\lor", " or ", "\\ldots",
          "\\mid"]
LATEXISH = st.lists(st.sampled_from(TOKENS), max_size=30).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300) | LATEXISH)
def test_fuzz_extraction_never_raises(text: str) -> None:
    answer = extract_answer(text)
    assert answer is None or isinstance(answer, str)
    assert isinstance(strict_box_correct(text, "5"), bool)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300) | LATEXISH, st.sampled_from(["42", "x = 42", "\\{x \\mid x > 0\\}"]))
def test_fuzz_stated_values_never_raises(pred: str, gold: str) -> None:
    values = stated_values(pred, gold)
    assert values is None or values == [pred] or (values and all(value.strip() for value in values))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.sampled_from(["{}", " {} ", "{}.", "x={}", "'{}'"])
)
def test_fuzz_integers_exact(pred: int, gold: int, template: str) -> None:
    assert is_equivalent(template.format(pred), str(gold)) is (pred == gold)


@settings(max_examples=40, deadline=None)
@given(LATEXISH)
def test_fuzz_grade_never_raises_or_hangs(text: str) -> None:
    start = time.monotonic()
    result = grade(f"\\boxed{{{text}}}", "7", timeout=1.0)
    assert isinstance(result.correct, bool)
    assert time.monotonic() - start < 1.0 + grading.WORKER_STARTUP_TIMEOUT  # a killed worker's successor may start
