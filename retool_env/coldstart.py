"""Cold-start SFT data made the way RL makes trajectories: model turns replayed through the environment.

This module drives `ToolEnvironment`, so it sits above it (the environment never imports it).

The ReTool paper cold-starts on code-integrated solutions whose interpreter blocks hold real execution output. Here a
solution is a list of segments (text, code, final answer; see `retool_env.data.sft.Segment`); `model_turns` writes
them as the text a model would generate in a tool format (the format's own `ToolFormat.model_turns`), and `replay`
feeds each turn's token ids to `ToolEnvironment.step`. The environment runs the code in its sandbox, inserts the
interpreter's answer (mask 0), grades the answer and returns the same `Trajectory` RL produces, so SFT tokens, masks
and layout come from one code path. ReTool-SFT rows keep their recorded interpreter outputs: `RecordedSandbox` answers
each call with the next one.

Procedural solutions (`arith_solutions`) cover every `retool_env.data.arith` level with three kinds, in configurable
shares: tool-free ("text"), code ("code"), and code whose first attempt fails and is fixed after reading the error
("self_correct"). Everything is deterministic for a seed.
"""

from __future__ import annotations

import math
import random
import re
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from string import Template
from typing import Any

from retool_env.data.problem import Problem
from retool_env.data.sft import Segment, SFTExample
from retool_env.dialects import FunctionCall
from retool_env.env import ToolEnvironment
from retool_env.formats import TOOL_NAME, DialectFormat, encode, format_class
from retool_env.grading import extract_answer
from retool_env.sandbox import ExecResult, Sandbox
from retool_env.trajectory import ToolStatus, Trajectory

_ERROR_LINE = re.compile(r"^\s*(?:[\w.]*(?:Error|Exception)\b|Traceback \(most recent call last\))", re.MULTILINE)


@dataclass(frozen=True)
class Solution:
    """A worked solution to replay: the problem, what the model writes, and which kind of solution it is.

    `segments` hold text, code and the answer; interpreter segments are recorded outputs (ReTool-SFT), replayed
    through `RecordedSandbox`. Without them the code runs in the environment's sandbox.
    """

    problem: Problem
    segments: tuple[Segment, ...]
    kind: str

    @property
    def recorded_outputs(self) -> list[str] | None:
        """The interpreter output recorded after each code segment ("" where none was), or None: run the code."""
        if not any(s.kind == "interpreter" for s in self.segments):
            return None
        outputs: list[str] = []
        for segment in self.segments:
            if segment.kind == "code":
                outputs.append("")
            elif segment.kind == "interpreter" and outputs:
                outputs[-1] = segment.content
        return outputs


# --- model turns ---------------------------------------------------------------------------------------------------


def model_turns(segments: Iterable[Segment], tool_format: str, end_of_turn: str) -> list[str]:
    """The text of each model turn in a tool format ("retool" or "hermes"): `ToolFormat.model_turns`.

    `retool`: a turn ends at `</code>` (the generation stop string), the last one with `<answer>...</answer>` and
    `end_of_turn`. `hermes`: every turn is an assistant message ending with `end_of_turn`, a tool call last.
    """
    return format_class(tool_format).model_turns(segments, end_of_turn)


# --- replay --------------------------------------------------------------------------------------------------------


class RecordedSandbox(Sandbox):
    """Answers each call with the next recorded interpreter output, so recorded trajectories replay without running
    code. An output that reads like a traceback gets status "error", so the episode's tool statistics stay honest."""

    def __init__(self, outputs: Iterable[str] = ()) -> None:
        self.outputs: deque[str] = deque(outputs)

    def load(self, outputs: Iterable[str]) -> None:
        self.outputs = deque(outputs)

    async def _run(self, code: str, *, timeout: float, session: str | None, stdin: str | None,
                   memory_mb: int | None) -> ExecResult:
        if not self.outputs:
            return ExecResult.failure(ToolStatus.SANDBOX_ERROR,
                                      "RecordedSandbox: no recorded output left for this call")
        output = self.outputs.popleft()
        status = ToolStatus.ERROR if _ERROR_LINE.search(output) else ToolStatus.OK
        return ExecResult(status, stdout=output, exit_code=0)


def end_of_turn_token(env: Any) -> str:
    """The token a model emits to end its assistant turn: the chat template's `<|im_end|>` where the format stops on
    it, else the format's first end token."""
    env = getattr(env, "unwrapped", env)
    if isinstance(env.format, DialectFormat):  # the template's own (Llama's <|eot_id|>, GLM's <|user|>, ...)
        return env.format.turn_end
    ids = env.format.end_token_ids
    im_end = env.tokenizer.convert_tokens_to_ids("<|im_end|>")
    return env.tokenizer.convert_ids_to_tokens(im_end if im_end in ids else ids[0])


def solution_turns(segments: Iterable[Segment], tool_format: Any) -> list[tuple[str, str | None]]:
    """A worked solution's model turns as (text, code) pairs, split after every call as `ToolFormat.model_turns`
    splits them; the last turn, the answer, has no code."""
    turns: list[tuple[str, str | None]] = []
    text: list[str] = []
    for segment in segments:
        if segment.kind == "code":
            turns.append(("\n\n".join(text), segment.content))
            text = []
        elif segment.kind == "answer":
            text.append(tool_format.answer_text(segment.content))
        elif segment.kind == "text":
            text.append(segment.content)
    turns.append(("\n\n".join(text), None))
    return turns


def template_turn_ids(env: Any, text: str, code: str | None) -> list[int]:
    """One model turn of a dialect format as its chat template renders it (an assistant message with `tool_calls`,
    shaped as the template reads them, or a plain answer), after the episode's context up to its end token: the
    layout the model must learn (a thinking template closes its think block, Llama 3.1 drops text before a call).
    Where the template ends the turn before the call (gpt-oss writes the text as an analysis message of its own),
    the call turn is the call alone; where it re-renders the context differently, the format's text."""
    env = getattr(env, "unwrapped", env)
    fmt = env.format
    if code is None:
        ids = _rendered_turn(env, {"role": "assistant", "content": text}, [])
    elif fmt.shape is None:  # the template drops `tool_calls`: the model's text is the content
        message = {"role": "assistant", "content": (text + fmt.call_glue if text else "") + fmt.call_text(code)}
        ids = _rendered_turn(env, message, fmt.tool_messages([""]))
    else:
        call = [FunctionCall(TOOL_NAME, {"code": code})]
        ids = None
        for content in dict.fromkeys([text or fmt.shape.content, fmt.shape.content]):
            message = fmt.dialect.tool_call_message(None if fmt.shape.content is None else content, call,
                                                    arguments_as_string=fmt.shape.arguments_as_string)
            ids = _rendered_turn(env, message, fmt.tool_messages([""]))  # a call that ends the chat may differ
            if ids is not None and [c.code for c in fmt.parse(ids).tool_calls] == [code]:
                break
            ids = None
    if ids is not None:
        return ids
    turn = (text + fmt.call_glue if text and code is not None else text) + (fmt.call_text(code) if code else "")
    return encode(env.tokenizer, turn + fmt.turn_end)


def _rendered_turn(env: Any, message: dict[str, Any], followers: list[dict[str, Any]]) -> list[int] | None:
    """The tokens the template renders for `message` after the episode's context, up to the first end token."""
    conversation, fmt = env._conversation, env.format
    rendered = conversation.render([*conversation.messages, message, *followers], add_generation_prompt=False)
    if not rendered.startswith(conversation.text):
        return None
    ids = encode(env.tokenizer, rendered[len(conversation.text):])
    end = next((i for i, t in enumerate(ids) if t in fmt.end_token_ids), None)
    return None if end is None else ids[: end + 1]


def replay(env: Any, solution: Solution) -> Trajectory:
    """Play `solution` through `env` turn by turn (token ids of each turn, as a policy would emit them; in a dialect
    format, as the chat template renders each turn, `template_turn_ids`).

    An environment whose sandbox is a `RecordedSandbox` is loaded with the solution's recorded outputs first.
    """
    env = getattr(env, "unwrapped", env)
    if isinstance(env.sandbox, RecordedSandbox):
        env.sandbox.load(solution.recorded_outputs or [])
    env.reset(options={"problem": solution.problem})
    if isinstance(env.format, DialectFormat):
        turns: Iterable[list[int]] = (template_turn_ids(env, text, code)
                                      for text, code in solution_turns(solution.segments, env.format))
    else:
        turns = (env.tokenizer.encode(turn, add_special_tokens=False)
                 for turn in env.format.model_turns(solution.segments, end_of_turn_token(env)))
    for ids in turns:
        _, _, terminated, truncated, _ = env.step({"token_ids": ids, "finish_reason": "stop"})
        if terminated or truncated:
            break
    return env.trajectory


def replay_solutions(solutions: Sequence[Solution], tokenizer: Any, *, tool_format: str = "retool",
                     sandbox: str | Sandbox = "local", **env_kwargs: Any) -> list[Trajectory]:
    """Replay every solution; those with recorded outputs through a `RecordedSandbox`, the others through `sandbox`.

    `env_kwargs` go to `ToolEnvironment` (prompt, reward, budgets...). Give recorded data generous budgets
    (`max_completion_tokens`, `max_tool_calls`, `max_observation_tokens`): the environment enforces them as in RL.
    """
    problems = [s.problem for s in solutions]
    envs: dict[bool, ToolEnvironment] = {}
    trajectories = []
    for solution in solutions:
        recorded = solution.recorded_outputs is not None
        if recorded not in envs:
            envs[recorded] = ToolEnvironment(tokenizer, problems, tool_format=tool_format,
                                             sandbox=RecordedSandbox() if recorded else sandbox, **env_kwargs)
        trajectories.append(replay(envs[recorded], solution))
    for env in envs.values():
        env.close()
    return trajectories


def sft_features(traj: Trajectory) -> dict[str, list[int]]:
    """A pre-tokenized SFT example: `input_ids` and `assistant_masks` (1 = trained: tokens the model wrote; the
    prompt and every environment-inserted token are 0), the columns TRL's SFTTrainer turns into labels."""
    return {"input_ids": [*traj.prompt_ids, *traj.completion_ids],
            "assistant_masks": [0] * len(traj.prompt_ids) + list(traj.env_mask)}


def build_coldstart(solutions: Sequence[Solution], tokenizer: Any, *, tool_format: str = "retool",
                    sandbox: str | Sandbox = "local", require_correct: bool = True,
                    **env_kwargs: Any) -> list[dict[str, Any]]:
    """SFT rows from solutions: replayed trajectories as `sft_features` plus id, level, kind, reward and tool calls.

    With `require_correct`, replays the environment does not grade correct, that overran a budget (a recorded
    trajectory without an answer, one longer than `max_completion_tokens`), or whose last code did not print the gold
    answer in the sandbox (the text after it quotes that output) are dropped: cold-start data teaches only complete,
    truthful solutions that earn the reward. A sandbox that fails raises: that is a broken set-up, not bad data.
    """
    rows = []
    for solution, traj in zip(solutions, replay_solutions(solutions, tokenizer, tool_format=tool_format,
                                                          sandbox=sandbox, **env_kwargs), strict=True):
        if solution.recorded_outputs is None and any(c.status == ToolStatus.SANDBOX_ERROR for c in traj.tool_calls):
            raise RuntimeError(f"the sandbox failed while replaying {solution.problem.id!r}: "
                               f"{traj.tool_calls[-1].output} (check it with `retool-env doctor`)")
        if require_correct and (not traj.correct or traj.truncated or not _printed_gold(solution, traj)):
            continue
        rows.append({**sft_features(traj), "id": solution.problem.id, "level": solution.problem.level or "",
                     "kind": solution.kind, "reward": traj.reward, "num_tool_calls": traj.num_tool_calls})
    return rows


def _printed_gold(solution: Solution, traj: Trajectory) -> bool:
    """Code solutions written here end by printing the answer: the sandbox must agree with the gold."""
    if solution.recorded_outputs is not None or not traj.tool_calls:
        return True
    last = traj.tool_calls[-1]
    return last.status == ToolStatus.OK and last.output.strip() == solution.problem.answer.strip()


# --- ReTool-SFT ----------------------------------------------------------------------------------------------------


def retool_sft_solutions(examples: Iterable[SFTExample]) -> list[Solution]:
    """ReTool-SFT examples as solutions replayed with their recorded outputs; the gold is their own boxed answer
    (the dataset has no separate gold), so a replay is correct when the answer survives the environment's budgets."""
    solutions = []
    for example in examples:
        answers = [s.content for s in example.segments if s.kind == "answer"]
        gold = (extract_answer(answers[-1]) if answers else None) or ""
        problem = Problem(example.question, gold, id=example.id, source="retool-sft")
        solutions.append(Solution(problem, example.segments, "recorded"))
    return solutions


# --- procedural solutions ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Recipe:
    """How to solve one procedural question template: `$name` fields come from the pattern's groups."""

    pattern: re.Pattern[str]
    plan: str  # why code helps, said before the code
    claim: str  # the quantity computed, as a phrase: "$a * $b"
    code: str  # assigns `answer`; `print(answer)` is appended


def _recipe(pattern: str, plan: str, claim: str, code: str) -> _Recipe:
    return _Recipe(re.compile(pattern), plan, claim, code)


_RECIPES = [
    _recipe(r"What is (?P<a>\d+) (?P<op>[-+*]) (?P<b>\d+)\?", "This is direct arithmetic; Python confirms it.",
            "$a $op $b", "answer = $a $op $b"),
    _recipe(r"Compute (?P<base>\d+)\^\{(?P<exp>\d+)\} mod (?P<mod>\d+)\.",
            "The exponent is far too large to expand; Python's three-argument pow does modular exponentiation "
            "exactly.", "$base^{$exp} mod $mod", "answer = pow($base, $exp, $mod)"),
    _recipe(r"What is the sum of the digits of (?P<base>\d+)\^\{(?P<exp>\d+)\}\?",
            "The power has hundreds of digits, so I will expand it exactly with Python's big integers and add the "
            "digits.", "the digit sum of $base^{$exp}", "answer = sum(int(d) for d in str($base ** $exp))"),
    _recipe(r"How many positive divisors does (?P<n>\d+) have\?",
            "The divisor count is the product of (exponent + 1) over the prime factorisation; sympy factors the "
            "number.", "the number of divisors of $n",
            "import sympy\n\nanswer = 1\nfor exponent in sympy.factorint($n).values():\n    answer *= exponent + 1"),
    _recipe(r"What is the greatest common divisor of (?P<a>\d+) and (?P<b>\d+)\?",
            "Euclid's algorithm gives the gcd; math.gcd runs it.", "gcd($a, $b)",
            "import math\n\nanswer = math.gcd($a, $b)"),
    _recipe(r"What is the least common multiple of (?P<a>\d+), (?P<b>\d+), and (?P<c>\d+)\?",
            "The lcm of several numbers is easiest with math.lcm.", "lcm($a, $b, $c)",
            "import math\n\nanswer = math.lcm($a, $b, $c)"),
    _recipe(r"Write the decimal number (?P<n>\d+) in base (?P<base>\d+)\.",
            "Repeated division by the base gives the digits from the last one up.", "$n in base $base",
            "n = $n\ndigits = ''\nwhile n:\n    n, digit = divmod(n, $base)\n    digits = str(digit) + digits\n"
            "answer = digits"),
    _recipe(r"What is the base-10 value of the base-(?P<base>\d+) number (?P<digits>\d+)\?",
            "Python's int() reads a numeral in any base.", "the value of $digits in base $base",
            "answer = int('$digits', $base)"),
    _recipe(r"Compute the sum of k\^\{(?P<power>\d+)\} for k from 1 to (?P<n>\d+)\.",
            "Summing the powers term by term is quick in Python.", "the sum of k^{$power} for k = 1..$n",
            "answer = sum(k ** $power for k in range(1, $n + 1))"),
    _recipe(r"What is the sum of the first (?P<n>\d+) prime numbers\?",
            "I will sieve primes with sympy, doubling the bound until there are enough, and add the first ones.",
            "the sum of the first $n primes",
            "import sympy\n\nprimes, bound = [], 64\nwhile len(primes) < $n:\n    bound *= 2\n"
            "    primes = list(sympy.primerange(2, bound))\nanswer = sum(primes[:$n])"),
    _recipe(r"Compute the sum of floor\((?P<big>\d+)/k\) for k from 1 to (?P<n>\d+)\.",
            "Integer division in a loop gives each floor exactly.", "the sum of floor($big/k) for k = 1..$n",
            "answer = sum($big // k for k in range(1, $n + 1))"),
    _recipe(r"How many integers from 1 to (?P<limit>\d+) are divisible by (?P<a>\d+) or (?P<b>\d+) but not by "
            r"(?P<c>\d+)\?", "Counting directly avoids mistakes in the inclusion-exclusion terms.",
            "the count", "answer = sum(1 for x in range(1, $limit + 1) if (x % $a == 0 or x % $b == 0) and x % $c)"),
    _recipe(r"How many (?P<digits>\d+)-digit positive integers have digits that sum to (?P<total>\d+)\?",
            "A dynamic programme over digit positions counts the numbers by digit sum.", "the count",
            "ways = {0: 1}  # digit sum -> count of prefixes\nfor position in range($digits):\n    new = {}\n"
            "    for total, count in ways.items():\n        for d in range(1 if position == 0 else 0, 10):\n"
            "            new[total + d] = new.get(total + d, 0) + count\n    ways = new\nanswer = ways.get($total, 0)"),
    _recipe(r"How many nonempty subsets of \{1, 2, \.\.\., (?P<size>\d+)\} have a sum divisible by (?P<mod>\d+)\?",
            "There are few enough subsets to enumerate them all.", "the count",
            "from itertools import combinations\n\nnumbers = range(1, $size + 1)\n"
            "answer = sum(1 for r in range(1, $size + 1) for subset in combinations(numbers, r) "
            "if sum(subset) % $mod == 0)"),
    _recipe(r"What is the sum of the digits of (?P<a>\d+) \* (?P<b>\d+)\?",
            "I will multiply exactly, then add the digits.", "the digit sum of $a * $b",
            "answer = sum(int(d) for d in str($a * $b))"),
    _recipe(r"Let N be the number of positive divisors of (?P<n>\d+)\. Compute (?P<base>\d+)\^N mod (?P<mod>\d+)\.",
            "First the divisor count from the factorisation, then a modular power.", "$base^N mod $mod",
            "import sympy\n\nN = 1\nfor exponent in sympy.factorint($n).values():\n    N *= exponent + 1\n"
            "answer = pow($base, N, $mod)"),
    _recipe(r"What is the greatest common divisor of (?P<base>\d+)\^\{(?P<m>\d+)\} - 1 and (?P=base)\^\{(?P<n>\d+)\} "
            r"- 1\?", "Both numbers are huge but exact in Python; math.gcd handles them.",
            "gcd($base^{$m} - 1, $base^{$n} - 1)",
            "import math\n\nanswer = math.gcd($base ** $m - 1, $base ** $n - 1)"),
]

# Bugs of the first attempt of a self-correcting solution, with what the model says after reading the error.
_BUGS = {
    "name_error": ("print(result)", "The code raised a NameError: there is no variable `result`, the value is stored "
                                    "in `answer`. Let me print the right variable."),
    "syntax_error": ("print(answer", "That is a SyntaxError: I never closed the parenthesis of `print`. Fixing it."),
}


def _solve(problem: Problem) -> tuple[_Recipe, dict[str, str]]:
    for recipe in _RECIPES:
        match = recipe.pattern.fullmatch(problem.question)
        if match:
            return recipe, {k: v for k, v in match.groupdict().items() if v is not None}
    raise ValueError(f"no cold-start recipe for problem {problem.id!r}: {problem.question!r} (procedural arith "
                     f"questions only; add a recipe in retool_env/coldstart.py for a new template)")


def arith_solution(problem: Problem, kind: str = "code", bug: str = "name_error") -> Solution:
    """One procedural problem solved as `kind`: "text" (no code), "code", or "self_correct" (a first attempt with
    `bug`, "name_error" or "syntax_error", then the fix). The answer written is the problem's gold."""
    recipe, fields = _solve(problem)
    claim = Template(recipe.claim).substitute(fields)
    code = Template(recipe.code).substitute(fields)
    answer = Segment("answer", f"\\boxed{{{problem.answer}}}")
    if kind == "text":
        if problem.metadata.get("needs_code", problem.level != "easy"):
            reasoning = f"Working it out carefully by hand, {claim} comes to {problem.answer}."
        else:
            reasoning = f"This is mental arithmetic: {claim} = {problem.answer}."
        return Solution(problem, (Segment("text", reasoning), answer), kind)
    conclusion = Segment("text", f"The interpreter printed {problem.answer}, so {claim} is {problem.answer}.")
    if kind == "code":
        return Solution(problem, (Segment("text", recipe.plan), Segment("code", f"{code}\nprint(answer)"),
                                  conclusion, answer), kind)
    if kind == "self_correct":
        wrong, fix = _BUGS[bug]
        return Solution(problem, (Segment("text", recipe.plan), Segment("code", f"{code}\n{wrong}"),
                                  Segment("text", fix), Segment("code", f"{code}\nprint(answer)"),
                                  conclusion, answer), kind)
    raise ValueError(f"unknown solution kind {kind!r}; choose 'text', 'code' or 'self_correct'")


def arith_solutions(problems: Sequence[Problem], *, seed: int = 0, text_share: float = 0.2,
                    self_correct_share: float = 0.2) -> list[Solution]:
    """Solutions for procedural problems, in order, with the shares kept within every level: about n * text_share
    tool-free and n * self_correct_share self-correcting, the rest plain code. Rounding remainders carry from one
    level to the next, so the totals match the shares too (two problems per level at 0.2 still give tool-free ones).
    Which problem gets which kind, and which bug, is a seeded draw within each level: same seed, same data."""
    if text_share < 0 or self_correct_share < 0 or text_share + self_correct_share > 1:
        raise ValueError("text_share and self_correct_share must be >= 0 and sum to at most 1")
    by_level: dict[str, list[int]] = defaultdict(list)
    for i, problem in enumerate(problems):
        by_level[problem.level or ""].append(i)
    kinds: dict[int, tuple[str, str]] = {}
    seen = texts = fixes = 0
    for level, indices in by_level.items():
        rng = random.Random(f"coldstart:{seed}:{level}")
        order = rng.sample(indices, len(indices))
        seen += len(order)
        n_text = min(len(order), math.floor(seen * text_share + 0.5) - texts)
        n_fix = min(len(order) - n_text, math.floor(seen * self_correct_share + 0.5) - fixes)
        texts, fixes = texts + n_text, fixes + n_fix
        for rank, i in enumerate(order):
            kind = "text" if rank < n_text else "self_correct" if rank < n_text + n_fix else "code"
            kinds[i] = (kind, rng.choice(sorted(_BUGS)))
    return [arith_solution(problem, *kinds[i]) for i, problem in enumerate(problems)]
