"""CJK text for the full-text index: the cjk_unicode61 transform and the SQL function that computes it.

Owns: which characters are CJK letters (`CJK_CHARS`, `CJK_RUN`), the index text of a message
(every maximal CJK run re-emitted as overlapping bigrams, `cjk_index_text`), the same transform
for a query term (`cjk_query_text`), and `hermes_cjk_terms(content, tool_calls)`, the SQL function
the CJK index is fed through (`register_functions`); `fold_text`, unicode61's case and accent
folding, as the SQL function `hermes_fold` that scans of rows not indexed yet match through.
Also what the library needs to know of hermes-agent's own CJK index (an FTS5 table with the native
`cjk_unicode61` tokenizer): finding it and its triggers, loading the agent's extension into a
connection, and dropping those triggers where it cannot be loaded (`agent_cjk_objects`,
`load_agent_tokenizer`, `drop_agent_triggers`).
Does not own: the FTS tables, triggers and queue that use it (hermes_state_fts).

Transaction contract: the text functions touch no connection. The SQL functions never raise, since
they run inside triggers and searches where an exception would fail the caller's write or read; SQL
calls them through `terms_sql` and `fold_sql`, which hand them text as bytes (see
`register_functions`). `drop_agent_triggers` runs inside the caller's write transaction; the other
agent helpers only read the catalogue.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import unicodedata
from pathlib import Path

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
    """Return (phrase text, prefix) that finds `text` as a substring in `hermes_fts_cjk`.

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


def terms_sql(content: str, tool_calls: str) -> str:
    """Return SQL calling `hermes_cjk_terms` on two columns, their text passed as bytes."""
    return f"hermes_cjk_terms(CAST({content} AS BLOB), CAST({tool_calls} AS BLOB))"


def fold_sql(column: str) -> str:
    """Return SQL calling `hermes_fold` on a column, its text passed as bytes."""
    return f"hermes_fold(CAST({column} AS BLOB))"


def register_functions(conn: sqlite3.Connection) -> None:
    """Register `hermes_cjk_terms(content, tool_calls)` and `hermes_fold(text)` on this connection (read-only handles too).

    Call them through `terms_sql` and `fold_sql`. Python's sqlite3 converts a TEXT argument to
    str before the function runs, and text another program stored that is not UTF-8 (a lone
    surrogate's bytes, a stray byte in CJK) fails that conversion: the statement, a search or
    an index rebuild, fails with it. As bytes the value always arrives, and is decoded leniently.
    """
    conn.create_function("hermes_cjk_terms", 2, cjk_terms, deterministic=True)
    conn.create_function("hermes_fold", 1, fold_text, deterministic=True)


# --- hermes-agent's own CJK index, fed by its native tokenizer ----------------------------------------
#
# hermes-agent (0.20 on) may keep an FTS5 table with the tokenizer `cjk_unicode61`, which a native
# SQLite extension in its home provides, plus triggers on `messages` that feed it. Any connection
# writing a message row runs those triggers, and fails ("no such tokenizer") unless it has the
# tokenizer. The library never reads that table; it only has to keep the agent's triggers
# working, or, where it cannot, do what the agent does on a host without the extension.

AGENT_TOKENIZER = "cjk_unicode61"
# Where hermes-agent keeps the extension: `lib/` of the home that holds the database file.
AGENT_EXTENSION = ("lib", "libfts5_cjk.so")
# The agent's own flag: its index misses rows, and its `hermes sessions optimize-storage` rebuilds it.
CJK_STALE_KEY = "fts_cjk_stale"
_TOKENIZE_OPTION = re.compile(rf"""tokenize\s*=\s*['"]?\s*{AGENT_TOKENIZER}\b""", re.IGNORECASE)


def agent_extension_path(db_path: str | os.PathLike[str]) -> Path:
    """Return where hermes-agent keeps its CJK tokenizer for the database file at `db_path`."""
    return Path(os.path.abspath(db_path)).parent.joinpath(*AGENT_EXTENSION)


def agent_cjk_objects(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
    """Return (tables, triggers): the FTS5 tables that need `cjk_unicode61`, and the triggers that write them.

    Read from the catalogue only (the tables themselves are never opened); on a file without
    such a table it is one query that finds nothing.
    """
    tables = [name for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%' "
        f"AND sql LIKE '%{AGENT_TOKENIZER}%'") if _TOKENIZE_OPTION.search(sql or "")]
    if not tables:
        return [], []
    # A name between non-identifier characters: `messages_fts_cjk` is not `messages_fts_cjk_pending`.
    named = re.compile("|".join(rf"(?<![\w$]){re.escape(t)}(?![\w$])" for t in tables), re.IGNORECASE)
    triggers = [name for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND EXISTS "
        "(SELECT 1 FROM json_each(?) WHERE instr(lower(sql), lower(value)))", (json.dumps(tables),))
        if named.search(sql)]
    return tables, triggers


def _untrusted(path: Path) -> str | None:
    # A library must not run code that someone else could have put there: the file and its folder
    # must belong to this user (or root) and be writable by nobody else.
    for item in (path.parent, path):
        info = item.stat()
        if info.st_uid not in (os.getuid(), 0) or info.st_mode & 0o022:
            return f"{item} is writable by, or belongs to, another user"
    return None


def load_agent_tokenizer(conn: sqlite3.Connection, path: Path) -> str | None:
    """Load hermes-agent's tokenizer extension at `path` into `conn`; return why it could not be, or None once loaded."""
    enable = getattr(conn, "enable_load_extension", None)
    if enable is None:
        return "this Python's sqlite3 module cannot load SQLite extensions"
    try:
        reason = _untrusted(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if reason is not None:
        return reason
    enable(True)
    try:
        conn.load_extension(str(path))
    except sqlite3.Error as exc:
        return f"{path}: {exc}"
    finally:
        enable(False)  # SQL can never load anything itself
    return None


def drop_agent_triggers(conn: sqlite3.Connection, triggers: list[str]) -> None:
    """Drop the agent's CJK triggers and mark its CJK index stale, as hermes-agent does (inside the caller's write transaction)."""
    for name in triggers:
        conn.execute(f'DROP TRIGGER IF EXISTS "{name}"')
    conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, '1')", (CJK_STALE_KEY,))


def lacks_agent_tokenizer(exc: BaseException) -> bool:
    """Tell whether `exc` (or what it was raised from) is SQLite missing hermes-agent's CJK tokenizer."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return False
        if isinstance(seen, sqlite3.OperationalError) and f"no such tokenizer: {AGENT_TOKENIZER}" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
