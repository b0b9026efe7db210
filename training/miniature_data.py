"""Problems and cold-start trajectories of the miniature ReTool run (`training/miniature.py`).

Five levels, short enough for a ~0.54M-parameter model to read and write one character at a time: `easy` is tens
plus units (`70 + 3`), 81 questions a model answers in its head, as people do; the four hard levels (`multiply`,
`modpow`, `digitsum`, `compose`) have answers no tiny model can compute in its head, but one line of Python can.
Numbers have a fixed width per level, so every question of a level has the same length. Hard test questions never
appear in training; easy questions repeat between the splits, as there are only 81 of them.

Cold-start solutions are written in the ReTool paper's layout (one assistant string with `<code>`,
`<interpreter>` and `<answer>` blocks) and saved as ReTool-SFT rows, so `training/sft_trl.py` reads them as it
reads ReTool-SFT and replays them through the environment. Interpreter outputs are real: every code block runs in
the project's sandbox first. Kinds: `text` (answer directly), `code`, `self_correct` (the first code has a
typo, the error is read, the code is fixed), and two where the first call is refused before it runs, as
`EnvConfig.fault_rate` refuses calls in RL and evaluation (`retool_env.faults`, its message): `retry` (the same code
again, copied from the block right above the refusal, then the answer), `retry_again` (that retry refused as well,
then a third call), and `give_up` (an answer straight after the refusal: a guess). The cold start shows the retry on
only part of the refusals, so that learning when it pays is left to RL.

The tool arm's cold start also holds copy drills: products of numbers of random widths, never in RL or evaluation,
solved with code as the task's code solutions are (the same share refused, then retried or given up). Everything RL
builds on needs the model to copy digits: from the question into the code, from the interpreter into the answer. On
the task's rows alone, a model this small learnt that copy on some seeds only: each level's answers have a fixed
width and can be partly learnt from the question, so some seeds learnt to copy the first digit and guess the rest.
A drill's digits and width vary, so its answer can only be copied.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from retool_env.data.problem import Problem
from retool_env.faults import FAULT_MESSAGE
from retool_env.formats import ReToolFormat

HARD_LEVELS = ("multiply", "modpow", "digitsum", "compose")
LEVELS = ("easy", *HARD_LEVELS)
# Head arithmetic a tiny model can do: tens plus units ("70 + 3"), whose answer is written digit by digit from
# the question. (Sums and times tables of single digits were tried: a 2-layer model did not learn them in minutes.)
EASY_FACTS = [(10 * t, "+", u) for t in range(1, 10) for u in range(1, 10)]


def _digits(rng: random.Random, n: int) -> int:
    """A number of exactly n digits: fixed widths keep every question of a level the same length."""
    return rng.randint(10 ** (n - 1), 10 ** n - 1)


def _easy(rng: random.Random) -> tuple[str, str, str]:
    a, op, b = rng.choice(EASY_FACTS)
    return f"What is {a} {op} {b}?", str(a + b if op == "+" else a * b), f"print({a}{op}{b})"


def _multiply(rng: random.Random) -> tuple[str, str, str]:
    a, b = _digits(rng, 3), _digits(rng, 2)
    return f"What is {a} * {b}?", str(a * b), f"print({a}*{b})"


def _modpow(rng: random.Random) -> tuple[str, str, str]:
    a, e, m = _digits(rng, 2), _digits(rng, 3), _digits(rng, 2)
    return f"What is {a}^{e} mod {m}?", str(pow(a, e, m)), f"print(pow({a},{e},{m}))"


def _digitsum(rng: random.Random) -> tuple[str, str, str]:
    a, e = _digits(rng, 2), _digits(rng, 2)
    return f"What is the digit sum of {a}^{e}?", str(sum(map(int, str(a ** e)))), f"print(sum(map(int,str({a}**{e}))))"


def _compose(rng: random.Random) -> tuple[str, str, str]:
    a, b, m = _digits(rng, 3), _digits(rng, 2), _digits(rng, 2)
    return f"What is {a} * {b} mod {m}?", str(a * b % m), f"print({a}*{b}%{m})"


def _drill(rng: random.Random) -> tuple[str, str, str]:
    """A product of numbers of random widths (1-4 and 1-3 digits): its digits and its width vary from row to row, so
    the only way to write the answer is to copy the interpreter's output, digit by digit."""
    a, b = _digits(rng, rng.randint(1, 4)), _digits(rng, rng.randint(1, 3))
    return f"What is {a} * {b}?", str(a * b), f"print({a}*{b})"


def make_drills(n: int, seed: int, exclude: set[str] | frozenset[str] = frozenset()) -> list[Problem]:
    """Copy drills, for the tool arm's cold start only (never in RL or evaluation): `n` products of random widths,
    none of them a question in `exclude` (the test set)."""
    rng = random.Random(f"miniature:{seed}:drill")
    made: list[Problem] = []
    while len(made) < n:
        question, answer, code = _drill(rng)
        if question not in exclude:
            made.append(Problem(question, answer, f"mini-drill-{seed}-{len(made)}", "miniature", "drill",
                                {"needs_code": True, "code": code}))
    return made


MAKERS: dict[str, Callable[[random.Random], tuple[str, str, str]]] = {
    "easy": _easy, "multiply": _multiply, "modpow": _modpow, "digitsum": _digitsum, "compose": _compose}


def make_problems(per_level: int, seed: int, exclude: set[str] | frozenset[str] = frozenset()) -> list[Problem]:
    """`per_level` problems of every level, interleaved; hard questions in `exclude` (the test set) are skipped."""
    problems = []
    for level in LEVELS:
        rng = random.Random(f"miniature:{seed}:{level}")
        made: list[Problem] = []
        seen: set[str] = set()
        while len(made) < per_level:
            question, answer, code = MAKERS[level](rng)
            if level != "easy" and (question in exclude or question in seen):
                continue
            seen.add(question)
            made.append(Problem(question, answer, f"mini-{level}-{seed}-{len(made)}", "miniature", level,
                                {"needs_code": level != "easy", "code": code}))
        problems += made
    return problems


def write_problems(problems: Sequence[Problem], path: Path) -> Path:
    """Problems as `question`/`answer` jsonl rows, which `retool_env.data.load_problems` reads back."""
    with open(path, "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps({"id": p.id, "question": p.question, "answer": p.answer, "level": p.level,
                                "source": p.source, "metadata": p.metadata}) + "\n")
    return path


# --- cold start ----------------------------------------------------------------------------------------------------

def _code_block(code: str) -> str:
    return ReToolFormat.call_text(code)


def _answer_block(answer: str) -> str:
    return ReToolFormat.answer_text(f"\\boxed{{{answer}}}")


def _bug(code: str, rng: random.Random) -> str:
    """A first attempt with a typo: a misspelt `print` (NameError) or a missing closing parenthesis (SyntaxError)."""
    return code.replace("print", "prnt", 1) if rng.random() < 0.5 else code[:-1]


def run_codes(codes: Sequence[str], timeout: float = 5.0, concurrency: int = 16) -> list[str]:
    """What the interpreter shows for each code, run in the project's local sandbox (as the environment runs it),
    `concurrency` calls at a time (thousands at once queue up in the sandbox and slow every call)."""
    from retool_env.sandbox import make_sandbox

    async def run_all() -> list[str]:
        sandbox = make_sandbox("local")
        slots = asyncio.Semaphore(concurrency)

        async def run(code: str) -> str:
            async with slots:
                return (await sandbox.run(code, timeout=timeout)).output

        try:
            return await asyncio.gather(*(run(code) for code in codes))
        finally:
            await sandbox.aclose()

    return asyncio.run(run_all())


def coldstart_kinds(problems: Sequence[Problem], shares: dict[str, tuple[float, float]], seed: int,
                    fault_share: float = 0.0, retry_share: float = 0.5, again_share: float = 0.0) -> list[str]:
    """A kind per problem: within a level, shares (text, self_correct) of the problems, the rest code; of the code
    solutions, `fault_share` have their first call refused, of those `retry_share` retry (the rest give up), and of
    the retries `again_share` are refused again and retry once more (`retry_again`)."""
    kinds = []
    for p in problems:
        text_share, fix_share = shares["easy" if p.level == "easy" else "hard"]
        rng = random.Random(f"kind:{seed}:{p.id}")
        draw = rng.random()
        kind = "text" if draw < text_share else "self_correct" if draw < text_share + fix_share else "code"
        if kind == "code" and rng.random() < fault_share:
            kind = "retry" if rng.random() < retry_share else "give_up"
            if kind == "retry" and rng.random() < again_share:
                kind = "retry_again"
        kinds.append(kind)
    return kinds


def write_coldstart(problems: Sequence[Problem], kinds: Sequence[str], path: Path, seed: int = 0) -> dict[str, int]:
    """Write the solutions as ReTool-SFT rows (`messages`: the raw question, then one assistant string) and return
    the count of each kind. Interpreter blocks hold the sandbox's real output for the code written."""
    rng = random.Random(f"bugs:{seed}")
    plans = []  # per problem: the code blocks written, each with whether the call is refused before it runs
    for p, kind in zip(problems, kinds, strict=True):
        code = p.metadata["code"]
        plans.append({"text": [], "code": [(code, False)],
                      "self_correct": [(_bug(code, rng), False), (code, False)],
                      "retry": [(code, True), (code, False)],
                      "retry_again": [(code, True), (code, True), (code, False)],
                      "give_up": [(code, True)]}[kind])
    outputs = iter(run_codes([c for codes in plans for c, refused in codes if not refused]))
    counts: dict[str, int] = {}
    with open(path, "w", encoding="utf-8") as f:
        for p, kind, codes in zip(problems, kinds, plans, strict=True):
            parts = []
            for i, (code, refused) in enumerate(codes):
                if i:
                    parts.append("Retry." if codes[i - 1][1] else "Fix the typo.")
                shown = FAULT_MESSAGE if refused else next(outputs).rstrip()
                parts.append(f"{_code_block(code)}\n<interpreter>\n{shown}\n</interpreter>")
            parts.append(_answer_block(p.answer))
            row = {"id": p.id, "messages": [{"role": "user", "content": p.question},
                                            {"role": "assistant", "content": "\n\n".join(parts)}]}
            f.write(json.dumps(row) + "\n")
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def tokenizer_corpus(problems: Sequence[Problem], faults: bool = True) -> str:
    """Text to train the BPE on: questions, code and tags with every digit removed, so no merge ever joins digits
    and numbers stay one character per digit (as Qwen's tokenizer keeps them). With `faults`, the refusal message
    and the retry too (without, the corpus of the runs before injected faults, so their tokenizer is rebuilt)."""
    lines = []
    fault_lines = f"{FAULT_MESSAGE}\n" if faults else ""
    for p in problems[:200]:
        lines += [p.question, _code_block(p.metadata["code"]), _code_block(_bug(p.metadata["code"], random.Random(0))),
                  "<interpreter>\nNameError: name 'prnt' is not defined\nSyntaxError: '(' was never closed\n"
                  f"{fault_lines}</interpreter>", "Fix the typo.", *(["Retry."] if faults else []),
                  _answer_block(p.answer), "Put your final answer in \\boxed{}.", "user assistant"]
    return "".join(ch for ch in "\n".join(lines) if not ch.isdigit())
