"""The TRL internals the adapter reaches into, in one place, with the TRL version they were checked against.

TRL gives a `rollout_func` no public way to log a metric, to tell whether a colocated vLLM engine dropped its weights
in its sleep, or to reach the trainer's tokenizer and distributed backend. These functions read them as TRL 1.16.0
has them, each with a fallback that keeps training correct if TRL changes (a metric not logged, one weight push too
many); `shape_changes` names what no longer matches, `tests/test_trl_internals.py` fails on it, and `ReToolRollout`
warns with it once on any other TRL version.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

CHECKED_TRL_VERSION = "1.16.0"


def log_metric(trainer: Any, name: str, value: float) -> None:
    """Queue a scalar on the trainer (`GRPOTrainer._log_metric`): averaged over processes and logging steps, and
    logged beside TRL's own metrics."""
    log = getattr(trainer, "_log_metric", None)
    if log is None:
        _warn_once("GRPOTrainer._log_metric is gone: the retool/* metrics are not logged")
        return
    log(name, value)


def engine_weights_asleep(vllm_generation: Any) -> bool:
    """Whether sleep level 2 dropped the colocated engine's weights (`VLLMGeneration._llm_weights_sleeping`), so they
    must be pushed again before it generates; True where TRL no longer says, which costs a push, never a stale
    policy."""
    return bool(getattr(vllm_generation, "_llm_weights_sleeping", True))


def mark_engine_weights_asleep(vllm_generation: Any) -> None:
    """Tell TRL that sleep level 2 dropped the engine's weights, as its own generation does after it sleeps."""
    vllm_generation._llm_weights_sleeping = True


def trainer_tokenizer(trainer: Any) -> Any:
    """The tokenizer GRPOTrainer compares completions' last tokens with (`_tokenizer`: the processing class, or its
    tokenizer for a processor)."""
    tokenizer = getattr(trainer, "_tokenizer", None)
    if tokenizer is not None:
        return tokenizer
    return getattr(trainer.processing_class, "tokenizer", trainer.processing_class)


def distributed_backend(trainer: Any) -> Any:
    """GRPOTrainer's `_dist` (FSDP's full-parameter gathering for generation), or None without one."""
    return getattr(trainer, "_dist", None)


def shape_changes() -> list[str]:
    """What of the internals above, and of the `rollout_func` contract in `GRPOTrainer._generate`, no longer matches
    the installed TRL; empty on TRL 1.16.0."""
    from trl import GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    changes = []
    log = getattr(GRPOTrainer, "_log_metric", None)
    if log is None or list(inspect.signature(log).parameters) != ["self", "name", "value"]:
        changes.append("GRPOTrainer._log_metric(self, name, value) is gone or takes other arguments")
    trainer_source, engine_source = inspect.getsource(GRPOTrainer), inspect.getsource(VLLMGeneration)
    expected = {
        "GRPOTrainer sets self._tokenizer": ("self._tokenizer = " in trainer_source),
        "GRPOTrainer sets self._dist": ("self._dist = " in trainer_source),
        "GRPOTrainer._generate calls rollout_func(prompts, self)": ("self.rollout_func(prompts, self)"
                                                                    in inspect.getsource(GRPOTrainer._generate)),
        "rollout_func must return prompt_ids, completion_ids and logprobs":
            ('{"prompt_ids", "completion_ids", "logprobs"}' in trainer_source),
        "a completion is truncated when its last token is neither eos nor pad (TRLEndTokens)":
            ("eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]" in trainer_source),
        "VLLMGeneration tracks self._llm_weights_sleeping": ("self._llm_weights_sleeping = " in engine_source),
        "VLLMGeneration has sync_weights, enable_sleep_mode, tensor_parallel_size and llm": (
            hasattr(VLLMGeneration, "sync_weights")
            and all(f"self.{name} = " in engine_source for name in ("enable_sleep_mode", "tensor_parallel_size"))
            and "self.llm = " in engine_source),
    }
    return changes + [f"no longer true: {claim}" for claim, holds in expected.items() if not holds]


@functools.lru_cache(maxsize=1)
def warn_if_unchecked() -> None:
    """Once per process: on a TRL other than the one checked, warn with what changed shape (nothing when it did not)."""
    import trl

    if trl.__version__ == CHECKED_TRL_VERSION:
        return
    changes = shape_changes()
    if changes:
        warnings.warn(f"TRL {trl.__version__}: the adapter was checked against TRL {CHECKED_TRL_VERSION}, and "
                      f"{'; '.join(changes)} (retool_adapters.trl.internals falls back)", RuntimeWarning,
                      stacklevel=2)


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)
