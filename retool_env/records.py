"""Episode records: every trained episode as one JSON line, and re-grading of stored episodes.

A training run that writes records can be audited after the fact: which answers the grader extracted, which tool
calls ran and what they printed, which policy version wrote each turn, what reward each episode got and why. NeMo-RL
#3635 and #3058 found a grader extraction failure that shifted every later reward without failing anything; with
records, `retool-env regrade RECORDS --grader math_verify` shows such a fault as disagreements, with examples.

```python
from retool_env.records import read_records, regrade

report = regrade(read_records("runs/records.jsonl"), grader="default")
assert report.reward_mismatches == 0   # the same grader reproduces the logged rewards exactly
```

One record (`SCHEMA_VERSION` 1; every field always present, None where unknown):

- `schema`: 1. `mode`: "train" or "eval". `policy_version`: the trainer's global step when the episode was generated
  (TRL's `rollout_func`), or the oldest policy version of its turns (the asynchronous worker), or the engine's
  weight version as it names it (slime's `weight_version`, a string where it is not a number). `seed`: the episode's
  sampling seed (None: unseeded). `group`: the episode's GRPO group: its index within the call (TRL) or worker
  (async), the prompt's `uid` (verl), the sample's `group_index` (slime).
- `problem_id`, `question`, `gold`.
- `prompt_ids`, `completion_ids`, `env_mask`: the tokens exactly as trained (`env_mask` after the filters, so all 0
  for an episode a filter took out of the loss), and `filtered`: the filters that did (`void_turn`, `accuracy`,
  `roc`, `roc_equal_reward`, `stale`; `retool_env.filters`), `[]` when none did. verl and slime decide group filters
  after the episode is written, so their records name `void_turn` only.
- `turns`: per model turn, `model` (its decoded text), `env` (the decoded environment tokens after it), `tool_calls`
  (how many it wrote) and `policy_version`.
- `tool_calls`: per call, `turn`, `code`, `status` (a `ToolStatus`), `output` (the text the model was shown) and
  `duration` in seconds.
- `answer_text`: the model text the grader read (`Trajectory.graded_text`: the last turn's answer, "" when that
  turn was no answer; None for a failed episode); `pred`: the answer the grader extracted from it (None: nothing
  extractable, a parse failure); `correct`, `strict_correct`.
- `reward`: the environment's; `trained_reward`: what GRPO was given (a group-level option such as
  `sign_safe_shaping` may change it; None: unscored, a failed episode or one RoC dropped); `reward_scheme` (its name
  or "module:function" path; None for an unnamed callable) and `reward_kwargs`: enough to recompute it;
  `episode_stats`: the `EpisodeStats` fields the scheme was given.
- `finish_reason`, `truncated`, `aborted` (a failed episode: never trained on, no reward).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from retool_env.grading import MAX_ANSWER_CHARS, Grade, extract_answer, grade, strict_box_correct
from retool_env.rewards import REWARD_SCHEMES, EpisodeStats, get_reward_fn
from retool_env.trajectory import Trajectory

__all__ = ["GRADERS", "SCHEMA_VERSION", "RecordWriter", "RegradeReport", "episode_record", "process_record_writer",
           "read_records", "regrade", "reward_scheme_name"]

SCHEMA_VERSION = 1


def reward_scheme_name(scheme: Any) -> str | None:
    """A name `get_reward_fn` resolves back to the scheme: a built-in name, a "module:function" path, or None."""
    if isinstance(scheme, str):
        return scheme
    for name, fn in REWARD_SCHEMES.items():
        if fn is scheme:
            return name
    module, qualname = getattr(scheme, "__module__", None), getattr(scheme, "__qualname__", "")
    if module and qualname and "<" not in qualname and "." not in qualname:
        return f"{module}:{qualname}"
    return None


def episode_record(traj: Trajectory, *, decode: Callable[[list[int]], str], episode_stats: EpisodeStats | None,
                   reward_scheme: Any, reward_kwargs: dict | None,
                   env_mask: Sequence[int] | None = None, filtered: Sequence[str] = (), question: str | None = None,
                   policy_version: int | str | None = None, seed: int | None = None, group: int | None = None,
                   mode: str = "train", trained_reward: float | None = None) -> dict[str, Any]:
    """One episode as a JSON-ready record (see the module docstring for the fields). `env_mask` is the mask as
    trained, when a filter changed the trajectory's own."""
    ids = traj.completion_ids
    turns = [{"model": decode(ids[t.start:t.end]), "env": decode(ids[t.end:t.env_end]), "tool_calls": t.num_tool_calls,
              "policy_version": t.policy_version} for t in traj.turns]
    return {
        "schema": SCHEMA_VERSION, "mode": mode, "policy_version": policy_version, "seed": seed, "group": group,
        "problem_id": traj.problem_id, "question": question, "gold": traj.gold,
        "prompt_ids": list(traj.prompt_ids), "completion_ids": list(ids),
        "env_mask": list(traj.env_mask if env_mask is None else env_mask), "filtered": list(filtered),
        "turns": turns,
        "tool_calls": [{"turn": c.turn, "code": c.code, "status": str(c.status), "output": c.output,
                        "duration": c.duration} for c in traj.tool_calls],
        "answer_text": traj.graded_text, "pred": traj.pred, "correct": traj.correct,
        "strict_correct": traj.strict_correct,
        "reward": traj.reward, "trained_reward": trained_reward, "reward_scheme": reward_scheme_name(reward_scheme),
        "reward_kwargs": dict(reward_kwargs or {}),
        "episode_stats": None if episode_stats is None else asdict(episode_stats),
        "finish_reason": traj.finish_reason, "truncated": traj.truncated, "aborted": traj.aborted,
    }


class RecordWriter:
    """Appends records to a JSONL file, one line each, flushed per batch (a crash loses at most the batch being
    written). Several processes must each have their own file: `for_process` names them."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.written = 0

    @staticmethod
    def for_process(path: str | os.PathLike, process_index: int, num_processes: int) -> RecordWriter:
        """`path` itself for one process; `records.rank3.jsonl` for process 3 of several."""
        path = Path(path)
        if num_processes > 1:
            path = path.with_name(f"{path.stem}.rank{process_index}{path.suffix}")
        return RecordWriter(path)

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
        if lines:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(lines)
            self.written += lines.count("\n")


_process_writers: dict[str, RecordWriter] = {}


def process_record_writer(path: str | os.PathLike) -> RecordWriter:
    """This process's `RecordWriter` for `path`, on a file of its own (`records.<host>-<pid>.jsonl`): for trainers
    that play episodes in several worker processes (verl's agent loop workers, slime's rollout) without telling the
    adapter its rank. One writer per path and process, however often an adapter asks."""
    key = os.fspath(path)
    if key not in _process_writers:
        root, ext = os.path.splitext(key)
        _process_writers[key] = RecordWriter(f"{root}.{socket.gethostname()}-{os.getpid()}{ext or '.jsonl'}")
    return _process_writers[key]


def read_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The records of a JSONL file, in order; a line that is not a record is an error naming the line."""
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON record: {exc}") from None
            if not isinstance(record, dict) or record.get("schema") != SCHEMA_VERSION:
                raise ValueError(f"{path}:{number}: not an episode record of schema {SCHEMA_VERSION}")
            yield record


# ------------------------------------------------------------------------------------------------------ graders
def _strict_grade(text: str, gold: str) -> Grade:
    """verl's `math_dapo` strict box check as the verdict (the `strict=True` of the reward schemes)."""
    verdict = strict_box_correct(text, gold)
    return Grade(verdict, extract_answer(text), "strict", strict_correct=verdict)


def _math_verify_grade(text: str, gold: str) -> Grade:
    """math-verify on its own: its extraction over the whole answer text (no project extraction, no fast path), as
    a grader other pipelines use. In process, under math-verify's own timeouts (a command-line audit, not training).
    """
    from math_verify import parse, verify

    gold_parsed = parse("\\boxed{" + gold + "}")
    pred_parsed = parse(text)
    pred = str(pred_parsed[-1]) if pred_parsed else None
    correct = bool(pred_parsed) and bool(verify(gold_parsed, pred_parsed))
    return Grade(correct, pred, "math_verify" if pred is not None else "none",
                 strict_correct=strict_box_correct(text, gold))


GRADERS: dict[str, Callable[[str, str], Grade]] = {
    "default": grade,  # the project's grader, as training used it
    "math_verify": _math_verify_grade,
    "strict": _strict_grade,
}
# The graders that extract the answer as training did (`extract_answer`), so a different answer is a disagreement;
# math-verify extracts its own way and writes answers in its own form, so only its verdicts are compared.
SAME_EXTRACTION = frozenset({"default", "strict"})


def _logged_form(pred: str | None) -> str | None:
    """An extracted answer as a record logs it (`Grade.pred`: cut at `MAX_ANSWER_CHARS`)."""
    return pred if pred is None or len(pred) <= MAX_ANSWER_CHARS else pred[:MAX_ANSWER_CHARS] + "..."


@dataclass
class RegradeReport:
    """What re-grading stored episodes found. A disagreement is an episode whose verdict (`correct`), reward or,
    under a grader in `SAME_EXTRACTION`, extracted answer (`pred`) differs from the logged one; `examples` holds the
    first few, each with both verdicts and the answer text."""

    grader: str
    episodes: int = 0
    regraded: int = 0  # episodes with an answer text (aborted ones have none)
    correct_logged: int = 0
    correct_now: int = 0
    parse_failures_logged: int = 0
    parse_failures_now: int = 0
    verdict_changes: int = 0
    answer_changes: int = 0  # the answer extracted now differs from the logged one (SAME_EXTRACTION graders)
    reward_mismatches: int = 0
    rewards_not_recomputable: int = 0  # no scheme name recorded (an unnamed callable)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        n = max(self.regraded, 1)
        return (f"{self.episodes} episodes, {self.regraded} regraded with {self.grader!r}: accuracy logged "
                f"{self.correct_logged / n:.4f}, now {self.correct_now / n:.4f}; parse failures logged "
                f"{self.parse_failures_logged / n:.4f}, now {self.parse_failures_now / n:.4f}; "
                f"{self.verdict_changes} verdict change(s), {self.answer_changes} answer change(s), "
                f"{self.reward_mismatches} reward mismatch(es)"
                + (f", {self.rewards_not_recomputable} reward(s) not recomputable" if self.rewards_not_recomputable
                   else ""))

    @property
    def disagreements(self) -> int:
        """Verdict changes, answer changes and reward mismatches together (an episode may count more than once)."""
        return self.verdict_changes + self.answer_changes + self.reward_mismatches

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def regrade(records: Iterable[dict[str, Any]], grader: str = "default", *, max_examples: int = 10) -> RegradeReport:
    """Re-score stored episodes with `grader` (a name in `GRADERS`) and recompute their rewards with the scheme
    each record names. With the grader training used, every reward is reproduced exactly."""
    if grader not in GRADERS:
        raise ValueError(f"unknown grader {grader!r}: use one of {', '.join(GRADERS)}")
    grade_fn, report = GRADERS[grader], RegradeReport(grader=grader)
    reward_fns: dict[str, Any] = {}
    for record in records:
        report.episodes += 1
        if record["aborted"] or record["answer_text"] is None:
            continue
        report.regraded += 1
        verdict = grade_fn(record["answer_text"], str(record["gold"]))
        report.correct_logged += bool(record["correct"])
        report.correct_now += verdict.correct
        report.parse_failures_logged += record["pred"] is None
        report.parse_failures_now += verdict.pred is None
        reward = None
        if record["reward_scheme"] is None or record["episode_stats"] is None:
            report.rewards_not_recomputable += 1
        else:
            key = json.dumps([record["reward_scheme"], record["reward_kwargs"]], sort_keys=True)
            if key not in reward_fns:
                reward_fns[key] = get_reward_fn(record["reward_scheme"], **record["reward_kwargs"])
            reward = float(reward_fns[key](verdict, EpisodeStats(**record["episode_stats"])))
        changed = verdict.correct != bool(record["correct"])
        answer_changed = grader in SAME_EXTRACTION and _logged_form(verdict.pred) != record["pred"]
        mismatch = reward is not None and reward != record["reward"]
        report.verdict_changes += changed
        report.answer_changes += answer_changed
        report.reward_mismatches += mismatch
        if (changed or answer_changed or mismatch) and len(report.examples) < max_examples:
            report.examples.append({
                "problem_id": record["problem_id"], "policy_version": record["policy_version"],
                "gold": record["gold"], "pred_logged": record["pred"], "pred_now": verdict.pred,
                "correct_logged": record["correct"], "correct_now": verdict.correct,
                "reward_logged": record["reward"], "reward_now": reward,
                "answer_text": record["answer_text"][-500:],
            })
    return report
