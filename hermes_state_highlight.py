"""Highlighting search hits in text: where the needles occur, and a window with every match marked.

Owns: the needle regex (case-insensitive on the original text, accents folded as the unicode61
tokenizer folds them), `first_match` (a C-speed scan, with the regex only when it must) and
`text_snippet` (a window of text around the first match, matches wrapped in >>> <<<) and
`window_snippets` (that window for many rows at once, from the first field that has a match).
Does not own: which rows or fields are highlighted, or FTS5's own snippet() (hermes_state_search).

Transaction contract: none; pure text functions.
"""
from __future__ import annotations

import re
import unicodedata
from collections import defaultdict
from typing import Any, Iterable, cast

SNIPPET_CHARS = 120  # the length of a text window

# The word index folds diacritics (unicode61), so "deja" finds "Déjà"; text windows match the
# same way: a Latin letter of a needle also matches its accented forms (and an accented one its base).
_ACCENTED: dict[str, str] = defaultdict(str)
for _ch in map(chr, range(0xC0, 0x250)):
    _base = unicodedata.normalize("NFD", _ch)[0]
    if _base != _ch and _base.isascii() and _base.isalpha():
        _ACCENTED[_base.lower()] += _ch


def _folded(needle: str) -> str:
    # Only Latin letters fold (as unicode61 does); any other character, a kana with its voicing
    # mark (デ) say, matches only itself.
    out = []
    for c in needle:
        base = unicodedata.normalize("NFD", c)[0].lower()
        out.append(f"[{re.escape(c)}{re.escape(base)}{_ACCENTED[base]}]" if base in _ACCENTED else re.escape(c))
    return "".join(out)


def needle_pattern(needles: list[str]) -> re.Pattern[str] | None:
    """Return one case- and accent-insensitive regex for all `needles` (None when there are none)."""
    # Case-insensitive on the original text: lowercasing first can change the length ("İ" -> "i̇")
    # and shift every position after it. Longest needles first, so "東京都" beats "東京".
    needles = sorted({n for n in needles if n}, key=len, reverse=True)
    return re.compile("|".join(map(_folded, needles)), re.IGNORECASE) if needles else None


def text_snippet(text: str | None, needles: list[str], chars: int = SNIPPET_CHARS) -> str:
    """Return a window of `text` around the first match with every match wrapped in >>> <<<."""
    if not text:
        return ""
    pattern = needle_pattern(needles)
    first = pattern.search(text) if pattern else None
    begin = max(0, (first.start() if first else 0) - chars // 3)
    end = min(len(text), begin + chars)
    out, pos = [], begin
    for match in pattern.finditer(text, begin, end) if pattern and first else ():
        if match.end() > match.start():
            out += [text[pos:match.start()], ">>>", match.group(), "<<<"]
            pos = match.end()
    out.append(text[pos:end])
    return ("..." if begin else "") + "".join(out) + ("..." if end < len(text) else "")


def first_match(text: str | None, needles: list[str]) -> int:
    """Return the index of the first case-insensitive occurrence of any needle in `text`, or -1."""
    if not text or not needles:
        return -1
    folded = text.lower()
    found = [i for i in (folded.find(n.lower()) for n in needles) if i >= 0] if len(folded) == len(text) else []
    if found or (text.isascii() and all(n.isascii() for n in needles)):
        return min(found, default=-1)
    # A few letters change length when lowered (positions would shift), and accents fold: the regex.
    match = cast(re.Pattern[str], needle_pattern(needles)).search(text)  # a query's needles are never all empty
    return match.start() if match else -1


# How far before the first match a window starts, and how long it is: wide enough that
# text_snippet can centre its 120 characters on the match.
WINDOW_BEFORE, WINDOW_CHARS = 2 * SNIPPET_CHARS, 4 * SNIPPET_CHARS


def window_snippets(rows: Iterable[tuple[Any, ...]], needles: list[str]) -> dict[int, str]:
    """Return {id: snippet} for rows of (id, field, ...), cut around the first match in the first field with one.

    Finding the match is a C-speed scan (`str.find`) and only a window of a few hundred
    characters is highlighted, so a hit in a 10 MB tool output costs milliseconds. A row with
    no match in any field gets a window at the start of its first field.
    """
    out = {}
    for i, first, *others in rows:
        text, at = first, first_match(first, needles)
        for other in others if at < 0 else ():
            found = first_match(other, needles)
            if found >= 0:
                text, at = other, found
                break
        if not text:
            out[i] = ""
            continue
        start = max(0, at - WINDOW_BEFORE)
        end = start + WINDOW_CHARS
        snippet = text_snippet(text[start:end], needles)
        out[i] = ("..." if start and not snippet.startswith("...") else "") + snippet + (
            "..." if end < len(text) and not snippet.endswith("...") else "")
    return out
