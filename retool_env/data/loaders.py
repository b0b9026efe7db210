"""Load math problems from local files, folders or the Hugging Face Hub, whatever upstream schema they were saved in.

The schema is detected from a row's columns, so a user points `load_problems` at a file and gets raw problems and gold
answers back: DAPO-Math-17k (original verl parquet, open-r1's processed copy, slime's jsonl), AIME 2024/2025 in their
common copies, MATH-500, MathArena's competitions (AIME 2026, HMMT, BRUMO, CMIMC), BeyondAIME, AMO-Bench, and
`Problem.to_dict()` rows. `BENCHMARKS` lists the evaluation sets by short name, with what their answers look like.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool_env.data.problem import Problem
from retool_env.data.text import find_control_chars, repair_control_chars, strip_dapo_template

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
SPLIT_NAMES = ("train", "test", "validation", "valid", "val", "dev", "eval")


@dataclass(frozen=True)
class HubDataset:
    """A dataset known by a short name: where it lives on the Hub and what a local copy is usually called."""

    title: str
    hub_id: str
    split: str
    config: str | None = None
    local_name: str = "data.parquet"
    answers: str = ""  # what the gold answers look like, where they are not all integers: what the grader must handle


_LATEX = "LaTeX strings: integers, fractions, radicals, expressions in pi; math-verify grades the non-integers"

HUB_DATASETS: dict[str, HubDataset] = {
    "dapo": HubDataset("DAPO-Math-17k", "BytedTsinghua-SIA/DAPO-Math-17k", "train", local_name="dapo-math-17k.parquet"),
    "dapo-processed": HubDataset("DAPO-Math-17k-Processed", "open-r1/DAPO-Math-17k-Processed", "train", config="all",
                                 local_name="dapo-math-17k-processed.parquet"),
    "aime24": HubDataset("AIME 2024", "Maxwell-Jia/AIME_2024", "train", local_name="aime_2024_problems.parquet"),
    "aime25": HubDataset("AIME 2025", "yentinglin/aime_2025", "train", local_name="aime_2025.jsonl"),
    "math500": HubDataset("MATH-500", "HuggingFaceH4/MATH-500", "test", local_name="math500_test.jsonl",
                          answers="LaTeX: integers, fractions, radicals, intervals, tuples, text; math-verify grades"),
    # Competitions after AIME 2025, as papers report them in 2026 (ids and splits as their dataset cards state).
    "aime26": HubDataset("AIME 2026", "MathArena/aime_2026", "train", local_name="aime_2026.parquet",
                         answers="integers 0-999 (int64 on the Hub)"),
    "hmmt_feb25": HubDataset("HMMT February 2025", "MathArena/hmmt_feb_2025", "train",
                             local_name="hmmt_feb_2025.parquet", answers=_LATEX),
    "hmmt_nov25": HubDataset("HMMT November 2025", "MathArena/hmmt_nov_2025", "train",
                             local_name="hmmt_nov_2025.parquet", answers=_LATEX),
    "hmmt_feb26": HubDataset("HMMT February 2026", "MathArena/hmmt_feb_2026", "train",
                             local_name="hmmt_feb_2026.parquet", answers=_LATEX),
    "brumo25": HubDataset("BRUMO 2025", "MathArena/brumo_2025", "train", local_name="brumo_2025.parquet",
                          answers=_LATEX),
    "cmimc25": HubDataset("CMIMC 2025", "MathArena/cmimc_2025", "train", local_name="cmimc_2025.parquet",
                          answers=_LATEX),
    "beyondaime": HubDataset("BeyondAIME", "ByteDance-Seed/BeyondAIME", "test", local_name="beyondaime.parquet",
                             answers="integers"),
    "amobench": HubDataset("AMO-Bench", "meituan-longcat/AMO-Bench", "test", local_name="amo_bench.jsonl",
                           answers="not all gradable by rule: the level is the answer type; 39 of 50 are number, set "
                                   "or variable (AMO-Bench-P, math-verify grades them), 11 are descriptions that need "
                                   "the authors' LLM judge and grade wrong here: evaluate levels number, set, "
                                   "variable"),
}

# Problem sets shipped in the package, loaded by short name without a hub.
PACKAGED_DATASETS: dict[str, Path] = {"math-sample": Path(__file__).parent / "math_sample.jsonl"}

# The evaluation benchmarks (short names of `HUB_DATASETS`), in the order reports list them.
BENCHMARKS = ("aime24", "aime25", "aime26", "hmmt_feb25", "hmmt_nov25", "hmmt_feb26", "brumo25", "cmimc25",
              "beyondaime", "amobench", "math500")


class DatasetUnavailableError(ConnectionError):
    """A Hub dataset could not be reached (offline machine, no cached copy); the message says how to load it locally."""


def load_problems(source: str | os.PathLike[str], split: str | None = None, limit: int | None = None, *,
                  repair_control_chars: bool = False) -> list[Problem]:
    """Problems from a local file or folder, a short name ("dapo", "aime24", "aime25", "math500", "arith",
    "math-sample") or a Hub id.

    `split` picks the Hub split or, in a folder whose file names carry split names, those files; a single file (or a
    folder without split names) is one split, whatever `split` says. DAPO-style data is deduplicated by problem text
    (the original file repeats each problem 100 times), keeping the first occurrence, and `limit` counts problems after
    deduplication. Questions with control characters (a LaTeX backslash lost to a Python escape, such as a form feed
    for `\\f` in `\\frac`) are reported with `warnings.warn`, or repaired with `repair_control_chars=True`.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    name = os.fspath(source)
    if name == "arith":
        from retool_env.data.arith import arith_split

        return arith_split(split or "train", limit)
    path = PACKAGED_DATASETS.get(name) or Path(name).expanduser()
    if path.exists():
        rows, hint = local_rows(path, split), _source_from_text("/".join(path.resolve().parts[-2:])) or path.stem
    elif name in HUB_DATASETS:
        rows, hint = hub_rows(HUB_DATASETS[name], split), name
    elif re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        known = next((d for d in HUB_DATASETS.values() if d.hub_id.lower() == name.lower()), None)
        known = known or HubDataset(name, name, "train", local_name=name.split("/")[-1] + ".parquet")
        rows, hint = hub_rows(known, split), _source_from_text(name) or name
    else:
        raise FileNotFoundError(f"{name!r} is not a file, a folder, or a known dataset "
                                f"({', '.join(['arith', *PACKAGED_DATASETS, *HUB_DATASETS])}, "
                                "or a Hub id like 'owner/name')")
    return _to_problems(rows, hint, limit, repair_control_chars)


def load_dataset_problems(dataset: Any, split: str | None = None) -> list[Problem]:
    """Problems from a list of Problems or dicts, or from anything `load_problems` reads (a file, a name)."""
    if dataset is None:
        raise ValueError("ToolEnvironment needs a dataset: a list of Problems, a file, or a name like 'arith'")
    if isinstance(dataset, str) or hasattr(dataset, "__fspath__"):
        problems = load_problems(dataset, split=split)
    else:
        problems = [p if isinstance(p, Problem) else Problem.from_dict(p) for p in dataset]
    if not problems:
        raise ValueError("the dataset has no problems")
    return problems


def _to_problems(rows: Iterable[dict[str, Any]], hint: str, limit: int | None, repair: bool) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[str] = set()
    for row in rows:
        if limit is not None and len(problems) >= limit:
            break
        schema = detect_schema(row)  # per row: a folder may mix files of different schemas
        problem = schema.convert(row, hint)
        if schema.dedupe:
            if problem.question in seen:
                continue
            seen.add(problem.question)
        problems.append(_check_control_chars(problem, len(problems), repair))
    return problems


def _check_control_chars(problem: Problem, index: int, repair: bool) -> Problem:
    if not find_control_chars(problem.question):
        return problem
    if repair:
        fixed = repair_control_chars(problem.question)
        problem = Problem(fixed, problem.answer, problem.id, problem.source, problem.level,
                          {**problem.metadata, "repaired_control_chars": True})
    bad = find_control_chars(problem.question)
    if bad:
        at = min(problem.question.find(c) for c in bad)
        excerpt = problem.question[max(0, at - 20):at + 20]
        warnings.warn(f"{problem.source} problem {index} (id {problem.id!r}): question contains control characters "
                      f"{bad} near {excerpt!r}, likely a LaTeX backslash lost to a Python escape (form feed + 'rac' "
                      f"for '\\frac'); pass repair_control_chars=True or use a clean copy", stacklevel=4)
    return problem


# --- schemas -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """One upstream on-disk layout: which columns identify it and how a row becomes a `Problem`."""

    name: str
    matches: Callable[[dict[str, Any]], bool]
    convert: Callable[[dict[str, Any], str], Problem]
    dedupe: bool = False


def question_id(question: str) -> str:
    """A stable id for a dataset without one: a hash of the problem text."""
    return hashlib.sha256(question.encode()).hexdigest()[:16]


def _answer(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def gold_answer(value: Any) -> str:
    """A gold answer as the grader compares it: a string, an integral float as an integer, without a `\\boxed{}`
    or `$...$` around the whole of it (AMO-Bench boxes its answers)."""
    text = _answer(value)
    while True:
        if text.startswith("\\boxed{") and text.endswith("}") and _closes_at_end(text, len("\\boxed")):
            text = text[len("\\boxed{"):-1].strip()
        elif len(text) > 2 and text[0] == text[-1] == "$":
            text = text.strip("$").strip()
        else:
            return text


def _closes_at_end(text: str, start: int) -> bool:
    """Whether the brace opened at `start` closes at the last character (so `\\boxed{1}+\\boxed{2}` stays)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i == len(text) - 1
    return False


def _source_from_text(text: str) -> str | None:
    """The short dataset name a path, Hub id, URL or `data_source` value points at, if any."""
    text = text.lower()
    for pattern, source in ((r"beyond[\W_]*aime", "beyondaime"), (r"amo[\W_]*bench", "amobench"),
                            (r"aime[\W_]*(?:20)?24|2024[\W_]*aime", "aime24"),
                            (r"aime[\W_]*(?:20)?25|2025[\W_]*aime", "aime25"),
                            (r"aime[\W_]*(?:20)?26|2026[\W_]*aime", "aime26"),
                            (r"hmmt[\W_]*feb\w*?[\W_]*(?:20)?25", "hmmt_feb25"),
                            (r"hmmt[\W_]*nov\w*?[\W_]*(?:20)?25", "hmmt_nov25"),
                            (r"hmmt[\W_]*feb\w*?[\W_]*(?:20)?26", "hmmt_feb26"),
                            (r"brumo[\W_]*(?:20)?25", "brumo25"), (r"cmimc[\W_]*(?:20)?25", "cmimc25"),
                            (r"math[\W_]*500", "math500"), (r"dapo", "dapo")):
        if re.search(pattern, text):
            return source
    return None


def _verl(row: dict[str, Any], hint: str) -> Problem:
    """verl's RL parquet (DAPO-Math-17k's original schema): `prompt` messages, `reward_model`, `extra_info`."""
    extra = row.get("extra_info") or {}
    question = extra.get("question") or strip_dapo_template(row["prompt"])
    row_id = row.get("id", extra.get("index"))
    source = _source_from_text(str(row.get("data_source", ""))) or hint
    return Problem(question.strip(), _answer(row["reward_model"]["ground_truth"]),
                   question_id(question) if row_id is None else str(row_id), source, None, {"schema": "verl"})


def _open_r1(row: dict[str, Any], hint: str) -> Problem:
    """open-r1/DAPO-Math-17k-Processed: the raw problem in `prompt`, the answer in `solution`."""
    question = strip_dapo_template(row["prompt"])
    index = (row.get("extra_info") or {}).get("index")
    return Problem(question, _answer(row["solution"]), question_id(question) if index is None else str(index),
                   _source_from_text(str(row.get("data_source", ""))) or hint, None, {"schema": "open-r1"})


def _slime(row: dict[str, Any], hint: str) -> Problem:
    """slime's jsonl: `prompt` (a templated string or message list) and `label`."""
    question = strip_dapo_template(row["prompt"])
    return Problem(question, _answer(row["label"]), question_id(question), hint, None, {"schema": "slime"})


def _maxwell(row: dict[str, Any], hint: str) -> Problem:
    """Maxwell-Jia/AIME_2024: `ID` like '2024-II-4', `Problem`, integer `Answer`."""
    source = _source_from_text(f"aime{row['ID']}") or hint
    return Problem(row["Problem"], _answer(row["Answer"]), str(row["ID"]), source, None, {"schema": "maxwell-jia"})


def _math500(row: dict[str, Any], hint: str) -> Problem:
    """HuggingFaceH4/MATH-500: `problem`, `answer`, `subject`, `level` (1-5), `unique_id`."""
    return Problem(row["problem"], _answer(row["answer"]), row["unique_id"], "math500", str(row["level"]),
                   {"schema": "math500", "subject": row.get("subject")})


def _problem_answer(row: dict[str, Any], hint: str) -> Problem:
    """`problem`/`answer` rows (AI-MO/H4 AIME with `id` and `url`, yentinglin's AIME 2025, harness copies)."""
    question = row["problem"]
    url = row.get("url") or ""
    metadata = {"schema": "problem-answer", **({"url": url} if url else {})}
    row_id = str(row["id"]) if row.get("id") is not None else question_id(question)
    return Problem(question, _answer(row["answer"]), row_id, _source_from_text(url) or hint, None, metadata)


def _matharena(row: dict[str, Any], hint: str) -> Problem:
    """MathArena's competitions (MathArena/aime_2026, hmmt_feb_2025, ...): `problem_idx`, `problem`, `answer` (int64
    for AIME, LaTeX strings elsewhere) and, in most, `problem_type` (a list of subjects)."""
    metadata = {"schema": "matharena", "problem_type": list(row.get("problem_type") or [])}
    return Problem(row["problem"], gold_answer(row["answer"]), f"{hint}-{row['problem_idx']}", hint, None, metadata)


def _amo_bench(row: dict[str, Any], hint: str) -> Problem:
    """meituan-longcat/AMO-Bench: `question_id`, the problem in `prompt`, a boxed `answer`, `answer_type` (number,
    set, variable, description; the level here, so a report splits by it) and a human `solution`."""
    kind = str(row["answer_type"])
    return Problem(row["prompt"].strip(), gold_answer(row["answer"]), str(row["question_id"]), "amobench", kind,
                   {"schema": "amo-bench", "answer_type": kind})


def _question_answer(row: dict[str, Any], hint: str) -> Problem:
    """`question`/`answer` rows, including `Problem.to_dict()` output and deepconf's AIME copies."""
    question = row["question"]
    level = row.get("level")
    return Problem(question, _answer(row["answer"]), str(row.get("id") or question_id(question)),
                   row.get("source") or hint, None if level is None else str(level),
                   dict(row.get("metadata") or {"schema": "question-answer"}))


SCHEMAS: list[Schema] = [
    Schema("amo-bench", lambda r: {"question_id", "prompt", "answer", "answer_type"} <= r.keys(), _amo_bench),
    Schema("verl", lambda r: {"prompt", "reward_model"} <= r.keys() and not isinstance(r["prompt"], str), _verl, True),
    Schema("open-r1", lambda r: {"prompt", "solution"} <= r.keys() and isinstance(r["prompt"], str), _open_r1, True),
    Schema("slime", lambda r: {"prompt", "label"} <= r.keys(), _slime, True),
    Schema("maxwell-jia", lambda r: {"ID", "Problem", "Answer"} <= r.keys(), _maxwell),
    Schema("math500", lambda r: {"problem", "answer", "unique_id", "level"} <= r.keys(), _math500),
    Schema("matharena", lambda r: {"problem_idx", "problem", "answer"} <= r.keys(), _matharena),
    Schema("problem-answer", lambda r: {"problem", "answer"} <= r.keys(), _problem_answer),
    Schema("question-answer", lambda r: {"question", "answer"} <= r.keys(), _question_answer),
]


def detect_schema(row: dict[str, Any]) -> Schema:
    """The first schema whose columns a row has; the order puts the most specific layouts first."""
    for schema in SCHEMAS:
        if schema.matches(row):
            return schema
    raise ValueError(f"unrecognised dataset schema with columns {sorted(row)}; expected one of: "
                     "verl (prompt, reward_model), open-r1 (prompt, solution), slime (prompt, label), "
                     "AMO-Bench (question_id, prompt, answer, answer_type), ID/Problem/Answer, "
                     "MathArena (problem_idx, problem, answer), problem/answer, question/answer")


# --- row sources ---------------------------------------------------------------------------------------------------


def local_rows(path: Path, split: str | None) -> Iterator[dict[str, Any]]:
    """Rows of a data file, or of every data file in a folder (those whose path names `split`, if given)."""
    files = [path] if path.is_file() else _data_files(path, split)
    seen_prompts: set[str] = set()
    for file in files:
        yield from read_rows(file, seen_prompts)


def _split_token(split: str) -> re.Pattern[str]:
    return re.compile(rf"(?:^|[/_.-]){re.escape(split)}(?:[/_.-]|$)")


def _data_files(folder: Path, split: str | None) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.suffix in DATA_SUFFIXES and p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    names = [p.relative_to(folder).as_posix() for p in files]
    # Files named after splits (train-00000-of-00001.parquet, test.jsonl) are split by name; others form one split.
    if split is not None and any(_split_token(s).search(n) for s in {*SPLIT_NAMES, split} for n in names):
        files = [p for p, n in zip(files, names, strict=True) if _split_token(split).search(n)]
    if not files:
        wanted = f" for split {split!r}" if split else ""
        raise FileNotFoundError(f"no {'/'.join(DATA_SUFFIXES)} files{wanted} under {folder}")
    return files


def read_rows(path: str | os.PathLike[str], seen_prompts: set[str] | None = None) -> Iterator[dict[str, Any]]:
    """Rows of one .parquet, .jsonl or .json file as plain dicts, streamed.

    Given `seen_prompts`, parquet rows whose `prompt` repeats one seen before are skipped before they become Python
    objects: DAPO-Math-17k's 1.8M rows hold 17,917 problems, and converting every copy would take minutes.
    """
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from arrow_rows(pq.ParquetFile(path).iter_batches(batch_size=4096), seen_prompts)
    elif path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)
    elif path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        yield from data if isinstance(data, list) else [data]
    else:
        raise ValueError(f"unsupported data file {path} (expected {', '.join(DATA_SUFFIXES)})")


def arrow_rows(batches: Iterable[Any], seen_prompts: set[str] | None = None) -> Iterator[dict[str, Any]]:
    """Rows of Arrow record batches or tables, skipping repeated prompts (cheaply, in Arrow) when given a set."""
    import pyarrow as pa

    for batch in batches:
        keys = _prompt_keys(batch) if seen_prompts is not None else None
        if keys is not None and seen_prompts is not None:
            fresh = []
            for key in keys:
                fresh.append(key not in seen_prompts)
                seen_prompts.add(key)
            batch = batch.filter(pa.array(fresh))
        yield from batch.to_pylist()


def _prompt_keys(batch: Any) -> list[str] | None:
    """Each row's prompt text when `prompt` is a string or a one-message list; None for other layouts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "prompt" not in batch.schema.names:
        return None
    column = batch.column("prompt")
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.to_pylist()
    if (pa.types.is_list(column.type) and pa.types.is_struct(column.type.value_type)
            and column.type.value_type.get_field_index("content") >= 0 and column.null_count == 0
            and pc.all(pc.equal(pc.list_value_length(column), 1)).as_py()):
        return pc.struct_field(pc.list_flatten(column), "content").to_pylist()
    return None


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub (`HF_ENDPOINT`) accepts a TCP connection; False at once under `HF_HUB_OFFLINE=1`."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def go_offline() -> None:
    """`HF_HUB_OFFLINE=1` for this process (libraries already imported too) and its children: the local cache only,
    at once, instead of a minute of retries per file."""
    import sys

    from huggingface_hub import constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True


def hub_rows(known: HubDataset, split: str | None, loader: str = "load_problems") -> Iterator[dict[str, Any]]:
    """Rows of a Hub dataset through `datasets` (imported here, so `import retool_env` stays light)."""
    hint = f"pass a local copy: {loader}('path/to/{known.local_name}')"
    if loader == "load_problems":
        hint += f" (or dataset='path/to/{known.local_name}' to ToolEnvironment, gym.make and the scripts)"
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(f"loading {known.title} from the Hub needs `pip install datasets`; or {hint}") from exc
    if not hub_reachable():
        go_offline()  # the cache only: a copy downloaded before still loads, anything else fails now
    try:
        dataset = datasets.load_dataset(known.hub_id, known.config, split=split or known.split)
    except (ConnectionError, OSError) as exc:
        raise DatasetUnavailableError(f"{known.title} ({known.hub_id}) is not available offline; {hint}") from exc
    yield from arrow_rows(dataset.with_format("arrow").iter(batch_size=4096), set())
