"""Dataset loaders on fixtures in the exact upstream schemas (tests/fixtures/data), and their error paths."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from retool_env.data import (
    DatasetUnavailableError,
    find_control_chars,
    generate_arith,
    load_problems,
    repair_control_chars,
    strip_dapo_template,
)

DATA = Path(__file__).parent / "fixtures" / "data"
DAPO_ORIGINAL = DATA / "dapo" / "dapo-math-17k.parquet"
DAPO_OPEN_R1 = DATA / "dapo" / "dapo-math-17k-processed_open-r1.jsonl"
DAPO_SLIME = DATA / "dapo" / "dapo-math-17k_slime.jsonl"
AIME24_MAXWELL = DATA / "aime24" / "aime_2024_problems.parquet"
AIME24_AIMO = DATA / "aime24" / "aime24_ai-mo.jsonl"
AIME24_VERL = DATA / "aime24" / "aime-2024_verl.parquet"
AIME25 = DATA / "aime25" / "aime25_problem_answer.jsonl"
MATH500 = DATA / "math500" / "test.jsonl"

DAPO_PREFIXES = [
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n",
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: \\boxed{$Answer} where $Answer is the answer to the problem.\n\n",
]
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def quiet_load(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_problems(*args, **kwargs)


# --- DAPO-Math-17k ---------------------------------------------------------------------------------------------------


def test_dapo_original_parquet_is_deduplicated_in_first_occurrence_order():
    table = pq.read_table(DAPO_ORIGINAL)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    indices = [row["index"] for row in table.column("extra_info").to_pylist()]
    first_seen = list(dict.fromkeys(indices))
    assert len(indices) > len(first_seen)  # the fixture really repeats problems

    problems = load_problems(DAPO_ORIGINAL)
    assert [p.id for p in problems] == first_seen
    raw = {row["extra_info"]["index"]: row for row in jsonl(DAPO_OPEN_R1)}  # open-r1 keeps the raw problem
    for problem in problems:
        assert problem.source == "dapo"
        assert problem.question == raw[problem.id]["prompt"]
        assert problem.answer == raw[problem.id]["reward_model"]["ground_truth"]


@pytest.mark.parametrize("path", [DAPO_ORIGINAL, DAPO_OPEN_R1, DAPO_SLIME], ids=["original", "open-r1", "slime"])
def test_every_dapo_schema_yields_the_raw_problem_and_answer(path):
    expected = [(row["prompt"], row["solution"]) for row in jsonl(DAPO_OPEN_R1)]
    problems = load_problems(path)
    assert [(p.question, p.answer) for p in problems] == expected
    assert all(p.source == "dapo" for p in problems)
    assert not any("Answer:" in p.question or "Solve the following" in p.question for p in problems)
    assert len({p.id for p in problems}) == len(problems)


def test_slime_rows_carry_the_boxed_wording_that_gets_stripped():
    row = jsonl(DAPO_SLIME)[0]
    assert "\\boxed{$Answer}" in row["prompt"][0]["content"]
    assert strip_dapo_template(row["prompt"]) == jsonl(DAPO_OPEN_R1)[0]["prompt"]
    assert strip_dapo_template(row["prompt"][0]["content"]) == jsonl(DAPO_OPEN_R1)[0]["prompt"]


@given(problem=st.text(min_size=1).map(str.strip).filter(bool), prefix=st.sampled_from(DAPO_PREFIXES))
def test_strip_dapo_template_returns_the_wrapped_problem(problem, prefix):
    assert strip_dapo_template(prefix + problem + DAPO_SUFFIX) == problem
    assert strip_dapo_template([{"role": "user", "content": prefix + problem + DAPO_SUFFIX}]) == problem
    assert strip_dapo_template(problem) == problem


def test_limit_counts_unique_problems():
    everything = load_problems(DAPO_ORIGINAL)
    assert load_problems(DAPO_ORIGINAL, limit=2) == everything[:2]
    assert load_problems(DAPO_ORIGINAL, limit=0) == []
    assert load_problems(DAPO_ORIGINAL, limit=100) == everything
    with pytest.raises(ValueError, match="limit"):
        load_problems(DAPO_ORIGINAL, limit=-1)


# --- AIME and MATH-500 -----------------------------------------------------------------------------------------------


def test_aime24_maxwell_parquet_ids_and_integer_answers_as_strings():
    table = pq.read_table(AIME24_MAXWELL)
    assert str(table.schema.field("Answer").type) == "int64"
    problems = quiet_load(AIME24_MAXWELL)
    assert [p.id for p in problems] == table.column("ID").to_pylist()
    assert [p.answer for p in problems] == [str(a) for a in table.column("Answer").to_pylist()]
    assert {p.source for p in problems} == {"aime24"}


def test_aime24_ai_mo_keeps_zero_padded_answers():
    rows = jsonl(AIME24_AIMO)
    problems = load_problems(AIME24_AIMO)
    assert [p.answer for p in problems] == [row["answer"] for row in rows]
    assert "025" in [p.answer for p in problems]
    assert [p.id for p in problems] == [str(row["id"]) for row in rows]
    assert [p.question for p in problems] == [row["problem"] for row in rows]
    assert {p.source for p in problems} == {"aime24"}


def test_verl_parquet_uses_the_raw_question_and_data_source():
    problems = load_problems(AIME24_VERL)
    rows = pq.read_table(AIME24_VERL).to_pylist()
    assert [p.answer for p in problems] == [row["reward_model"]["ground_truth"] for row in rows]
    assert [p.question for p in problems] == [row["extra_info"]["question"] for row in rows]
    assert all("Please reason step by step" in row["prompt"][0]["content"] for row in rows)
    assert {p.source for p in problems} == {"aime24"}


def test_math500_levels_subjects_and_ids():
    rows = jsonl(MATH500)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its literal TABs are upstream text, not corruption
        problems = load_problems(MATH500)
    assert [p.id for p in problems] == [row["unique_id"] for row in rows]
    assert [p.level for p in problems] == [str(row["level"]) for row in rows]
    assert [p.metadata["subject"] for p in problems] == [row["subject"] for row in rows]
    assert [p.answer for p in problems] == [row["answer"] for row in rows]
    assert {p.source for p in problems} == {"math500"}
    assert any("\t" in p.question for p in problems)


# --- control characters ----------------------------------------------------------------------------------------------


def test_corrupted_aime_rows_warn_with_dataset_and_row_id():
    with pytest.warns(UserWarning) as record:
        problems = load_problems(AIME24_MAXWELL)
    messages = [str(w.message) for w in record]
    corrupted = [p for p in problems if find_control_chars(p.question)]
    assert {p.id for p in corrupted} == {"2024-I-1", "2024-II-8"}
    assert len(messages) == len(corrupted)
    for problem, message in zip(corrupted, messages, strict=True):
        assert "aime24" in message and problem.id in message


def test_repair_control_chars_restores_latex_commands():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        problems = load_problems(AIME25, repair_control_chars=True)
    raw = [row["problem"] for row in jsonl(AIME25)]
    assert any("\x0c" in q for q in raw) and any("\triangle" in q for q in raw)
    for problem, original in zip(problems, raw, strict=True):
        assert find_control_chars(problem.question) == []
        assert problem.question.count("\\frac") == original.count("\\frac") + original.count("\x0crac")
        assert problem.metadata.get("repaired_control_chars", False) == (problem.question != original)
    assert any("\\triangle DEF" in p.question for p in problems)


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc",)) | st.sampled_from("\n\t ")))
def test_clean_text_is_left_alone(text):
    if not find_control_chars(text):
        assert repair_control_chars(text) == text


# --- folders, round trips, errors ---------------------------------------------------------------------------------


def test_folder_loads_every_file_and_split_picks_files(tmp_path):
    assert len(quiet_load(DATA / "aime24")) == len(jsonl(AIME24_AIMO)) + 3 + 2  # three schemas in one folder
    shutil.copy(MATH500, tmp_path / "test.jsonl")
    shutil.copy(AIME24_AIMO, tmp_path / "train.jsonl")
    assert [p.source for p in load_problems(tmp_path, split="test")] == ["math500"] * len(jsonl(MATH500))
    assert len(load_problems(tmp_path)) == len(jsonl(MATH500)) + len(jsonl(AIME24_AIMO))
    with pytest.raises(FileNotFoundError, match="validation"):
        load_problems(tmp_path, split="validation")
    assert quiet_load(DATA / "aime24", split="train") == quiet_load(DATA / "aime24")  # no split names: one split


def test_problem_dicts_round_trip(tmp_path):
    problems = generate_arith(12, seed=5)
    path = tmp_path / "arith.jsonl"
    path.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in problems))
    loaded = load_problems(path)
    assert loaded == problems
    assert [p.metadata for p in loaded] == [p.metadata for p in problems]


def test_unknown_sources_and_schemas_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="known dataset"):
        load_problems("no-such-dataset")
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"text": "hi", "target": 1}) + "\n")
    with pytest.raises(ValueError, match="text"):
        load_problems(path)


def test_hub_names_fail_offline_with_a_local_copy_hint(tmp_path):
    """In a fresh interpreter `import retool_env.data` stays light, and an offline Hub load says what to do."""
    script = (
        "import sys, retool_env.data as d\n"
        "heavy = [m for m in ('datasets', 'torch', 'trl', 'vllm') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "try:\n    d.load_problems('aime24')\n"
        "except (d.DatasetUnavailableError, ImportError) as e:\n    print(type(e).__name__, e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path), "HF_DATASETS_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "not available offline" in out.stdout or "pip install datasets" in out.stdout
    assert "load_problems('path/to/aime_2024_problems.parquet')" in out.stdout


def test_missing_datasets_package_says_how_to_load_locally(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    with pytest.raises(ImportError, match=r"path/to/dapo-math-17k\.parquet"):
        load_problems("dapo")


def test_unavailable_error_is_a_connection_error():
    assert issubclass(DatasetUnavailableError, ConnectionError)


def test_hub_path_reads_a_dataset_through_datasets(monkeypatch, tmp_path):
    """The real Hub code path, with `load_dataset` pointed at the local fixture instead of the network."""
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(hub_id, config=None, split=None):
        calls.append((hub_id, config, split))
        return datasets.Dataset.from_parquet(str(DAPO_ORIGINAL), cache_dir=str(tmp_path))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_problems("dapo", limit=2) == load_problems(DAPO_ORIGINAL, limit=2)
    assert load_problems("dapo-processed", split="en") == load_problems(DAPO_ORIGINAL)
    assert calls == [("BytedTsinghua-SIA/DAPO-Math-17k", None, "train"),
                     ("open-r1/DAPO-Math-17k-Processed", "all", "en")]


# --- the 2026 benchmarks: MathArena's competitions, BeyondAIME, AMO-Bench -------------------------------------------

BENCHMARK_FIXTURES = {  # short name: (fixture folder laid out as on the Hub, expected (id, gold answer) pairs)
    "aime26": (DATA / "matharena" / "aime_2026", [("aime26-1", "70"), ("aime26-2", "5"), ("aime26-3", "204")]),
    "hmmt_feb25": (DATA / "matharena" / "hmmt_feb_2025",
                   [("hmmt_feb25-1", "\\frac{9\\sqrt{23}}{23}"), ("hmmt_feb25-2", "4\\pi"), ("hmmt_feb25-3", "120")]),
    "hmmt_nov25": (DATA / "matharena" / "hmmt_nov_2025",
                   [("hmmt_nov25-1", "\\frac{1}{576}"), ("hmmt_nov25-2", "8\\sqrt{10}")]),
    "hmmt_feb26": (DATA / "matharena" / "hmmt_feb_2026",
                   [("hmmt_feb26-1", "2^{25}\\cdot 26!"), ("hmmt_feb26-2", "\\frac{3}{4}")]),
    "brumo25": (DATA / "matharena" / "brumo_2025", [("brumo25-1", "2\\sqrt{2}"), ("brumo25-2", "103")]),
    "cmimc25": (DATA / "matharena" / "cmimc_2025", [("cmimc25-1", "\\frac{\\pi}{6}"), ("cmimc25-2", "1001")]),
    "beyondaime": (DATA / "beyondaime", [(None, "30"), (None, "401")]),
    "amobench": (DATA / "amo_bench", [("1", "7656"), ("2", "\\{-2, 2\\}"), ("5", "n^2 + 1"),
                                      ("9", "\\text{all constant functions}")]),
}


@pytest.mark.parametrize("name", list(BENCHMARK_FIXTURES))
def test_benchmark_fixture_loads_with_ids_sources_and_clean_answers(name):
    folder, expected = BENCHMARK_FIXTURES[name]
    problems = load_problems(folder)
    assert [(p.id if ident else None, p.answer) for p, (ident, _) in zip(problems, expected, strict=True)] == expected
    assert {p.source for p in problems} == {name}
    assert all(p.question and "\\boxed" not in p.answer for p in problems)
    if folder.parent.name == "matharena":
        table = pq.read_table(next(folder.rglob("*.parquet")))
        assert {"problem_idx", "problem", "answer"} <= set(table.column_names)
        assert all(p.metadata["schema"] == "matharena" for p in problems)


def test_matharena_keeps_problem_types_and_integer_aime_answers():
    aime = pq.read_table(BENCHMARK_FIXTURES["aime26"][0] / "data" / "train-00000-of-00001.parquet")
    assert str(aime.schema.field("answer").type) == "int64"  # as on the Hub: the loader makes strings of them
    hmmt = load_problems(BENCHMARK_FIXTURES["hmmt_feb26"][0])
    assert hmmt[1].metadata["problem_type"] == ["Algebra", "Number Theory"]


def test_amo_bench_levels_are_answer_types_so_the_parser_subset_is_a_level_filter():
    problems = load_problems(BENCHMARK_FIXTURES["amobench"][0])
    assert [p.level for p in problems] == ["number", "set", "variable", "description"]
    parser_graded = [p for p in problems if p.level in ("number", "set", "variable")]  # AMO-Bench-P
    assert [p.id for p in parser_graded] == ["1", "2", "5"]


@pytest.mark.parametrize("name", [n for n in BENCHMARK_FIXTURES if n != "amobench"] + ["amobench-p"])
def test_the_grader_accepts_each_gold_answer_boxed_and_rejects_a_wrong_one(name):
    from retool_env.grading import grade

    folder, _ = BENCHMARK_FIXTURES[name.removesuffix("-p")]
    for problem in load_problems(folder):
        if problem.level == "description":  # needs the authors' LLM judge: not graded by rule
            continue
        assert grade(f"So the answer is $\\boxed{{{problem.answer}}}$.", problem.answer).correct, problem
        assert not grade("\\boxed{123456789}", problem.answer).correct, problem


@pytest.mark.parametrize("name", list(BENCHMARK_FIXTURES))
def test_each_benchmark_loads_by_short_name_and_hub_id_through_datasets(name, monkeypatch, tmp_path):
    """`datasets.load_dataset` for real, on a local folder laid out as the Hub repository (the registry's split must
    exist there); only the Hub id is pointed at the folder, and the Hub is switched off."""
    import dataclasses

    from huggingface_hub import constants

    from retool_env.data import HUB_DATASETS

    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
    folder, _ = BENCHMARK_FIXTURES[name]
    known = HUB_DATASETS[name]
    assert known.answers  # every benchmark says what its answers look like
    monkeypatch.setitem(HUB_DATASETS, name, dataclasses.replace(known, hub_id=str(folder)))
    assert load_problems(name) == load_problems(folder)
    assert load_problems(name, limit=1) == load_problems(folder)[:1]


def test_benchmark_hub_ids_map_to_their_entries_and_fail_offline_with_a_hint(monkeypatch):
    from retool_env.data import HUB_DATASETS
    from retool_env.data.loaders import BENCHMARKS

    assert set(BENCHMARKS) <= set(HUB_DATASETS)
    seen = []

    def fake_hub_rows(known, split, loader="load_problems"):
        seen.append((known.hub_id, known.split))
        return iter([])

    monkeypatch.setattr("retool_env.data.loaders.hub_rows", fake_hub_rows)
    load_problems("ByteDance-Seed/BeyondAIME")
    load_problems("meituan-longcat/AMO-Bench")
    load_problems("MathArena/hmmt_feb_2025")
    assert seen == [("ByteDance-Seed/BeyondAIME", "test"), ("meituan-longcat/AMO-Bench", "test"),
                    ("MathArena/hmmt_feb_2025", "train")]
