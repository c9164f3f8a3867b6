"""CJK text for the full-text index: the cjk_unicode61 transform and the SQL function that computes it.

Owns: which characters are CJK letters (`CJK_CHARS`, `CJK_RUN`), the index text of a message
(every maximal CJK run re-emitted as overlapping bigrams, `cjk_index_text`), the same transform
for a query term (`cjk_query_text`), and `hermes_cjk_terms(content, tool_calls)`, the SQL function
the CJK index is fed through (`register_functions`); `fold_text`, unicode61's case and accent
folding, as the SQL function `hermes_fold` that scans of rows not indexed yet match through, and
`holds_words`, whether text holds a quoted term as whole words (the SQL function `hermes_words`).
Does not own: the FTS tables, triggers and queue that use it (hermes_state_fts).

Transaction contract: none; pure text functions. The SQL functions never raise, since they run
inside triggers and searches where an exception would fail the caller's write or read; SQL calls
them through `terms_sql`, `fold_sql` and `words_sql`, which hand them text as bytes (see
`register_functions`).
"""
from __future__ import annotations

import functools
import re
import sqlite3
import unicodedata

from hermes_state_common import LENIENT_TEXT, logger

# Letters and numbers of the CJK scripts (Han, kana, Hangul, Bopomofo, their extensions and the
# halfwidth forms). Punctuation such as 、。「」・ is left out on purpose: it separates words.
CJK_CHARS = ("\u1100-\u11ff\u3005-\u3007\u3021-\u3029\u3031-\u3035\u303b\u303c\u3041-\u3096"
             "\u309d-\u309f\u30a1-\u30fa\u30fc-\u30ff\u3105-\u312f\u3131-\u318e\u31a0-\u31bf"
             "\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97c\uac00-\ud7a3\ud7b0-\ud7fb"
             "\uf900-\ufaff\uff66-\uff9f\uffa0-\uffdc\U0001b000-\U0001b16f\U00020000-\U0003134f")
CJK_RUN = re.compile(f"[{CJK_CHARS}]+")


def has_cjk(text: str | None) -> bool:
    """Tell whether `text` holds at least one CJK letter."""
    return bool(text and not text.isascii() and CJK_RUN.search(text) is not None)


def _run_terms(run: str, last_unigram: bool = True) -> list[str]:
    # Overlapping bigrams, then the run's last character alone, so that every character of
    # the run starts some token: a one-character query is then a prefix query (`東*`).
    if len(run) == 1:
        return [run]
    terms = [run[i:i + 2] for i in range(len(run) - 1)]
    return terms + [run[-1]] if last_unigram else terms


def cjk_index_text(text: str) -> str:
    """Return `text` with every maximal CJK run re-emitted as space-separated bigrams (cjk_unicode61).

    "iPhone16を買った" -> "iPhone16 を買 買っ った た": Latin stays for unicode61 to tokenize, a
    run of n > 1 characters becomes its n-1 bigrams plus its last character, a lone character stays.
    """
    pieces, pos = [], 0
    for match in CJK_RUN.finditer(text):
        pieces.append(text[pos:match.start()].strip())
        pieces.extend(_run_terms(match.group()))
        pos = match.end()
    pieces.append(text[pos:].strip())
    return " ".join(filter(None, pieces))  # the non-empty pieces


def cjk_query_text(text: str) -> tuple[str, bool]:
    """Return (phrase text, prefix) that finds `text` as a substring in `messages_fts_cjk`.

    Same transform as the index, except at the end of the term: a final run keeps its bigrams
    only (the document may continue the run), and a final lone character becomes a prefix.
    """
    runs = list(CJK_RUN.finditer(text))
    pieces, pos, prefix = [], 0, False
    for index, match in enumerate(runs):
        pieces.append(text[pos:match.start()])
        run = match.group()
        at_end = index == len(runs) - 1 and not any(ch.isalnum() for ch in text[match.end():])
        pieces.extend(_run_terms(run, last_unigram=not at_end))
        prefix = at_end and len(run) == 1
        pos = match.end()
    pieces.append(text[pos:])
    return " ".join(" ".join(p for p in pieces if p).split()), prefix


def _as_text(value: object) -> str:
    # Bytes are stored text (the SQL passes it as bytes): decoded as a listing shows it.
    if isinstance(value, bytes):
        return LENIENT_TEXT(value)
    return value if isinstance(value, str) else str(value)


def cjk_terms(content: object, tool_calls: object = None) -> str | None:
    """Return the CJK index text of a message, or None when it holds no CJK (the SQL function).

    Text may come as bytes (decoded leniently, as a listing shows it). Never raises: it runs
    inside triggers, where an exception would fail the user's write.
    """
    try:
        values = [v for v in (content, tool_calls) if v is not None]
        if all(isinstance(v, bytes) and v.isascii() for v in values):
            return None  # the common case, at C speed: ASCII holds no CJK
        texts = [_as_text(v) for v in values]
        if not any(has_cjk(t) for t in texts):
            return None
        return "\n".join(cjk_index_text(t) for t in texts)
    except Exception:  # noqa: BLE001 - see docstring
        logger.exception("hermes_cjk_terms failed; the row is left out of the CJK index")
        return None


# Each accented Latin letter and its base letter, as the word index's unicode61 folds them ("Déjà"
# is found by "deja"); one str.translate, C speed, so a scan of many queued rows stays cheap.
_UNACCENTED = {ord(c): base for c in map(chr, range(0xC0, 0x250))
               if (base := unicodedata.normalize("NFD", c)[0]) != c and base.isascii() and base.isalpha()}


def fold_text(value: object) -> str | None:
    """Return `value` as text with case and Latin accents folded as the word index folds them (None for NULL).

    Text may come as bytes (decoded leniently, as a listing shows it).
    """
    if value is None:
        return None
    text = _as_text(value)
    return text.lower() if text.isascii() else text.translate(_UNACCENTED).lower()


# The word index's tokens: runs of letters and digits (unicode61 splits at anything else, `_` too).
_TOKEN = re.compile(r"[^\W_]+")


def word_tokens(text: str) -> list[str]:
    """Return the words of `text` as the word index splits them (runs of letters and digits), unfolded."""
    return _TOKEN.findall(text)


@functools.lru_cache(maxsize=64)
def _words_pattern(term: str) -> re.Pattern[str] | None:
    # `term` is the quoted text, with a trailing "*" when its last word is a prefix. Its words,
    # folded, in order, with anything but letters and digits between them, and no letter or
    # digit right before the first or right after the last (unless it is a prefix).
    prefix = term.endswith("*")
    words = word_tokens(fold_text(term.rstrip("*")) or "")
    if not words:
        return None
    body = r"[\W_]+".join(map(re.escape, words))
    return re.compile(r"(?<![^\W_])" + body + ("" if prefix else r"(?![^\W_])"))


def holds_words(term: object, *values: object) -> int:
    """Return 1 when a value holds `term`'s words next to each other as the word index reads them, else 0.

    `term` is a quoted term's text, ending in `*` when its last word is a prefix. Never raises
    (a search runs it): a value it cannot read does not hold the words.
    """
    try:
        pattern = _words_pattern(_as_text(term)) if term is not None else None
        if pattern is None:
            return 0
        return int(any(v is not None and pattern.search(fold_text(v) or "") is not None for v in values))
    except Exception:  # noqa: BLE001 - see docstring
        logger.exception("hermes_words failed; the row is taken not to hold the words")
        return 0


def words_sql(columns: tuple[str, ...]) -> str:
    """Return SQL calling `hermes_words` with a term (a `?`) and columns, their text passed as bytes."""
    return "hermes_words(?, " + ", ".join(f"CAST({c} AS BLOB)" for c in columns) + ")"


def terms_sql(content: str, tool_calls: str) -> str:
    """Return SQL calling `hermes_cjk_terms` on two columns, their text passed as bytes."""
    return f"hermes_cjk_terms(CAST({content} AS BLOB), CAST({tool_calls} AS BLOB))"


def fold_sql(column: str) -> str:
    """Return SQL calling `hermes_fold` on a column, its text passed as bytes."""
    return f"hermes_fold(CAST({column} AS BLOB))"


def register_functions(conn: sqlite3.Connection) -> None:
    """Register `hermes_cjk_terms`, `hermes_fold` and `hermes_words` on this connection (read-only handles too).

    Call them through `terms_sql`, `fold_sql` and `words_sql`. Python's sqlite3 converts a TEXT argument to
    str before the function runs, and text another program stored that is not UTF-8 (a lone
    surrogate's bytes, a stray byte in CJK) fails that conversion: the statement, a search or
    an index rebuild, fails with it. As bytes the value always arrives, and is decoded leniently.
    """
    conn.create_function("hermes_cjk_terms", 2, cjk_terms, deterministic=True)
    conn.create_function("hermes_fold", 1, fold_text, deterministic=True)
    conn.create_function("hermes_words", -1, holds_words, deterministic=True)
