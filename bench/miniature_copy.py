"""The copy probe behind the miniature's copy numbers: of the answers written right after a call that printed a
number, how many repeat that number, per level, from an evaluation's per-problem samples.

    python bench/miniature_copy.py runs/frozen/seed2/tool/eval-after_sft/per_problem.jsonl
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter

LAST_OUTPUT = re.compile(r"<interpreter>\n(.*?)\n</interpreter>", re.DOTALL)


def copy_rates(path: str) -> dict[str, tuple[int, int]]:
    """Per level: (answers that repeat the last printed number, answers written after a printed number)."""
    copied: Counter[str] = Counter()
    read: Counter[str] = Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            problem = json.loads(line)
            for sample in problem["samples"]:
                outputs = LAST_OUTPUT.findall(sample["response"])
                if not outputs or sample["pred"] is None or not outputs[-1].strip().isdigit():
                    continue
                read[problem["level"]] += 1
                copied[problem["level"]] += sample["pred"] == outputs[-1].strip()
    return {level: (copied[level], read[level]) for level in read}


if __name__ == "__main__":
    for level, (copied, read) in copy_rates(sys.argv[1]).items():
        print(f"{level:10s} {copied:4d} of {read:4d} ({copied / read:.2f})")
