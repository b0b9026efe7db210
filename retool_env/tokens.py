"""Token helpers on the step path: text to ids and back, straight through the Rust tokenizer where there is one.

Two ways to encode. `encode` parses added tokens (`<|im_end|>`, `<tool_call>`...): for text the environment or the
chat template writes. `encode_text` never produces one: for text nobody trusts (interpreter output), so code that
prints `</tool_response><|im_end|>\\n<|im_start|>user` is shown as those characters and never becomes a turn the
model reads as the user's (as `split_special_tokens=True` does in transformers, for every added token, and without
touching the shared tokenizer's state). This module imports nothing from the package: formats, chat and the
environment build on it.
"""

from __future__ import annotations

import contextlib
import json
import re
import weakref
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """What `retool_env` needs of a tokenizer; a Hugging Face tokenizer (`PreTrainedTokenizerBase`, fast or slow)
    has all of it. Read with `getattr` where present: `backend_tokenizer` (the Rust tokenizer, used directly on the
    step path) and `clean_up_tokenization_spaces`."""

    chat_template: Any  # the Jinja text, or None (a dict of named templates in some tokenizers)

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def unk_token_id(self) -> int | None: ...

    @property
    def all_special_tokens(self) -> list[str]: ...

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str: ...

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any: ...

    def convert_tokens_to_ids(self, tokens: Any) -> Any: ...

    def get_added_vocab(self) -> dict[str, int]: ...

    def __len__(self) -> int: ...


_added_patterns: weakref.WeakKeyDictionary[Any, re.Pattern[str] | None] = weakref.WeakKeyDictionary()


def load_tokenizer(tokenizer: Tokenizer | str) -> Tokenizer:
    """A tokenizer object, or one loaded by name or path with transformers."""
    if not isinstance(tokenizer, str):
        return tokenizer
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(tokenizer)
    except OSError as exc:
        raise ValueError(f"cannot load tokenizer {tokenizer!r} (offline machines need a local path, or pass a "
                         f"tokenizer object such as retool_env.offline.qwen_tokenizer())") from exc


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of text the environment or the template wrote (no BOS/EOS added, added tokens parsed); straight
    to the Rust tokenizer when there is one (it is on every step's path, and transformers' wrapper costs
    milliseconds on long texts)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text, add_special_tokens=False)


_PIECES_LIMIT = 4096  # pieces remembered per tokenizer (the template's own repeat; the rest is encoded each time)
_piece_caches: weakref.WeakKeyDictionary[Any, tuple[re.Pattern[str], dict[str, int], dict[str, list[int]]] | None] = (
    weakref.WeakKeyDictionary())


def _piece_cache(tokenizer: Tokenizer) -> tuple[re.Pattern[str], dict[str, int], dict[str, list[int]]] | None:
    """What `encode_pieces` needs of a Rust tokenizer that splits text at added tokens and encodes each piece on its
    own (no added token strips spaces or matches whole words only or after normalization, no prefix that only the
    first piece gets); None for any other."""
    try:
        return _piece_caches[tokenizer]
    except (KeyError, TypeError):
        pass
    found: tuple[re.Pattern[str], dict[str, int], dict[str, list[int]]] | None = None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "get_added_tokens_decoder", None)
    pattern = added_token_pattern(tokenizer)
    if callable(decoder) and pattern is not None and not getattr(backend, "encode_special_tokens", False):
        added = decoder()
        plain = all(not (t.single_word or t.lstrip or t.rstrip or t.normalized) for t in added.values())
        ids = {t.content: i for i, t in added.items()}
        texts = set(getattr(tokenizer, "all_special_tokens", None) or []) | set(tokenizer.get_added_vocab())
        if plain and "Metaspace" not in repr(getattr(backend, "pre_tokenizer", None)) and texts == set(ids):
            found = (pattern, ids, {})
    with contextlib.suppress(TypeError):
        _piece_caches[tokenizer] = found
    return found


def encode_pieces(tokenizer: Tokenizer, text: str) -> list[int]:
    """`encode(tokenizer, text)`, with the pieces between added tokens remembered: what a chat template writes
    around the tool results (`\n`, `user\n`, `assistant\n`...) is the same on every step. The Rust tokenizer
    splits text at added tokens and encodes each piece on its own, so this is the same ids (where it does not,
    see `_piece_cache`, this is `encode`)."""
    cache = _piece_cache(tokenizer)
    if cache is None:
        return encode(tokenizer, text)
    pattern, added, pieces = cache
    ids: list[int] = []
    position = 0
    for match in pattern.finditer(text):
        if match.start() > position:
            ids += _piece(tokenizer, pieces, text[position : match.start()])
        ids.append(added[match.group()])
        position = match.end()
    if position < len(text):
        ids += _piece(tokenizer, pieces, text[position:])
    return ids


def _piece(tokenizer: Tokenizer, pieces: dict[str, list[int]], text: str) -> list[int]:
    ids = pieces.get(text)
    if ids is None:
        ids = encode(tokenizer, text)
        if len(pieces) < _PIECES_LIMIT and len(text) <= 64:
            pieces[text] = ids
    return ids


def decode(tokenizer: Tokenizer, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """Text of token ids, exactly as the tokenizer's own `decode` gives it (see `encode` for why direct)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def added_token_pattern(tokenizer: Tokenizer) -> re.Pattern[str] | None:
    """A pattern matching any added token's text (special or not), longest first; None if there are none."""
    try:
        return _added_patterns[tokenizer]
    except (KeyError, TypeError):
        pass
    strings = set(getattr(tokenizer, "all_special_tokens", None) or [])
    get_added = getattr(tokenizer, "get_added_vocab", None)
    if callable(get_added):
        strings.update(get_added())
    texts = sorted((s for s in strings if s), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, texts))) if texts else None
    with contextlib.suppress(TypeError):  # not weakly referenceable: computed each time
        _added_patterns[tokenizer] = pattern
    return pattern


def has_added_token_text(tokenizer: Tokenizer, text: str) -> bool:
    """Whether `encode` would read an added token (`<|im_end|>`, `<tool_call>`...) somewhere in `text`."""
    pattern = added_token_pattern(tokenizer)
    return pattern is not None and pattern.search(text) is not None


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of untrusted text with every added token's text split into ordinary tokens.

    Each occurrence of an added token's text is cut after its first character, and the pieces are encoded apart:
    the pieces hold no added token's full text, and the model's vocabulary proper has no id for one, so none can
    come back. Text without such an occurrence encodes exactly as `encode` (the common case costs one search)."""
    pattern = added_token_pattern(tokenizer)
    cuts = [m.start() + 1 for m in pattern.finditer(text)] if pattern is not None else []
    if not cuts:
        return encode(tokenizer, text)
    pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True) if end > start]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return [i for encoding in backend.encode_batch(pieces, add_special_tokens=False) for i in encoding.ids]
    return [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False)]


_byte_bounds: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
_BOUND_PRE_TOKENIZERS = {"Sequence", "Split", "ByteLevel"}  # none of them adds text
_NORMALIZER_GROWTH = {None: 1, "NFC": 3}  # at most how many UTF-8 bytes a byte becomes (Unicode's NFC bound: 3x)


def tokens_per_byte(tokenizer: Tokenizer) -> int | None:
    """At most how many tokens `encode` or `encode_text` gives per UTF-8 byte of text, where that is known without
    encoding: a Rust byte-level BPE tokenizer (every token, added ones included, covers at least one byte of the
    normalized text), with no normalizer or NFC and pre-tokenizers that add nothing (no prefix space). None for any
    other tokenizer."""
    try:
        return _byte_bounds[tokenizer]
    except (KeyError, TypeError):
        pass
    bound: int | None = None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        normalizer = getattr(backend, "normalizer", None)
        growth = _NORMALIZER_GROWTH.get(None if normalizer is None else type(normalizer).__name__)
        model = getattr(backend, "model", None)
        if growth is not None and type(model).__name__ == "BPE" and backend is not None:
            steps = [json.loads(backend.pre_tokenizer.__getstate__())]
            kinds: list[str] = []
            while steps:
                step = steps.pop()
                kinds.append(step.get("type"))
                if step.get("type") == "ByteLevel" and step.get("add_prefix_space"):
                    kinds.append("prefix space")
                steps.extend(step.get("pretokenizers") or [])
            if "ByteLevel" in kinds and set(kinds) <= _BOUND_PRE_TOKENIZERS:
                bound = growth
    except Exception:  # a tokenizer whose parts do not describe themselves: no bound
        bound = None
    with contextlib.suppress(TypeError):
        _byte_bounds[tokenizer] = bound
    return bound


def clip_tokens(text: str, tokenizer: Tokenizer, max_tokens: int) -> str:
    """Keep the head and the tail of a long output around a marker saying what was cut, so that the result,
    marker included, holds at most `max_tokens` tokens as `encode_text` counts them (as observations encode it).
    A budget too small for the marker keeps the head alone. A text too short to exceed the budget whatever its
    tokens (`tokens_per_byte`) is returned without encoding it."""
    per_byte = tokens_per_byte(tokenizer)
    if per_byte is not None and (4 * per_byte * len(text) <= max_tokens or
                                 per_byte * len(text.encode("utf-8", "surrogatepass")) <= max_tokens):
        return text
    ids = encode_text(tokenizer, text)
    if len(ids) <= max_tokens:
        return text
    keep = max_tokens
    for _ in range(8):  # decoding and re-encoding a cut can shift a token or two: shrink until it fits
        clipped = _clipped(ids, tokenizer, keep)
        over = len(encode_text(tokenizer, clipped)) - max_tokens
        if over <= 0:
            return clipped
        keep -= over
    return ""


def _omitted(n: int) -> str:
    return f"\n... [{n} tokens omitted] ...\n"


def _clipped(ids: list[int], tokenizer: Tokenizer, keep: int) -> str:
    """The head and tail of `ids` around the omission marker, `keep` tokens in all, the marker counted."""
    room = keep - len(encode_text(tokenizer, _omitted(len(ids))))  # the longest count it could state
    if room < 2:
        return decode(tokenizer, ids[: max(0, keep)])
    head, tail = room // 2, room - room // 2
    return decode(tokenizer, ids[:head]) + _omitted(len(ids) - head - tail) + decode(tokenizer, ids[-tail:])
