"""Cold-start data replayed through the environment: real sandbox output, +1 rewards, masks exactly on tool tokens."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from retool_env import ToolEnvironment
from retool_env.coldstart import (
    RecordedSandbox,
    Solution,
    arith_solution,
    arith_solutions,
    build_coldstart,
    end_of_turn_token,
    model_turns,
    replay,
    replay_solutions,
    retool_sft_solutions,
    sft_features,
)
from retool_env.data import LEVELS, Segment, generate_arith, load_retool_sft

RETOOL_SFT = Path(__file__).parent / "fixtures" / "data" / "retool" / "train_2000.parquet"
# One problem of each kind per level: a third tool-free, a third self-correcting, a third plain code.
PROBLEMS = generate_arith(3 * len(LEVELS), seed=7)
SOLUTIONS = arith_solutions(PROBLEMS, seed=0, text_share=1 / 3, self_correct_share=1 / 3)
BIG_BUDGETS = {"max_completion_tokens": 16384, "max_observation_tokens": 4096, "max_tool_calls": 32}


@pytest.fixture(scope="module", params=[("retool", "tiny"), ("hermes", "qwen")])
def replayed(request, tiny_tok, qwen_tok):
    tool_format, name = request.param
    tok = tiny_tok if name == "tiny" else qwen_tok
    env = ToolEnvironment(tok, PROBLEMS, tool_format=tool_format)
    return env, [replay(env, solution) for solution in SOLUTIONS]  # each reset starts a new Trajectory object


def expected_layout(env, solution, traj):
    """The completion a correct replay must produce: each turn's own tokens (mask 1), then the format's rendering
    of that turn's interpreter output (mask 0)."""
    turns = model_turns(solution.segments, env.format.name, end_of_turn_token(env))
    ids, mask = [], []
    for i, turn in enumerate(turns):
        turn_ids = env.tokenizer.encode(turn, add_special_tokens=False)
        ids += turn_ids
        mask += [1] * len(turn_ids)
        if i < len(turns) - 1:
            observation = env.format.observation_ids([traj.tool_calls[i].output])
            ids += observation
            mask += [0] * len(observation)
    return ids, mask


def test_every_level_and_kind_replays_to_reward_plus_one(replayed):
    env, trajectories = replayed
    assert Counter((s.problem.level, s.kind) for s in SOLUTIONS) == Counter(
        {(level, kind): 1 for level in LEVELS for kind in ("text", "code", "self_correct")})
    for solution, traj in zip(SOLUTIONS, trajectories, strict=True):
        assert (traj.correct, traj.reward, traj.finish_reason) == (True, 1.0, "answer"), solution.problem.question
        assert traj.pred == solution.problem.answer


def test_interpreter_blocks_hold_real_sandbox_output(replayed):
    env, trajectories = replayed
    for solution, traj in zip(SOLUTIONS, trajectories, strict=True):
        statuses = [call.status for call in traj.tool_calls]
        if solution.kind == "text":
            assert statuses == [] and traj.num_turns == 1
            continue
        # The last call computed the gold answer in the sandbox: the data's numbers are the interpreter's.
        assert statuses[-1] == "ok" and traj.tool_calls[-1].output.strip() == solution.problem.answer
        if solution.kind == "code":
            assert statuses == ["ok"]
        else:  # an error first, then the fix that names it
            first_error = traj.tool_calls[0].output
            fix_text = next(s.content for s in solution.segments[2:] if s.kind == "text")
            error_name = "NameError" if "NameError" in fix_text else "SyntaxError"
            assert statuses == ["error", "ok"] and error_name in first_error and error_name in fix_text


def test_env_mask_is_zero_exactly_on_interpreter_tokens(replayed):
    env, trajectories = replayed
    for solution, traj in zip(SOLUTIONS, trajectories, strict=True):
        ids, mask = expected_layout(env, solution, traj)
        assert traj.completion_ids == ids and traj.env_mask == mask
        environment_text = env.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        for call in traj.tool_calls:
            assert call.output.strip() in environment_text
        model_text = env.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert "<interpreter>" not in model_text and "<tool_response>" not in model_text


def test_sft_features_mask_the_prompt_and_the_environment(replayed):
    env, trajectories = replayed
    features = sft_features(trajectories[1])
    assert features["input_ids"] == trajectories[1].prompt_ids + trajectories[1].completion_ids
    assert features["assistant_masks"] == [0] * len(trajectories[1].prompt_ids) + trajectories[1].env_mask


def test_hermes_turns_are_what_the_chat_template_renders(qwen_tok):
    solution = arith_solution(PROBLEMS[1], "code")
    code = next(s.content for s in solution.segments if s.kind == "code")
    first = model_turns(solution.segments, "hermes", "<|im_end|>")[0]
    call = {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": solution.segments[0].content, "tool_calls": [call]}]
    rendered = qwen_tok.apply_chat_template(messages, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n" + first + "\n")


def test_shares_are_exact_per_level_and_seeded():
    problems = generate_arith(10 * len(LEVELS), seed=1)
    solutions = arith_solutions(problems, seed=5, text_share=0.2, self_correct_share=0.3)
    counts = Counter((s.problem.level, s.kind) for s in solutions)
    for level in LEVELS:
        assert (counts[level, "text"], counts[level, "self_correct"], counts[level, "code"]) == (2, 3, 5)
    assert [s.problem for s in solutions] == problems
    assert solutions == arith_solutions(problems, seed=5, text_share=0.2, self_correct_share=0.3)
    assert [s.kind for s in solutions] != [s.kind for s in arith_solutions(problems, seed=6, text_share=0.2,
                                                                             self_correct_share=0.3)]
    with pytest.raises(ValueError, match="sum to at most 1"):
        arith_solutions(problems, text_share=0.8, self_correct_share=0.3)


def test_build_coldstart_is_deterministic(tiny_tok):
    def rows():
        problems = generate_arith(8, seed=3, levels=["easy", "modpow"])
        solutions = arith_solutions(problems, seed=2, text_share=0.25, self_correct_share=0.25)
        return build_coldstart(solutions, tiny_tok, tool_format="retool")

    first = rows()
    assert first == rows() and len(first) == 8
    assert Counter(row["kind"] for row in first) == {"text": 2, "self_correct": 2, "code": 4}
    for row in first:
        assert row["reward"] == 1.0 and len(row["input_ids"]) == len(row["assistant_masks"])
        assert row["num_tool_calls"] == {"text": 0, "code": 1, "self_correct": 2}[row["kind"]]


def test_replays_over_budget_are_dropped(tiny_tok):
    solutions = arith_solutions(generate_arith(2, seed=3), text_share=0.5)
    assert build_coldstart(solutions, tiny_tok, max_completion_tokens=12) == []
    kept = build_coldstart(solutions, tiny_tok, max_completion_tokens=12, require_correct=False)
    # Both overran the budget: clipped to it, the answer lost its box and the code never ran.
    assert {row["kind"]: row["reward"] for row in kept} == {"text": -1.0, "code": -1.0}


@pytest.mark.parametrize("tool_format", ["retool", "hermes"])
def test_retool_sft_replays_its_recorded_outputs(qwen_tok, tool_format):
    examples = load_retool_sft(RETOOL_SFT)
    solutions = retool_sft_solutions(examples)
    trajectories = replay_solutions(solutions, qwen_tok, tool_format=tool_format, **BIG_BUDGETS)
    for example, traj in zip(examples, trajectories, strict=True):
        recorded = [s.content for s in example.segments if s.kind == "interpreter"]
        assert [call.output for call in traj.tool_calls] == recorded
        assert traj.correct and traj.reward == 1.0
        environment_text = qwen_tok.decode([t for t, m in zip(traj.completion_ids, traj.env_mask, strict=True)
                                            if not m])
        assert all(output in environment_text for output in recorded)
        model_text = qwen_tok.decode([t for t, m in zip(traj.completion_ids, traj.env_mask, strict=True) if m])
        assert not any(output in model_text for output in recorded if len(output) > 3)
    assert [s.problem.answer for s in solutions] == ["3", "1680"]


def test_solutions_the_sandbox_contradicts_are_dropped(tiny_tok):
    problem = next(p for p in PROBLEMS if p.level == "modpow")
    wrong = dataclasses.replace(problem, answer=str(int(problem.answer) + 1))
    solutions = [arith_solution(wrong, "code"), arith_solution(problem, "code")]
    # The environment grades the text alone, so the wrong claim earns +1; the builder checks the interpreter too.
    assert [row["reward"] for row in build_coldstart(solutions, tiny_tok, require_correct=False)] == [1.0, 1.0]
    assert [row["id"] for row in build_coldstart(solutions, tiny_tok)] == [problem.id]


def test_a_failing_sandbox_raises(tiny_tok):
    with pytest.raises(RuntimeError, match="the sandbox failed"):
        build_coldstart([arith_solution(PROBLEMS[1], "code")], tiny_tok, sandbox=RecordedSandbox())


def test_recorded_sandbox_reports_errors_and_running_out():
    sandbox = RecordedSandbox(["42", "Traceback (most recent call last):\n  ...\nNameError: name 'x' is not defined"])
    assert sandbox.run_sync("print(42)").status == "ok"
    assert sandbox.run_sync("print(x)").status == "error"
    assert sandbox.run_sync("print(1)").status == "sandbox_error"


def test_recorded_outputs_align_with_code_blocks():
    segments = (Segment("text", "a"), Segment("code", "print(1)"), Segment("interpreter", "1"),
                Segment("code", "pass"), Segment("code", "print(2)"), Segment("interpreter", "2"),
                Segment("answer", "\\boxed{2}"))
    assert Solution(PROBLEMS[0], segments, "recorded").recorded_outputs == ["1", "", "2"]
    assert arith_solution(PROBLEMS[0]).recorded_outputs is None


def test_unknown_questions_and_kinds_are_rejected():
    from retool_env.data import Problem

    with pytest.raises(ValueError, match="no cold-start recipe"):
        arith_solution(Problem("Prove Fermat's last theorem.", "0", id="flt"))
    with pytest.raises(ValueError, match="unknown solution kind"):
        arith_solution(PROBLEMS[0], "poem")
