"""Grading speed and agreement: this grader against math-verify alone and verl's strict box rule.

Three measurements:

1. Microseconds per call on DAPO/AIME-style integer answers (right, wrong and zero-padded) and on MATH-500-style
   answers (each gold against a rewritten equal form and against a one-digit change).
   - "retool_env": `is_equivalent`, fast path in-process, math-verify in the worker pool.
   - "math-verify": `verify(parse("\\boxed{gold}"), parse("\\boxed{pred}"))` in this process's main thread, its
     best case (its signal timeouts only work there), with its default 5 s timeouts, as ours.
   - "strict box": verl's `math_dapo` strict check on `\\boxed{pred}`.
2. Agreement with the expected verdict on the case table (tests/fixtures/grading/cases.json), and false positives;
   then the reward path on whole responses (tests/fixtures/grading/responses.json): `grade` against math-verify
   alone on the same text (`verify(parse("$gold$"), parse(response))`).
3. A fuzz of `grade` over generated text (integers, rewritten and corrupted MATH-500 golds, hostile LaTeX) from 4
   threads sharing the worker pool: exceptions, timeouts, and hangs (a call over HANG_S).

    python bench/grading.py [--fuzz 10000] [--out bench/results/grading.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from retool_env import grading
from retool_env.grading import grade, grading_stats, is_equivalent, strict_box_correct

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "grading"
FUZZ_TIMEOUT = grading.DEFAULT_TIMEOUT
HANG_S = 2 * FUZZ_TIMEOUT + 5.0  # one busy worker ahead, the call itself, and a killed worker's restart


def load_responses() -> list[dict]:
    return json.loads((FIXTURES / "responses.json").read_text())["cases"]


def responses_agreement(responses: list[dict]) -> dict[str, dict[str, int]]:
    """Right verdicts and false positives of the two reward paths on whole model responses."""
    from math_verify import parse, verify

    def mv(case: dict) -> bool:
        try:
            return bool(verify(parse("$" + case["gold"] + "$"), parse(case["response"])))
        except BaseException:  # its TimeoutException is a BaseException
            return False

    paths = {"retool_env grade": lambda case: grade(case["response"], case["gold"]).correct, "math-verify": mv}
    out = {}
    for name, fn in paths.items():
        verdicts = [fn(case) for case in responses]
        out[name] = {"right": sum(v == c["expected"] for v, c in zip(verdicts, responses, strict=True)),
                     "false_positives": sum(v and not c["expected"] for v, c in zip(verdicts, responses, strict=True)),
                     "cases": len(responses)}
    return out


def load() -> tuple[list[dict], list[str], dict[str, list[str]]]:
    cases = json.loads((FIXTURES / "cases.json").read_text())["cases"]
    for case in cases:
        for key in ("pred", "gold"):
            if isinstance(case[key], list):
                case[key] = case[key][0] * case[key][1]
    math500 = json.loads((FIXTURES / "math500_answers.json").read_text())
    integers = json.loads((FIXTURES / "integer_answers.json").read_text())
    return cases, math500, integers


def bump_first_digit(answer: str) -> str | None:
    digit = re.search(r"\d", answer)
    if digit is None:
        return None
    i = digit.start()
    return answer[:i] + str((int(answer[i]) + 1) % 10) + answer[i + 1 :]


def math_verify_alone():
    """math-verify as most trainers call it, in the main thread with its own (signal) timeouts."""
    from math_verify import parse, verify

    def equal(pred: str, gold: str) -> bool:
        try:
            return bool(verify(parse("\\boxed{" + gold + "}"), parse("\\boxed{" + pred + "}")))
        except BaseException:  # its TimeoutException is a BaseException
            return False

    return equal


def per_call_us(fn, pairs: list[tuple[str, str]], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        for pred, gold in pairs:
            start = time.perf_counter()
            fn(pred, gold)
            times.append(time.perf_counter() - start)
    times.sort()
    return {
        "mean_us": statistics.fmean(times) * 1e6,
        "p50_us": times[len(times) // 2] * 1e6,
        "p99_us": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e6,
        "calls": len(times),
    }


def fuzz_texts(n: int, math500: list[str], integers: list[str], seed: int = 0) -> list[tuple[str, str]]:
    """Generated (model_text, gold): a realistic mix with a tail of hostile inputs."""
    rng = random.Random(seed)
    tokens = [*"0123456789+-*/^_{}()[],.=x \\$%!'", "\\frac", "\\boxed{", "\\sqrt", "\\pi", "\\text{", "10^{10^{",
              "\\left(", "\\right)", "\\infty", "\\cup", "<answer>", "</answer>", "```", "Answer:", "\n"]
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.4:
            gold = rng.choice(integers)
            pred = rng.choice([gold, gold.zfill(3), f" {gold}.", str(int(gold) + rng.randint(-3, 3)), f"x={gold}"])
            text = rng.choice(["The answer is \\boxed{%s}.", "<answer>\n\\boxed{%s}\n</answer>", "Answer: %s"]) % pred
        elif kind < 0.75:
            gold = rng.choice(math500)
            pred = rng.choice([gold, gold.replace("\\frac", "\\dfrac"), bump_first_digit(gold) or gold,
                               gold[: rng.randint(0, len(gold))]])
            text = f"So the final answer is $\\boxed{{{pred}}}$."
        else:
            gold = rng.choice(integers + math500)
            junk = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 60)))
            text = rng.choice(["\\boxed{%s}", "%s", "Answer: %s", "\\boxed{%s"]) % junk
        out.append((text, gold))
    return out


def run_fuzz(cases: list[tuple[str, str]]) -> dict[str, float]:
    def one(case: tuple[str, str]) -> tuple[float, bool, str | None]:
        start = time.monotonic()
        try:
            result = grade(case[0], case[1], timeout=FUZZ_TIMEOUT)
            error = None if isinstance(result.correct, bool) else "non-bool verdict"
            timed_out = result.timed_out
        except Exception as exc:  # counted: the grader must never raise
            error, timed_out = repr(exc), False
        return time.monotonic() - start, timed_out, error

    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, cases))
    durations = [d for d, _, _ in results]
    return {
        "cases": len(cases),
        "seconds": time.monotonic() - start,
        "exceptions": sum(error is not None for _, _, error in results),
        "timeouts": sum(t for _, t, _ in results),
        "hangs": sum(d > HANG_S for d in durations),
        "p99_call_s": sorted(durations)[int(len(durations) * 0.99)],
        "max_call_s": max(durations),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fuzz", type=int, default=10_000, help="fuzz cases through grade() (0 to skip)")
    parser.add_argument("--out", default="bench/results/grading.json")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # math-verify logs each timeout
    cases, math500, integer_sets = load()
    integers = integer_sets["aime24"] + integer_sets["aime25"] + integer_sets["dapo"]
    mv = math_verify_alone()

    def strict(pred: str, gold: str) -> bool:
        return strict_box_correct("\\boxed{" + pred + "}", gold)

    methods = {"retool_env": is_equivalent, "math-verify": mv, "strict box": strict}

    # Warm up: start the worker pool and math-verify's lazy imports, outside the timings.
    for fn in methods.values():
        fn("\\sqrt{8}", "2\\sqrt{2}")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: is_equivalent(f"\\sqrt{{{n}}}", "x"), range(4)))

    integer_pairs = [(p, g) for g in integers for p in (g, str(int(g) + 1), g.zfill(3), f" {g}.")]
    integer_pairs += list(zip(integer_sets["aime24_zero_padded"], integer_sets["aime24_zero_padded"], strict=True))
    math_pairs = [(g.replace("\\frac", "\\dfrac").replace(",", ", "), g) for g in math500]
    math_pairs += [(b, g) for g in math500 if (b := bump_first_digit(g)) is not None]

    speed: dict[str, dict[str, dict[str, float]]] = {}
    for name, fn in methods.items():  # the same repeats for every method: math-verify caches recent parses
        speed[name] = {"integer": per_call_us(fn, integer_pairs, 5), "math500": per_call_us(fn, math_pairs, 1)}

    agreement = {}
    for name, fn in methods.items():
        verdicts = [fn(c["pred"], c["gold"]) for c in cases]
        agreement[name] = {
            "agree": sum(v == c["expected"] for v, c in zip(verdicts, cases, strict=True)),
            "false_positives": [c["pred"][:60] + " vs " + c["gold"][:60]
                                for v, c in zip(verdicts, cases, strict=True) if v and not c["expected"]],
            "false_negatives": [c["pred"][:60] + " vs " + c["gold"][:60]
                                for v, c in zip(verdicts, cases, strict=True) if c["expected"] and not v],
        }

    responses = responses_agreement(load_responses())
    fuzz = run_fuzz(fuzz_texts(args.fuzz, math500, integers)) if args.fuzz else None

    print(f"\nGrading: microseconds per call (mean / p50 / p99), {len(integer_pairs)} integer pairs, "
          f"{len(math_pairs)} MATH-500 pairs; agreement on {len(cases)} table cases")
    print(f"{'method':<12} {'integer mean':>13} {'p50':>9} {'p99':>9} {'MATH-500 mean':>14} {'p50':>9} {'p99':>9} "
          f"{'agree':>9} {'false +':>8}")
    for name in methods:
        i, m, a = speed[name]["integer"], speed[name]["math500"], agreement[name]
        print(f"{name:<12} {i['mean_us']:>13.1f} {i['p50_us']:>9.1f} {i['p99_us']:>9.1f} {m['mean_us']:>14.1f} "
              f"{m['p50_us']:>9.1f} {m['p99_us']:>9.1f} {a['agree']:>5}/{len(cases):<3} {len(a['false_positives']):>8}")
    ratio = speed["math-verify"]["integer"]["mean_us"] / speed["retool_env"]["integer"]["mean_us"]
    print(f"\nretool_env is {ratio:.0f}x faster than math-verify alone on integer answers (mean)")
    for name in methods:
        for kind in ("false_positives", "false_negatives"):
            if listed := agreement[name][kind]:
                more = f" (+{len(listed) - 6} more)" if len(listed) > 6 else ""
                print(f"{name} {kind.replace('_', ' ')} ({len(listed)}): {listed[:6]}{more}")
    for name, r in responses.items():
        print(f"whole responses, {name}: {r['right']}/{r['cases']} right, {r['false_positives']} false positives")
    if fuzz:
        print(f"fuzz: {fuzz['cases']} cases in {fuzz['seconds']:.1f} s, {fuzz['exceptions']} exceptions, "
              f"{fuzz['timeouts']} timeouts, {fuzz['hangs']} hangs (> {HANG_S:.0f} s), "
              f"p99 call {fuzz['p99_call_s']:.3f} s, "
              f"slowest {fuzz['max_call_s']:.2f} s")
    print(f"grading_stats: {grading_stats()}")

    result = {
        "benchmark": "grading",
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "pool_workers": grading.pool.default_pool_size(),
                    "note": "shared development machine; other jobs were running, so treat times as rough"},
        "speed_us": speed,
        "integer_speedup_vs_math_verify": ratio,
        "agreement": {name: {**a, "cases": len(cases)} for name, a in agreement.items()},
        "responses": responses,
        "fuzz": fuzz,
        "grading_stats": grading_stats(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
