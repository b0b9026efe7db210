"""What every tool-call dialect shares: the parsed call, the schema typing of its arguments, bounded scanning.

A dialect reads the text of one assistant turn (after its reasoning block, with or without its end token) and finds
the tool calls written in it. Model text is hostile input on the step path, so every scan here is linear in the
text (`str.find`/`str.split`, never a backtracking regular expression), nothing recurses on the input, and JSON or
Python literals are decoded only once their nesting is known to be at most `MAX_DEPTH`.
"""

from __future__ import annotations

import ast
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from retool_env.reasoning import CallBlocks, split_reasoning

MAX_DEPTH = 32  # deepest nesting of brackets a call's arguments may have
MAX_CALLS = 32  # most calls one turn may make; scanners stop reading after one more
DEFAULT_TOOL = "code_interpreter"  # the tool an example names when no tools are given


@dataclass(frozen=True)
class FunctionCall:
    """A call to write: a function name and its arguments (`Dialect.call_text` renders it)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedCall:
    """One call found in a turn: its name and typed arguments, or `error`, which tells the model what was wrong."""

    name: str | None
    arguments: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class ParsedTurn:
    """The calls of one turn, in order, and its `content`: the text outside the call blocks.

    `unfinished` is True when the text ends inside a call block the dialect closes with a marker of its own (the
    generation was cut off there); a call closed only by the turn's end token is never unfinished."""

    calls: tuple[ParsedCall, ...]
    content: str
    unfinished: bool = False


@dataclass
class RawCall:
    """A call as a dialect's scanner read it, before schema typing. `text_valued`: the dialect writes every argument
    as text (XML-style dialects), so values are converted to the schema's types."""

    name: str | None
    arguments: dict[str, Any] | None = None
    error: str | None = None
    text_valued: bool = False


@dataclass
class Scan:
    """What a dialect's scanner returns."""

    calls: list[RawCall] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    unfinished: bool = False


def tool_functions(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """The function part of each tool schema (OpenAI's `{"type": "function", "function": {...}}` or bare), by name."""
    functions = {}
    for tool in tools or ():
        function = tool.get("function", tool)
        functions[function["name"]] = function
    return functions


_SYNTAX = re.compile(r"[\"'\[\](){}]")  # one character class: a linear search, no backtracking


def json_depth_ok(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether brackets outside string literals nest at most `limit` deep (quotes ' and " both open strings, so
    the check serves JSON and Python literals alike); one pass that jumps between syntax characters."""
    if text.count("[") + text.count("{") + text.count("(") <= limit:  # never deeper than its openers
        return True
    depth, i = 0, 0
    while True:
        match = _SYNTAX.search(text, i)
        if match is None:
            return True
        i, ch = match.start(), match.group()
        if ch in "\"'":
            i = string_end(text, i + 1, ch)
            if i < 0:
                return True  # an unclosed string: nothing after it nests
            continue
        depth += 1 if ch in "[{(" else -1
        if depth > limit:
            return False
        i += 1


def bracket_end(text: str, start: int) -> int:
    """The index just after the bracket that closes the one at `start` (strings in either quote skipped), or -1
    when the text ends first or brackets nest deeper than `MAX_DEPTH`. One pass between syntax characters."""
    depth, i = 0, start
    while True:
        match = _SYNTAX.search(text, i)
        if match is None:
            return -1
        i, ch = match.start(), match.group()
        if ch in "\"'":
            i = string_end(text, i + 1, ch)
            if i < 0:
                return -1
            continue
        depth += 1 if ch in "[{(" else -1
        if depth == 0:
            return i + 1
        if depth > MAX_DEPTH:
            return -1
        i += 1


def string_end(text: str, i: int, quote: str, end: int | None = None) -> int:
    """The index just after the `quote` that closes a string whose body starts at `i` (backslash escapes skipped),
    or -1 when the text ends first. Linear: each search resumes where the last one stopped."""
    end = len(text) if end is None else end
    close = text.find(quote, i, end)
    while close >= 0:
        backslash = text.find("\\", i, close)
        if backslash < 0:
            return close + len(quote)
        i = backslash + 2
        if i > close:
            close = text.find(quote, i, end)
    return -1


_ESCAPE_SYNTAX = re.compile(r"[\"'\\\n\r\t\x00]")  # quotes, backslashes and the control characters to escape
_CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x00": "\\x00"}


def escape_raw_control_chars(text: str) -> str:
    """Escape newlines and tabs written raw inside string literals (a common model mistake, and how some templates
    render strings); text outside strings is unchanged. One pass that jumps between syntax characters."""
    out, quote, i = [], "", 0
    for match in _ESCAPE_SYNTAX.finditer(text):
        at, ch = match.start(), match.group()
        if at < i:  # the character a backslash escaped
            continue
        out.append(text[i:at])
        i = at + 1
        if ch == "\\":
            out.append(text[at:at + 2] if quote else ch)  # inside a string, the pair is kept as written
            i = at + 2 if quote else i
        elif ch in "\"'":
            quote = ch if not quote else "" if ch == quote else quote
            out.append(ch)
        else:
            out.append(_CONTROL_ESCAPES[ch] if quote else ch)
    out.append(text[i:])
    return "".join(out)


def _describe_json_error(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} at line {exc.lineno} column {exc.colno}"


def json_error(exc: ValueError) -> str:
    """What a failed JSON decode says: its error and column, or the limit it ran into (an integer over Python's
    digit limit raises a plain ValueError)."""
    return f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)[:120]


def loads_json(text: str) -> tuple[Any, str | None]:
    """Decode JSON of bounded nesting; raw newlines inside strings are repaired only when plain decoding fails, so
    valid JSON is never altered. Returns (value, None) or (None, what is wrong, to follow "... is")."""
    if not json_depth_ok(text):
        return None, f"nested too deeply (over {MAX_DEPTH} levels)"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        try:
            return json.loads(escape_raw_control_chars(text)), None
        except ValueError:
            return None, f"not valid JSON ({_describe_json_error(exc)})"
    except ValueError as exc:  # a number json cannot hold, e.g. an integer over Python's digit limit
        return None, f"not valid JSON ({exc})"
    except RecursionError:  # unreachable below MAX_DEPTH; kept so a hostile input cannot crash a step
        return None, "nested too deeply"


def loads_literal(text: str) -> tuple[Any, str | None]:
    """Decode one value written as JSON or as a Python literal (`'text'`, `True`, `[1, 2]`), of bounded nesting."""
    text = text.strip()
    if not json_depth_ok(text):
        return None, f"the value nests deeper than {MAX_DEPTH} levels"
    try:
        return json.loads(text), None
    except (ValueError, RecursionError):  # JSONDecodeError, or a number json cannot hold
        pass
    try:
        value = ast.literal_eval(_SetsAsLists().visit(ast.parse(escape_raw_control_chars(text), mode="eval")))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None, f"{text[:60]!r} is not a literal value"
    return json_value(value, text)


class _SetsAsLists(ast.NodeTransformer):
    """A set literal read as the list it writes, in its written order (as vLLM reads it)."""

    def visit_Set(self, node: ast.Set) -> ast.AST:
        self.generic_visit(node)
        return ast.copy_location(ast.List(elts=node.elts, ctx=ast.Load()), node)


def json_value(value: Any, text: str = "") -> tuple[Any, str | None]:
    """A Python literal as the JSON value a tool receives: sets and tuples as lists (as vLLM sends them); bytes,
    complex numbers and non-string keys have no JSON form and are refused. Nesting is already bounded."""
    if value is None or isinstance(value, str | bool | int | float):
        return value, None
    if isinstance(value, list | tuple | set | frozenset):
        items = []
        for item in value:
            converted, error = json_value(item, text)
            if error is not None:
                return None, error
            items.append(converted)
        return items, None
    if isinstance(value, dict):
        mapping = {}
        for key, item in value.items():
            converted, error = json_value(item, text)
            if error is not None or not isinstance(key, str):
                return None, error or f"{text[:60]!r} has a key that is not a string"
            mapping[key] = converted
        return mapping, None
    return None, f"{text[:60]!r} holds a {type(value).__name__}, which has no JSON form"


def find_blocks(text: str, start: str, end: str) -> Iterator[tuple[str, str | None, bool]]:
    """Split text at `start ... end` blocks, in one pass: yields (text before the block, the block's inside,
    closed). An opened block with no `end` holds the rest of the text (closed=False); the text after the last
    block comes last, with no block (None)."""
    position = 0
    while True:
        opened = text.find(start, position)
        if opened < 0:
            yield text[position:], None, True
            return
        inside = opened + len(start)
        closed = text.find(end, inside)
        if closed < 0:
            yield text[position:opened], text[inside:], False
            return
        yield text[position:opened], text[inside:closed], True
        position = closed + len(end)


class Finder:
    """`str.find` over one text that remembers each needle's last answer, so a parser that asks for the same
    needle again from a later position costs no rescan: the searches for one needle together scan the text once."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._last: dict[str, tuple[int, int]] = {}  # needle -> (searched from, found at or -1)

    def find(self, needle: str, position: int) -> int:
        start, found = self._last.get(needle, (-1, -1))
        if start >= 0 and start <= position and (found < 0 or found >= position):
            return found
        found = self.text.find(needle, position)
        self._last[needle] = (position, found)
        return found


def scan_blocks(text: str, start: str, end: str, read: Callable[[str], list[RawCall]]) -> Scan:
    """The calls of every `start ... end` block, each block's inside read by `read`; the text around the blocks is
    the content. A block left open at the end of the text makes the scan unfinished."""
    scan = Scan()
    for before, body, closed in find_blocks(text, start, end):
        scan.content.append(before)
        if body is None:
            break
        if not closed:
            scan.unfinished = True
            break
        scan.calls.extend(read(body))
        if len(scan.calls) > MAX_CALLS:
            break
    return scan


def value_text(value: Any) -> str:
    """A parameter's value as the XML-style templates write it: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def read_json_call(body: str, name_keys: tuple[str, ...] = ("name",),
                   argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> RawCall:
    """A call written as one JSON object with a name and its arguments (an object, or a string holding one)."""
    call, error = loads_json(body.strip())
    if error is not None:
        return RawCall(None, error=f"the tool call is {error}")
    if not isinstance(call, dict):
        return RawCall(None, error=f"the tool call must be a JSON object, not {type(call).__name__}")
    return named_arguments(call, name_keys, argument_keys)


def named_arguments(call: dict, name_keys: tuple[str, ...], argument_keys: tuple[str, ...]) -> RawCall:
    name = next((call[k] for k in name_keys if k in call), None)
    if not isinstance(name, str):
        return RawCall(None, error=f"the tool call needs a {name_keys[0]!r} string")
    arguments = next((call[k] for k in argument_keys if k in call), None)
    return RawCall(name, *arguments_object(arguments, argument_keys[0]))


def arguments_object(arguments: object, what: str = "arguments") -> tuple[dict | None, str | None]:
    """Arguments as a mapping: an object as is, a string decoded as JSON (OpenAI's wire form)."""
    for _ in range(2):  # a JSON string holding the object; twice where a template encoded a string again
        if isinstance(arguments, str):
            arguments, error = loads_json(arguments)
            if error is not None:
                return None, f"the {what} string is {error}"
    if not isinstance(arguments, dict):
        return None, f"{what!r} must be a JSON object"
    return arguments, None


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,), "null": (type(None),),
}


# Type names models' schemas use besides JSON Schema's, as vLLM's parsers read them.
_TYPE_ALIASES = {"str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
                 "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
                 "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer",
                 "float": "number", "float32": "number", "float64": "number", "double": "number",
                 "bool": "boolean", "dict": "object", "arr": "array", "list": "array", "sequence": "array"}
_JSON_TYPE_OF = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
                 type(None): "null"}
# The order in which a value written as text is tried against its parameter's types (vLLM's).
_TEXT_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")


def schema_types(schema: Any, depth: int = 0) -> list[str]:
    """The JSON Schema types a parameter's schema allows: `type` (a name or a list), the types of its `enum`
    values, and those of `anyOf`/`oneOf`/`allOf` (what Pydantic writes for `Optional[int]`); aliases such as
    `float` named as JSON Schema names them. Empty when the schema says nothing (any value)."""
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return []
    found: list[str] = []
    kind = schema.get("type")
    for name in [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []:
        if isinstance(name, str):
            found.append(_TYPE_ALIASES.get(name.strip().lower(), name.strip().lower()))
    enum = schema.get("enum")
    for value in enum if isinstance(enum, list) else []:
        found.append(_JSON_TYPE_OF.get(type(value), "string"))
    for field_name in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(field_name)
        for choice in choices if isinstance(choices, list) else []:
            found.extend(schema_types(choice, depth + 1))
    return list(dict.fromkeys(found))


def _is_type(value: Any, kinds: list[str]) -> bool:
    """Whether a decoded value has one of the JSON Schema types (a boolean is not an integer; unknown types pass)."""
    for kind in kinds:
        if kind not in _JSON_TYPES or (isinstance(value, _JSON_TYPES[kind]) and
                                       (kind == "boolean" or not isinstance(value, bool))):
            return True
    return False


def _type_name(value: Any) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _from_text(value: str, kind: str) -> tuple[Any, str | None]:
    """A value written as text, converted to the JSON Schema type `kind`."""
    stripped = value.strip()
    if kind == "integer":
        try:
            return int(stripped), None
        except ValueError:
            return None, f"{stripped[:40]!r} is not an integer"
    if kind == "number":
        try:
            number = float(stripped)
        except ValueError:
            return None, f"{stripped[:40]!r} is not a number"
        return (int(number) if number.is_integer() and "." not in stripped and "e" not in stripped.lower()
                else number), None
    if kind == "boolean":
        if stripped.lower() in ("true", "false"):
            return stripped.lower() == "true", None
        return None, f"{stripped[:40]!r} is not true or false"
    if kind == "null":
        return (None, None) if stripped.lower() == "null" else (None, f"{stripped[:40]!r} is not null")
    if kind in ("array", "object"):
        parsed, error = loads_literal(stripped)
        if error is None and isinstance(parsed, list if kind == "array" else dict):
            return parsed, None
        return None, error or f"{stripped[:40]!r} is not {'an array' if kind == 'array' else 'an object'}"
    return value, None


def type_arguments(name: str, arguments: dict[str, Any], function: dict[str, Any],
                   text_valued: bool) -> tuple[dict[str, Any] | None, str | None]:
    """Check a call's arguments against the function's JSON Schema: required parameters present, each value of its
    declared type (text values converted first, for dialects that write arguments as text). Parameters the schema
    does not declare are kept as written."""
    schema = function.get("parameters") or {}
    properties = schema.get("properties") or {}
    missing = [key for key in schema.get("required", ()) if key not in arguments]
    if missing:
        return None, f"{name} needs the parameter {missing[0]!r}"
    typed: dict[str, Any] = {}
    for key, value in arguments.items():
        kinds = schema_types(properties.get(key))
        if text_valued and isinstance(value, str) and kinds:  # tried in vLLM's order: "null" is null, not text
            errors = []
            for candidate in sorted(kinds, key=lambda k: _TEXT_PRIORITY.index(k) if k in _TEXT_PRIORITY else 6):
                converted, error = _from_text(value, candidate)
                if error is None:
                    value = converted
                    break
                errors.append(error)
            else:
                return None, f"parameter {key!r} of {name}: {errors[0]}"
        if kinds and not _is_type(value, kinds):
            return None, f"parameter {key!r} of {name} must be {' or '.join(kinds)}, not {_type_name(value)}"
        typed[key] = value
    return typed, None


class Dialect(ABC):
    """One model family's way of writing tool calls: parse them from a turn, write them as its template does.

    Class attributes say what the caller needs around the parser: `stop_strings` end a turn of calls besides the
    template's end-of-turn token (pass them to the generator); `multiple_calls` whether a turn may hold several;
    `arguments_as_string` whether the family's template expects `function.arguments` as a JSON string, not a
    mapping; `end_tokens` the family's end-of-turn tokens, which `parse` drops from the end of a turn;
    `call_blocks` the (opener, closer) of its call blocks (None: the block runs to the end of the text), inside
    which a `</think>` is the call's text, never the end of the reasoning; `think_tags` whether the family marks
    reasoning with `<think>` tags at all (harmony-style families use channels); `calls_as_text` whether the family's
    templates render a call turn's text verbatim as content, results after it, so the environment gives the turn
    back to the template as the model wrote it rather than as `tool_calls` (Qwen's hermes templates).

    For `tool_format="auto"`: `markers` are the template texts that show it writes calls this way (a template
    matches a group when it holds all of that group's strings), checked after the dialects named in
    `detect_after`, whose templates write these markers too. `aliases` are other names vLLM uses for it. A dialect's
    module ends with `TheDialect.register()`."""

    name: ClassVar[str]
    markers: ClassVar[tuple[tuple[str, ...], ...]] = ()
    detect_after: ClassVar[tuple[str, ...]] = ()
    aliases: ClassVar[tuple[str, ...]] = ()
    stop_strings: ClassVar[tuple[str, ...]] = ()
    end_tokens: ClassVar[tuple[str, ...]] = ()
    multiple_calls: ClassVar[bool] = True
    arguments_as_string: ClassVar[bool] = False
    call_blocks: ClassVar[CallBlocks] = ()
    think_tags: ClassVar[bool] = True
    calls_as_text: ClassVar[bool] = False
    whole_turn_call: ClassVar[tuple[str, ...]] = ()  # a turn that starts with one of these is all one call

    @classmethod
    def register(cls) -> None:
        """Make this dialect a `tool_format` (and `get_dialect`) name, with its aliases."""
        DIALECTS[cls.name] = cls()
        ALIASES.update(dict.fromkeys(cls.aliases, cls.name))

    def split_reasoning(self, text: str, opened: bool = False) -> tuple[str, str]:
        """(reasoning, content) of a turn (`retool_env.reasoning`): reasoning ends only at the model's own
        `</think>`, outside every call block; `opened`: the context before the turn opened a think block."""
        if not self.think_tags:
            return "", text
        if not opened and text.lstrip().startswith(self.whole_turn_call):
            return "", text
        return split_reasoning(text, opened, self.call_blocks)

    def parse(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> ParsedTurn:
        """The calls written in `text`, each typed by its tool's schema (unchecked when `tools` is None)."""
        scan = self._scan(self.strip_end(text))
        functions = tool_functions(tools)
        calls = [self._check(raw, functions, tools) for raw in scan.calls[:MAX_CALLS]]
        if len(scan.calls) > MAX_CALLS:
            calls.append(ParsedCall(None, None, f"more than {MAX_CALLS} tool calls in one turn; only the first "
                                                f"{MAX_CALLS} are read"))
        return ParsedTurn(tuple(calls), "".join(scan.content), scan.unfinished)

    def strip_end(self, text: str) -> str:
        """The turn without a trailing end-of-turn token (and the whitespace a template puts before it)."""
        for token in (*self.stop_strings, *self.end_tokens):
            stripped = text.rstrip()
            if stripped.endswith(token):
                return stripped[: -len(token)]
        return text

    def _check(self, raw: RawCall, functions: dict[str, dict[str, Any]],
               tools: Sequence[dict[str, Any]] | None) -> ParsedCall:
        if raw.error is not None:
            return ParsedCall(raw.name, None, self.fault(raw.error, tools))
        if raw.name is None or raw.arguments is None:
            return ParsedCall(raw.name, None, self.fault("the call has no function name or no arguments", tools))
        if tools is None:
            return ParsedCall(raw.name, raw.arguments)
        if raw.name not in functions:
            known = ", ".join(repr(n) for n in functions) or "none"
            shown = repr(raw.name) if len(raw.name) <= 80 else repr(raw.name[:77]) + "..."  # the model's own text
            return ParsedCall(raw.name, None, f"unknown function {shown}; the functions are: {known}.")
        typed, error = type_arguments(raw.name, raw.arguments, functions[raw.name], raw.text_valued)
        if error is not None:
            return ParsedCall(raw.name, None, self.fault(error, tools))
        return ParsedCall(raw.name, typed)

    def fault(self, what: str, tools: Sequence[dict[str, Any]] | None = None) -> str:
        """An error for the model: what was wrong, and a call written the way this dialect writes one."""
        return f"{what}. Write a {self.name} tool call like this:\n{self.call_text([example_call(tools)])}"

    @abstractmethod
    def _scan(self, text: str) -> Scan:
        """Find the call blocks of `text` and read each one's name and raw arguments."""

    @abstractmethod
    def call_text(self, calls: Sequence[FunctionCall]) -> str:
        """The calls as the model writes them (as the family's chat template renders an assistant's `tool_calls`)."""

    def tool_call_message(self, content: str | None, calls: Sequence[FunctionCall],
                          arguments_as_string: bool | None = None) -> dict[str, Any]:
        """An assistant message with `tool_calls`, shaped as a chat template reads it (`arguments_as_string`: the
        template wants `function.arguments` as a JSON string; None: as this family's original template does)."""
        as_string = self.arguments_as_string if arguments_as_string is None else arguments_as_string
        tool_calls = []
        for index, call in enumerate(calls):
            arguments = json.dumps(call.arguments, ensure_ascii=False) if as_string else call.arguments
            tool_calls.append({"type": "function", "id": f"call_{index}",
                               "function": {"name": call.name, "arguments": arguments}})
        return {"role": "assistant", "content": content, "tool_calls": tool_calls}


DIALECTS: dict[str, Dialect] = {}
"""Every dialect by its name, each put there by its own module (`Dialect.register`)."""
ALIASES: dict[str, str] = {}  # other names vLLM uses -> the dialect's name


def example_call(tools: Sequence[dict[str, Any]] | None) -> FunctionCall:
    """A call to show in an error or a prompt: the first tool, each required parameter holding a placeholder."""
    functions = list(tool_functions(tools).values())
    if not functions:
        return FunctionCall(DEFAULT_TOOL, {"code": "print(6 * 7)"})
    function = functions[0]
    schema = function.get("parameters") or {}
    properties = schema.get("properties") or {}
    required = schema.get("required") or list(properties)[:1]
    return FunctionCall(function["name"], {key: _placeholder(properties.get(key) or {}) for key in required})


def _placeholder(prop: dict[str, Any]) -> Any:
    kind = prop.get("type")
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(
        kind if isinstance(kind, str) else "", "...")
