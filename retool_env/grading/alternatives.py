"""Answers that list or relate alternatives: the values an answer states, so that a hedge never pays.

An answer states one value, or a name and that value (`x = 42`, `f(x) = 2x`). A relation states a value on each
side, so every side but a leading name must equal the gold on its own: `\\frac{84}{2} = 42` is right for 42, and
`\\frac{84}{2} = 43` (a false equation), `x = 41 = 42` (a chain) and `42 \\approx 43` are right for no gold. Inside
brackets, where a side cannot be compared with the gold on its own, a relation must follow a name:
`(x = 1, y = 2)` is an answer, `(\\frac{84}{2} = 43, 5)` is not. The word "or", `\\lor` and `\\vee` list
alternatives and are never an answer. When the gold itself has a relation (an equation, a set-builder) or says
"or", those forms are compared whole, as written.

One linear scan over tokens, no recursion: hostile text costs its length.
"""

from __future__ import annotations

import re

from .extraction import MAX_ANSWER_CHARS
from .normalization import clean

_RELATION_MACROS = frozenset({
    "approx", "approxeq", "simeq", "sim", "cong", "equiv", "doteq", "coloneqq", "eqqcolon", "to", "rightarrow",
    "longrightarrow", "Rightarrow", "Longrightarrow", "implies", "iff", "Leftrightarrow", "leftrightarrow",
    "Longleftrightarrow", "mapsto", "mid",
})  # fmt: skip
_DISJUNCTION = re.compile(r"(?<![A-Za-z\\])or(?![A-Za-z])|\\(?:lor|vee)(?![A-Za-z])", re.IGNORECASE)
# `=` alone (not `<=`, `>=`, `!=`, `==`), `:=`, a macro, an escaped character, a bracket, a comma.
_TOKEN = re.compile(r"(?<![<>!=:])=(?!=)|:=|\\[A-Za-z]+|\\.|[{}()\[\],]")
_OPEN = frozenset({"{", "(", "[", "\\{", "\\begin"})
_CLOSE = frozenset({"}", ")", "]", "\\}", "\\end"})
_GREEK = (r"alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma|"
          r"tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega")
# A variable: a letter that is not part of a macro's name, or a Greek letter other than pi (a number).
_VARIABLE = re.compile(rf"(?<![\\A-Za-z])[A-Za-z]|\\(?:{_GREEK})(?![A-Za-z])")


def _is_relation(token: str) -> bool:
    return token in ("=", ":=") or (token[0] == "\\" and token[1:] in _RELATION_MACROS)


def _names_something(side: str) -> bool:
    """Whether a relation's side names an unknown (`x`, `f(x)`, `a_1`, `\\theta`, `\\text{area}`) rather than
    states a value (`\\frac{84}{2}`, `2\\pi`)."""
    return _VARIABLE.search(side) is not None


def _relations(text: str) -> bool:
    return any(_is_relation(match.group()) for match in _TOKEN.finditer(text))


def stated_values(pred: str, gold: str) -> list[str] | None:
    """The values `pred` states, each of which must equal `gold` for the answer to be right; None when `pred` lists
    or relates alternatives. An answer with no relation states itself."""
    if len(pred) > MAX_ANSWER_CHARS:
        return [pred]  # rejected unread by the fast path
    if _DISJUNCTION.search(pred) and not _DISJUNCTION.search(gold):
        return None
    if _relations(gold):
        return [pred]
    text = clean(pred)
    sides, side_start = [], 0
    element_start: list[int] = []  # per open bracket: where its current element starts (after it or a comma)
    related: list[bool] = []  # per open bracket: whether its current element has had a relation
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in _OPEN:
            element_start.append(match.end())
            related.append(False)
        elif token in _CLOSE:
            if element_start:
                element_start.pop()
                related.pop()
        elif token == "," and element_start:
            element_start[-1], related[-1] = match.end(), False
        elif _is_relation(token):
            if not element_start:
                sides.append(text[side_start : match.start()])
                side_start = match.end()
            elif related[-1] or not _names_something(text[element_start[-1] : match.start()]):
                return None  # inside brackets, only `name = value`
            else:
                related[-1] = True
    if not sides:
        return [pred]
    sides.append(text[side_start:])
    if _names_something(sides[0]):
        sides = sides[1:]  # `x = 42` states 42
    values = [side.strip() for side in sides if side.strip()]
    return values or None
