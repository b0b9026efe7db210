"""jinja2's sandbox internals that `retool_env.chat_render` uses to render chat templates faster, alike.

`remembering_overlay` recompiles transformers' template in an overlay of its immutable sandbox: attribute checks
remembered per (type, name), the only things jinja's immutable sandbox decides them on, and an attribute once found
safe on a type read on that decision (the sandbox's own steps after its check); the items of a plain `dict` read
without the failed attribute lookup first; builtin methods (`content.startswith`) and the template's own macros
called as jinja's `Context.call` calls them (a macro's pass-context mark read through `jinja2.utils._PassArg`); the
tools' `tojson` written once per frozen tool list. It overrides the sandbox's `is_safe_attribute`, `getattr` and
`call`, and reads `wrap_str_format` (jinja 3.1.5+), as jinja2 3.1.6 has them; where a piece is missing it leaves
that work to the sandbox (`ChatRenderer` also checks its first renders against `apply_chat_template`).
"""

from __future__ import annotations

import inspect
from types import BuiltinMethodType, MethodType
from typing import Any

CHECKED_JINJA2_VERSION = "3.1.6"
_FORMAT_METHODS = ("format", "format_map")  # the sandbox wraps these in its safe formatter
_METHOD_TYPES = (MethodType, BuiltinMethodType)
_MEMO_LIMIT = 4096  # attribute decisions remembered per template (names come from the template's source)


def remembering_overlay(template: str, compiled: Any, frozen_json: dict[int, tuple[Any, dict[Any, str]]]) -> Any:
    """`template`, compiled by transformers as `compiled`, recompiled in an overlay of its sandbox that decides
    alike, faster (see the module docstring); `compiled` itself when its sandbox is not jinja's immutable one.
    `frozen_json`: id -> (a frozen tool list, its `tojson` texts by options), written once each."""
    import jinja2.utils
    from jinja2.runtime import Macro
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

    pass_arg: Any = getattr(jinja2.utils, "_PassArg", None)  # without it, macros are called through the sandbox

    base = compiled.environment
    if type(base) is not ImmutableSandboxedEnvironment:
        return compiled
    env = base.overlay()
    check = env.is_safe_attribute
    decided: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        safe = decided.get(key)
        if safe is None:
            safe = check(obj, attr, value)
            if len(decided) < _MEMO_LIMIT:
                decided[key] = safe
        return safe

    sandbox_getattr, dict_names = env.getattr, frozenset(dir(dict))
    wrap_str_format = getattr(env, "wrap_str_format", None)

    def getattr_(obj: Any, attribute: str) -> Any:
        kind = type(obj)
        # A plain dict has no attribute but its class's: the sandbox's lookup fails, then reads the item.
        if kind is dict and attribute not in dict_names:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return env.undefined(obj=obj, name=attribute)
        # An attribute the sandbox already found safe on this type (`loop.index0`, `ns.value`,
        # `content.startswith`): the sandbox's own steps after its check, which it would decide alike.
        if wrap_str_format is not None and decided.get((kind, attribute)) is True:
            try:
                value = getattr(obj, attribute)
            except AttributeError:
                try:
                    return obj[attribute]
                except (TypeError, LookupError):
                    return env.undefined(obj=obj, name=attribute)
            if type(value) in _METHOD_TYPES and value.__name__ in _FORMAT_METHODS:
                fmt = wrap_str_format(value)
                if fmt is not None:
                    return fmt
            return value
        return sandbox_getattr(obj, attribute)

    sandbox_call = env.call
    macro_fast = (pass_arg is not None and pass_arg.from_obj(Macro.__call__) is pass_arg.eval_context
                  and type(env).is_safe_callable is SandboxedEnvironment.is_safe_callable
                  and not hasattr(Macro, "unsafe_callable") and not hasattr(Macro, "alters_data"))

    def call(__context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        # A builtin method (`content.startswith`) passed the attribute checks to be reached, can carry no unsafe
        # or pass-context mark, and is called as jinja's `Context.call` calls it; `str.format` and `format_map`
        # always go through the sandbox (jinja before 3.1.5 gives them its safe formatter there, not at access).
        # A template's own macro is safe to call and takes the eval context: `Context.call`'s steps for it.
        kind = type(__obj)
        if kind is BuiltinMethodType and __obj.__name__ not in _FORMAT_METHODS:
            kwargs.pop("_block_vars", None)
            kwargs.pop("_loop_vars", None)
            try:
                return __obj(*args, **kwargs)
            except StopIteration:
                return env.undefined("value was undefined because a callable raised a StopIteration exception")
        if kind is Macro and macro_fast:
            kwargs.pop("_block_vars", None)
            kwargs.pop("_loop_vars", None)
            try:
                return __obj(__context.eval_ctx, *args, **kwargs)
            except StopIteration:
                return env.undefined("value was undefined because a callable raised a StopIteration exception")
        return sandbox_call(__context, __obj, *args, **kwargs)

    tojson: Any = env.filters.get("tojson")

    def frozen_tojson(value: Any, *args: Any, **kwargs: Any) -> Any:
        # The tools' JSON (`tools | tojson`, on every render) written once per options for the frozen copy.
        texts = frozen_json.get(id(value))
        if texts is None or texts[0] is not value:
            return tojson(value, *args, **kwargs)
        key = (args, tuple(sorted(kwargs.items())))
        try:
            return texts[1][key]
        except KeyError:
            text = texts[1][key] = tojson(value, *args, **kwargs)
            return text
        except TypeError:  # unhashable options
            return tojson(value, *args, **kwargs)

    env.is_safe_attribute = is_safe_attribute  # type: ignore[method-assign]
    env.getattr = getattr_  # type: ignore[method-assign]
    env.call = call  # type: ignore[method-assign]
    if callable(tojson) and (pass_arg is None or pass_arg.from_obj(tojson) is None):  # transformers' plain filter
        env.filters = {**env.filters, "tojson": frozen_tojson}  # the overlay's own filters, transformers' untouched
    return env.from_string(template)


def shape_changes() -> list[str]:
    """What `remembering_overlay` reads of jinja2 and no longer matches the installed jinja2; empty on 3.1.6."""
    import jinja2
    import jinja2.utils
    from jinja2.runtime import Context, Macro
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

    pass_arg = getattr(jinja2.utils, "_PassArg", None)
    env = ImmutableSandboxedEnvironment()
    expected = {
        "jinja2.utils._PassArg has from_obj and eval_context": (
            pass_arg is not None and callable(getattr(pass_arg, "from_obj", None))
            and hasattr(pass_arg, "eval_context")),
        "Macro.__call__ is marked to take the eval context": (
            pass_arg is not None and pass_arg.from_obj(Macro.__call__) is pass_arg.eval_context),
        "Macro carries no unsafe_callable or alters_data mark": (
            not hasattr(Macro, "unsafe_callable") and not hasattr(Macro, "alters_data")),
        "the sandbox has overlay, is_safe_attribute, getattr, call and wrap_str_format": all(
            callable(getattr(env, name, None))
            for name in ("overlay", "is_safe_attribute", "getattr", "call", "wrap_str_format")),
        "SandboxedEnvironment.call takes (self, context, obj, *args, **kwargs)": [
            p.kind.name for p in inspect.signature(SandboxedEnvironment.call).parameters.values()] == [
            "POSITIONAL_OR_KEYWORD"] * 3 + ["VAR_POSITIONAL", "VAR_KEYWORD"],
        "Context.call pops _block_vars and _loop_vars": (
            "_block_vars" in inspect.getsource(Context.call) and "_loop_vars" in inspect.getsource(Context.call)),
        "the default filters include tojson": "tojson" in env.filters,
    }
    return [f"no longer true on jinja2 {jinja2.__version__}: {claim}" for claim, holds in expected.items()
            if not holds]
