"""Episode records and `retool-env regrade`: real episodes of the environment (tiny tokenizer, real sandbox and
grader) written, read back, and re-graded; the same grader reproduces every reward, another finds a planted
disagreement. The GRPOTrainer run that writes records is in test_trl.py."""

from __future__ import annotations

import json

import pytest

from retool_env.cli import main
from retool_env.data import Problem
from retool_env.env import ToolEnvironment
from retool_env.records import RecordWriter, episode_record, read_records, regrade, reward_scheme_name
from retool_env.rewards import EpisodeStats, get_reward_fn

PROBLEM = Problem(question="What is 6 times 7?", answer="42", id="six-sevens")
CALL = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
FAILING_CALL = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "1 / 0"}}\n</tool_call>'


def play(tok, turns: list[str], **config) -> tuple[ToolEnvironment, dict]:
    """One episode of the real environment with the given model turns; returns it and its record."""
    env = ToolEnvironment(tok, [PROBLEM], max_tool_calls=4, **config)
    env.reset(options={"problem": PROBLEM})
    end = env.format.end_token_ids[0]
    for text in turns:
        env.step(tok.encode(text, add_special_tokens=False) + [end])
    traj = env.trajectory
    record = episode_record(traj, decode=tok.decode, episode_stats=EpisodeStats.of(traj),
                            reward_scheme=env.config.reward,
                            reward_kwargs=env.config.reward_kwargs, question=PROBLEM.question, policy_version=3,
                            seed=11, group=0)
    return env, record


@pytest.fixture(scope="module")
def records(tiny_tok) -> list[dict]:
    reward_kwargs = {"tool_call_cost": 0.05, "tool_success_reward": 0.02}
    played = [
        play(tiny_tok, [CALL, "So \\boxed{42}."], reward_kwargs=reward_kwargs),           # right, one ok call
        play(tiny_tok, [FAILING_CALL, CALL, "It is \\boxed{41}."], reward_kwargs=reward_kwargs),  # wrong
        play(tiny_tok, ["I get 6*7 = 42 then."], reward_kwargs=reward_kwargs),  # no extractable answer here
    ]
    for env, _ in played:
        env.close()
    return [record for _, record in played]


def test_a_record_holds_the_episode(records, tiny_tok):
    right, wrong, unparsed = records
    assert right["schema"] == 1 and right["problem_id"] == "six-sevens" and right["gold"] == "42"
    assert right["policy_version"] == 3 and right["seed"] == 11 and right["mode"] == "train"
    assert len(right["completion_ids"]) == len(right["env_mask"]) and 0 in right["env_mask"]
    assert [t["tool_calls"] for t in right["turns"]] == [1, 0]
    assert "print(6 * 7)" in right["turns"][0]["model"] and "42" in right["turns"][0]["env"]
    assert right["tool_calls"] == [{"turn": 1, "code": "print(6 * 7)", "status": "ok", "output": "42\n",
                                    "duration": right["tool_calls"][0]["duration"]}]
    assert right["answer_text"] == "So \\boxed{42}." and right["pred"] == "42" and right["correct"]
    assert right["reward"] == pytest.approx(1.0 - 0.05 + 0.02)
    assert right["episode_stats"]["num_tool_calls"] == 1 and right["reward_scheme"] == "retool"
    assert [c["status"] for c in wrong["tool_calls"]] == ["error", "ok"] and "ZeroDivisionError" in \
        wrong["tool_calls"][0]["output"]
    assert wrong["pred"] == "41" and not wrong["correct"]
    assert unparsed["pred"] is None and unparsed["tool_calls"] == []
    assert tiny_tok.decode(right["completion_ids"]) == "".join(t["model"] + t["env"] for t in right["turns"])


def test_records_round_trip_and_the_same_grader_reproduces_every_reward(records, tmp_path):
    path = tmp_path / "records.jsonl"
    writer = RecordWriter(path)
    writer.write(records[:2])
    writer.write(records[2:])
    assert writer.written == 3
    assert list(read_records(path)) == records
    report = regrade(read_records(path), "default")
    assert (report.episodes, report.regraded, report.verdict_changes, report.reward_mismatches) == (3, 3, 0, 0)
    assert report.correct_logged == report.correct_now == 1
    assert report.parse_failures_logged == report.parse_failures_now == 1


def test_regrade_finds_a_planted_disagreement(records, tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    RecordWriter(path).write(records)
    # math-verify reads the bare "42" of the third episode, which the project's grader does not take as an answer.
    report = regrade(read_records(path), "math_verify")
    assert report.verdict_changes == 1 and report.reward_mismatches == 1
    (example,) = report.examples
    assert example["pred_logged"] is None and example["pred_now"] == "42" and example["correct_now"]
    assert example["reward_now"] == 1.0 and example["reward_logged"] == -1.0
    assert main(["regrade", str(path), "--grader", "math_verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict_changes"] == 1
    assert main(["regrade", str(path), "--grader", "math_verify", "--fail-on-disagreement"]) == 1
    assert "1 verdict change(s)" in capsys.readouterr().out
    assert main(["regrade", str(path), "--fail-on-disagreement"]) == 0
    # verl's strict box check: only the boxed right answer passes, as it did.
    assert regrade(read_records(path), "strict").verdict_changes == 0


def test_regrade_reports_an_extracted_answer_that_changed(records, tmp_path, capsys):
    # The logged answer is not what the grader extracts from the logged text today; verdict and reward agree.
    drifted = {**records[0], "pred": "42.0"}
    report = regrade([drifted], "default")
    assert (report.verdict_changes, report.reward_mismatches, report.answer_changes) == (0, 0, 1)
    (example,) = report.examples
    assert (example["pred_logged"], example["pred_now"]) == ("42.0", "42")
    path = tmp_path / "records.jsonl"
    RecordWriter(path).write([drifted])
    assert main(["regrade", str(path), "--fail-on-disagreement"]) == 1
    assert "1 answer change(s)" in capsys.readouterr().out
    assert regrade([drifted], "strict").answer_changes == 1
    assert regrade([drifted], "math_verify").answer_changes == 0  # its own extraction: verdicts compared only


def test_bad_files_and_unnamed_schemes_are_reported(records, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(records[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        list(read_records(path))
    assert main(["regrade", str(path)]) == 2 and "bad.jsonl:2" in capsys.readouterr().err
    path.write_text(json.dumps({"schema": 99}) + "\n")
    with pytest.raises(ValueError, match="schema 1"):
        list(read_records(path))
    with pytest.raises(ValueError, match="unknown grader"):
        regrade([], "lenient")
    assert reward_scheme_name(get_reward_fn("binary")) == "binary"
    assert reward_scheme_name(lambda grade, stats: 0.0) is None
    unnamed = dict(records[0], reward_scheme=None)
    assert regrade([unnamed]).rewards_not_recomputable == 1


def test_each_process_writes_its_own_file(tmp_path):
    assert RecordWriter.for_process(tmp_path / "r.jsonl", 0, 1).path == tmp_path / "r.jsonl"
    assert RecordWriter.for_process(tmp_path / "r.jsonl", 2, 4).path == tmp_path / "r.rank2.jsonl"
