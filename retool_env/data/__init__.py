"""Problems for the environment: dataset loaders, the offline procedural task generator, ReTool-SFT parsing.

Cold-start SFT data, which replays solutions through the environment, lives above it in `retool_env.coldstart`.
"""

from retool_env.data.arith import ARITH_SPLITS, LEVELS, Level, arith_split, generate_arith, iter_arith
from retool_env.data.loaders import (
    HUB_DATASETS,
    DatasetUnavailableError,
    load_dataset_problems,
    load_problems,
    read_rows,
)
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
    "SFTExample",
    "Segment",
    "arith_split",
    "find_control_chars",
    "generate_arith",
    "iter_arith",
    "load_dataset_problems",
    "load_problems",
    "load_retool_sft",
    "parse_retool_sft",
    "read_rows",
    "render_sft",
    "repair_control_chars",
    "strip_dapo_template",
    "strip_retool_template",
    "to_hermes",
    "to_retool",
]
