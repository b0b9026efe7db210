"""Stand-ins for what the slime adapter meets in slime and vime, which are not on PyPI (Megatron, SGLang, Ray).

Read from THUDM/slime at `SLIME_COMMIT` (slime/utils/types.py, slime/rollout/sglang_rollout.py,
slime/ray/rollout.py, slime/rollout/filter_hub/base_types.py) and vllm-project/vime (vime/rollout/vllm_rollout.py,
vime/rollout/fully_async_rollout.py): the `Sample` dataclass with every field and default, the arguments and
sampling params the rollout hands a custom generate function, how it calls the reward and the dynamic filter, and
what the trainer asserts when it turns samples into training data. Behaviour is restated, not imported.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from enum import Enum
from types import SimpleNamespace
from typing import Any

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
SLIME_ROLLOUT = "slime.rollout.sglang_rollout.generate_rollout"  # slime's default --rollout-function-path
SLIME_FULLY_ASYNC = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
VIME_ROLLOUT = "vime.rollout.vllm_rollout.generate_rollout"


@dataclass
class Sample:
    """slime.utils.types.Sample at SLIME_COMMIT: every field, default and nested type."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        def add(self, meta_info: dict) -> None:
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def get_reward_value(self, args: Any) -> float:
        return self.reward if not args.reward_key else self.reward[args.reward_key]


def slime_args(**overrides: Any) -> SimpleNamespace:
    """The defaults of slime's arguments that a custom generate / reward function reads."""
    return SimpleNamespace(**{
        "hf_checkpoint": None, "rollout_function_path": SLIME_ROLLOUT, "dynamic_sampling_filter_path": None,
        "rollout_temperature": 1.0, "rollout_top_p": 1.0, "rollout_top_k": -1, "rollout_max_response_len": 2048,
        "rollout_max_context_len": None, "rollout_stop": None, "rollout_stop_token_ids": None,
        "rollout_skip_special_tokens": False, "rollout_seed": 42, "n_samples_per_prompt": 2,
        "sglang_enable_deterministic_inference": False, "sglang_router_ip": None, "sglang_router_port": None,
        "reward_key": None, "eval_reward_key": None, "group_rm": False, "partial_rollout": False, **overrides})


def vime_args(**overrides: Any) -> SimpleNamespace:
    """vime's arguments: the vLLM router's address, no SGLang router, vime's default rollout function."""
    args = vars(slime_args(rollout_function_path=VIME_ROLLOUT, vllm_router_ip=None, vllm_router_port=None,
                           vllm_enable_deterministic_inference=False))
    for name in ("sglang_router_ip", "sglang_router_port", "sglang_enable_deterministic_inference"):
        del args[name]
    return SimpleNamespace(**{**args, **overrides})


def rollout_sampling_params(args: SimpleNamespace) -> dict[str, Any]:
    """The sampling params slime's `GenerateState` (and vime's) builds from the arguments for every sample."""
    params = {"temperature": args.rollout_temperature, "top_p": args.rollout_top_p, "top_k": args.rollout_top_k,
              "max_new_tokens": args.rollout_max_response_len, "stop": args.rollout_stop,
              "stop_token_ids": args.rollout_stop_token_ids, "skip_special_tokens": args.rollout_skip_special_tokens,
              "no_stop_trim": True, "spaces_between_special_tokens": False}
    if args.rollout_top_p != 1.0 and hasattr(args, "sglang_router_ip"):  # slime asks SGLang for top-p replay
        params["custom_params"] = {"return_top_p_token_ids": True}
    return params


async def generate_and_rm_group(args: SimpleNamespace, group: list[Sample], generate: Any, rm: Any,
                                evaluation: bool = False) -> list[Sample]:
    """slime's `generate_and_rm_group`: a seed per sample under deterministic inference (slime's key
    "sampling_seed", vime's "seed"), the custom generate function (with `evaluation=` when it takes it; it may return
    a `Sample` or a `list[Sample]`), the reward per sample unless the sample is ABORTED or already has one, or for
    the whole group with `--group-rm`."""
    samples = []
    for i, sample in enumerate(group):
        params = rollout_sampling_params(args)
        if getattr(args, "sglang_enable_deterministic_inference", False):
            params["sampling_seed"] = args.rollout_seed + i
        if getattr(args, "vllm_enable_deterministic_inference", False):
            params["seed"] = args.rollout_seed + i
        if "evaluation" in inspect.signature(generate).parameters:
            sample = await generate(args, sample, params, evaluation=evaluation)
        else:
            sample = await generate(args, sample, params)
        # A custom generate function may return several samples for one rollout (slime's generate_and_rm):
        # none is scored when one is ABORTED, else each without a reward.
        parts = sample if isinstance(sample, list) else [sample]
        if not args.group_rm and all(s.status is not Sample.Status.ABORTED for s in parts):
            for s in parts:
                if s.reward is None:
                    s.reward = await rm(args, s)
        samples.append(sample)
    if args.group_rm:
        for sample, reward in zip(samples, await rm(args, samples), strict=True):
            sample.reward = reward
    return samples


@dataclass
class DynamicFilterOutput:
    """slime.rollout.filter_hub.base_types.DynamicFilterOutput: a drop's reason becomes a rollout metric."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def dynamic_filter_keeps(fn: Any, args: SimpleNamespace, group: list[Sample]) -> tuple[bool, str | None]:
    """slime's `call_dynamic_filter`: a bool is the legacy answer, else a `DynamicFilterOutput(keep, reason)`."""
    output = fn(args, group)
    return (output, None) if isinstance(output, bool) else (output.keep, output.reason)


def to_train_data(args: SimpleNamespace, samples: list[Sample]) -> dict[str, list]:
    """What slime's `Sample._validate_response_metadata_lengths` and `RolloutManager._convert_samples_to_train_data`
    check and compute: per-sample lengths, the reward through `get_reward_value`, and top-p spans when
    `--rollout-top-p` is not 1."""
    for s in samples:
        assert len(s.tokens) >= s.response_length
        assert s.loss_mask is None or len(s.loss_mask) == s.response_length
        assert s.rollout_log_probs is None or len(s.rollout_log_probs) == s.response_length
        if args.rollout_top_p != 1.0:
            assert s.rollout_top_p_token_ids is not None and s.rollout_top_p_token_offsets is not None
            assert len(s.rollout_top_p_token_offsets) == s.response_length + 1
            assert int(s.rollout_top_p_token_offsets[-1]) == len(s.rollout_top_p_token_ids)
    rewards = [float(s.get_reward_value(args)) for s in samples]  # a None or a dict here is slime's TypeError
    # A sample with `remove_sample` (set by a --rollout-sample-filter-path) trains on no token; its reward stays.
    return {"tokens": [s.tokens for s in samples], "rewards": rewards,
            "loss_masks": [[0] * s.response_length if s.remove_sample else s.loss_mask for s in samples]}


def keep_none(args: SimpleNamespace, group: list[Sample]) -> DynamicFilterOutput:
    """A user's dynamic filter that drops every group it is asked about."""
    return DynamicFilterOutput(keep=False, reason="kept none")
