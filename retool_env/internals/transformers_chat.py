"""transformers' chat template internals that `retool_env.chat_render` uses to render a conversation as
`apply_chat_template(..., tokenize=False)` renders it, without the copies it makes on every call.

The fast path calls the private helpers of `transformers.utils.chat_template_utils` that `apply_chat_template`
itself calls, as transformers 5.24.0 has them:
- `_compile_jinja_template(chat_template)`: the template compiled in transformers' sandbox (then overlaid, see
  `retool_env.internals.jinja_sandbox`);
- `_normalize_chat_messages(conversation)`: message objects (dataclasses, pydantic) to dicts, `None` values dropped;
- `_plain_template_data(value)`: everything the template sees rebuilt of plain JSON types;
- `_alias_reasoning_fields(chat)`: a message's reasoning under each name templates read it by.
It also reads `PreTrainedTokenizerBase.apply_chat_template`'s parameters (template options with one of those names
go its own way) and calls `get_chat_template(chat_template, tools)` and `special_tokens_map`, public. Where a helper
is missing, `chat_template_helpers` is None and every render goes through `apply_chat_template`; where one changed,
`ChatRenderer` finds its first renders differ from `apply_chat_template`'s and turns its fast path off.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

CHECKED_TRANSFORMERS_VERSION = "5.24.0"
HELPER_NAMES = ("_compile_jinja_template", "_normalize_chat_messages", "_plain_template_data",
                "_alias_reasoning_fields")
# What the fast path passes `apply_chat_template`'s template rendering, besides the template options (**kwargs).
_APPLY_PARAMETERS_USED = ("conversation", "tools", "documents", "add_generation_prompt", "tokenize")


@dataclass(frozen=True)
class ChatTemplateHelpers:
    """What the fast path uses of transformers (see the module docstring)."""

    base_class: Any  # PreTrainedTokenizerBase: the fast path serves its subclasses that keep its apply_chat_template
    compile: Any
    normalize: Any
    plain: Any
    alias: Any
    apply_parameters: frozenset[str]  # the names apply_chat_template takes itself


_found: list[ChatTemplateHelpers] = []


def chat_template_helpers() -> ChatTemplateHelpers | None:
    """transformers' chat template helpers, when transformers is loaded and has those the fast path uses."""
    if _found:
        return _found[0]
    if "transformers" not in sys.modules:  # a tokenizer that is not transformers' needs none of it
        return None
    try:
        from transformers import PreTrainedTokenizerBase
        from transformers.utils import chat_template_utils as utils
    except ImportError:
        return None
    compile_, normalize, plain, alias = (getattr(utils, name, None) for name in HELPER_NAMES)
    if not all(callable(helper) for helper in (compile_, normalize, plain, alias)):
        return None
    parameters = frozenset(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    _found.append(ChatTemplateHelpers(PreTrainedTokenizerBase, compile_, normalize, plain, alias, parameters))
    return _found[0]


def _takes_one_argument(function: Any) -> bool:
    """Whether `function(value)` binds, as the fast path calls each helper."""
    try:
        inspect.signature(function).bind(None)
    except (TypeError, ValueError):
        return False
    return True


def shape_changes() -> list[str]:
    """What the fast path reads of transformers and no longer matches the installed transformers; empty on
    5.24.0."""
    import transformers
    from transformers import PreTrainedTokenizerBase
    from transformers.utils import chat_template_utils as utils

    expected = {}
    for name in HELPER_NAMES:
        helper = getattr(utils, name, None)
        expected[f"chat_template_utils.{name} exists and takes one argument"] = (
            callable(helper) and _takes_one_argument(helper))
    apply = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters
    expected["PreTrainedTokenizerBase.apply_chat_template takes " + ", ".join(_APPLY_PARAMETERS_USED)
             + " and the template options as **kwargs"] = (
        all(name in apply for name in _APPLY_PARAMETERS_USED)
        and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in apply.values()))
    get_template = inspect.signature(PreTrainedTokenizerBase.get_chat_template).parameters
    expected["PreTrainedTokenizerBase.get_chat_template takes (chat_template, tools)"] = (
        list(get_template)[1:3] == ["chat_template", "tools"])
    expected["PreTrainedTokenizerBase has special_tokens_map"] = hasattr(PreTrainedTokenizerBase, "special_tokens_map")
    return [f"no longer true on transformers {transformers.__version__}: {claim}" for claim, holds in expected.items()
            if not holds]
