"""The search query language: user text into terms, OR groups and the FTS5 expressions of each index.

Owns: parsing any input into terms and operators (`parse_query`), the sanitizer callers know by
its name (`_sanitize_fts5_query`), the plan a search routes (`plan_query`: OR groups of terms that
must match and terms that must not), and how terms are written for each kind of index: unicode61
words (`word_expression`), CJK bigrams (`cjk_expression`) and trigram candidates
(`trigram_expression`, `trigrams`).
Does not own: which index answers which group (the route table of hermes_state_search) or the
indexes themselves (hermes_state_fts).

Transaction contract: none; pure functions of text. No input makes anything here raise.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Union, cast

from hermes_state_cjk import CJK_CHARS, CJK_RUN, cjk_query_text, has_cjk
from hermes_state_common import strip_surrogates

MAX_QUERY_CHARS = 2048
MAX_QUERY_TERMS = 32

_CJK_LETTERS = re.compile(f"[{CJK_CHARS}\\s]+")


@dataclass(frozen=True)
class Term:
    """One search term: its text, whether the user put it in quotes, whether it is a prefix (`word*`).

    A term the user quoted (`"docker image"`) is matched as whole words, the way FTS5 matches a
    phrase; any other term is also found inside longer words. A word with inner punctuation
    (`chat-send`) is written as an FTS5 string too, but it was not quoted: it stays a piece of text.

    `cjk` (the text holds a CJK letter) and `cjk_letters` (it is CJK letters and spaces only)
    are worked out once, from the text, so routing reads them without recomputing.
    """

    text: str
    quoted: bool = False
    prefix: bool = False
    cjk: bool = field(init=False, repr=False, compare=False)
    cjk_letters: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cjk", has_cjk(self.text))
        object.__setattr__(self, "cjk_letters", _CJK_LETTERS.fullmatch(self.text) is not None)


Item = Union[Term, str]  # a str item is an operator: "AND", "OR" or "NOT"
_OPERATORS = frozenset({"AND", "OR", "NOT"})
_KEYWORDS = _OPERATORS | {"NEAR"}
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\ufeff]+")


def _strip_edges(chunk: str) -> str:
    start, end = 0, len(chunk)
    while start < end and not chunk[start].isalnum():
        start += 1
    while end > start and not chunk[end - 1].isalnum():
        end -= 1
    return chunk[start:end]


def _bare(text: str) -> bool:
    # FTS5 barewords are letters, digits and non-ASCII; anything else (-, ., /, @, ', _ ...) is
    # quoted, which makes unicode61 read it as a phrase: "chat-send" finds "chat send".
    return all(ch.isalnum() for ch in text) and text not in _KEYWORDS


def word_term(term: Term) -> str:
    """Write one term for a unicode61 index: a bareword when FTS5 reads it as one, else a phrase.

    A colon inside a phrase is written as a space: the tokenizer splits there anyway, so
    `error:timeout` finds the same rows, and no colon is left for a reader to take for a
    column filter.
    """
    if not term.quoted and _bare(term.text):
        body = term.text
    else:
        body = '"' + (" ".join(term.text.replace(":", " ").split()) if ":" in term.text else term.text) + '"'
    return body + ("*" if term.prefix else "")


def cjk_term(term: Term) -> str:
    """Write one term for the CJK bigram index: its bigram phrase, or as `word_term` when it has no CJK."""
    if not term.cjk:
        return word_term(term)
    text, prefix = cjk_query_text(term.text)
    return f'"{text}"' + ("*" if prefix or term.prefix else "")


def _render(term: Callable[[Term], str], terms: tuple[Term, ...], excluded: tuple[Term, ...]) -> str:
    # The canonical form `t1 t2 NOT x NOT y`: FTS5 reads `a NOT x b` as `a NOT (x b)`.
    return " ".join([term(t) for t in terms] + [f"NOT {term(t)}" for t in excluded])


def word_expression(terms: tuple[Term, ...], excluded: tuple[Term, ...] = ()) -> str:
    """Return the expression for a unicode61 index (words, reasoning): every term, none of `excluded`."""
    return _render(word_term, terms, excluded)


def cjk_expression(terms: tuple[Term, ...], excluded: tuple[Term, ...] = ()) -> str:
    """Return the expression for the CJK bigram index: every term, none of `excluded`."""
    return _render(cjk_term, terms, excluded)


def trigram_expression(texts: tuple[str, ...]) -> str:
    """Return the FTS5 expression for rows holding every trigram of every text (candidates only).

    Each trigram is a one-token phrase, which an index without positions can answer; whether
    the trigrams are adjacent is checked on the row afterwards.
    """
    return " AND ".join(quoted_token(gram) for gram in trigrams(texts))


def trigrams(texts: tuple[str, ...]) -> tuple[str, ...]:
    """Return every trigram of the texts, each once, in order."""
    return tuple(dict.fromkeys(text[i:i + 3] for text in texts for i in range(len(text) - 2)))


def quoted_token(token: str) -> str:
    """Return `token` as an FTS5 string (one phrase of one token)."""
    return '"' + token.replace('"', '""') + '"'


def _normalize(items: list[Item]) -> list[Item]:
    # Each run of operators between two terms becomes at most "OR" then "NOT": the last AND/OR of
    # the run says how the terms join ("a AND OR b" is "a OR b"), and the run negates the next term
    # when it ends with NOT ("a AND NOT b" is "a NOT b", "a OR NOT b" keeps both). A leading NOT
    # is kept (it excludes within what the other terms match); other operators at either end go.
    out: list[Item] = []
    run: list[str] = []
    terms = 0
    for item in items:
        if isinstance(item, str):
            run.append(item)
            continue
        if terms >= MAX_QUERY_TERMS:
            break
        joins = [op for op in run if op != "NOT"]
        if out and joins and joins[-1] == "OR":
            out.append("OR")
        if run and run[-1] == "NOT":
            out.append("NOT")
        out.append(item)
        terms += 1
        run = []
    return out


def _clean(query: str) -> str:
    return _CONTROL.sub(" ", cast(str, strip_surrogates(query[:MAX_QUERY_CHARS])))  # text in, text out


def _drop_zero_width(text: str) -> str:
    # Zero-width characters typed or pasted into a query ("東\u200b京") would split its term.
    # ZWNJ and ZWJ are kept unless next to CJK: Persian and Indic words and emoji sequences need
    # them. A run is judged by its neighbours as a whole, so that a second pass removes nothing.
    def replace(run: re.Match[str]) -> str:
        near = text[max(run.start() - 1, 0):run.start()] + text[run.end():run.end() + 1]
        return "" if CJK_RUN.search(near) else run.group().replace("\u200b", "").replace("\ufeff", "")
    return _ZERO_WIDTH.sub(replace, text)


def parse_query(query: object) -> list[Item]:
    """Parse user input into terms and operators; any input is accepted, nothing raises.

    Balanced "phrases" are kept, an unmatched quote is dropped, special characters at a word's
    edges are dropped (#123 -> 123, 50% -> 50), a word with inner punctuation becomes a phrase
    (chat-send, src/main.py, don't), `-word` and `-"a phrase"` are NOT, AND/OR at either end
    and a trailing NOT are dropped (a query of operator words only is taken literally), and a
    trailing `*` stays a prefix query. At most 32 terms and 2,048 characters.
    """
    if not isinstance(query, str):
        return []
    text = _drop_zero_width(_clean(query))
    if text.count('"') % 2:  # an unmatched quote: the last one goes
        cut = text.rfind('"')
        text = text[:cut] + " " + text[cut + 1:]
    parts = text.split('"')
    items: list[Item] = []
    symbols = False
    for index, part in enumerate(parts):
        if index % 2:
            phrase = " ".join(part.split())
            if any(ch.isalnum() for ch in phrase):
                items.append(Term(phrase, quoted=True, prefix=parts[index + 1].startswith("*")))
        else:
            negated = index + 1 < len(parts) and _negates_phrase(part, parts[index + 1])
            symbols = _add_words(items, part[:-1] if negated else part) or symbols
            if negated:
                items.append("NOT")
    items = _normalize(items if symbols else _literal_operators(items))
    while items and len(render_query(items, word_term)) > MAX_QUERY_CHARS:
        items = _normalize(items[:-1])
    return items


def _negates_phrase(before: str, phrase: str) -> bool:
    # `-"a phrase"` leaves the phrase out: a `-` alone right before the opening quote.
    return (before.endswith("-") and (len(before) == 1 or before[-2].isspace())
            and any(ch.isalnum() for ch in phrase))


def _literal_operators(items: list[Item]) -> list[Item]:
    # "AND", "OR NOT": operators with nothing to combine are the words being looked for.
    if items and all(isinstance(item, str) for item in items):
        return [Term(item) for item in items if isinstance(item, str)]  # all are, as just checked
    return items


def _add_words(items: list[Item], part: str) -> bool:
    # The operators and words of unquoted text; True when a chunk was symbols only (and dropped).
    symbols = False
    for chunk in part.split():
        if chunk in _OPERATORS:
            items.append(chunk)
            continue
        if len(chunk) > 1 and chunk[0] == "-" and chunk[1].isalnum():
            items.append("NOT")  # `-word` leaves the word out; a `-` inside a word (chat-send) is no operator
            chunk = chunk[1:]
        core = _strip_edges(chunk)
        if core:
            items.append(Term(core, prefix=chunk.endswith("*")))
        else:
            symbols = True
    return symbols


@dataclass(frozen=True)
class Group:
    """One OR branch of a query: terms that must all match and terms that must not.

    The query is an OR of such groups; `NOT x` excludes the one term x (FTS5 itself would read
    `a NOT b c` as `a NOT (b c)`, so expressions are always rendered in this canonical form).
    Which index can answer a group is the search's route table's business, not the group's.
    """

    terms: tuple[Term, ...]
    excluded: tuple[Term, ...] = ()


def _groups(items: list[Item]) -> list[Group]:
    groups: list[Group] = []
    terms: list[Term] = []
    excluded: list[Term] = []
    negate = False
    for item in [*items, "OR"]:
        if item == "OR":
            if terms or excluded:  # a group of exclusions alone: every message without them
                groups.append(Group(tuple(terms), tuple(excluded)))
            terms, excluded, negate = [], [], False
        elif item == "NOT":
            negate = True
        elif isinstance(item, Term):
            (excluded if negate else terms).append(item)
            negate = False
    return groups


def render_query(items: list[Item], term: Callable[[Term], str]) -> str:
    """Render parsed items as an FTS5 expression in canonical form, each term through `term`.

    A group of exclusions alone ("NOT x") is left out: FTS5 cannot express it (the search
    answers it by scanning).
    """
    return " OR ".join(_render(term, g.terms, g.excluded) for g in _groups(items) if g.terms)


def _sanitize_fts5_query(query: object) -> str:
    """Return an FTS5 expression for `query` that MATCH always accepts ('' when nothing is left).

    Idempotent: sanitizing its own output returns it unchanged.
    """
    return render_query(parse_query(query), word_term)


@dataclass(frozen=True)
class QueryPlan:
    """A sanitized query as OR groups; search_messages routes each group to an index."""

    groups: tuple[Group, ...]
    like_only: bool = False   # symbols only ("🎉", "%%"): no index holds them, a LIKE scan can

    @property
    def needles(self) -> list[str]:
        """The texts a hit may contain, for highlighting."""
        return [t.text for g in self.groups for t in g.terms]


def plan_query(query: object) -> QueryPlan | None:
    """Sanitize `query` into OR groups; None when nothing searchable is left.

    Text made of symbols only (emoji, `%%`) gives a LIKE-only plan of its whitespace-separated
    chunks (AND/OR/NOT honoured) instead of nothing.
    """
    groups = _groups(parse_query(query))
    if groups:
        return QueryPlan(tuple(groups))
    if not isinstance(query, str):
        return None
    chunks = _clean(query).replace('"', " ").translate({0x200B: None, 0xFEFF: None}).split()
    items: list[Item] = []
    for chunk in chunks:
        if chunk in _OPERATORS:
            items.append(chunk)
        elif len(chunk) > 1 and chunk[0] == "-":
            items += ["NOT", Term(chunk[1:])]
        else:
            items.append(Term(chunk))
    groups = _groups(_normalize(items))
    return QueryPlan(tuple(groups), like_only=True) if groups else None
