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

import json
from collections.abc import Iterator
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
        if isinstance(self.reward_kwargs, str):  # from the command line
            self.reward_kwargs = json.loads(self.reward_kwargs)
        self.reward_kwargs = dict(self.reward_kwargs or {})
        if isinstance(self.chat_template_kwargs, str):
            self.chat_template_kwargs = json.loads(self.chat_template_kwargs)
        self.chat_template_kwargs = dict(self.chat_template_kwargs or {})

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> EnvConfig:
        """The EnvConfig fields of any object that has them (a script's arguments dataclass that extends EnvConfig),
        with `overrides` replacing some."""
        return cls(**{**{f.name: getattr(settings, f.name) for f in fields(cls)}, **overrides})

    # A mapping of ToolEnvironment's keyword arguments: `ToolEnvironment(tokenizer, dataset, **config)`.
    def keys(self) -> Iterator[str]:
        return iter(f.name for f in fields(EnvConfig))

    def __getitem__(self, name: str) -> Any:
        if name not in {f.name for f in fields(EnvConfig)}:
            raise KeyError(name)
        return getattr(self, name)
