"""Problems for the environment: dataset loaders, the offline procedural task generator, cold-start data."""

from retool_env.data.arith import ARITH_SPLITS, LEVELS, Level, arith_split, generate_arith, iter_arith
from retool_env.data.coldstart import (
    RecordedSandbox,
    Solution,
    arith_solution,
    arith_solutions,
    build_coldstart,
    model_turns,
    replay,
    replay_solutions,
    retool_sft_solutions,
    sft_features,
)
from retool_env.data.loaders import HUB_DATASETS, DatasetUnavailableError, load_problems, read_rows
from retool_env.data.problem import Problem
from retool_env.data.sft import Segment, SFTExample, load_retool_sft, parse_retool_sft, render_sft, to_hermes, to_retool
from retool_env.data.text import find_control_chars, repair_control_chars, strip_dapo_template, strip_retool_template

__all__ = [
    "ARITH_SPLITS",
    "HUB_DATASETS",
    "LEVELS",
    "DatasetUnavailableError",
    "Level",
    "Problem",
    "RecordedSandbox",
    "SFTExample",
    "Segment",
    "Solution",
    "arith_solution",
    "arith_solutions",
    "arith_split",
    "build_coldstart",
    "find_control_chars",
    "generate_arith",
    "iter_arith",
    "load_problems",
    "load_retool_sft",
    "model_turns",
    "parse_retool_sft",
    "read_rows",
    "render_sft",
    "repair_control_chars",
    "replay",
    "replay_solutions",
    "retool_sft_solutions",
    "sft_features",
    "strip_dapo_template",
    "strip_retool_template",
    "to_hermes",
    "to_retool",
]
