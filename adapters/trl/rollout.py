"""TRL adapter: ReTool-Env episodes as GRPOTrainer's `rollout_func`, and reward functions that read their reward.

```python
from retool_adapters.trl import ReToolRollout, env_reward, correctness, problems_to_dataset

problems = load_problems("dapo")
trainer = GRPOTrainer(
    model=model, processing_class=tokenizer, args=GRPOConfig(..., reward_weights=[1.0, 0.0]),
    train_dataset=problems_to_dataset(problems),   # `prompt` holds the raw question
    reward_funcs=[env_reward, correctness],        # correctness has weight 0: accuracy in the logs, not in the loss
    rollout_func=ReToolRollout(problems, tool_format="hermes", reward="retool"),
)
```

TRL hands the rollout function the raw `prompt` values of its batch, already repeated `num_generations` times, and
the trainer itself. Each prompt is mapped back to its Problem and played as one episode of `ToolEnvironment`; all
episodes run concurrently through `retool_env.rollout.run_episodes`, generating with the trainer's own engine: its
vLLM client (server mode), its in-process `vllm.LLM` (colocate mode), or Hugging Face `generate` on the policy
(`use_vllm=False`, the CPU path). The output is what `GRPOTrainer._generate` expects: `prompt_ids`,
`completion_ids`, one sampled-token `logprobs` per completion token, `env_mask` (TRL's tool mask: environment tokens
carry no loss), and per-episode extra fields that reach the reward functions as keyword arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

from retool_adapters.chat_templates import training_env_kwargs
from retool_adapters.trl.environment import CodeInterpreterEnvironment as CodeInterpreterEnvironment
from retool_adapters.trl.environment import grade_final_answers as grade_final_answers
from retool_adapters.trl.environment import run_sync
from retool_adapters.trl.internals import (
    distributed_backend,
    engine_weights_asleep,
    log_metric,
    mark_engine_weights_asleep,
    trainer_tokenizer,
    warn_if_unchecked,
)
from retool_env.data import Problem
from retool_env.filters import TrainingPlan, TrajectoryFilters, has_void_turn, roc_penalty, roc_select  # noqa: F401
from retool_env.filters import group_indices as filters_group_indices
from retool_env.records import RecordWriter, episode_record
from retool_env.rewards import EpisodeStats
from retool_env.rollout import Generator, SamplingParams, derive_seed, run_episodes
from retool_env.tool_runner import shared_sandbox
from retool_env.trajectory import ToolStatus, Trajectory

# Per-episode fields returned next to the tokens; TRL passes each to the reward functions as a keyword argument.
EXTRA_FIELDS = ("env_reward", "correct", "strict_correct", "num_tool_calls", "num_turns", "truncated", "aborted",
                "finish_reason", "pred")


def question_of(prompt: Any) -> str:
    """The raw problem text of a dataset `prompt`: the string itself, or the last user message of a conversation."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1].get("content"), str):
            return users[-1]["content"]
    raise TypeError(f"a prompt must be the raw question, or messages ending in a user message; got {prompt!r:.200}")


def index_problems(problems: Sequence[Problem]) -> dict[str, Problem]:
    """Problems by question text, the key TRL's prompts are looked up by. Same question, other answer: an error."""
    index: dict[str, Problem] = {}
    for problem in problems:
        seen = index.setdefault(problem.question, problem)
        if seen.answer != problem.answer:
            raise ValueError(f"the question {problem.question[:120]!r} appears with two answers ({seen.answer!r} in "
                             f"{seen.id or seen.source!r}, {problem.answer!r} in {problem.id or problem.source!r}); "
                             f"a prompt must identify one problem: deduplicate the dataset")
    return index


def problems_to_dataset(problems: Sequence[Problem], *, prompt: str | None = None) -> Any:
    """A `datasets.Dataset` for GRPOTrainer: `prompt` is the raw question (ReToolRollout templates it), plus the answer.

    With `prompt` (a name in `retool_env.prompts.PROMPTS`), `prompt` holds that template's chat messages instead, as
    TRL's own tool loop (`environment_factory`) needs: TRL applies the chat template and the tool schema itself.
    """
    from datasets import Dataset

    from retool_env.prompts import get_prompt

    template = get_prompt(prompt) if prompt is not None else None
    return Dataset.from_list([{"prompt": template.messages(p.question) if template else p.question,
                               "answer": p.answer, "problem_id": p.id} for p in problems])


def sampling_from_config(args: Any) -> SamplingParams:
    """GRPOConfig's sampling settings (TRL's top_k=0 means off, as -1 does in vLLM and SamplingParams)."""
    if getattr(args, "repetition_penalty", 1.0) not in (None, 1.0) or getattr(args, "min_p", None) not in (None, 0.0):
        raise ValueError("ReToolRollout samples with temperature, top_p and top_k only; unset repetition_penalty and "
                         "min_p in GRPOConfig")
    top_k = args.top_k if args.top_k and args.top_k > 0 else -1
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=top_k)


class ReToolRollout:
    """GRPOTrainer's `rollout_func`: one ReTool-Env episode per prompt, generated by the trainer's own engine.

    `problems` must hold every problem the train and eval datasets can prompt with: TRL passes only the `prompt`
    text, and the gold answer is found by it. `env_kwargs` go to `ToolEnvironment` (tool_format, prompt, sandbox,
    reward, reward_kwargs, max_tool_calls, max_observation_tokens, max_turn_tokens, tool_timeout, stateful, ...);
    `max_completion_tokens` defaults to GRPOConfig's `max_completion_length`, which spans every turn, as in TRL. The
    tokenizer defaults to the trainer's `processing_class`. Sampling follows GRPOConfig's temperature, top_p and
    top_k; its `generation_kwargs` do not apply, as the environment owns the stop conditions. `generator` replaces the
    trainer's engine with another backend (an OpenAI-compatible server, say), whose weights are then the caller's to
    keep in sync.

    `seeded` (the default) gives every episode its own sampling seed, derived from GRPOConfig's `seed`, the process
    index, the step and the episode's place in the batch: a rerun samples the same tokens, however its requests were
    batched (`SamplingParams.seed`; vLLM and HFGenerator both sample seeded requests independently of their batch).
    `seeded=False` leaves sampling to the engine's own random state.

    An episode that fails (generator error, missing logprobs, `episode_timeout`) is never trained on: it comes back
    as one end token with `env_mask` 0 and `env_reward` None, which GRPO scores NaN and gives zero advantage.
    `episode_timeout` (seconds per episode) is off by default, as episode lengths vary; in server mode each turn
    waits at most `generation_timeout` seconds for the vLLM server (TRL's client sets no read timeout), so a stuck
    server aborts its episodes instead of hanging the step.

    `mask_void_turns` (SimpleTIR, arXiv 2509.02479; off by default) takes every episode with a void turn
    (`has_void_turn`: a turn with neither a complete tool call nor a final answer) out of the loss, `env_mask` all 0,
    while its reward still counts in its group's statistics; `retool/void_turn_ratio` logs their share either way.

    `accuracy_filter=(low, high)` (SimpleTIR's 0.1-0.9; DAPO's dynamic sampling is its (0, 1) limit; off by default)
    takes out of the loss every group whose accuracy, over its scored episodes in this call, lies outside [low, high]:
    a group all right or all wrong teaches nothing about correctness, yet the tool shaping would still give it
    advantages. The batch keeps its size (TRL's is fixed), so it is a mask, not the papers' oversampling;
    `retool/filtered_groups` logs the share of groups taken out.

    `roc_down_sample=n` is rStar2-Agent's GRPO-RoC (arXiv 2508.20722, `rstar2_agent/down_sample/roc.py`; off by
    default) as a filter over groups TRL generated with `num_generations=2n`: a group whose scored rewards are all
    equal is rejected (masked, `roc_equal_reward`); from the others n episodes are kept (`roc_select`) and the rest
    come back unscored (`env_reward` and `correct` None) with `env_mask` 0, so TRL leaves them out of the group's
    mean and std (its NaN-aware baseline) and of the loss: the advantages are those of the n kept, as in RoC. TRL's
    batch keeps its 2n episodes per group (it cannot oversample), so the dropped half still costs its generation and
    one forward pass; use a loss normalised by the trained tokens (TRL's default `loss_type="dapo"`, or "bnpo"), for
    which the masked episodes weigh nothing. `retool/roc_rejected_groups` and `retool/roc_dropped` log the shares.

    `sign_safe_shaping` (off by default) passes each group's rewards through `retool_env.rewards.sign_safe_rewards`
    (after RoC): no correct rollout can then get a negative advantage from tool costs or step rewards (AdaTIR's
    sign reversal, arXiv 2601.14696); `"above_wrong"` also keeps each above every wrong one of its group. `env_reward`
    then holds the clipped reward.

    Filters and `sign_safe_shaping` group episodes by problem within one call, as TRL repeats each prompt
    `num_generations` times in a row: with several processes, keep whole groups on one process (a per-process
    batch that is a multiple of `num_generations`).

    `records_path` (off by default) appends every training episode (not evaluation ones) to a JSONL file of
    `retool_env.records` (tokens, mask as trained, decoded turns, tool calls, reward and its inputs, extracted
    answer, global step, seed), one file per process (`records.rank1.jsonl` ...); `retool-env regrade` re-scores it.
    """

    def __init__(
        self,
        problems: Sequence[Problem],
        *,
        tokenizer: Any = None,
        concurrency: int = 256,
        episode_timeout: float | None = None,
        generation_timeout: float | None = 600.0,
        generator: Generator | None = None,
        seeded: bool = True,
        mask_void_turns: bool = False,
        accuracy_filter: tuple[float, float] | None = None,
        roc_down_sample: int | None = None,
        sign_safe_shaping: bool | str = False,
        records_path: str | os.PathLike | None = None,
        **env_kwargs: Any,
    ) -> None:
        if not problems:
            raise ValueError("ReToolRollout needs the problems its prompts come from")
        TrajectoryFilters(mask_void_turns, accuracy_filter, roc_down_sample, sign_safe_shaping)  # checks them
        if "dataset" in env_kwargs:
            raise ValueError("pass the problems as ReToolRollout's first argument, not as `dataset`")
        if env_kwargs.get("sample_mode", "episode") != "episode":
            raise ValueError("TRL's rollout_func returns one completion per prompt, so an episode must be one sample: "
                             "keep sample_mode='episode' (a template that rewrites history is then swapped for "
                             "TRL's prefix-preserving training version)")
        self.problems = list(problems)
        self.by_question = index_problems(self.problems)
        self.tokenizer = tokenizer
        self.concurrency = concurrency
        self.episode_timeout = episode_timeout
        self.generation_timeout = generation_timeout
        self.generator = generator
        self.seeded = seeded
        self.mask_void_turns = mask_void_turns
        self.accuracy_filter = accuracy_filter
        self.roc_down_sample = roc_down_sample
        self.sign_safe_shaping = sign_safe_shaping
        self.records_path = records_path
        self._records: RecordWriter | None = None
        self._seed_step, self._calls_this_step = -1, 0
        self.env_kwargs = env_kwargs
        self._server_client: Any = None  # a VLLMClient for ranks other than the main one (server mode)
        self._prompt_env: Any = None  # see _spare_env

    @property
    def filters(self) -> TrajectoryFilters:
        """The trajectory filter options, as `retool_env.filters` applies them."""
        return TrajectoryFilters(self.mask_void_turns, self.accuracy_filter, self.roc_down_sample,
                                 self.sign_safe_shaping)

    # ------------------------------------------------------------------------------------------------ the call
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        """Play one episode per prompt, in order, and return TRL's rollout fields plus the per-episode extras."""
        warn_if_unchecked()
        problems = [self.problem_for(prompt) for prompt in prompts]
        make_env = self._env_factory(trainer)
        concurrency = max(1, min(self.concurrency, len(problems)))
        sampling = sampling_from_config(trainer.args)
        if self.seeded:
            sampling = dataclasses.replace(sampling, seed=self._rollout_seed(trainer))
        roc_seed = derive_seed(trainer.args.seed, trainer.accelerator.process_index, trainer.state.global_step, "roc")
        with self._generation_backend(trainer, concurrency) as generator:
            trajectories = run_sync(run_episodes(
                problems, make_env, generator,
                concurrency=concurrency,
                sampling=sampling,
                episode_timeout=self.episode_timeout,
                require_logprobs=True,  # TRL's importance-sampling correction uses them: never invent them
                progress=False,
            ))
        if trajectories and all(t.aborted for t in trajectories):
            raise RuntimeError(f"every episode of the batch failed, so there is nothing to train on; the first: "
                               f"{trajectories[0].finish_reason}")
        log_episode_metrics(trainer, trajectories)
        log_sandbox_metrics(trainer, self.env_kwargs.get("sandbox", "local"))
        if self.accuracy_filter is not None:
            filtered, groups = self.groups_outside_accuracy(trajectories, problems), {id(p) for p in problems}
            log_metric(trainer, "retool/filtered_groups", len(filtered) / len(groups))
        plan = self.training_plan(trajectories, problems, roc_seed=roc_seed)
        if self.roc_down_sample is not None:
            roc_groups = group_indices(problems)
            rejected = sum(all("roc_equal_reward" in plan.filters[i] for i in group) for group in roc_groups.values())
            log_metric(trainer, "retool/roc_rejected_groups", rejected / len(roc_groups))
            log_metric(trainer, "retool/roc_dropped", sum("roc" in f for f in plan.filters) / len(trajectories))
        out = self.to_rollout_output(trajectories, problems, make_env, trl_end_tokens(trainer), plan=plan)
        if self.records_path is not None and trainer.model.training:
            self.write_records(trainer, trajectories, problems, out, plan, make_env, sampling.seed)
        return out

    def training_plan(self, trajectories: Sequence[Trajectory], problems: Sequence[Problem], *,
                      roc_seed: int = 0) -> TrainingPlan:
        """What reaches GRPO of each episode: the filters that take it out of the loss, and its reward (None:
        unscored, left out of its group's statistics); `retool_env.filters.TrajectoryFilters.plan`."""
        return self.filters.plan(trajectories, [id(p) for p in problems], roc_seed=roc_seed)

    def write_records(self, trainer: Any, trajectories: Sequence[Trajectory], problems: Sequence[Problem],
                      out: dict[str, list], plan: TrainingPlan, make_env: Callable[[], Any],
                      base_seed: int | None) -> None:
        """Append the call's episodes to `records_path` (see `retool_env.records`)."""
        if self._records is None:
            assert self.records_path is not None
            self._records = RecordWriter.for_process(self.records_path, trainer.accelerator.process_index,
                                                     trainer.accelerator.num_processes)
        env = self._spare_env(make_env)
        groups = {key: number for number, key in enumerate(group_indices(problems))}
        records = []
        for i, (traj, problem) in enumerate(zip(trajectories, problems, strict=True)):
            failed = traj.aborted or not traj.completion_ids
            records.append(episode_record(
                traj, decode=env.tokenizer.decode,
                episode_stats=None if failed else EpisodeStats.of(traj),
                reward_scheme=env.config.reward, reward_kwargs=env.config.reward_kwargs,
                env_mask=None if failed else out["env_mask"][i][:len(traj.env_mask)],
                filtered=plan.filters[i], question=problem.question, policy_version=trainer.state.global_step,
                seed=None if base_seed is None else base_seed + i, group=groups[id(problem)], mode="train",
                trained_reward=out["env_reward"][i]))
        self._records.write(records)

    def groups_outside_accuracy(self, trajectories: Sequence[Trajectory], problems: Sequence[Problem]) -> set[Hashable]:
        """The problems (by `id()`) whose groups `accuracy_filter` takes out of the loss."""
        return self.filters.groups_outside_accuracy(trajectories, [id(p) for p in problems])

    def _rollout_seed(self, trainer: Any) -> int:
        """This call's base seed, from GRPOConfig's `seed`, the process, the step and how many rollouts this step has
        had (training and evaluation); episode i samples under base + i."""
        step = trainer.state.global_step
        self._calls_this_step = self._calls_this_step + 1 if self._seed_step == step else 0
        self._seed_step = step
        return derive_seed(trainer.args.seed, trainer.accelerator.process_index, step, self._calls_this_step)

    def problem_for(self, prompt: Any) -> Problem:
        """The problem a dataset prompt was made from (TRL passes the prompt alone)."""
        question = question_of(prompt)
        try:
            return self.by_question[question]
        except KeyError:
            raise KeyError(f"the prompt {question[:120]!r} is not one of ReToolRollout's {len(self.by_question)} "
                           f"problems; build the datasets with problems_to_dataset() from the same problems") from None

    def to_rollout_output(self, trajectories: Sequence[Trajectory], problems: Sequence[Problem],
                          make_env: Callable[[], Any], end_tokens: TRLEndTokens | None = None, *,
                          plan: TrainingPlan | None = None) -> dict[str, list]:
        """TRL's rollout dict: token lists per episode, with a masked one-token stand-in for each failed episode.

        With `end_tokens`, each episode's last token tells TRL what the environment decided (see `TRLEndTokens`);
        `plan` (default: `training_plan`) says which episodes the filters mask and what reward each carries."""
        out: dict[str, list] = {key: [] for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                    *EXTRA_FIELDS)}
        plan = plan or self.training_plan(trajectories, problems)
        for traj, problem, filters, reward in zip(trajectories, problems, plan.filters, plan.rewards, strict=True):
            failed = traj.aborted or not traj.completion_ids
            if failed:
                out["prompt_ids"].append(traj.prompt_ids or self._prompt_ids(problem, make_env))
                out["completion_ids"].append([self._end_token_id(make_env)])
                out["logprobs"].append([0.0])
                out["env_mask"].append([0])  # no loss on a token nobody sampled
            else:
                out["prompt_ids"].append(list(traj.prompt_ids))
                extra = end_tokens.closing(traj) if end_tokens is not None else []
                out["completion_ids"].append(list(traj.completion_ids) + extra)
                out["logprobs"].append(list(traj.logprobs) + [0.0] * len(extra))
                out["env_mask"].append([0] * (len(traj.env_mask) + len(extra)) if filters else
                                       list(traj.env_mask) + [0] * len(extra))
            unscored = failed or reward is None
            out["env_reward"].append(None if unscored else reward)
            out["correct"].append(None if unscored else traj.correct)
            out["strict_correct"].append(None if unscored else traj.strict_correct)
            out["num_tool_calls"].append(traj.num_tool_calls)
            out["num_turns"].append(traj.num_turns)
            out["truncated"].append(traj.truncated)
            out["aborted"].append(failed)
            out["finish_reason"].append(traj.finish_reason)
            out["pred"].append(traj.pred)
        return out

    # ----------------------------------------------------------------------------------------- environments
    def _env_factory(self, trainer: Any) -> Callable[[], Any]:
        from retool_env.env import ToolEnvironment

        tokenizer = self.tokenizer if self.tokenizer is not None else trainer.processing_class
        self.env_kwargs = training_env_kwargs(tokenizer, self.env_kwargs)  # logs once: then the template is chosen
        kwargs = {"max_completion_tokens": trainer.args.max_completion_length, **self.env_kwargs}
        if getattr(trainer.args, "chat_template_kwargs", None) and "chat_template_kwargs" not in kwargs:
            kwargs["chat_template_kwargs"] = dict(trainer.args.chat_template_kwargs)  # e.g. enable_thinking
        return lambda: ToolEnvironment(tokenizer, self.problems, **kwargs)

    def _spare_env(self, make_env: Callable[[], Any]) -> Any:
        """An environment outside the episodes, for the prompt and end token of a failed episode's stand-in."""
        if self._prompt_env is None:
            self._prompt_env = make_env()
        return self._prompt_env

    def _prompt_ids(self, problem: Problem, make_env: Callable[[], Any]) -> list[int]:
        prompt_ids, _ = self._spare_env(make_env).reset(options={"problem": problem})
        return prompt_ids.tolist()

    def _end_token_id(self, make_env: Callable[[], Any]) -> int:
        return self._spare_env(make_env).format.end_token_ids[0]

    # ------------------------------------------------------------------------------------------- generation
    @contextlib.contextmanager
    def _generation_backend(self, trainer: Any, concurrency: int) -> Iterator[Generator]:
        """The trainer's engine as a Generator, for the duration of one rollout."""
        args = trainer.args
        if self.generator is not None:
            yield self.generator
        elif args.use_vllm and args.vllm_mode == "server":
            generator = self._server_generator(trainer, concurrency)
            try:
                yield generator
            finally:
                generator.close()
        elif args.use_vllm:
            with _colocated_engine(trainer) as llm:
                from retool_adapters.generators import VLLMEngineGenerator

                yield VLLMEngineGenerator(llm)
        else:
            with _policy_generator(trainer, max_batch_size=concurrency) as generator:
                yield generator

    def _server_generator(self, trainer: Any, concurrency: int) -> Any:
        from retool_adapters.generators import TRLVLLMClientGenerator

        # Every rank generates its own episodes (so their tool calls run on every node), but only after the main
        # rank has pushed this step's weights: other ranks return from sync_weights before it is done.
        trainer.accelerator.wait_for_everyone()
        client = getattr(trainer.vllm_generation, "vllm_client", None)
        if client is None:  # TRL builds its client on the main process only
            if self._server_client is None:
                from trl.generation.vllm_client import VLLMClient

                args = trainer.args
                base_url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
                self._server_client = VLLMClient(base_url=base_url, connection_timeout=args.vllm_server_timeout)
            client = self._server_client
        return TRLVLLMClientGenerator(client, eos_token_ids=trainer.eos_token_ids, concurrency=concurrency,
                                      timeout_s=self.generation_timeout)


@dataclasses.dataclass(frozen=True)
class TRLEndTokens:
    """How GRPOTrainer tells a truncated completion: its last token is neither an eos token nor the pad token
    (TRL 1.16 `_generate` for `completions/clipped_ratio`, `_generate_and_score_completions` for
    `mask_truncated_completions`). The environment decides otherwise: a hermes episode it cuts off at `max_tool_calls`
    still ends with the model's `<|im_end|>`, which TRL reads as finished; and a model whose eos is `<|endoftext|>`
    ends every finished hermes episode with `<|im_end|>`, which TRL reads as truncated. `closing` gives the one
    token (mask 0, logprob 0: no loss, and last, so no other token attends to it) that makes TRL's reading the
    environment's `Trajectory.truncated`, or nothing where they already agree."""

    end_ids: frozenset[int | None]  # TRL's eos_and_pad
    eos_id: int  # closes a finished episode TRL would read as truncated
    marker_id: int  # closes a truncated episode TRL would read as finished: "\n", what the chat template writes next

    def closing(self, traj: Trajectory) -> list[int]:
        ends_like_trl_finished = bool(traj.completion_ids) and traj.completion_ids[-1] in self.end_ids
        if traj.truncated and ends_like_trl_finished:
            return [self.marker_id]
        if not traj.truncated and not ends_like_trl_finished:
            return [self.eos_id]
        return []


def trl_end_tokens(trainer: Any) -> TRLEndTokens:
    """The trainer's eos and pad tokens, as GRPOTrainer compares a completion's last token with them."""
    tokenizer = trainer_tokenizer(trainer)
    end_ids = frozenset([*trainer.eos_token_ids, tokenizer.pad_token_id])
    marker = tokenizer.encode("\n", add_special_tokens=False)[-1:]
    if not marker or marker[0] in end_ids:
        raise ValueError("the tokenizer has no newline token outside its eos and pad tokens, so truncated episodes "
                         "cannot be told apart for TRL")
    return TRLEndTokens(end_ids=end_ids, eos_id=trainer.eos_token_ids[0], marker_id=marker[0])


@contextlib.contextmanager
def _colocated_engine(trainer: Any) -> Iterator[Any]:
    """The trainer's in-process `vllm.LLM`, awake for the rollout and put back to sleep after, as TRL does."""
    vllm_generation = trainer.vllm_generation
    if vllm_generation.tensor_parallel_size > 1:
        raise NotImplementedError("vllm_tensor_parallel_size > 1 in colocate mode needs every rank of a "
                                  "tensor-parallel group to submit identical batches, which multi-turn episodes do "
                                  "not; use vllm_mode='server' for models that need tensor parallelism")
    llm = vllm_generation.llm
    if not vllm_generation.enable_sleep_mode:
        yield llm
        return
    if engine_weights_asleep(vllm_generation):  # sleep level 2 dropped the weights: push the policy's again
        vllm_generation.sync_weights()
    llm.wake_up(tags=["kv_cache"])
    try:
        yield llm
    finally:
        llm.sleep(level=2)
        mark_engine_weights_asleep(vllm_generation)


@contextlib.contextmanager
def _policy_generator(trainer: Any, max_batch_size: int) -> Iterator[Generator]:
    """Hugging Face `generate` on the policy itself, unwrapped (and gathered under ZeRO-3) as TRL's own path does."""
    from trl.models.utils import unwrap_model_for_generation

    from retool_adapters.generators import HFGenerator

    args = trainer.args
    dist = distributed_backend(trainer)
    with (
        unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                    gather_deepspeed3_params=args.ds3_gather_for_generation,
                                    gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as model,
        dist.summon_full_params(trainer.model_wrapped, recurse=False) if dist else contextlib.nullcontext(),
    ):
        was_training = model.training
        try:
            # Eval mode (no dropout) while sampling; logprobs of the distribution sampled from, after temperature,
            # as TRL's policy logprobs and its vLLM engines' "processed_logprobs" are.
            yield HFGenerator(model, trainer.processing_class, logprobs_mode="processed_logprobs",
                              max_batch_size=max_batch_size)
        finally:
            model.train(was_training)


# ------------------------------------------------------------------------------------------------------- metrics
# roc_penalty, roc_select and TrainingPlan live in retool_env.filters and stay importable from here.
def group_indices(problems: Sequence[Problem]) -> dict[Hashable, list[int]]:
    """The batch's GRPO groups: the positions of each problem (by `id()`), in order of first appearance."""
    return filters_group_indices([id(problem) for problem in problems])


def episode_metrics(trajectories: Sequence[Trajectory]) -> dict[str, list[float]]:
    """Per-episode (and per-tool-call, for rates) values of the `retool/*` metrics; failed episodes count only in
    `retool/aborted`. Episode counts come from `Trajectory.tool_stats`; the rates are over the calls that were run or
    rejected (`ToolStatus.SKIPPED` excluded): `tool_error_rate` counts every call that did not end `ok` (failed,
    timed out or invalid), `tool_timeout_rate` and `tool_invalid_rate` their own status."""
    done = [t for t in trajectories if not t.aborted and t.completion_ids]
    stats = [t.tool_stats() for t in done]
    statuses = [c.status for t in done for c in t.tool_calls if c.status != ToolStatus.SKIPPED]
    metrics: dict[str, list[float]] = {
        "retool/aborted": [float(t.aborted or not t.completion_ids) for t in trajectories],
        "retool/tool_calls_per_episode": [float(s.executed) for s in stats],
        "retool/turns": [float(t.num_turns) for t in done],
        "retool/truncation_rate": [float(t.truncated) for t in done],
        "retool/void_turn_ratio": [float(has_void_turn(t)) for t in done],
        "retool/accuracy": [float(bool(t.correct)) for t in done],
        "retool/parse_failure_rate": [float(t.pred is None) for t in done],  # no extractable answer
        "retool/strict_accuracy": [float(bool(t.strict_correct)) for t in done],
        "retool/response_length": [float(len(t.completion_ids)) for t in done],
        "retool/used_tool": [float(s.executed > 0) for s in stats],
        "retool/tool_error_rate": [float(status != ToolStatus.OK) for status in statuses],
        "retool/tool_timeout_rate": [float(status == ToolStatus.TIMEOUT) for status in statuses],
        "retool/tool_invalid_rate": [float(status == ToolStatus.INVALID) for status in statuses],
    }
    return {name: values for name, values in metrics.items() if values}


def log_episode_metrics(trainer: Any, trajectories: Sequence[Trajectory]) -> None:
    """Queue the `retool/*` metrics on the trainer. TRL averages queued values over all processes' episodes (and
    tool calls) once per batch, then over the logging steps, and logs them next to its own metrics."""
    for name, values in episode_metrics(trajectories).items():
        for value in values:
            log_metric(trainer, name, value)


def log_sandbox_metrics(trainer: Any, sandbox: Any) -> None:
    """`retool/sandbox/*` (in flight, queued, p50/p99 latency, calls, errors, retries, lost) from a sandbox that keeps
    them (`RaySandbox.stats()`); nothing for the others."""

    stats = getattr(shared_sandbox(sandbox) if isinstance(sandbox, str) else sandbox, "stats", None)
    for name, value in (stats() if stats else {}).items():
        if isinstance(value, (int, float)):
            log_metric(trainer, f"retool/sandbox/{name}", value)


# ----------------------------------------------------------------------------------------------- reward functions
def env_reward(completions: list, env_reward: list[float | None] | None = None, **kwargs: Any) -> list[float | None]:
    """The environment's reward for each episode, as GRPO's reward; None (no advantage) for a failed episode."""
    if env_reward is None:
        raise ValueError("env_reward reads the `env_reward` field of ReToolRollout; pass "
                         "rollout_func=ReToolRollout(...)")
    return [None if r is None or math.isnan(r) else float(r) for r in env_reward]


def correctness(completions: list, correct: list[bool | None] | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 for a correct final answer, else 0.0: give it weight 0 in `reward_weights` to log accuracy without
    training on it."""
    if correct is None:
        raise ValueError("correctness reads the `correct` field of ReToolRollout; pass rollout_func=ReToolRollout(...)")
    return [None if c is None else float(c) for c in correct]


REWARD_FUNCS = (env_reward, correctness)
REWARD_WEIGHTS = (1.0, 0.0)
