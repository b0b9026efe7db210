"""GEM: the environment as a `gem.Env` (text in, text out, gym's 5-tuple), registered in GEM's registry as
"retool_env", so `gem.make` and `gem.make_vec` (sync or async vectorised, with GEM's autoreset) build it.

GEM's loops are text level: `reset` returns the environment's prompt already rendered by the policy's chat template
(decoded with its special tokens: apply no template on top of it), `step` takes the turn's text and returns the
text the environment appends (the tool results in the chat template's tool turn, ready for the next generation), or
GEM's `TERMINAL_STATE` when the episode ends, with the reward. Tokenizing the prompt and each observation alone gives
the environment's own ids (tested with Qwen2.5's tokenizer); `info["token_ids"]` carries them for a loop that
stays in ids, and such a loop steps with the engine's token ids (`step(ids)` or `step({"token_ids": ids,
"logprobs": ..., "finish_reason": ...})`): vLLM v1's ids end with the stop token `<|im_end|>` and its text does not,
so the text alone would make the environment close the turn a second time in ids. Parsing, sandbox, budgets, grading
and reward are the `ToolEnvironment`'s underneath.

    import gem
    import retool_adapters.gem  # registers "retool_env"
    envs = gem.make_vec(["retool_env"] * 8, async_mode=True, tokenizer="Qwen/Qwen2.5-7B-Instruct", dataset="arith")

gem-llm 0.1.0 pins msgspec==0.19.0 and nltk for its search tool and word games; this adapter imports neither
(`gem`, `gem.core`, `gem.envs.registration`, `gem.vector`), so it installs with `--no-deps` beside
`reasoning-gym`, which `import gem` loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

try:
    from gem.core import Env
    from gem.envs.registration import ENV_REGISTRY, register
    from gem.utils.constants import TERMINAL_STATE
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(f"retool_adapters.gem needs GEM: pip install gem-llm (missing {exc.name})",
                              name=exc.name) from exc

from retool_env.env import ToolEnvironment
from retool_env.tokens import load_tokenizer

__all__ = ["ENV_ID", "ReToolGemEnv"]

ENV_ID = "retool_env"
_tokenizers: dict[str, Any] = {}


class ReToolGemEnv(Env):
    """One `ToolEnvironment` behind GEM's text interface; `seed` (GEM's per-env seed in `make_vec`) seeds its
    problem draws, `reset(idx=i)` picks problem `i`."""

    def __init__(self, tokenizer: Any, dataset: Any = None, seed: int = 0, **env_kwargs: Any) -> None:
        super().__init__()
        if isinstance(tokenizer, str):
            tokenizer = _tokenizers.setdefault(tokenizer, load_tokenizer(tokenizer))
        self.seed, self._seeded = seed, False
        self._config = {"tokenizer": tokenizer, "dataset": dataset, **env_kwargs}
        self.env = ToolEnvironment(tokenizer, dataset, **env_kwargs)

    def reset(self, seed: int | None = None, idx: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; returns the rendered prompt and the environment's reset info (plus `token_ids`)."""
        super().reset(seed)  # GEM's convention: seeds Python's and NumPy's global RNGs too
        if seed is None and not self._seeded:
            seed = self.seed
        self._seeded = True
        prompt_ids, info = self.env.reset(seed=seed, options=None if idx is None else {"index": idx})
        return self._text(prompt_ids), {**info, "token_ids": prompt_ids.tolist()}

    def step(self, action: str | Sequence[int] | Mapping[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the turn's tool calls, or grade its final answer. `action` is the turn's text, or the engine's token
        ids exactly as generated (a list, or the environment's mapping action), which the environment keeps as is."""
        if isinstance(action, str):
            env_action: Any = self.env.format.encode(action)
            action_ids = list(env_action)
        else:
            env_action = action
            action_ids = [int(t) for t in (action["token_ids"] if isinstance(action, Mapping) else action)]
        obs_ids, reward, terminated, truncated, info = self.env.step(env_action)
        done = terminated or truncated
        info = {**info, "token_ids": obs_ids.tolist(), "action_ids": action_ids}
        if done:
            traj = self.env.trajectory
            assert traj is not None
            info.update(correct=bool(traj.correct), num_tool_calls=traj.num_tool_calls)
        return (TERMINAL_STATE if done else self._text(obs_ids)), float(reward), terminated, truncated, info

    def _text(self, ids: Any) -> str:
        return self.env.tokenizer.decode(ids.tolist(), skip_special_tokens=False)

    def spawn(self, same_state: bool = False, **kwargs: Any) -> ReToolGemEnv:
        """A new environment with this one's configuration (`kwargs` override it). An episode's interpreter session
        lives in the sandbox and is not copied, so `same_state=True` is refused."""
        if same_state:
            raise NotImplementedError("ReToolGemEnv cannot copy an episode's state (its interpreter session)")
        config = {**self._config, "seed": self.seed, **kwargs}
        return ReToolGemEnv(**config)

    def close(self) -> None:
        self.env.close()


if ENV_ID not in ENV_REGISTRY:
    register(ENV_ID, f"{__name__}:ReToolGemEnv")
