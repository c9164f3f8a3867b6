"""Search: `search_messages` routes each query through the ordered route table `ROUTES`.

Owns: the filters every route applies, the route table (which index serves which terms, whether
its empty answer is exact, whether rows holding a term inside a longer word must be added: CJK
index, mixed split, word index, substring index, bounded scan, in the order of docs/search.md),
ranking, `SearchResults` (a list saying whether it is exact), and what each hit of a page
carries, whatever found it: the message and session details, its snippet (FTS5 snippet() for a
word or reasoning hit, worked out on a copy of the page's rows, else a text window around the
first match) and its context rows, each fetched for the whole page in one statement.
Does not own: the query language (hermes_state_query), the FTS tables and their upkeep
(hermes_state_fts), how text is marked (hermes_state_highlight), listings and statistics
(hermes_state_listings).

Transaction contract: read-only, on the caller's connection, inside one read snapshot.
"""
from __future__ import annotations

import json
import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any, Callable, Collection, Iterable, Iterator

import hermes_state_fts as fts
import hermes_state_highlight as highlight
from hermes_state_cjk import fold_sql, fold_text, word_tokens, words_sql
from hermes_state_common import check_count, escape_like, logger
from hermes_state_sessions import filter_name, filter_names, filter_number, session_filters
from hermes_state_query import (Group, QueryPlan, Term, cjk_expression, plan_query, quoted_token, trigram_expression,
                                trigrams, word_expression, word_term)

# --- full-text search --------------------------------------------------------------
# Routing (docs/search.md): each OR branch of a query is routed on its own. A branch holding CJK
# goes to messages_fts_cjk (bigrams), any other to the word index; one that finds nothing falls
# back to its CJK terms from the index with the other terms checked by LIKE (mixed branches), the
# substring index (terms of >= 3 characters, every message's text), then a LIKE scan of the
# newest messages. Rows that an index does not cover yet (a rebuild under way, CJK rows queued by
# a writer without our SQL function) are scanned with LIKE, so they are never missing. A scan
# that had to stop before the oldest rows marks the result incomplete (SearchResults.complete).


class SearchResults(list):
    """The hits of a search (a list), and whether they are exact.

    `complete` is False only when part of the answer came from a scan that stopped before the
    oldest rows (terms too short for every index, or rows not indexed yet) and found fewer hits
    than asked: older matches may exist that it did not read.
    """

    def __init__(self, hits: Iterable[dict[str, Any]] = (), *, complete: bool = True):
        super().__init__(hits)
        self.complete = complete

RANK_WINDOW = 1000       # bm25 ranks the newest matches first; see "Ranking" in docs/search.md
FILTERED_POOL = 50       # ... and at least this many of those passing the filters
SPARE_RANKED = 20        # best rows ranked beyond the page, in case some of them are archived
LIKE_SCAN_ROWS = 20_000  # the most rows any LIKE scan reads
DIRECT_SCAN_ROWS = 500   # an id range this narrow is read row by row, not through the substring index
RARE_TRIGRAM_ROWS = 256  # a trigram in fewer rows than this narrows the substring index's candidates alone
# Trigrams of a base64 payload (an image a tool returned): a letter, '+' or '/', a letter. Prose and
# code hardly ever hold even a few of them; a payload of 0.5 MB holds all twelve (199 of 200 random
# ones did). Such a payload also holds nearly every other trigram, so it is a candidate of every
# substring lookup and would be read and checked in full each time; the lookup leaves out the rows
# holding all twelve, and nobody searches for a piece of base64. Their whole words are still found.
PAYLOAD_TRIGRAMS = ("q+z", "j/x", "x+q", "z/j", "k+q", "q/w", "v+j", "j/v", "x/z", "z+x", "w+k", "k/w")
_NOT_PAYLOAD = " NOT (" + " AND ".join(f'"{g}"' for g in PAYLOAD_TRIGRAMS) + ")"
_ASCII_TOKEN = re.compile(r"[A-Za-z0-9]+")  # what the word index (unicode61) makes a token of, in ASCII text


def whole_words(term: Term) -> bool:
    """Return True when `term` is found as whole words only: the user quoted it and it holds no CJK."""
    # CJK has no word boundaries to respect: its bigram index finds every substring either way.
    return term.quoted and not term.cjk


def in_word_phrase(text: str) -> str | None:
    """Return a word-index expression that every row holding `text` (ASCII) as a substring matches, or None.

    Inside a longer word the piece's first token may continue to the left and its last to the
    right; the tokens between are whole words, in order. So the first token is left out when the
    piece starts inside a token, the last becomes a prefix when it ends inside one, and the rest
    is a phrase the word index answers from its positions. None when too little is left.
    """
    if not text.isascii():
        return None
    tokens = _ASCII_TOKEN.findall(text)
    if text[:1].isalnum():
        tokens = tokens[1:]
    star = "*" if text[-1:].isalnum() else ""
    if not tokens or (len(tokens) == 1 and star and len(tokens[0]) < 3):
        return None
    return '"' + " ".join(tokens) + '"' + star
_MAX_ROWID = 2 ** 63 - 1
warned: set[str] = set()  # the keys of warnings this process has logged (each is logged once)


def _warn_once(key: str, message: str) -> None:
    if key not in warned:
        warned.add(key)
        logger.warning(message)


@dataclass(frozen=True)
class _Filters:
    """The WHERE conditions every route applies: `m` is the message row, `s` its session."""

    sql: str = ""
    params: tuple[Any, ...] = ()
    join: str = ""

    @classmethod
    def build(cls, source_filter: Any, exclude_sources: Any, role_filter: Any, session_id: Any,
              include_inactive: bool, since: Any = None, until: Any = None, model_filter: Any = None) -> _Filters:
        """Validate the caller's filters and return their SQL; bad ones raise SessionFilterError (a ValueError)."""
        if session_id is not None:
            filter_name("session_id", session_id)
        roles = filter_names("role_filter", role_filter)
        # The session's own filters, checked and built as every listing's are (an empty list: none passes).
        on_session, session_params = session_filters(
            "s.", sources=filter_names("source_filter", source_filter),
            exclude_sources=filter_names("exclude_sources", exclude_sources),
            models=filter_names("model_filter", model_filter), include_archived=True)
        where: list[str] = []
        params: list[Any] = []
        if not include_inactive:
            where.append("m.active = 1")
        if roles:  # an empty list of roles filters nothing, as in hermes-agent (an empty list of sources finds nothing)
            where.append(f"m.role IN ({', '.join('?' * len(roles))})")
            params.extend(roles)
        where += on_session
        params += session_params
        for op, name, value in ((">=", "since", since), ("<", "until", until)):
            if value is not None:
                where.append(f"m.timestamp {op} ?")
                params.append(filter_number(name, value))
        if session_id is not None:
            where.append("m.session_id = ?")
            params.append(session_id)
        join = " JOIN sessions s ON s.id = m.session_id" if on_session else ""
        return cls("".join(f" AND {w}" for w in where), tuple(params), join)

    @property
    def live_only(self) -> bool:
        """True when the only condition is the default one, that the row is live (active)."""
        return self.sql == " AND m.active = 1" and not self.join

    def plus(self, sql: str, params: list[Any]) -> _Filters:
        """Return these filters and one more condition on `m` (a LIKE check of terms no index serves)."""
        return replace(self, sql=f"{self.sql} AND {self.text_check(sql)}", params=(*self.params, *params))

    def text_check(self, sql: str) -> str:
        """Return `sql`, a check that reads the message's text, written so it runs after the session's conditions."""
        # SQLite checks a condition at the innermost table it names: a LIKE on `m` alone runs before
        # the session row is read, so a source filter passing one row in ten still read the text of
        # all ten (the long tool output of every candidate). Naming `s` moves the check after it.
        return f"CASE WHEN s.id IS NULL THEN 0 ELSE {sql} END" if self.join else sql


def _is_query_error(exc: sqlite3.OperationalError) -> bool:
    # The sanitizer makes these unreachable; this is the belt to its braces.
    text = str(exc)
    return text.startswith("fts5:") or "unterminated string" in text or "no such column" in text


# --- bm25's order for a lone phrase, without its count -----------------------------
# bm25 weighs each phrase by how rare it is in the whole index, and FTS5 works that out by
# walking every row that holds the phrase, all of the index, before it scores the first row: for
# a phrase of common words that walk costs as much as finding the matches themselves. When the
# branch's hits meet no other scores (one branch, one table, one phrase), that weight multiplies
# every score alike and cannot change the order, so the rows are ordered by the rest of bm25's
# formula, worked out here from what FTS5 keeps for each row: how often the phrase occurs in it
# (counted by highlight(), which reads the row's own text) and how many tokens the row holds.

_BM25_K1, _BM25_B = 1.2, 0.75  # FTS5's constants
# Past the pool, the most tokens whose rows are read to count a phrase in (about 15 ms here):
# beyond that, bm25's own count is likely the cheaper walk, and the rows are scored by bm25.
PHRASE_COUNT_TOKENS = 500_000


class _UseBm25(Exception):
    """bm25 must score these rows: they hold too much text to count the phrase in, or a row's text is missing."""


_LONE_PHRASE = re.compile(r'"([ -!#-~]*)"')  # one quoted string of printable ASCII, nothing around it


def _row_tokens(sizes: Any) -> int:
    """Return the tokens of a row from its `<index>_docsize` record; _UseBm25 when it has none that reads."""
    try:
        return sum(fts.varints(sizes))
    except (IndexError, TypeError):  # missing or cut short: bm25 reports it as FTS5 does
        raise _UseBm25 from None


@dataclass(frozen=True)
class _PhraseOrder:
    """How to score a lone phrase's rows in bm25's order without the phrase's count (see above)."""

    table: str
    columns: tuple[str, ...]
    average: float  # tokens per row over the whole table, as bm25 reads it

    def select(self) -> str:
        """Return the statement's columns after the rowid: the phrase's count in each column, then the row's sizes."""
        t = self.table
        # Each occurrence adds one byte to the highlighted text, whatever the text holds.
        counts = (f"COALESCE(length(CAST(highlight({t}, {i}, ' ', '') AS BLOB)) - length(CAST({t}.{c} AS BLOB)), 0)"
                  for i, c in enumerate(self.columns))
        return ", ".join((*counts, f"(SELECT sz FROM {t}_docsize WHERE id = {t}.rowid)"))

    def counted(self, rows: Iterable[tuple[Any, ...]], free: int) -> Iterator[tuple[Any, ...]]:
        """Yield `rows` (read with `select()`); past the first `free`, raise _UseBm25 once they hold too many tokens."""
        tokens = 0
        for n, row in enumerate(rows, 1):
            tokens += _row_tokens(row[-1])
            if n > free and tokens > PHRASE_COUNT_TOKENS:
                raise _UseBm25
            yield row

    def scored(self, rows: Iterable[tuple[Any, ...]]) -> list[tuple[int, float]]:
        """Return (rowid, score) of rows read with `select()`; lower is better, as bm25's (_UseBm25 when it cannot)."""
        k1, b, n = _BM25_K1, _BM25_B, len(self.columns)
        out = []
        for row in rows:
            freq = float(sum(row[1:1 + n]))
            if not freq:  # the index holds the phrase, but the row's text does not say so
                raise _UseBm25
            size = float(_row_tokens(row[1 + n]))
            # The same operations, in the same order, as FTS5's bm25 (less the phrase's weight).
            out.append((row[0], -((freq * (k1 + 1.0)) / (freq + k1 * (1 - b + b * size / self.average)))))
        return out


def lone_phrase_order(conn: sqlite3.Connection, table: str, expr: str) -> _PhraseOrder | None:
    """Return how to order `table`'s rows for `expr` without its count, or None when only bm25 itself can.

    Only for one quoted phrase of distinct ASCII words: two occurrences of such a phrase never
    overlap, so highlight() marks each one apart and counts them as bm25 does.
    """
    if table != fts.WORD or not (match := _LONE_PHRASE.fullmatch(expr)):
        return None
    words = [w.lower() for w in _ASCII_TOKEN.findall(match[1])]
    if len(words) < 2 or len(set(words)) < len(words):
        return None
    totals = fts.token_totals(conn, table)
    if totals is None or totals[0] <= 0:
        return None
    return _PhraseOrder(table, fts.COLUMNS[table], float(totals[1]) / float(totals[0]))


def _ranked(conn: sqlite3.Connection, table: str, expr: str, f: _Filters, low: int, high: int,
            need: int, skip_queued: bool = False, alone: bool = False) -> list[tuple[int, float]]:
    """Return up to `need` (id, bm25) of `table`'s matches passing the filters, best first.

    bm25 needs every candidate's document length, so ranking all matches of a common word costs
    a lookup per matching row. Only the newest matches are ranked (docs/search.md, "Ranking"):
    the newest `RANK_WINDOW` of them, and further back when that is needed to hold the newest
    `FILTERED_POOL` (at least `need`) of those passing the filters. Each bound is one seek from
    the end of the doclists.
    `skip_queued` leaves out rows waiting in the CJK queue: their index entry may be stale.
    `alone`: these scores meet no others, so a lone phrase may be ordered without its count.
    """
    queued = f" AND m.id NOT IN (SELECT id FROM {fts.CJK_PENDING})" if skip_queued else ""
    joined = (f"FROM {table} JOIN messages m ON m.id = {table}.rowid{f.join} "
              f"WHERE {table} MATCH ? AND {table}.rowid BETWEEN ? AND ?{f.sql}{queued}")
    pool = max(need, FILTERED_POOL)
    try:
        if not (f.live_only and not skip_queued):
            order = lone_phrase_order(conn, table, expr) if alone else None
            return sorted(_filtered_pool(conn, table, expr, joined, f, low, high, pool, order),
                          key=lambda r: (r[1], -r[0]))[:need]
        floor: int | None = None
        if _PHRASE.search(expr):
            best = _live_ranked(conn, table, expr, joined, f, low, high, need, pool)
        else:
            floor = _floor(conn, table, expr, joined, f, low, high, pool)
            best = _live_best(conn, table, expr, floor, high, need)
        if best is not None:
            return best
        if floor is None:
            floor = _floor(conn, table, expr, joined, f, low, high, pool)
        return conn.execute(f"SELECT {table}.rowid, bm25({table}) AS score {joined} "
                            f"ORDER BY score, {table}.rowid DESC LIMIT ?", (expr, floor, high, *f.params, need)).fetchall()
    except sqlite3.OperationalError as exc:
        if not _is_query_error(exc):
            raise
        logger.info("search query %r was refused by %s: %s", expr, table, exc)
        return []


# A quoted string holding more than one token: FTS5 matches it by comparing positions, row by row,
# so walking its matches costs several times a word's. The window is then read in one statement
# with the scores (one walk), where a word seeks its start first (a cheap walk, no rows to Python).
_PHRASE = re.compile(r'"[^"]*[^\w"][^"]*"')


def _window_start(conn: sqlite3.Connection, table: str, expr: str, low: int, high: int) -> int | None:
    """Return the rowid of the `RANK_WINDOW`-th newest match, or None when there are fewer matches."""
    row = conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ? AND rowid BETWEEN ? AND ? "
                       "ORDER BY rowid DESC LIMIT 1 OFFSET ?", (expr, low, high, RANK_WINDOW - 1)).fetchone()
    return None if row is None else row[0]


def _pooled(conn: sqlite3.Connection, table: str, joined: str, expr: str, f: _Filters, low: int, high: int,
            pool: int) -> int | None:
    """Return the rowid of the `pool`-th newest match passing the filters, or None when fewer pass."""
    row = conn.execute(f"SELECT {table}.rowid {joined} ORDER BY {table}.rowid DESC LIMIT 1 OFFSET ?",
                       (expr, low, high, *f.params, pool - 1)).fetchone()
    return None if row is None else row[0]


def _floor(conn: sqlite3.Connection, table: str, expr: str, joined: str, f: _Filters, low: int, high: int,
           pool: int) -> int:
    """Return where the ranking window starts: the window's oldest match, or further back to hold the pool."""
    start = _window_start(conn, table, expr, low, high)
    if start is None:
        return low  # fewer matches than the window: rank them all
    pooled = _pooled(conn, table, joined, expr, f, low, high, pool)
    return low if pooled is None else min(start, pooled)


def _filtered_pool(conn: sqlite3.Connection, table: str, expr: str, joined: str, f: _Filters, low: int, high: int,
                   pool: int, order: _PhraseOrder | None = None) -> list[tuple[int, float]]:
    """Return the window's rows passing the filters, scored, and older ones until `pool` of them (newest first).

    With `order` (a lone phrase), rows are scored by it while they hold little enough text
    (counting the phrase in more would cost more than bm25's own count); bm25 scores them otherwise.
    """
    if order is not None:
        try:
            return order.scored(_pool_rows(conn, table, expr, joined, f, low, high, pool, order))
        except _UseBm25:
            pass
    return _pool_rows(conn, table, expr, joined, f, low, high, pool)


def _pool_rows(conn: sqlite3.Connection, table: str, expr: str, joined: str, f: _Filters, low: int, high: int,
               pool: int, order: _PhraseOrder | None = None) -> list[Any]:
    """Return `_filtered_pool`'s rows: (rowid, bm25), or as `order` reads them.

    One scan, newest first, scores every passing row: a second statement would pay bm25's pass
    over each term's whole doclist again. A filter that passes few rows makes it reach further
    back than the window, never the ranking of all matches. The window's start is only sought
    once `pool` rows have passed: with fewer, every passing row is ranked whatever the window,
    and a rare phrase's matches are walked once instead of twice.
    """
    cursor = conn.execute(f"SELECT {table}.rowid, {order.select() if order else f'bm25({table})'} {joined} "
                          f"ORDER BY {table}.rowid DESC", (expr, low, high, *f.params))
    read = order.counted(cursor, pool) if order else cursor  # each row is stepped only as it is read
    try:
        rows: list[Any] = list(islice(read, pool))
        if len(rows) < pool:
            return rows
        start = _window_start(conn, table, expr, low, high)
        if start is None:
            rows += read  # fewer matches than the window: rank them all
        elif rows[-1][0] >= start:  # the pool lies inside the window: its other rows too
            # Row by row: the statement stops at the first passing row past the window's start.
            # A batch would go on past it, joining and scoring rows that are thrown away.
            for row in read:
                if row[0] < start:
                    break
                rows.append(row)
    finally:
        cursor.close()
    return rows


def _live_best(conn: sqlite3.Connection, table: str, expr: str, floor: int, high: int,
               need: int) -> list[tuple[int, float]] | None:
    """Rank the index's rows from `floor` alone and keep the live ones; None when too many of the best are archived.

    Nearly every row is live: looking up only the best rows replaces a `messages` lookup for
    every row of the window. The rows kept are a prefix of the joined ranking's order, or all of it.
    """
    best = conn.execute(f"SELECT rowid, bm25({table}) AS score FROM {table} WHERE {table} MATCH ? "
                        "AND rowid BETWEEN ? AND ? ORDER BY score, rowid DESC LIMIT ?",
                        (expr, floor, high, need + SPARE_RANKED)).fetchall()
    return _kept_live(conn, best, need)


def _kept_live(conn: sqlite3.Connection, best: list[tuple[int, float]], need: int) -> list[tuple[int, float]] | None:
    """Return the live rows of `best` (the window's best rows, best first), or None when fewer than `need` are live and others may be."""
    live = {r[0] for r in conn.execute("SELECT id FROM messages WHERE id IN (SELECT value FROM json_each(?)) "
                                       "AND active = 1", (json.dumps([r[0] for r in best]),))}
    kept = [r for r in best if r[0] in live]
    return kept[:need] if len(kept) >= need or len(best) < need + SPARE_RANKED else None


def _live_ranked(conn: sqlite3.Connection, table: str, expr: str, joined: str, f: _Filters, low: int, high: int,
                 need: int, pool: int) -> list[tuple[int, float]] | None:
    """Rank the window from the index alone and keep the live rows; None when the general path must answer.

    Nearly every row is live: looking up only the best rows replaces a `messages` lookup for
    every row of the window. One statement reads the newest `RANK_WINDOW` matches with their
    scores, so the window's start needs no seek of its own (a rare phrase's matches are walked
    once, not twice). None when the window holds fewer than `pool` live rows (it reaches further
    back) or too many of the best are archived. The rows kept are a prefix of the joined
    ranking's order, or all of it.
    """
    window = conn.execute(f"SELECT rowid, bm25({table}) FROM {table} WHERE {table} MATCH ? "
                          "AND rowid BETWEEN ? AND ? ORDER BY rowid DESC LIMIT ?",
                          (expr, low, high, RANK_WINDOW)).fetchall()
    if len(window) == RANK_WINDOW:
        pooled = _pooled(conn, table, joined, expr, f, low, high, pool)
        if pooled is None or pooled < window[-1][0]:
            return None
    return _kept_live(conn, sorted(window, key=lambda r: (r[1], -r[0]))[:need + SPARE_RANKED], need)


_CONTAINS = ("(COALESCE(m.content LIKE ? ESCAPE '\\', 0) OR COALESCE(m.tool_calls LIKE ? ESCAPE '\\', 0)"
             " OR COALESCE(m.tool_name LIKE ? ESCAPE '\\', 0))")
_IN_REASONING = ("(COALESCE(m.reasoning LIKE ? ESCAPE '\\', 0) OR COALESCE(m.reasoning_content LIKE ? ESCAPE '\\', 0))")

# The same tests for rows no index holds yet (queued), folding case and Latin accents as the word
# index does, so "deja" finds a queued "Déjà" as it finds an indexed one (instr: no LIKE pattern).
_FOLDED = {contains: "(" + " OR ".join(f"COALESCE(instr({fold_sql(f'm.{column}')}, ?), 0) > 0" for column in columns) + ")"
           for contains, columns in ((_CONTAINS, ("content", "tool_calls", "tool_name")),
                                     (_IN_REASONING, ("reasoning", "reasoning_content")))}

# Whether a row holds a quoted term as whole words, in the same columns.
_WORDS = {_CONTAINS: words_sql(("m.content", "m.tool_calls", "m.tool_name")),
          _IN_REASONING: words_sql(("m.reasoning", "m.reasoning_content"))}

# A hit while routing: (message id, bm25 score or 0.0 for a LIKE hit, (table, expression) that
# FTS5 snippet() can highlight it with, or None for a text-window snippet).
_Hit = tuple[int, float, tuple[str, str] | None]


def _like_terms(terms: tuple[Term, ...], excluded: tuple[Term, ...] = (),
                contains: str = _CONTAINS, folded: bool = False) -> tuple[str, list[str]]:
    """Return SQL true when message `m` contains every term and no excluded one (substrings; `folded`: as the index folds).

    A quoted term (`whole_words`) must be there as whole words, as the word index would find it.
    """
    parts, params = [], []
    words = _WORDS[contains]
    if folded:
        contains = _FOLDED[contains]
    for term, negated in [(t, False) for t in terms] + [(t, True) for t in excluded]:
        if not negated and whole_words(term):
            # A cheap test that every word is there, in order (LIKE, C speed), then the words
            # themselves; a row not yet indexed (folded) is read by the word test alone.
            loose = "%" + "%".join(escape_like(w) for w in word_tokens(term.text)) + "%"
            parts.append(words if folded else f"({contains} AND {words})")
            params += ([] if folded else [loose] * contains.count("?")) + [term.text + ("*" if term.prefix else "")]
            continue
        parts.append(("NOT " if negated else "") + contains)
        pattern = fold_text(term.text) or "" if folded else f"%{escape_like(term.text)}%"
        params += [pattern] * contains.count("?")
    return "(" + (" AND ".join(parts) or "1") + ")", params  # nothing to check: every row passes


def _like(conn: sqlite3.Connection, groups: tuple[Group, ...], f: _Filters, low: int, high: int, need: int,
          only_queued: bool = False, contains: str = _CONTAINS, cut: list[bool] | None = None,
          queue: str = fts.CJK_PENDING) -> list[int]:
    """Return the ids of messages in [low, high] matching any of `groups` by LIKE, newest first.

    Reads at most `LIKE_SCAN_ROWS` rows: the newest of the range, or of `queue`. When it
    stopped before the range's oldest row and found fewer than `need`, it appends True to `cut`
    (older matches may exist). A group with no terms matches every row without its exclusions.
    """
    ors, params = [], []
    for group in groups:  # queued rows are few: each one's text is folded as the index folds it
        sql, group_params = _like_terms(group.terms, group.excluded, contains, folded=only_queued)
        ors.append(sql)
        params += group_params
    condition = "(" + " OR ".join(ors) + ")"
    if only_queued:
        scope = (f" AND m.id IN (SELECT id FROM {queue} WHERE id BETWEEN ? AND ? "
                 "ORDER BY id DESC LIMIT ?)")
        scope_params: tuple = (low, high, LIKE_SCAN_ROWS)
        stopped = conn.execute(f"SELECT COUNT(*) > ? FROM {queue} WHERE id BETWEEN ? AND ?",
                               (LIKE_SCAN_ROWS, low, high)).fetchone()[0]
    else:
        newest = conn.execute("SELECT MAX(id) FROM messages WHERE id <= ?", (high,)).fetchone()[0] or 0
        stopped = newest - LIKE_SCAN_ROWS + 1 > low and conn.execute(
            "SELECT 1 FROM messages WHERE id BETWEEN ? AND ? LIMIT 1", (low, newest - LIKE_SCAN_ROWS)).fetchone()
        low = max(low, newest - LIKE_SCAN_ROWS + 1)
        scope, scope_params = "", ()
    sql = (f"SELECT m.id FROM messages m{f.join} WHERE m.id BETWEEN ? AND ?{scope}{f.sql} AND {f.text_check(condition)} "
           "ORDER BY m.id DESC LIMIT ?")
    ids = [r[0] for r in conn.execute(sql, (low, high, *scope_params, *f.params, *params, need))]
    if stopped and len(ids) < need and cut is not None:
        cut.append(True)
    return ids


@dataclass(frozen=True)
class _Ask:
    """One OR branch being routed: the branch, where to look, and how many hits are wanted."""

    conn: sqlite3.Connection
    group: Group
    filters: _Filters
    state: fts.FtsState
    low: int
    high: int
    need: int
    cut: list[bool] = field(default_factory=list)  # a scan stopped early (see SearchResults.complete)
    bare: _Filters = _Filters()  # the caller's filters alone, without the branch's exclusions
    refused: list[bool] = field(default_factory=list)  # the substring index refused the query
    alone: bool = False  # the query's only branch, and no reasoning hits: no other branch's scores meet its own

    def ranked(self, table: str, expr: str, *, snippet: bool = False,
               filters: _Filters | None = None, alone: bool = False) -> list[_Hit]:
        """Return the index's ranked hits; with `snippet`, FTS5 can highlight them from `expr`.

        `alone`: no other ranked hit meets these (see `lone_phrase_order`).
        """
        skip = table == fts.CJK and self.state.cjk_pending  # a queued row's entry may be stale
        return [(i, score, (table, expr) if snippet else None)
                for i, score in _ranked(self.conn, table, expr, filters or self.filters, self.low, self.high,
                                        self.need, skip, alone)]

    def uncovered(self, *, cjk: bool) -> list[_Hit]:
        """LIKE-scan the rows the index does not cover yet: (P, H] of a rebuild, queued CJK rows, the writer's queue."""
        found: list[int] = []
        if self.state.rebuild is not None:
            progress, high_water = self.state.rebuild
            low, high = max(self.low, progress + 1), min(self.high, high_water)
            held = None if self.state.old_upto is None else min(high, self.state.old_upto)
            if held is not None and low <= held:
                # The rows an older layout's index still holds are found there, not scanned.
                old = self._in_old_substrings(low, held)
                if old is not None:
                    found += old
                    low = held + 1
            if low <= high:
                found += _like(self.conn, (self.group,), self.filters, low, high, self.need, cut=self.cut)
        if cjk and self.state.cjk_pending:
            found += _like(self.conn, (self.group,), self.filters, self.low, self.high, self.need, only_queued=True,
                           cut=self.cut)
        if self.state.queued:  # rows another handle has not indexed yet (at most a batch)
            found += _like(self.conn, (self.group,), self.filters, self.low, self.high, self.need, only_queued=True,
                           cut=self.cut, queue=fts.PENDING)
        return [(i, 0.0, None) for i in found]

    def _in_old_substrings(self, low: int, high: int) -> list[int] | None:
        """Return the ids of rows in [low, high] holding the terms, found through an older layout's substring index.

        That index (kept while an upgrade's rebuild runs) holds every message written before the
        upgrade, as it was then; each candidate is checked for the terms on its row as it is now,
        so a row deleted or changed since is never returned for text it no longer has. None when
        it cannot answer (a term under 3 characters, a query it refuses): the caller scans instead.
        """
        terms = self.group.terms
        if not terms or any(len(t.text) < 3 for t in terms):
            return None
        contains, params = _like_terms(terms, self.group.excluded)
        f = self.filters
        try:
            rows = self.conn.execute(
                f"SELECT m.id FROM {fts.OLD_SUBSTRINGS} o JOIN messages m ON m.id = o.rowid{f.join} "
                f"WHERE {fts.OLD_SUBSTRINGS} MATCH ? AND o.rowid BETWEEN ? AND ?{f.sql} AND {f.text_check(contains)} "
                "ORDER BY o.rowid DESC LIMIT ?",
                (" ".join(quoted_token(t.text) for t in terms), low, high, *f.params, *params, self.need)).fetchall()
        except sqlite3.OperationalError as exc:
            if not _is_query_error(exc):
                raise
            return None
        return [r[0] for r in rows]

    def substrings(self, need: int | None = None, known: Iterable[int] = ()) -> list[_Hit]:
        """Return the newest `need` rows (default: all wanted) holding every term as a substring.

        The substring index gives the rows holding every trigram of the terms (no text read); the
        filters come next, then rows in `known` (hits the caller has already) are left out, and
        only the rows left are checked for the terms themselves. Rows holding a base64 payload
        (all of PAYLOAD_TRIGRAMS) are no candidates. A piece holding a whole word takes its
        candidates from the word index instead (`in_word_phrase`). A range of at most
        `DIRECT_SCAN_ROWS` ids (one session's) is checked row by row instead: reading its few
        rows costs less than seeking each trigram through every segment of the index, and finds
        the same rows.
        """
        f = self.filters
        known = sorted(known)
        words = fts.WORD in self.state.tables
        # A quoted term is whole words: with the word index it is a condition on the candidates,
        # not a piece of text to look for (without it, it is looked for as text like any term).
        exact = tuple(t for t in self.group.terms if whole_words(t)) if words else ()
        pieces = tuple(t for t in self.group.terms if t not in exact)
        texts = tuple(t.text for t in pieces)
        # LIKE per column, not instr() in the lowered concatenation the index holds: the same rows
        # (a term holds no line break, so none spans two columns; both fold ASCII letters only),
        # without building and lowering a copy of each candidate's text.
        contains, params = _like_terms(pieces, _indexed_excluded(self.group))
        grams: tuple[str, ...] = ()
        phrases = [word_term(t) for t in exact] + [p for p in map(in_word_phrase, texts) if p is not None]
        if self.high - self.low < DIRECT_SCAN_ROWS and not exact:
            key, source = "m.id", f"messages m{f.join} WHERE"
        elif phrases and words:
            # A piece with a whole word inside ("kube-proxy-7f3", a phrase): the word index's
            # positions find its candidates, where the trigrams of its common words would each
            # name most of the store. A quoted term is matched there whole.
            key, grams = "w.rowid", (" AND ".join(phrases),)
            source = f"{fts.WORD} w JOIN messages m ON m.id = w.rowid{f.join} WHERE {fts.WORD} MATCH ? AND"
        else:
            key, grams = "t.rowid", (f"({trigram_expression(self._rare_trigrams(texts))}){_NOT_PAYLOAD}",)
            source = f"{fts.TRIGRAM} t JOIN messages m ON m.id = t.rowid{f.join} WHERE {fts.TRIGRAM} MATCH ? AND"
        skip = f" AND {key} NOT IN (SELECT value FROM json_each(?))" if known else ""
        sql = (f"SELECT {key} FROM {source} {key} BETWEEN ? AND ?{f.sql}{skip} AND {f.text_check(contains)} "
               f"ORDER BY {key} DESC LIMIT ?")
        try:
            rows = self.conn.execute(sql, (*grams, self.low, self.high, *f.params,
                                           *([json.dumps(known)] if known else []), *params,
                                           self.need if need is None else need)).fetchall()
        except sqlite3.OperationalError as exc:
            if not _is_query_error(exc):
                raise
            logger.info("substring query %r was refused: %s", texts, exc)
            self.refused.append(True)
            return []
        return [(r[0], 0.0, None) for r in rows]

    def _rare_trigrams(self, texts: tuple[str, ...]) -> tuple[str, ...]:
        """Return the texts' trigrams that few rows hold (each its own text), or the texts when none is rare."""
        # The index intersects every trigram's list of rows, so a common one ("qui": half the
        # store) costs its whole list; the rare ones find the same candidates, and each row is
        # checked for the terms themselves anyway. A probe reads at most RARE_TRIGRAM_ROWS ids.
        grams = trigrams(texts)
        if len(grams) < 3:
            return texts
        probe = f"SELECT COUNT(*) FROM (SELECT 1 FROM {fts.TRIGRAM} WHERE {fts.TRIGRAM} MATCH ? LIMIT ?)"
        rare: tuple[str, ...] = ()
        try:
            for g in grams:
                held = self.conn.execute(probe, (quoted_token(g), RARE_TRIGRAM_ROWS)).fetchone()[0]
                if held == 0:
                    return (g,)  # no row holds it, so none holds the terms: the rest need no probe
                if held < RARE_TRIGRAM_ROWS:
                    rare += (g,)
        except sqlite3.OperationalError as exc:
            if not _is_query_error(exc):
                raise
            return texts  # the query itself reports what the index refuses
        return rare or texts

    def has(self, table: str) -> bool:
        """Return True when the database has this FTS table."""
        return table in self.state.tables


# --- the route table: what each index can do ----------------------------------------------------

def _indexed_excluded(g: Group) -> tuple[Term, ...]:
    """Excluded terms an index checks (`NOT x` in its expression): those without CJK."""
    return tuple(t for t in g.excluded if not t.cjk)


def _cjk_route(a: _Ask) -> list[_Hit]:
    # Bigrams stand for CJK letters only: a term holding anything else ("100%完成", "Agent通信")
    # must also be in the row literally, or "100完成" would answer "100%完成".
    loose = tuple(t for t in a.group.terms if not t.cjk_letters)
    filters = a.filters.plus(*_like_terms(loose)) if loose else None
    return a.ranked(fts.CJK, cjk_expression(a.group.terms, _indexed_excluded(a.group)),
                    filters=filters) + a.uncovered(cjk=True)


def _mixed_route(a: _Ask) -> list[_Hit]:
    # A branch mixing CJK and other terms that the CJK index cannot serve whole ("東京 ockerfil",
    # "web_search 検索"): the CJK terms from the index, the others checked on those rows as
    # substrings of content, tool_calls and tool_name.
    cjk = tuple(t for t in a.group.terms if t.cjk)
    others = tuple(t for t in a.group.terms if not t.cjk)
    return a.ranked(fts.CJK, cjk_expression(cjk, _indexed_excluded(a.group)),
                    filters=a.filters.plus(*_like_terms(others)))


def _word_route(a: _Ask) -> list[_Hit]:
    # Latin glued to CJK ("iPhone16を") is one unicode61 token in the word index; the CJK index,
    # which splits it, holds every message that has CJK, so it is asked too.
    expr = word_expression(a.group.terms, _indexed_excluded(a.group))
    cjk = a.ranked(fts.CJK, expr) if a.has(fts.CJK) else []
    return a.ranked(fts.WORD, expr, snippet=True, alone=a.alone and not cjk) + cjk + a.uncovered(cjk=True)


def _substring_route(a: _Ask) -> list[_Hit]:
    # Newest first, after every ranked hit (score 0.0); the window snippet highlights the piece.
    return a.substrings() + a.uncovered(cjk=True)


def _scan_route(a: _Ask) -> list[_Hit]:
    if not a.state.tables:
        _warn_once("fts", "full-text search: no FTS index in this database; searching the newest "
                          f"{LIKE_SCAN_ROWS} messages with LIKE")
    logger.debug("search %r: last resort LIKE scan", [t.text for t in a.group.terms])
    return [(i, 0.0, None) for i in _like(a.conn, (a.group,), a.filters, a.low, a.high, a.need, cut=a.cut)]


def _never(g: Group) -> bool:
    return False


@dataclass(frozen=True)
class _Route:
    """One way to answer a branch, with what its index can do.

    It applies when its index exists and `serves` the branch's terms. Its hits end the routing
    when it finds some, or always when `exact` says its empty answer is the answer. A route
    with `whole_words` finds terms as whole words (or CJK bigrams), so rows holding a term only
    inside a longer word are added from the substring index.
    """

    name: str
    index: str | None                  # the FTS table it reads; None: it needs none
    serves: Callable[[Group], bool]
    run: Callable[[_Ask], list[_Hit]]
    exact: Callable[[Group], bool] = _never
    whole_words: bool = False

    def applies(self, a: _Ask) -> bool:
        """Return True when this route can answer the branch on this database."""
        return (self.index is None or self.index in a.state.tables) and self.serves(a.group)


# The trigram index finds a piece by its trigrams: it serves terms of at least 3 characters. It
# holds every row (those it does not cover yet are scanned by `uncovered`), so when it accepted
# the query its empty answer is the answer: an absent word reads no text beyond its candidates.
SUBSTRING_ROUTE = _Route("substring index", fts.TRIGRAM, lambda g: all(len(t.text) >= 3 for t in g.terms),
                         _substring_route, exact=lambda g: True)
# For terms of CJK letters only the bigram index is exact: its bigrams are exact substrings.
CJK_ROUTE = _Route("cjk index", fts.CJK, lambda g: any(t.cjk for t in g.terms), _cjk_route,
                   exact=lambda g: all(t.cjk_letters for t in g.terms), whole_words=True)

# The routing order of docs/search.md: each branch takes the first route that applies and
# finds something; the bounded scan always applies and always answers, so routing always ends.
ROUTES: tuple[_Route, ...] = (
    CJK_ROUTE,
    _Route("mixed split", fts.CJK, lambda g: any(t.cjk for t in g.terms) and not all(t.cjk for t in g.terms),
           _mixed_route, whole_words=True),
    _Route("word index", fts.WORD, lambda g: not any(t.cjk for t in g.terms), _word_route, whole_words=True),
    SUBSTRING_ROUTE,
    _Route("bounded scan", None, lambda g: True, _scan_route, exact=lambda g: True),
)


def _answer(routes: tuple[_Route, ...], ask: _Ask, bare: _Ask | None = None) -> tuple[_Route, list[_Hit]]:
    """Return the first route of `routes` that applies and answers, with its hits (the last one always does).

    `bare` is the branch without its exclusions: when a route finds rows for it, the route
    answers even if the exclusions left nothing, so `a -b` never finds a row that `a` would not.
    """
    for route in routes:
        if route.applies(ask):
            before = len(ask.refused)
            found = route.run(ask)
            answered = route.exact(ask.group) and len(ask.refused) == before  # a refusal is no answer
            if found or answered or (bare is not None and route.run(replace(bare, need=1))):
                return route, found
    raise AssertionError("a route table ends with a route that always applies and answers")


def _excluding(f: _Filters, g: Group, reasoning: bool) -> _Filters:
    """Return `f` and: the message holds none of the branch's excluded terms, as substrings of its text.

    An index's `NOT x` leaves out rows with the word x; this leaves out rows with x anywhere
    (inside a longer word, in a CJK run, in rows not indexed yet), as a term is found anywhere.
    With `reasoning` the models' reasoning must not hold them either.
    """
    if not g.excluded:
        return f
    f = f.plus(*_like_terms((), g.excluded))
    return f.plus(*_like_terms((), g.excluded, _IN_REASONING)) if reasoning else f


def _find_group(ask: _Ask) -> list[_Hit]:
    """Route one OR branch of the query through ROUTES; return its hits in any order."""
    g = ask.group
    if not g.terms:  # "NOT docker" alone: the newest messages without it
        return [(i, 0.0, None) for i in _like(ask.conn, (g,), ask.filters, ask.low, ask.high, ask.need, cut=ask.cut)]
    bare = replace(ask, group=Group(g.terms), filters=ask.bare, cut=[]) if g.excluded else None
    if CJK_ROUTE.serves(g) and not ask.has(fts.CJK):
        _warn_once("cjk", "full-text search: the CJK index is missing, so CJK queries use the trigram index "
                          "(3+ characters) or a bounded LIKE scan; open the database writable to build it")
    route, found = _answer(ROUTES, ask, bare)
    if (route.whole_words and SUBSTRING_ROUTE.applies(ask) and not CJK_ROUTE.exact(g)
            and not all(whole_words(t) for t in g.terms)):
        # Whole words rank first; every other row holding a term inside a longer word follows,
        # newest first, so a piece seen anywhere is found even when some row has it as a word.
        # A quoted term is whole words only, so a branch of quoted terms alone adds nothing.
        # Those rows (score 0.0) sort after every ranked hit, so once k ranked rows are found the
        # page has room for need - k of them at most: the pass asks for that many rows outside
        # the k, and is skipped when the ranked rows fill the page.
        ranked = {i for i, score, _ in found if score < 0.0}
        if len(ranked) < ask.need:
            found += ask.substrings(ask.need - len(ranked), ranked)
    return found


def _reasoning_like(a: _Ask, low: int, high: int) -> list[_Hit]:
    return [(i, 0.0, None) for i in _like(a.conn, (a.group,), a.filters, low, high, a.need,
                                          contains=_IN_REASONING, cut=a.cut)]


def _reasoning_index_route(a: _Ask) -> list[_Hit]:
    found = a.ranked(fts.REASONING, word_expression(a.group.terms, _indexed_excluded(a.group)), snippet=True)
    if a.state.rebuild is not None:  # rows of (P, H] wait for the rebuild
        low, high = max(a.low, a.state.rebuild[0] + 1), min(a.high, a.state.rebuild[1])
        found += _reasoning_like(a, low, high) if low <= high else []
    if a.state.queued:  # rows another handle has not indexed yet
        found += [(i, 0.0, None) for i in _like(a.conn, (a.group,), a.filters, a.low, a.high, a.need, only_queued=True,
                                                contains=_IN_REASONING, cut=a.cut, queue=fts.PENDING)]
    return found


# With include_reasoning, each branch is also looked up in the reasoning text. Its one index holds
# unicode61 words (a bigram index over long reasoning was judged not worth its size), so a branch
# with a CJK term, or a file without that index, takes the bounded scan of the reasoning fields.
REASONING_ROUTES: tuple[_Route, ...] = (
    _Route("reasoning index", fts.REASONING, lambda g: not any(t.cjk for t in g.terms), _reasoning_index_route,
           exact=lambda g: True),
    _Route("reasoning scan", None, lambda g: True, lambda a: _reasoning_like(a, a.low, a.high), exact=lambda g: True),
)


def _reasoning_hits(a: _Ask) -> list[_Hit]:
    """Return a branch's hits in reasoning text, from the first of REASONING_ROUTES that applies."""
    return _answer(REASONING_ROUTES, a)[1] if a.group.terms else []  # exclusions alone: the content scan has them


def _find(conn: sqlite3.Connection, plan: QueryPlan, f: _Filters, low: int, high: int,
          need: int, include_reasoning: bool = False,
          cut: list[bool] | None = None) -> list[tuple[int, tuple[str, str] | None]]:
    """Route every OR branch on its own and merge: (id, snippet source) hits, best first, maybe repeated.

    bm25 scores of different indexes and expressions are merged as if comparable (docs/search.md,
    "Ranking"); LIKE and substring hits score 0.0, after every ranked hit. A scan that stopped
    early appends True to `cut`.
    """
    cut = [] if cut is None else cut
    found: list[tuple[int, float, tuple[str, str] | None]]
    if plan.like_only:  # every group's exclusions are in its own LIKE condition
        found = [(i, 0.0, None) for i in _like(conn, plan.groups, f, low, high, need, cut=cut)]
        if include_reasoning:
            found += [(i, 0.0, None) for i in _like(conn, plan.groups, f, low, high, need, contains=_IN_REASONING,
                                                    cut=cut)]
    else:
        state = fts.cached_state(conn)  # the catalogue is re-read only after a schema change
        alone = len(plan.groups) == 1 and not include_reasoning
        asks = [_Ask(conn, group, _excluding(f, group, include_reasoning), state, low, high, need, cut, f,
                     alone=alone) for group in plan.groups]
        found = [hit for ask in asks for hit in _find_group(ask)]
        if include_reasoning:
            found += [hit for ask in asks for hit in _reasoning_hits(ask)]
    return [(i, source) for i, _, source in sorted(found, key=lambda h: (h[1], -h[0]))]


def search_messages(conn: sqlite3.Connection, query: Any, source_filter: Any = None, exclude_sources: Any = None,
                    role_filter: Any = None, session_id: str | None = None, limit: int = 20, offset: int = 0,
                    include_inactive: bool = False, include_reasoning: bool = False, *, since: float | None = None,
                    until: float | None = None, model_filter: Any = None, sort: str | None = None,
                    fields: Collection[str] | None = None) -> SearchResults:
    """Search message text, best match first; any query text is accepted (None finds nothing), a non-string raises TypeError.

    Each hit: id, session_id, role, timestamp, tool_name, snippet (matches in >>> <<<), context
    (previous message, the hit, next message of the session, content cut to 200 characters), source, model,
    session_started, title (the session's). Active rows only unless `include_inactive`; the
    reasoning text is searched too with `include_reasoning`. `since`/`until` (epoch seconds)
    bound the messages' time; `model_filter` keeps sessions of these models (exact names). Bad limit/offset or filter
    types raise ValueError. `sort` "newest"/"oldest" orders the hits by message time instead
    (best match first among equal times); `fields` keeps only these keys of each hit. The result
    is a SearchResults list whose `complete` says whether it is exact (see there). Run it in one
    read snapshot (the facade does).
    """
    if query is not None and not isinstance(query, str):  # None finds nothing, as in hermes-agent
        raise TypeError(f"query must be a string, not {type(query).__name__}")
    keep = _result_fields(fields)
    order = _sort_order(sort)
    limit, offset = check_count("limit", limit), check_count("offset", offset)
    f = _Filters.build(source_filter, exclude_sources, role_filter, session_id, include_inactive, since, until,
                       model_filter)
    plan = plan_query(query)
    if plan is None or limit == 0:
        return SearchResults()
    low, high = 0, _MAX_ROWID
    if session_id is not None:
        # A session's rows sit in a narrow id range; the FTS seek is bounded to it.
        low, high = conn.execute("SELECT MIN(id), MAX(id) FROM messages WHERE session_id = ?",
                                 (session_id,)).fetchone()
        if low is None:
            return SearchResults()
    # Each message once, at its best rank; if any index that found it can highlight it (an FTS5
    # snippet), that one does: a text window compares text literally and would miss "Déjà" for "deja".
    unique: dict[int, tuple[str, str] | None] = {}
    cut: list[bool] = []
    need = SORTED_POOL if order else offset + limit
    for i, source in _find(conn, plan, f, low, high, need, bool(include_reasoning), cut):
        if unique.get(i) is None:
            unique[i] = source
    page = _ordered(conn, list(unique.items()), order, cut)[offset:offset + limit]
    found = present(conn, plan.needles, page, with_context=keep is None or "context" in keep) if page else []
    return SearchResults(_projected(found, keep), complete=not cut)


# --- hermes-agent 0.20.1's result projection and time order -------------------------------------
# The keys of a hit a caller may keep with `fields`; the context is only read when it is kept.
RESULT_FIELDS = frozenset({"id", "session_id", "role", "timestamp", "tool_name", "snippet", "context", "source",
                           "model", "session_started", "title"})
SORTED_POOL = 10_000  # the most matches put in time order; beyond it the result says it is not complete


def _result_fields(fields: Any) -> frozenset[str] | None:
    # TypeError and ValueError as hermes-agent 0.20.1 raises them, so a caller's handler fits both.
    if fields is None:
        return None
    if isinstance(fields, (str, bytes)):
        raise TypeError("search fields must be a collection of field names, not a string")
    if not isinstance(fields, Iterable):
        raise TypeError(f"search fields must be a collection of field names, not {type(fields).__name__}")
    names = list(fields)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"search fields must be strings, not {names!r}")
    unknown = set(names) - RESULT_FIELDS
    if unknown:
        raise ValueError(f"unknown search result field(s): {', '.join(sorted(unknown))}")
    return frozenset(names)


def _sort_order(sort: Any) -> str | None:
    if sort is None or sort == "relevance":
        return None
    if sort not in ("newest", "oldest"):
        raise ValueError(f"sort must be None, 'relevance', 'newest' or 'oldest', not {sort!r}")
    return str(sort)


def _ordered(conn: sqlite3.Connection, hits: list[tuple[int, Any]], order: str | None,
             cut: list[bool]) -> list[tuple[int, Any]]:
    """Return `hits` (best match first) in the asked order; appends True to `cut` when the pool was full."""
    if order is None:
        return hits
    if len(hits) >= SORTED_POOL:
        cut.append(True)  # more matches than were put in time order: others may be newer (older)
    return _by_time(conn, hits, newest=order == "newest")


def _projected(found: list[dict[str, Any]], keep: frozenset[str] | None) -> list[dict[str, Any]]:
    return found if keep is None else [{k: hit[k] for k in hit if k in keep} for hit in found]


def _by_time(conn: sqlite3.Connection, hits: list[tuple[int, Any]], *, newest: bool) -> list[tuple[int, Any]]:
    """Return `hits` (best match first) ordered by message time, the better match first among equal times."""
    times = dict(conn.execute("SELECT id, timestamp FROM messages WHERE id IN (SELECT value FROM json_each(?))",
                              (json.dumps([i for i, _ in hits]),)))
    sign = -1 if newest else 1
    ranked = [(sign * float(times.get(i) or 0.0), n, (i, source)) for n, (i, source) in enumerate(hits)]
    return [hit for _, _, hit in sorted(ranked, key=lambda r: (r[0], r[1]))]


# --- a page of search hits: details, snippet, context ---------------------------------------------

_CONTEXT_CHARS = 200
_SNIPPET_ARGS = "'>>>', '<<<', '...', 16"
# Longer rows get a snippet cut from a window around the first match: snippet() tokenizes the whole
# row (the copy's insert, then snippet() itself), which on a page of tool output cost more than
# finding the hits did.
_FTS_SNIPPET_MAX_CHARS = 4_000

def _snippets(conn: sqlite3.Connection, needles: list[str],
              hits: list[tuple[int, tuple[str, str] | None]]) -> dict[int, str]:
    """Return {id: snippet}: FTS5 snippet() for word/reasoning hits, a text window for the others."""
    out: dict[int, str] = {}
    by_source: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, source in hits:
        if source is not None:
            by_source[source].append(i)
    declared = bool(by_source) and fts.cached_state(conn).declared
    for (table, expr), ids in by_source.items():  # one statement per index and OR branch, not per hit
        # FTS5's snippet() re-tokenizes the whole row for every phrase match, so its cost grows
        # with the square of a long row's size; long rows take the text-window path below.
        columns = fts.COLUMNS.get(table)
        if declared and columns:
            # The index is the declared one (default tokenizer): a copy of the rows gives the same
            # snippets without a seek through every segment of the index per hit (highlight.fts_snippets).
            out.update(highlight.fts_snippets(conn.execute(
                f"SELECT rowid, {', '.join(columns)} FROM {table} WHERE rowid IN (SELECT value FROM json_each(?)) "
                f"AND {' + '.join(f'COALESCE(length({c}), 0)' for c in columns)} <= ?",
                (json.dumps(ids), _FTS_SNIPPET_MAX_CHARS)).fetchall(), expr, len(columns)))
            continue
        column = 0 if table == fts.TRIGRAM else -1
        sizes = ("reasoning", "reasoning_content") if table == fts.REASONING else ("content", "tool_calls", "tool_name")
        out.update(conn.execute(
            f"SELECT rowid, snippet({table}, {column}, {_SNIPPET_ARGS}) FROM {table} "
            f"WHERE {table} MATCH ? AND rowid IN (SELECT id FROM messages WHERE id IN (SELECT value FROM json_each(?)) "
            f"AND {' + '.join(f'COALESCE(length({c}), 0)' for c in sizes)} <= ?)",
            (expr, json.dumps(ids), _FTS_SNIPPET_MAX_CHARS)))
    rest = [i for i, _ in hits if ">>>" not in (out.get(i) or "")]
    if rest:
        out.update(_window_snippets(conn, rest, needles))
    return out


def _window_snippets(conn: sqlite3.Connection, ids: list[int], needles: list[str]) -> dict[int, str]:
    """Return {id: snippet} cut from a window around the first match of content (else tool_calls, reasoning)."""
    return highlight.window_snippets(conn.execute(
        "SELECT id, content, tool_calls, reasoning_content, reasoning FROM messages "
        "WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),)), needles)


# Previous message, the hit itself and next message of the same session and generation (active
# or archived), for every hit in one statement; `+active` keeps the planner on the (session_id,
# id) index.
_CONTEXT_SQL = f"""
SELECT h.id, h.id, h.role, substr(h.content, 1, {_CONTEXT_CHARS})
  FROM messages h WHERE h.id IN (SELECT value FROM json_each(:batch))
UNION ALL
SELECT h.id, c.id, c.role, substr(c.content, 1, {_CONTEXT_CHARS})
  FROM messages h JOIN messages c ON c.id = (
       SELECT p.id FROM messages p WHERE p.session_id = h.session_id AND p.id < h.id AND +p.active IS h.active
        ORDER BY p.id DESC LIMIT 1)
 WHERE h.id IN (SELECT value FROM json_each(:batch))
UNION ALL
SELECT h.id, c.id, c.role, substr(c.content, 1, {_CONTEXT_CHARS})
  FROM messages h JOIN messages c ON c.id = (
       SELECT n.id FROM messages n WHERE n.session_id = h.session_id AND n.id > h.id AND +n.active IS h.active
        ORDER BY n.id LIMIT 1)
 WHERE h.id IN (SELECT value FROM json_each(:batch))"""


def present(conn: sqlite3.Connection, needles: list[str],
            hits: list[tuple[int, tuple[str, str] | None]], *, with_context: bool = True) -> list[dict[str, Any]]:
    """Return the result dicts of a page of hits, in its order: (id, (index, expression) or None) each.

    The second item names the FTS5 index and expression that can give the hit's snippet; without
    one the snippet is a text window around the first of `needles`. A hit whose row is gone is
    left out. A fixed number of statements for the whole page; without `with_context` each hit's
    context is left empty, unread.
    """
    batch = json.dumps([i for i, _ in hits])
    rows = {r[0]: r for r in conn.execute(
        "SELECT m.id, m.session_id, m.role, m.timestamp, m.tool_name, s.source, s.model, s.started_at, s.title "
        "FROM messages m LEFT JOIN sessions s ON s.id = m.session_id "
        "WHERE m.id IN (SELECT value FROM json_each(?))", (batch,))}
    snippets = _snippets(conn, needles, hits)
    context: dict[int, list[dict[str, Any]]] = defaultdict(list)
    rows_around = conn.execute(_CONTEXT_SQL, {"batch": batch}) if with_context else []
    for hit, cid, role, content in sorted(rows_around, key=lambda r: (r[0], r[1])):
        context[hit].append({"id": cid, "role": role, "content": content})
    out = []
    for hit, _ in hits:
        row = rows.get(hit)
        if row is None:
            continue
        out.append({"id": row[0], "session_id": row[1], "role": row[2], "timestamp": row[3], "tool_name": row[4],
                    "snippet": snippets.get(hit, ""), "context": context.get(hit, []),
                    "source": row[5], "model": row[6], "session_started": row[7], "title": row[8]})
    return out
