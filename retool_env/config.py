"""EnvConfig: the environment's settings, declared once.

`ToolEnvironment(tokenizer, dataset, **config)` takes these fields as keyword arguments, and every training script
hands the same dataclass to `TrlParser`, so a recipe's YAML file sets the environment the way it sets the trainer:

```python
from retool_env import EnvConfig, ToolEnvironment

config = EnvConfig(tool_format="retool", max_tool_calls=4, reward_kwargs={"tool_call_cost": 0.05})
env = ToolEnvironment(tokenizer, problems, **config)
```
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class EnvConfig:
    """How an episode is played: tool format, prompt, sandbox, reward and budgets (see `ToolEnvironment`).

    `ToolEnvironment` also accepts objects where a name is declared here: a `ToolFormat`, a `PromptTemplate`, a
    `Sandbox`, a reward callable. The dataclass is a mapping of its fields, so `**config` unpacks it.
    """

    tool_format: str = field(default="auto", metadata={
        "help": "auto (the tool-call dialect the chat template writes, logged; retool without a chat template), "
                "hermes (<tool_call> JSON), a dialect of retool_env.dialects (qwen3_coder, openai, llama3_json, "
                "glm45, deepseek_v3, ...; results as tool turns of the chat template) or retool (the paper's "
                "<code>, results inline as <interpreter>)."})
    prompt: str | None = field(default=None, metadata={
        "help": "Prompt template (retool, dapo, slime, plain); default: the tool format's own."})
    sandbox: str = field(default="local", metadata={
        "help": "local (the embedded fork-server sandbox), ray (a pool over a Ray cluster; ray:resource=sandbox "
                "names the nodes' resource) or a SandboxFusion /run_code URL."})
    reward: str = field(default="retool", metadata={
        "help": "Reward scheme (retool, retool_slime, paper, binary) or a 'package.module:function' path."})
    reward_kwargs: dict | str | None = field(default=None, metadata={
        "help": "Keyword arguments of the reward scheme, e.g. {tool_call_cost: 0.05}: a mapping in YAML, JSON on "
                "the command line."})
    max_tool_calls: int = field(default=8, metadata={"help": "Executed tool calls allowed per episode."})
    max_completion_tokens: int = field(default=4096, metadata={
        "help": "Token budget of an episode after the prompt, model and interpreter tokens together."})
    max_observation_tokens: int = field(default=512, metadata={
        "help": "Tokens of one interpreter output shown to the model (head and tail kept)."})
    max_turn_tokens: int | None = field(default=None, metadata={"help": "Tokens the model may write per turn."})
    max_model_len: int | None = field(default=None, metadata={
        "help": "Most tokens one context may hold, prompt and completion together, as vLLM's max_model_len (set it "
                "to the engine's); default: bounded by max_completion_tokens alone."})
    tool_timeout: float = field(default=5.0, metadata={"help": "Seconds one tool call may run."})
    error_format: str = field(default="full", metadata={
        "help": "What the model is shown of a call that failed: full (its whole output), last_line (the last line, "
                "the traceback's exception, cut to 400 characters, as the ReTool evaluation feeds back) or "
                "head_tail:N (the first and last N/2 characters)."})
    on_timeout: str = field(default="feedback", metadata={
        "help": "A call that times out: feedback (the model is told and goes on) or abort (the episode ends, "
                "truncated, finish_reason tool_timeout, as verifiers' abort_on_code_timeout)."})
    fault_rate: float = field(default=0.0, metadata={
        "help": "Share of tool calls refused before they run, as a busy or failing sandbox refuses them (status "
                "sandbox_error, a retryable message; counted as failed calls): robustness training and tests. "
                "Seeded by fault_seed and the episode so far (retool_env.faults)."})
    fault_seed: int = field(default=0, metadata={"help": "Seed of the injected faults (fault_rate)."})
    stateful: bool = field(default=False, metadata={
        "help": "Keep variables between an episode's tool calls (Jupyter-like)."})
    chat_template: str | None = field(default=None, metadata={
        "help": "Chat template that renders the episode: a name (qwen3, qwen3_training, deepseek_r1_distill...: "
                "retool_env/chat_templates, then TRL's), a .jinja file, or the template text; default: the "
                "tokenizer's own."})
    chat_template_kwargs: dict | str | None = field(default=None, metadata={
        "help": "Options of the chat template passed to every render, e.g. {enable_thinking: false}: a mapping in "
                "YAML, JSON on the command line (TRL's GRPOConfig.chat_template_kwargs, verl's "
                "apply_chat_template_kwargs)."})
    sample_mode: str = field(default="episode", metadata={
        "help": "episode: one training sample per episode (a template that rewrites history is counted in "
                "trajectory.rewritten_turns and warned about); turn: a new sample whenever the template rewrites "
                "history, each context exactly as the template renders it, append-only turns merged."})

    def __post_init__(self) -> None:
        self.reward_kwargs = _mapping(self.reward_kwargs)  # JSON text from the command line, a mapping from YAML
        self.chat_template_kwargs = _mapping(self.chat_template_kwargs)

    @property
    def reward_options(self) -> dict[str, Any]:
        """`reward_kwargs` as a dict (the field also takes JSON text, which `__post_init__` decodes)."""
        return _mapping(self.reward_kwargs)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """`chat_template_kwargs` as a dict (the field also takes JSON text, which `__post_init__` decodes)."""
        return _mapping(self.chat_template_kwargs)

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> EnvConfig:
        """The EnvConfig fields of any object that has them (a script's arguments dataclass that extends EnvConfig),
        with `overrides` replacing some."""
        return cls(**{**{f.name: getattr(settings, f.name) for f in fields(cls)}, **overrides})

    @classmethod
    def with_defaults(cls, *, taken_elsewhere: Sequence[str] = (), **defaults: Any) -> type[EnvConfig]:
        """EnvConfig with other defaults for some fields, as the base of a script's arguments whose recipe differs
        (SFT replays long solutions): `class DataArguments(EnvConfig.with_defaults(max_completion_tokens=16384))`.
        The fields stay declared once, here, with their type and help. A default of None means the script fills the
        field in (grpo_trl.py: GRPOConfig's `max_completion_length`). `taken_elsewhere` leaves fields off the
        script's command line that another of its dataclasses declares too (GRPOConfig's chat_template_kwargs)."""
        declared = {f.name: f for f in fields(cls)}
        unknown = sorted({*defaults, *taken_elsewhere} - set(declared))
        if unknown:
            raise TypeError(f"EnvConfig has no field(s) {unknown}")
        changed = []
        for name in dict.fromkeys([*defaults, *taken_elsewhere]):
            declared_field = declared[name]
            default = defaults.get(name, declared_field.default)
            annotation = _declared_annotation(cls, name)
            if default is None and "None" not in annotation:
                annotation += " | None"
            changed.append((name, annotation, field(default=default, init=name not in taken_elsewhere,
                                                     metadata=declared_field.metadata)))
        variant = dataclasses.make_dataclass(f"{cls.__name__}WithDefaults", changed, bases=(cls,))
        variant.__module__ = cls.__module__
        return variant

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, **defaults: Any) -> None:
        """Every field as a `--flag` of an argparse parser (`max_tool_calls` as `--max-tool-calls`), for a script
        that has no `TrlParser`; `defaults` replace some of the declared ones. Read back with `from_settings(args)`."""
        group = parser.add_argument_group("environment (retool_env.EnvConfig)")
        for f in fields(cls):
            kind = _argument_type(_declared_annotation(cls, f.name))
            group.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind,
                               default=defaults.get(f.name, f.default), help=f.metadata.get("help"))

    # A mapping of ToolEnvironment's keyword arguments: `ToolEnvironment(tokenizer, dataset, **config)`.
    def keys(self) -> Iterator[str]:
        return iter(f.name for f in fields(EnvConfig))

    def __getitem__(self, name: str) -> Any:
        if name not in {f.name for f in fields(EnvConfig)}:
            raise KeyError(name)
        return getattr(self, name)


def _declared_annotation(cls: type, name: str) -> str:
    """A field's annotation as written: `Field.type` is not it once a parser has resolved it in place (TRL's and
    transformers' HfArgumentParser set it to the type object, on the Field objects every subclass shares)."""
    return next(str(inspect.get_annotations(c)[name]) for c in cls.__mro__ if name in inspect.get_annotations(c))


def _argument_type(annotation: str) -> Callable[[str], Any]:
    """How a command-line value becomes a field's value (dicts stay JSON text: `__post_init__` reads them)."""
    kind = annotation.split("|")[0].strip()
    if kind == "bool":
        return lambda text: text.strip().lower() in ("1", "true", "yes", "on")
    return {"int": int, "float": float}.get(kind, str)


def _mapping(value: dict | str | None) -> dict[str, Any]:
    """A dict of options given as a mapping, JSON text or nothing."""
    return dict(json.loads(value) if isinstance(value, str) else value or {})
