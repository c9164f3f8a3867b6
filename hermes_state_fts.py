"""Full-text indexes over messages: the FTS5 tables, their triggers, rebuild markers and upkeep.

Owns: `messages_fts` (unicode61 words of content, tool_name, tool_calls), `messages_fts_trigram`
(substrings of every message's content, tool name and tool calls), `messages_fts_reasoning` (words of reasoning text),
`messages_fts_cjk` (CJK runs as bigrams, from hermes_state_cjk) with its queue `messages_fts_cjk_pending`,
the triggers that keep them in sync (all declared here as SQL, in `OBJECTS`, with the layouts
an open converts in place and the TEMP trigger that feeds the CJK index), the rebuild markers
`fts_rebuild_high_water`/`fts_rebuild_progress`, the chunked resumable rebuild, the writer's queue
batch (`index_batch`, and `flush_queue`, a closing handle indexing what it left queued), the periodic merge,
the bounded merge after a rebuild, reading each index's FTS5 structure record (`Structure`: how many
levels deep it is, rebuilt when too deep), and `FtsState` (what exists and what is pending; `cached_state` keeps it per connection for searches).
Does not own: the query language (hermes_state_query), running searches (hermes_state_search) or
writing message rows (hermes_state_messages).

Transaction contract: functions taking a connection run inside the caller's write transaction (or
read under its lock) and never commit. `ensure_fts`, `run_pending`, `rebuild` and `flush_queue` take
the Writer and open their own short write transactions, one per chunk. `upkeep` runs after a COMMIT and never raises.
Persistent triggers use plain SQL only, so a sqlite3 shell can read and write (DELETE too) the file;
the CJK terms come from a Python function that only this library's connections register.
See docs/search.md for the design and its trade-offs.
"""
from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from hermes_state_cjk import register_functions, terms_sql
from hermes_state_common import FTS_MERGE_EVERY_N_WRITES, FTS_OPTIMIZE_EVERY_N_WRITES, FTS_REBUILD_CHUNK_ROWS, logger
from hermes_state_schema import Connection
from hermes_state_writer import RetryPolicy, Writer
from hermes_state_errors import StateDbIncompatibleError

# --- the full-text objects' declarations: FTS5 tables, source views, queues and triggers, as SQL --
# What a current file holds (OBJECTS, as sqlite_master stores it), the layout one release older that
# open converts in place, the rebuild and queue gates the triggers apply, and the per-connection TEMP
# trigger that feeds the CJK index. No connection is touched here.

WORD, TRIGRAM, CJK = "messages_fts", "messages_fts_trigram", "messages_fts_cjk"
REASONING = "messages_fts_reasoning"
CJK_PENDING = "messages_fts_cjk_pending"
FTS_TABLES = (WORD, TRIGRAM, CJK, REASONING)
# The indexed columns of the word and reasoning indexes, in their declared order.
COLUMNS = {WORD: ("content", "tool_name", "tool_calls"), REASONING: ("reasoning",)}
HIGH_WATER, PROGRESS = "fts_rebuild_high_water", "fts_rebuild_progress"
# Set by the rebuild's last chunk: a rebuild leaves each index in dozens of segments, which every
# search seeks one by one, so they are merged afterwards a bounded step at a time.
MERGE_PENDING = "fts_merge_after_rebuild"
# An older layout's substring index (hermes-agent's trigram table), kept under this name while the
# upgrade's rebuild runs: searches find the rows not rebuilt yet through it instead of a bounded
# scan. It holds the messages up to the id under OLD_SUBSTRINGS_UPTO in state_meta.
OLD_SUBSTRINGS, OLD_SUBSTRINGS_UPTO = "hermes_old_substrings", "fts_old_substrings_upto"
# Rows a library handle appended and will index itself, in batches (`index_batch`).
PENDING = "messages_fts_pending"
# FTS5 options every index keeps in its config table (`<index>_config`, which sqlite_master does not
# show): open writes them into a file that lacks them, and every program writing the file follows
# them, since FTS5 reads them from the file.
FTS_OPTIONS: tuple[tuple[str, int], ...] = (("automerge", 8),)


# --- the declared FTS objects ----------------------------------------------------------------------

def rebuild_gate(row_id: str) -> str:
    # A row is indexed by the triggers iff no rebuild is under way, or it is at or below
    # the progress marker (already rebuilt), or above the high-water mark (newer than the
    # rebuild). Rows in (P, H] are left to the rebuild, so none is indexed twice or missed.
    return (f"(NOT EXISTS (SELECT 1 FROM state_meta WHERE key = '{HIGH_WATER}')"
            f" OR {row_id} > (SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = '{HIGH_WATER}')"
            f" OR {row_id} <= (SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = '{PROGRESS}'))")


def _wide(row: str) -> str:
    # Non-ASCII text (fewer characters than bytes) may hold CJK. Plain SQL, so it runs in any shell.
    return (f"(length({row}.content) < length(CAST({row}.content AS BLOB))"
            f" OR length({row}.tool_calls) < length(CAST({row}.tool_calls AS BLOB)))")


def reasoning_text(row: str) -> str:
    """Return SQL for `row`'s reasoning text: reasoning and reasoning_content usually hold the same text, indexed once."""
    return (f"CASE WHEN {row}.reasoning_content IS NULL OR {row}.reasoning_content IS {row}.reasoning "
            f"THEN {row}.reasoning WHEN {row}.reasoning IS NULL THEN {row}.reasoning_content "
            f"ELSE {row}.reasoning_content || char(10) || {row}.reasoning END")


def reasons(row: str) -> str:
    """Return SQL true when `row` has reasoning text."""
    return f"({row}.reasoning <> '' OR {row}.reasoning_content <> '')"


def searchable_text(row: str) -> str:
    """Return SQL for the text a substring search looks in: content, tool name, tool calls of `row`.

    Every role, tool output included; newlines keep a match from spanning two fields.
    """
    return (f"COALESCE({row}.content, '') || char(10) || COALESCE({row}.tool_name, '') || char(10) "
            f"|| COALESCE({row}.tool_calls, '')")


CJK_TABLE_SQL = f"CREATE VIRTUAL TABLE {CJK} USING fts5(terms)"

def _unqueued(row_id: str) -> str:
    # A row in the writer's queue is not in the word, substring or reasoning index yet: the library
    # handle that wrote it indexes it with others in one batch. Plain SQL, so every writer obeys it.
    return f"NOT EXISTS (SELECT 1 FROM {PENDING} WHERE id = {row_id})"


def indexed(row_id: str) -> str:
    """Return SQL true when row `row_id` belongs in the word, substring and reasoning indexes now.

    Not while it waits in the writer's queue or in the range a rebuild under way has still to
    index. The indexes' content sources hold exactly these rows, so FTS5's own `rebuild` and
    `integrity-check`, run by any program, agree with what the library indexed.
    """
    return f"{rebuild_gate(row_id)} AND {_unqueued(row_id)}"


def _tables(gated: bool) -> tuple[tuple[str, str, str], ...]:
    """Return the declared tables and source views; without `gated`, the layout whose sources held every row."""
    where = f" WHERE {indexed('messages.id')}" if gated else ""
    also = f" AND {indexed('messages.id')}" if gated else ""
    word_source = (("view", "messages_fts_source",
                    "CREATE VIEW messages_fts_source AS SELECT id, content, tool_name, tool_calls FROM messages"
                    f"{where}"),) if gated else ()
    return (
    *word_source,
    ("table", WORD, f"CREATE VIRTUAL TABLE {WORD} USING fts5({', '.join(COLUMNS[WORD])}, "
                    f"content='{'messages_fts_source' if gated else 'messages'}', content_rowid='id')"),
    # Substrings of every message's text: trigrams with detail=none store which rows hold each
    # trigram but no positions, about half the size of a position-full index over less text.
    # Nothing ranks these hits, so no per-row token counts are kept either (columnsize=0).
    ("view", "messages_fts_trigram_source",
     f"CREATE VIEW messages_fts_trigram_source AS SELECT id, {searchable_text('messages')} AS content FROM messages"
     f"{where}"),
    # The column is called `content`, as in hermes-agent's own substring table, so that program's
    # searches of this table run; it answers one-trigram queries from here and scans for longer ones.
    ("table", TRIGRAM, f"CREATE VIRTUAL TABLE {TRIGRAM} USING fts5(content, content='messages_fts_trigram_source', "
                       "content_rowid='id', tokenize='trigram', detail='none', columnsize=0)"),
    ("table", CJK, CJK_TABLE_SQL),
    ("view", "messages_fts_reasoning_source",
     f"CREATE VIEW messages_fts_reasoning_source AS SELECT id, {reasoning_text('messages')} AS reasoning "
     f"FROM messages WHERE {reasons('messages')}{also}"),
    ("table", REASONING, f"CREATE VIRTUAL TABLE {REASONING} USING fts5(reasoning, "
                         "content='messages_fts_reasoning_source', content_rowid='id')"),
    ("table", CJK_PENDING, f"CREATE TABLE {CJK_PENDING} (id INTEGER PRIMARY KEY)"),
    )


def _triggers(queued: bool) -> tuple[tuple[str, str, str], ...]:
    """Return the declared triggers; without `queued`, the layout before the writer's queue existed."""
    def gate(row_id: str) -> str:  # the rebuild gate, and the queue's when the queue exists
        return indexed(row_id) if queued else rebuild_gate(row_id)
    return (
    # The six trigger names below are the ones hermes-agent creates with IF NOT EXISTS and
    # counts at every start: finding all six, it creates none of its own and rebuilds nothing,
    # and its writes are indexed by these (plain SQL, so they run in any program).
    ("trigger", "messages_fts_insert",
     f"CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages WHEN {gate('new.id')} BEGIN "
     f"INSERT INTO {WORD}(rowid, content, tool_name, tool_calls) "
     f"VALUES (new.id, new.content, new.tool_name, new.tool_calls); "
     f"INSERT INTO {REASONING}(rowid, reasoning) SELECT new.id, {reasoning_text('new')} WHERE {reasons('new')}; "
     "END"),
    ("trigger", "messages_fts_trigram_insert",
     f"CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages WHEN {gate('new.id')} BEGIN "
     f"INSERT INTO {TRIGRAM}(rowid, content) VALUES (new.id, {searchable_text('new')}); "
     "END"),
    ("trigger", "messages_fts_delete",
     f"CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages WHEN {gate('old.id')} BEGIN "
     f"INSERT INTO {WORD}({WORD}, rowid, content, tool_name, tool_calls) "
     f"VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls); "
     f"INSERT INTO {REASONING}({REASONING}, rowid, reasoning) SELECT 'delete', old.id, {reasoning_text('old')} "
     f"WHERE {reasons('old')}; "
     "END"),
    ("trigger", "messages_fts_trigram_delete",
     f"CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages WHEN {gate('old.id')} BEGIN "
     f"INSERT INTO {TRIGRAM}({TRIGRAM}, rowid, content) VALUES ('delete', old.id, {searchable_text('old')}); "
     "END"),
    ("trigger", "messages_fts_update",
     "CREATE TRIGGER messages_fts_update AFTER UPDATE OF id, role, content, tool_name, tool_calls ON messages "
     "BEGIN "
     f"INSERT INTO {WORD}({WORD}, rowid, content, tool_name, tool_calls) "
     f"SELECT 'delete', old.id, old.content, old.tool_name, old.tool_calls WHERE {gate('old.id')}; "
     f"INSERT INTO {WORD}(rowid, content, tool_name, tool_calls) "
     f"SELECT new.id, new.content, new.tool_name, new.tool_calls WHERE {gate('new.id')}; "
     "END"),
    ("trigger", "messages_fts_trigram_update",
     "CREATE TRIGGER messages_fts_trigram_update AFTER UPDATE OF id, role, content, tool_name, tool_calls ON messages "
     "BEGIN "
     f"INSERT INTO {TRIGRAM}({TRIGRAM}, rowid, content) SELECT 'delete', old.id, {searchable_text('old')} "
     f"WHERE {gate('old.id')}; "
     f"INSERT INTO {TRIGRAM}(rowid, content) SELECT new.id, {searchable_text('new')} WHERE {gate('new.id')}; "
     "END"),
    ("trigger", "messages_fts_reasoning_update",
     "CREATE TRIGGER messages_fts_reasoning_update AFTER UPDATE OF id, reasoning, reasoning_content ON messages "
     f"BEGIN INSERT INTO {REASONING}({REASONING}, rowid, reasoning) SELECT 'delete', old.id, {reasoning_text('old')} "
     f"WHERE {reasons('old')} AND {gate('old.id')}; "
     f"INSERT INTO {REASONING}(rowid, reasoning) SELECT new.id, {reasoning_text('new')} "
     f"WHERE {reasons('new')} AND {gate('new.id')}; END"),
    # The CJK index cannot be fed by persistent triggers (they would need our function, and a
    # plain shell has none), so persistent triggers only queue possibly-CJK rows; this library's
    # connections drain the queue at once through a TEMP trigger, other writers leave it for the
    # next open. Deleted and updated rows are queued too, so their stale terms are removed.
    ("trigger", "messages_fts_cjk_insert",
     f"CREATE TRIGGER messages_fts_cjk_insert AFTER INSERT ON messages WHEN {_wide('new')} BEGIN "
     f"INSERT OR REPLACE INTO {CJK_PENDING}(id) VALUES (new.id); "
     "END"),
    ("trigger", "messages_fts_cjk_delete",
     f"CREATE TRIGGER messages_fts_cjk_delete AFTER DELETE ON messages WHEN {_wide('old')} BEGIN "
     f"INSERT OR REPLACE INTO {CJK_PENDING}(id) VALUES (old.id); "
     "END"),
    ("trigger", "messages_fts_cjk_update",
     "CREATE TRIGGER messages_fts_cjk_update AFTER UPDATE OF id, content, tool_calls ON messages "
     f"WHEN {_wide('old')} OR {_wide('new')} BEGIN "
     f"INSERT OR REPLACE INTO {CJK_PENDING}(id) SELECT old.id WHERE old.id IS NOT new.id; "
     f"INSERT OR REPLACE INTO {CJK_PENDING}(id) VALUES (new.id); "
     "END"),
    )


_QUEUE = ("table", PENDING, f"CREATE TABLE {PENDING} (id INTEGER PRIMARY KEY)")
OBJECTS = (*_tables(True), _QUEUE, *_triggers(True))
# Older layouts whose indexes hold exactly what the declared layout's would: open converts them in
# place, with no rebuild. One release older, the content sources held every row (queued ones too);
# two releases older, there was no writer's queue and the triggers had no queue gate.
UNGATED_OBJECTS = (*_tables(False), _QUEUE, *_triggers(True))
UNQUEUED_OBJECTS = (*_tables(False), *_triggers(False))
CONVERTIBLE_LAYOUTS = (UNGATED_OBJECTS, UNQUEUED_OBJECTS)
# Every object a release of this schema version made: what a file to restore may carry.
OWN_OBJECTS = frozenset(obj for layout in (OBJECTS, *CONVERTIBLE_LAYOUTS) for obj in layout)
OBJECT_NAMES = frozenset(name for _, name, _ in OBJECTS)

# Per writable connection, created at open (temp schema only: no lock on the file). REPLACE
# re-fires it for a queued id. A row in the writer's queue is left for its batch.
DRAIN_TRIGGER_SQL = (
    f"CREATE TEMP TRIGGER IF NOT EXISTS hermes_fts_cjk_drain AFTER INSERT ON {CJK_PENDING} "
    f"WHEN NOT EXISTS (SELECT 1 FROM main.{PENDING} WHERE id = new.id) BEGIN "
    f"DELETE FROM {CJK} WHERE rowid = new.id; "
    f"INSERT INTO {CJK}(rowid, terms) SELECT id, t FROM "
    f"(SELECT id, {terms_sql('content', 'tool_calls')} AS t FROM messages WHERE id = new.id) "
    "WHERE t IS NOT NULL; "
    f"DELETE FROM {CJK_PENDING} WHERE id = new.id; "
    "END")


# --- the declarations as scripts, under hermes-agent's names -----------------------------------------

def _script(objects: tuple[tuple[str, str, str], ...]) -> str:
    # Each statement as sqlite_master stores it, made idempotent, so the script runs on any file.
    return "".join(re.sub(r"^CREATE (VIRTUAL TABLE|TABLE|VIEW|TRIGGER) ", r"CREATE \1 IF NOT EXISTS ", sql) + ";\n"
                   for _, _, sql in objects)


# The full-text objects except the substring index (word, reasoning and CJK indexes, their
# queues and triggers), and the substring index alone. Run after SCHEMA_SQL.
FTS_SQL = _script(tuple(o for o in OBJECTS if "trigram" not in o[1]))
FTS_TRIGRAM_SQL = _script(tuple(o for o in OBJECTS if "trigram" in o[1]))


# The upkeep cadences' defaults (hermes_state_common says why each is what it is), by their names here.
MERGE_EVERY_N_WRITES = FTS_MERGE_EVERY_N_WRITES
OPTIMIZE_EVERY_N_WRITES = FTS_OPTIMIZE_EVERY_N_WRITES
MERGE_PAGES = 200            # bounded work per merge: a few milliseconds, never a full optimize
REBUILD_CHUNK_ROWS = FTS_REBUILD_CHUNK_ROWS
CJK_BATCH_ROWS = 2000        # queued CJK rows (another program's) one batch indexes at most
# A library thread's pause between two of its write transactions: longer than the longest sleep of
# SQLite's busy handler (100 ms), so a writer waiting on the lock always tries once in the gap.
BACKGROUND_PAUSE_S = 0.12
# And after a transaction that held the lock longer than that, a pause as long as it held it: other
# writers then have the lock at least half of the time, however long one of its steps takes.
BACKGROUND_DUTY = 1.0


def _normalized(sql: str | None) -> str:
    return " ".join((sql or "").split())


@dataclass(frozen=True)
class FtsState:
    """What the catalogue and the markers say about the FTS objects (no data table is read)."""

    declared: bool                    # every object present exactly as declared, nothing foreign
    tables: frozenset[str]            # which of the FTS tables exist at all
    rebuild: tuple[int, int] | None   # (progress, high water) while a rebuild is under way
    cjk_pending: bool                 # rows wait in the CJK queue
    queued: bool = False              # rows wait in the writer's queue (not in the word, substring, reasoning indexes)
    merging: bool = False             # a finished rebuild's segments wait to be merged (read by `inspect` only)
    old_upto: int | None = None       # an older layout's substring index holds the rows up to this id

    @property
    def work_pending(self) -> bool:
        return self.rebuild is not None or self.cjk_pending or self.queued or self.merging


@dataclass(frozen=True)
class _Catalogue:
    """The half of FtsState that only a schema change can change."""

    declared: bool
    tables: frozenset[str]
    queue: bool                       # the CJK queue table exists
    convertible: bool = False         # exactly an older layout that open converts in place
    pending: bool = False             # the writer's queue table exists
    old_substrings: bool = False      # an older layout's substring index is kept for the rebuild (OLD_SUBSTRINGS)


def _read_catalogue(conn: sqlite3.Connection) -> _Catalogue:
    found: dict[str, str] = {}
    foreign = False
    for kind, name, table, sql in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE type IN ('table', 'view', 'trigger') "
            "AND (name LIKE 'messages\\_fts%' ESCAPE '\\' OR (type = 'trigger' AND tbl_name = 'messages') "
            f"OR name = '{OLD_SUBSTRINGS}')"):
        if name in OBJECT_NAMES or name == OLD_SUBSTRINGS:
            found[name] = _normalized(sql)
        elif kind == "trigger" and "messages_fts" in (sql or ""):
            foreign = True  # an older layout's trigger writing our tables would double-index rows
    declared = not foreign and all(found.get(name) == _normalized(sql) for _, name, sql in OBJECTS)
    convertible = not declared and not foreign and any(
        all(found.get(name) == _normalized(sql) for _, name, sql in layout) for layout in CONVERTIBLE_LAYOUTS)
    return _Catalogue(declared, frozenset(t for t in FTS_TABLES if t in found), CJK_PENDING in found, convertible,
                      PENDING in found, OLD_SUBSTRINGS in found)


def _rebuild_range(high_water: str | None, progress: str | None) -> tuple[int, int] | None:
    return None if high_water is None else (int(progress or 0), int(high_water))


def _markers(conn: sqlite3.Connection) -> tuple[int, int] | None:
    values = dict(conn.execute("SELECT key, value FROM state_meta WHERE key IN (?, ?)", (HIGH_WATER, PROGRESS)))
    return _rebuild_range(values.get(HIGH_WATER), values.get(PROGRESS))


def _live_sql(catalogue: _Catalogue, version: bool = False) -> str:
    # The markers and whether the queue has rows: two key lookups and one probe, one statement.
    queued = f"EXISTS (SELECT 1 FROM {CJK_PENDING})" if catalogue.queue else "0"
    pending = f"EXISTS (SELECT 1 FROM {PENDING})" if catalogue.pending else "0"
    head = "schema_version, " if version else ""
    # Only a file that kept an older substring index reads its bound: no cost for any other.
    old = f", (SELECT value FROM state_meta WHERE key = '{OLD_SUBSTRINGS_UPTO}')" if catalogue.old_substrings else ""
    return (f"SELECT {head}(SELECT value FROM state_meta WHERE key = '{HIGH_WATER}'), "
            f"(SELECT value FROM state_meta WHERE key = '{PROGRESS}'), {queued}, {pending}{old}"
            + (" FROM pragma_schema_version" if version else ""))


def _state(catalogue: _Catalogue, high_water: str | None, progress: str | None, queued: int,
           pending: int = 0, old_upto: str | None = None) -> FtsState:
    return FtsState(catalogue.declared, catalogue.tables, _rebuild_range(high_water, progress), bool(queued),
                    bool(pending), old_upto=None if old_upto is None else int(old_upto))


def inspect(conn: sqlite3.Connection) -> FtsState:
    """Read the FTS objects, markers and queue state afresh from the catalogue; never scans messages."""
    catalogue = _read_catalogue(conn)
    state = _state(catalogue, *conn.execute(_live_sql(catalogue)).fetchone())
    if conn.execute("SELECT 1 FROM state_meta WHERE key = ?", (MERGE_PENDING,)).fetchone() is None:
        return state
    return replace(state, merging=True)


# A search takes the catalogue half of FtsState from a cache on the connection (see
# schema.Connection), checked against the schema cookie (PRAGMA schema_version, which every CREATE
# and DROP by any connection bumps) in the statement that reads the live half: one statement per
# search instead of a catalogue scan.

def cached_state(conn: sqlite3.Connection) -> FtsState:
    """Return what `inspect` returns, reading the catalogue again only when the schema has changed.

    The markers and the queue are read on every call; the objects are re-read after any schema
    change (a rebuild, another process dropping or creating an index). Read-only; one statement
    when nothing in the schema changed since this connection's last call. A connection the
    library did not open keeps no cache: its catalogue is read on every call.
    """
    if not isinstance(conn, Connection):
        catalogue = _read_catalogue(conn)
        return _state(catalogue, *conn.execute(_live_sql(catalogue)).fetchone())
    entry = conn.fts_catalogue
    if entry is not None:
        try:
            version, *live = conn.execute(_live_sql(entry[1], version=True)).fetchone()
        except sqlite3.OperationalError:
            version = None  # the queue table is gone: another program dropped it since the last read
        if version == entry[0]:
            return _state(entry[1], *live)  # pyright: ignore[reportPossiblyUnboundVariable]  # set when the versions match
    # The cookie is read before the catalogue: a change in between only makes the next call re-read.
    version = conn.execute("PRAGMA schema_version").fetchone()[0]
    catalogue = _read_catalogue(conn)
    # One attribute store, atomic as it is: a search on another thread reads the old pair or the new one.
    conn.fts_catalogue = (version, catalogue)
    return _state(catalogue, *conn.execute(_live_sql(catalogue)).fetchone())


# --- creating, rebuilding, catching up ------------------------------------------------------------

def fts5_available(conn: sqlite3.Connection) -> bool:
    """Tell whether this SQLite has FTS5 with the trigram tokenizer (3.34+)."""
    if sqlite3.sqlite_version_info < (3, 34, 0):
        return False
    try:
        conn.execute("SELECT fts5_source_id()").fetchone()
    except sqlite3.OperationalError:
        return False
    return True


def drop_fts_objects(conn: sqlite3.Connection,
                     retire: Callable[[sqlite3.Connection, str, str], bool] | None = None) -> None:
    """Drop every FTS object, this layout's and an older layout's (tables, views, triggers on messages).

    Must run inside the caller's write transaction. `create_fts` builds them again; an upgrade
    calls this before any back-fill so no old trigger re-indexes rows one by one. Each table is
    first offered to `retire(conn, name, sql)`, which returns True when it has removed the table
    itself (an upgrade moves the pages of a large old index aside instead of freeing them all now).
    """
    rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE type IN ('trigger', 'view', 'table') "
                        "AND (name IN (SELECT value FROM json_each(?)) OR (type = 'trigger' AND tbl_name = 'messages' "
                        "AND sql LIKE '%messages_fts%'))", (json.dumps(sorted(OBJECT_NAMES)),)).fetchall()
    order = {"trigger": 0, "view": 1, "table": 2}  # triggers first: they name the tables
    for kind, name, sql in sorted(rows, key=lambda r: order[r[0]]):
        if kind == "table" and retire is not None and retire(conn, name, sql or ""):
            continue
        conn.execute(f'DROP {kind.upper()} IF EXISTS "{name}"')


def create_fts(conn: sqlite3.Connection) -> None:
    """(Re)create every FTS object and, when messages exist, start a rebuild of them.

    Must run inside the caller's write transaction. Objects that are missing, differ from the
    declared SQL or come from an older layout are dropped first, so the result is exact.
    """
    drop_fts_objects(conn)
    for _, _, sql in OBJECTS:
        conn.execute(sql)
    set_options(conn)
    _set_markers(conn, conn.execute("SELECT MAX(id) FROM messages").fetchone()[0])


def options_set(conn: sqlite3.Connection, tables: frozenset[str]) -> bool:
    """Tell whether each of `tables` holds FTS_OPTIONS in its config (one read of their config tables)."""
    wanted = {(table, name, value) for table in tables for name, value in FTS_OPTIONS}
    if not wanted:
        return True
    names = ", ".join(f"'{name}'" for name, _ in FTS_OPTIONS)
    found = conn.execute(" UNION ALL ".join(f"SELECT '{table}', k, v FROM {table}_config WHERE k IN ({names})"
                                            for table in sorted(tables))).fetchall()
    return wanted <= set(found)


def set_options(conn: sqlite3.Connection, tables: tuple[str, ...] = FTS_TABLES) -> None:
    """Write FTS_OPTIONS into the config of each of `tables` (inside the caller's write transaction)."""
    for table in tables:
        for name, value in FTS_OPTIONS:
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES (?, ?)", (name, value))


def _set_markers(conn: sqlite3.Connection, high_water: int | None, progress: int = 0) -> None:
    if high_water is None or progress >= high_water:
        conn.execute("DELETE FROM state_meta WHERE key IN (?, ?)", (HIGH_WATER, PROGRESS))
        return
    conn.executemany("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, ?)",
                     [(HIGH_WATER, str(high_water)), (PROGRESS, str(progress))])


def start_rebuild(conn: sqlite3.Connection) -> None:
    """Empty the three indexes and set the markers so every existing row is rebuilt in chunks.

    Must run inside the caller's write transaction. Does nothing while a rebuild is under way
    (that one is resumed instead).
    """
    if _markers(conn) is not None:
        return
    # Rows written since the upgrade are not in an older layout's index: this rebuild does without it.
    conn.execute("DELETE FROM state_meta WHERE key = ?", (OLD_SUBSTRINGS_UPTO,))
    conn.execute(f"INSERT INTO {WORD}({WORD}) VALUES ('delete-all')")
    conn.execute(f"INSERT INTO {TRIGRAM}({TRIGRAM}) VALUES ('delete-all')")
    conn.execute(f"INSERT INTO {REASONING}({REASONING}) VALUES ('delete-all')")
    # The CJK table keeps its own text (it is small); dropping it is cheaper than deleting rows.
    conn.execute(f"DROP TABLE {CJK}")
    conn.execute(CJK_TABLE_SQL)
    set_options(conn, (CJK,))
    conn.execute(f"DELETE FROM {CJK_PENDING}")
    conn.execute(f"DELETE FROM {PENDING}")
    _set_markers(conn, conn.execute("SELECT MAX(id) FROM messages").fetchone()[0])


def _index_range(conn: sqlite3.Connection, low: int, high: int) -> None:
    """Index the messages with low < id <= high into all three tables (none of them is indexed yet)."""
    conn.execute(f"INSERT INTO {WORD}(rowid, content, tool_name, tool_calls) "
                 "SELECT id, content, tool_name, tool_calls FROM messages WHERE id > ? AND id <= ?", (low, high))
    # From the table itself: the content sources leave out the range until its markers move on.
    conn.execute(f"INSERT INTO {TRIGRAM}(rowid, content) SELECT id, {searchable_text('messages')} FROM messages "
                 "WHERE id > ? AND id <= ?", (low, high))
    conn.execute(f"INSERT INTO {REASONING}(rowid, reasoning) SELECT id, {reasoning_text('messages')} FROM messages "
                 f"WHERE id > ? AND id <= ? AND {reasons('messages')}", (low, high))
    # The CJK table is a plain FTS5 table (rows delete by rowid), so clearing the range first
    # makes this idempotent with rows the queue already handled.
    conn.execute(f"DELETE FROM {CJK} WHERE rowid > ? AND rowid <= ?", (low, high))
    conn.execute(f"INSERT INTO {CJK}(rowid, terms) SELECT id, t FROM (SELECT id, {terms_sql('content', 'tool_calls')} "
                 "AS t FROM messages WHERE id > ? AND id <= ?) WHERE t IS NOT NULL", (low, high))
    conn.execute(f"DELETE FROM {CJK_PENDING} WHERE id > ? AND id <= ?", (low, high))
    conn.execute(f"DELETE FROM {PENDING} WHERE id > ? AND id <= ?", (low, high))


# The rows a batch takes: queued, and not left to a rebuild under way. Its three statements read the
# table itself (the content sources leave queued rows out until the queue is emptied).
_QUEUED = f"id IN (SELECT id FROM {PENDING}) AND {rebuild_gate('id')}"
_INDEX_QUEUED_SQL = (
    f"INSERT INTO {WORD}(rowid, content, tool_name, tool_calls) "
    f"SELECT id, content, tool_name, tool_calls FROM messages WHERE {_QUEUED}",
    f"INSERT INTO {TRIGRAM}(rowid, content) SELECT id, {searchable_text('messages')} FROM messages WHERE {_QUEUED}",
    f"INSERT INTO {REASONING}(rowid, reasoning) SELECT id, {reasoning_text('messages')} FROM messages "
    f"WHERE {_QUEUED} AND {reasons('messages')}",
    f"DELETE FROM {PENDING}")


def index_queued(conn: sqlite3.Connection) -> None:
    """Index every row of the writer's queue into the word, substring and reasoning indexes, and empty it.

    Must run inside the caller's write transaction. One statement per index for the whole batch,
    so FTS5 writes one segment per index for it. Rows a rebuild under way will index are skipped.
    """
    for sql in _INDEX_QUEUED_SQL:
        conn.execute(sql)


def _convert_in_place(conn: sqlite3.Connection) -> None:
    # An older layout whose indexes are complete: only views, triggers, the queue table and the word
    # index's content source differ. FTS5 reads a table's options from its CREATE statement, so the
    # word index's is rewritten in the catalogue (the schema cookie moves on, so every connection
    # reads it again); nothing is re-indexed. Inside the caller's write transaction.
    found = {name: _normalized(sql) for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE name LIKE 'messages\\_fts%' ESCAPE '\\' OR type = 'trigger'")}
    for kind, name, sql in OBJECTS:
        if found.get(name) == _normalized(sql):
            continue
        if kind == "table" and name in found:
            conn.execute("PRAGMA writable_schema = ON")
            try:
                conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (sql, name))
                conn.execute(f"PRAGMA schema_version = {conn.execute('PRAGMA schema_version').fetchone()[0] + 1}")
            finally:
                conn.execute("PRAGMA writable_schema = OFF")
        else:
            conn.execute(f'DROP {kind.upper()} IF EXISTS "{name}"')
            conn.execute(sql)


# A chunk is indexed in pieces of an eighth of its rows (32 at most), the clock read after each: the next chunk's
# size is a guess from the last one's time, and rows of one chunk can weigh far more than the last's
# (a run of long tool output, pages read cold from the disk). Past CHUNK_BUDGET_S it stops early.
CHUNK_PIECES = 8
CHUNK_PIECE_ROWS = 32  # and no piece of more rows than this (a piece of long tool output can take a second)
# ... nor of more text than this, unless it is one row: the trigram index makes a token of every
# character, so the time a piece takes follows its text, and 32 rows of tool output can be MBs.
CHUNK_PIECE_CHARS = 64 * 1024


def _piece_end(conn: sqlite3.Connection, after: int, high_water: int, most: int) -> tuple[int, int]:
    """Return (the last id, the rows) of the next piece of (after, high_water]: at most `most` rows and CHUNK_PIECE_CHARS."""
    # length() reads each row's text (SQLite counts characters), which the piece then reads again from the cache.
    sizes = conn.execute("SELECT id, COALESCE(length(content), 0) + COALESCE(length(tool_calls), 0) FROM messages "
                         "WHERE id > ? AND id <= ? ORDER BY id LIMIT ?", (after, high_water, most)).fetchall()
    end, taken, chars = after, 0, 0
    for row_id, size in sizes:
        if taken and chars + size > CHUNK_PIECE_CHARS:
            return end, taken
        end, taken, chars = row_id, taken + 1, chars + size
    # Every row up to the high-water mark fits: the piece ends there (ids past the last row may be gone).
    return (high_water if len(sizes) < most else end), max(taken, 1)


def rebuild_step(conn: sqlite3.Connection, chunk_rows: int = REBUILD_CHUNK_ROWS) -> bool:
    """Index the next chunk of (P, H] and advance P in the same transaction; return whether more remains.

    Must run inside the caller's write transaction; the markers are re-read there, so two
    processes resuming the same rebuild never index a row twice. The chunk ends early, at a piece's
    end, once it has taken CHUNK_BUDGET_S.
    """
    markers = _markers(conn)
    if markers is None:
        return False
    progress, high_water = markers
    deadline = time.monotonic() + CHUNK_BUDGET_S
    rows, upper = max(chunk_rows, 1), progress
    piece = max(1, min(CHUNK_PIECE_ROWS, -(-rows // CHUNK_PIECES)))
    while rows > 0 and upper < high_water:
        end, taken = _piece_end(conn, upper, high_water, min(piece, rows))
        _index_range(conn, upper, end)
        rows, upper = rows - taken, end
        if time.monotonic() >= deadline:
            break
    _set_markers(conn, high_water, upper)
    if upper >= high_water:  # the last chunk: the segments it left are merged next
        conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, '1')", (MERGE_PENDING,))
    return upper < high_water


# The pages one merge step writes: on the heavy store of docs/performance.md, 500 pages took
# 0.1-0.3 s on a slow machine.
MERGE_STEP_PAGES = 64

# FTS5 keeps each index as segments on numbered levels, described by one structure record (rowid
# 10 of `<index>_data`). Its reader refuses a record naming more than 2,000 levels, and then the
# table cannot even be opened: every search and every write through a trigger fails. Two commands
# add levels for good each time the segments sit on more than one level: `optimize`, and `merge`
# with a negative page count (both first move every segment onto a new level above the others).
# Under a steady trickle of appends that is nearly every time, so a loop of either climbs to the
# limit. The library runs neither in a loop: one such start per index after a rebuild, then
# positive merges (whose levels grow with the logarithm of the segments); `optimize` rebuilds an
# index first once it is this deep; and an open rebuilds an index past OVERGROWN_LEVELS.
STRUCTURE_ROWID = 10
FTS5_MAX_LEVELS = 2000
COMPACT_LEVELS = 64
OVERGROWN_LEVELS = 128


@dataclass(frozen=True)
class Structure:
    """An FTS5 index's structure record, decoded: its levels and how many leaf pages its segments hold."""

    levels: tuple[tuple[int, int], ...]  # per level, lowest first: (segments being merged, segments)
    pages: int = 0

    @property
    def depth(self) -> int:
        return len(self.levels)

    @property
    def segments(self) -> int:
        return sum(count for _, count in self.levels)

    @property
    def merging(self) -> bool:
        """A merge is under way (FTS5 continues it a share at a time)."""
        return any(inputs for inputs, _ in self.levels)


def _varint(block: bytes, at: int) -> tuple[int, int]:
    # SQLite's varint, as FTS5 writes it: 7 bits a byte, high bit set on all but the last; a ninth byte gives 8.
    value = 0
    for n in range(9):
        byte = block[at]
        at += 1
        if n == 8:
            return (value << 8) | byte, at
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, at
    return value, at


_STRUCTURE_V2 = b"\xff\x00\x00\x01"  # newer SQLites mark a record whose segments carry more fields


def _head(block: bytes) -> tuple[bool, int]:
    # After the 4-byte cookie: the newer layout's marker, if any; returns (newer, offset of the level count).
    newer = block[4:8] == _STRUCTURE_V2
    return newer, 8 if newer else 4


def structure_depth(block: bytes) -> int:
    """Return the number of levels a structure record names (its first field after the cookie)."""
    return _varint(block, _head(block)[1])[0]


def decode_structure(block: bytes) -> Structure:
    """Decode an FTS5 structure record; raises ValueError when it is cut short."""
    try:
        newer, at = _head(block)
        depth, at = _varint(block, at)
        _, at = _varint(block, at)      # segments in all
        _, at = _varint(block, at)      # write counter
        if newer:
            _, at = _varint(block, at)  # origin counter
        levels, pages = [], 0
        for _ in range(depth):
            inputs, at = _varint(block, at)
            count, at = _varint(block, at)
            for _ in range(count):
                _, at = _varint(block, at)           # segment id
                first, at = _varint(block, at)
                last, at = _varint(block, at)
                pages += max(0, last - first + 1)
                for _ in range(5 if newer else 0):   # origins, tombstone pages and entries
                    _, at = _varint(block, at)
            levels.append((inputs, count))
    except IndexError:
        raise ValueError("the FTS5 structure record is cut short") from None
    return Structure(tuple(levels), pages)


def read_structure(conn: sqlite3.Connection, table: str) -> Structure | None:
    """Return `table`'s decoded structure record, or None when it has none or it cannot be read."""
    row = conn.execute(f"SELECT block FROM {table}_data WHERE id = ?", (STRUCTURE_ROWID,)).fetchone()
    if row is None or not isinstance(row[0], bytes) or len(row[0]) < 5:
        return None
    try:
        return decode_structure(row[0])
    except ValueError:
        return None


def varints(blob: bytes) -> list[int]:
    """Return every varint of `blob`, as FTS5 writes a row's token counts (`<index>_docsize`) and its totals."""
    values, at = [], 0
    while at < len(blob):
        value, at = _varint(blob, at)
        values.append(value)
    return values


AVERAGES_ROWID = 1  # FTS5's totals record in `<index>_data`: its rows, then the tokens of each column


def token_totals(conn: sqlite3.Connection, table: str) -> tuple[int, int] | None:
    """Return (rows, tokens in all columns) of `table` as its bm25 reads them, or None when it keeps none."""
    try:
        row = conn.execute(f"SELECT block FROM {table}_data WHERE id = ?", (AVERAGES_ROWID,)).fetchone()
    except sqlite3.OperationalError:
        return None
    if row is None or not isinstance(row[0], bytes):
        return None
    try:
        totals = varints(row[0])
    except IndexError:  # cut short
        return None
    return (totals[0], sum(totals[1:])) if totals else None


def overgrown(conn: sqlite3.Connection, tables: Iterable[str]) -> dict[str, int]:
    """Return {index: levels} for each of `tables` deeper than OVERGROWN_LEVELS (one statement, no index opened).

    Reads the structure records as plain rows, so it works on an index FTS5 itself refuses to open.
    """
    names = sorted(tables)
    if not names:
        return {}
    blocks = conn.execute("SELECT " + ", ".join(f"(SELECT block FROM {t}_data WHERE id = {STRUCTURE_ROWID})"
                                                for t in names)).fetchone()
    found = {}
    for table, block in zip(names, blocks):
        if isinstance(block, bytes) and len(block) >= 5:
            try:
                depth = structure_depth(block)
            except IndexError:
                continue
            if depth > OVERGROWN_LEVELS:
                found[table] = depth
    return found


def reset_structures(conn: sqlite3.Connection, tables: Iterable[str]) -> None:
    """Write an empty structure record into each of `tables`, so FTS5 opens them again (to be emptied next).

    Inside the caller's write transaction, and only as the first half of emptying or dropping
    the index: the segments' pages stay in `<index>_data` until then. The cookie (the config
    version FTS5 checks) is kept; the rest says: no level, no segment.
    """
    for table in tables:
        conn.execute(f"UPDATE {table}_data SET block = substr(block, 1, 4) || x'000000' WHERE id = ?",
                     (STRUCTURE_ROWID,))


def rebuild_overgrown(conn: sqlite3.Connection, tables: Iterable[str]) -> dict[str, int]:
    """Start a full rebuild when an index of `tables` is deeper than OVERGROWN_LEVELS; return {index: levels}.

    Inside the caller's write transaction. Such an index is a few merges away from the depth
    FTS5 refuses to read (or past it already): every index is emptied and rebuilt from the
    messages in chunks, as after an upgrade; no message is touched. A rebuild under way starts over.
    """
    found = overgrown(conn, tables)
    if found:
        reset_structures(conn, found)
        conn.execute("DELETE FROM state_meta WHERE key IN (?, ?, ?)", (HIGH_WATER, PROGRESS, MERGE_PENDING))
        start_rebuild(conn)
    return found


def _merge_plan(value: str, present: list[str], pages: int, conn: sqlite3.Connection) -> dict:
    # The marker's value: "1" as the rebuild's last chunk sets it, then the plan as JSON: the index
    # being merged ("at"), whether its one start has been made, and how many steps remain. The steps
    # are bounded from the start by the pages the indexes hold, so the merge ends whatever others write.
    try:
        plan = json.loads(value)
        if isinstance(plan, dict) and {"at", "started", "steps"} <= set(plan):
            return plan
    except ValueError:
        pass
    steps = 0
    for table in present:
        found = read_structure(conn, table)
        steps += 2 * (((found.pages if found else 0) // max(1, pages)) + 1) + 4
    return {"at": present[0] if present else None, "started": False, "steps": steps}


def merge_step(conn: sqlite3.Connection, pages: int = MERGE_STEP_PAGES) -> bool:
    """Merge the next share of the segments a finished rebuild left; return whether more remains.

    Must run inside the caller's write transaction. Each index in turn gets one merge of all its
    segments into one (FTS5's `merge` with a negative page count, about `pages` pages per call),
    continued by positive merges (which also merge any level holding 4 segments or more), which
    add levels only as the logarithm of the segments however many other writers add meanwhile.
    The index is done once a step makes no progress; what other writers add later is left to
    FTS5's automerge. The steps are counted in the marker and bounded by the size of the indexes,
    so the whole merge ends; the marker goes when it has.
    """
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (MERGE_PENDING,)).fetchone()
    if row is None:
        return False
    present = [t for t in FTS_TABLES if t in _read_catalogue(conn).tables]
    plan = _merge_plan(str(row[0]), present, pages, conn)
    while plan["at"] in present:
        table = plan["at"]
        found = read_structure(conn, table)
        command = None
        if found is not None and found.segments > 1 and plan["steps"] > 0:
            if not found.merging and not plan["started"] and found.depth + 2 <= COMPACT_LEVELS:
                command, plan["started"] = -max(1, pages), True
            else:  # continues the merge under way (FTS5 picks it first), then any level of 4 or more segments
                command = max(1, pages)
        if command is not None:
            before = conn.total_changes
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('merge', ?)", (command,))
            plan["steps"] -= 1
            if conn.total_changes - before >= 2:  # FTS5's sign that the command merged something
                conn.execute("UPDATE state_meta SET value = ? WHERE key = ?", (json.dumps(plan), MERGE_PENDING))
                return True
        later = present[present.index(table) + 1:]
        plan.update(at=later[0] if later else None, started=False)
    conn.execute("DELETE FROM state_meta WHERE key = ?", (MERGE_PENDING,))
    return False


def drain_cjk(conn: sqlite3.Connection, limit: int = CJK_BATCH_ROWS) -> bool:
    """Index (or un-index) up to `limit` queued CJK rows; return whether more remain queued.

    Must run inside the caller's write transaction. Idempotent per row: the old terms are
    deleted by rowid, then the row's current text (if it still exists and has CJK) is indexed.
    """
    ids = [r[0] for r in conn.execute(f"SELECT id FROM {CJK_PENDING} ORDER BY id LIMIT ?", (limit,))]
    if not ids:
        return False
    batch = json.dumps(ids)
    conn.execute(f"DELETE FROM {CJK} WHERE rowid IN (SELECT value FROM json_each(?))", (batch,))
    conn.execute(f"INSERT INTO {CJK}(rowid, terms) SELECT id, t FROM (SELECT id, {terms_sql('content', 'tool_calls')} "
                 "AS t FROM messages WHERE id IN (SELECT value FROM json_each(?))) WHERE t IS NOT NULL", (batch,))
    conn.execute(f"DELETE FROM {CJK_PENDING} WHERE id IN (SELECT value FROM json_each(?))", (batch,))
    return len(ids) == limit


def index_batch(conn: sqlite3.Connection) -> None:
    """Index the writer's queue into every index, and up to CJK_BATCH_ROWS of the CJK queue (needs the library's SQL function).

    Bounded: another program may have queued many CJK rows; each batch takes its share, and
    searches scan the rest meanwhile.
    """
    index_queued(conn)
    drain_cjk(conn)


def flush_queue(writer: Writer, policy: RetryPolicy) -> None:
    """Index whatever the writer's queue holds, in one short write transaction of its own; never raises.

    A handle runs it when it closes, so other programs' searches find its rows in the indexes.
    One try: a file another process holds leaves the rows queued (searches still find them, and
    the next batch of any library handle indexes them), and that is logged, not warned about.
    """
    queuer = writer.conn
    if not (isinstance(queuer, Connection) and queuer.fts_queued):
        return  # nothing queued through this connection since its queue was last emptied: no SQL at all
    try:
        with writer.transaction(0.0, policy, quiet=True) as conn:
            state = inspect(conn)
            if state.declared and (state.queued or state.cjk_pending):
                index_batch(conn)
        queuer.fts_queued = 0
    except Exception as exc:  # noqa: BLE001 - searches scan queued rows; the next batch indexes them
        logger.info("indexing the queued messages was put off: %s", exc)


def advance(conn: sqlite3.Connection, chunk_rows: int = REBUILD_CHUNK_ROWS) -> bool:
    """Do one bounded unit of pending work (rebuild chunk, else CJK queue, else merging); return whether more remains.

    `chunk_rows` is the most rows a rebuild chunk or CJK batch takes.
    """
    if rebuild_step(conn, chunk_rows):
        return True
    index_queued(conn)
    drain_cjk(conn, chunk_rows)
    if conn.execute(f"SELECT EXISTS (SELECT 1 FROM {CJK_PENDING})").fetchone()[0] == 1:
        return True
    return merge_step(conn)


def install_write_triggers(conn: sqlite3.Connection) -> None:
    """Create this connection's TEMP trigger that drains the CJK queue as rows are written.

    Run at open, outside any transaction, before the connection's first write; it touches only the
    connection's temp schema (no lock on the database file). Idempotent.
    """
    register_functions(conn)
    conn.execute(DRAIN_TRIGGER_SQL)


def ensure_fts(writer: Writer, patience_s: float, policy: RetryPolicy, *, writable: bool) -> FtsState | None:
    """Make the FTS objects exist as declared; return what is pending (None on a read-only handle).

    Opens a write transaction only when an object is missing or differs: an up-to-date file
    costs a few catalogue reads and takes no write lock, whatever its queues hold (the caller
    leaves queued rows to work off the open path, and searches scan them meanwhile). A
    read-only (or newer-schema) handle only registers the SQL function. Raises
    StateDbIncompatibleError when SQLite lacks FTS5.
    """
    conn = writer.conn
    register_functions(conn)
    if not writable:
        return None
    if not fts5_available(conn):
        raise StateDbIncompatibleError(
            f"this SQLite ({sqlite3.sqlite_version}) lacks FTS5 with the trigram tokenizer (3.34+), which "
            "hermes-state needs to index messages; use a Python whose sqlite3 has FTS5, or open read-only.")
    state = inspect(conn)
    if state.declared and overgrown(conn, state.tables):
        _rebuild_overgrown(writer, patience_s, policy)
        state = inspect(conn)
    if not state.declared:
        with writer.transaction(patience_s, policy):
            catalogue = _read_catalogue(conn)  # another process may have built them meanwhile
            if catalogue.convertible:
                try:
                    _convert_in_place(conn)
                except sqlite3.DatabaseError as exc:  # a SQLite that refuses catalogue edits (defensive mode)
                    logger.info("the full-text objects could not be converted in place (%s); rebuilding them", exc)
                    create_fts(conn)
            elif not catalogue.declared:
                create_fts(conn)
        state = inspect(conn)
    if state.declared and not options_set(conn, state.tables):
        with writer.transaction(patience_s, policy):
            set_options(conn)  # a file an older release created, or one whose options were changed
    cached_state(conn)  # the append path decides from this cache (re-read only after a schema change)
    return state


def _rebuild_overgrown(writer: Writer, patience_s: float, policy: RetryPolicy) -> None:
    # An index FTS5 refuses (or soon will) fails every write through its triggers: rebuilt from the
    # messages, in the background after this transaction. A SQLite that refuses writes to an
    # index's own tables (defensive mode) leaves it as it was; `recover` still reads every message.
    try:
        with writer.transaction(patience_s, policy) as conn:
            found = rebuild_overgrown(conn, inspect(conn).tables)
    except sqlite3.DatabaseError as exc:
        logger.warning("a full-text index has too many levels and could not be rebuilt (%s); searches and "
                       "writes may fail until it is (`hermes-state recover` saves every message)", exc)
        return
    for table, depth in sorted(found.items()):
        logger.warning("the full-text index %s had %d levels (SQLite reads at most %d); every index is being "
                       "rebuilt from the messages, none of which was changed", table, depth, FTS5_MAX_LEVELS)


# A chunk's cost follows the bytes of its rows, not their number: 2,000 rows of base64 payloads and
# long tool output held the lock for over a second. The rows of the next chunk are scaled so that
# one takes about this long, never more than the chunk size asked for, never under the floor.
CHUNK_TARGET_S = 0.1
CHUNK_BUDGET_S = 2 * CHUNK_TARGET_S  # the most a chunk goes on for, however many rows it was given
CHUNK_FLOOR_ROWS = 20


def next_chunk_rows(rows: int, took_s: float, most: int) -> int:
    """Return how many rows the next chunk takes after `rows` took `took_s` (at most `most`)."""
    if took_s <= 0:
        return most
    return max(min(CHUNK_FLOOR_ROWS, most), min(most, int(rows * CHUNK_TARGET_S / took_s)))


# The lease of the one background thread (of any process) that works off pending index work:
# every writable open of a file with work pending starts a thread, and two would only take turns
# with the lock while the processes' own writes wait behind both.
WORKER_KEY = "background_worker"
WORKER_LEASE_S = 10.0  # renewed by every chunk; a holder that is killed is provably gone at once
LEASE_RETRY_S = 1.0    # how often a thread waiting for the lease looks again (one empty write transaction)


def live_worker(conn: sqlite3.Connection, now: float | None = None) -> str | None:
    """Return the holder of the background worker's lease while it is live, else None (none, expired, gone, unreadable)."""
    from hermes_state_lockowners import lock_is_live
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (WORKER_KEY,)).fetchone()
    if row is None:
        return None
    holder, _, expires = str(row[0]).rpartition(" until=")
    try:
        return holder if lock_is_live(holder, float(expires), time.time() if now is None else now) else None
    except ValueError:
        return None  # a value this library did not write: taken over


def _take_turn(conn: sqlite3.Connection, holder: str) -> bool:
    """Inside the write transaction: take or renew the lease for `holder`; False when another holds it live."""
    now = time.time()
    other = live_worker(conn, now)
    if other is not None and not other.startswith(holder):
        return False
    conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, ?)",
                 (WORKER_KEY, f"{holder} until={now + WORKER_LEASE_S:.3f}"))
    return True


def release_turn(writer: Writer, holder: str, policy: RetryPolicy, patience_s: float = 1.0) -> None:
    """Give back `holder`'s worker lease, so the next open's thread need not wait for it to expire (best effort)."""
    try:
        with writer.transaction(patience_s, policy, quiet=True) as conn:
            conn.execute("DELETE FROM state_meta WHERE key = ? AND substr(value, 1, ?) = ?",
                         (WORKER_KEY, len(holder), holder))
    except Exception as exc:  # noqa: BLE001 - the lease expires by itself
        logger.debug("the background worker's lease is left to expire (%s)", exc)


def run_pending(writer: Writer, patience_s: float, policy: RetryPolicy, chunk_rows: int = REBUILD_CHUNK_ROWS,
                stop: threading.Event | None = None, pause_s: float = 0.0,
                step: Callable[[sqlite3.Connection], bool] | None = None, holder: str | None = None,
                free: Callable[[sqlite3.Connection], bool] | None = None) -> bool:
    """Run rebuild chunks and CJK catch-up (or `step`), one write transaction each, until done or `stop` is set.

    Returns True when nothing is pending any more. Between chunks it pauses `pause_s` without
    holding any lock, so other writers get their turn. `step(conn)` does one bounded unit of
    other work and returns whether more remains. With `holder` (a background thread's), each
    chunk first takes or renews the one worker lease; while another thread holds it live, this
    one looks again every LEASE_RETRY_S and takes over once it is given back or expires. With
    `free`, a transaction first asks `free(conn)` to make room: when it did, that was the chunk.
    """
    rows = chunk_rows
    while stop is None or not stop.is_set():
        # A background run (`stop` given) stops waiting for the lock as soon as its handle closes,
        # holds the fork gate for each chunk, and fails quietly: it resumes at the next open.
        with writer.transaction(patience_s, policy, stop=stop, quiet=stop is not None) as conn:
            began = time.monotonic()
            waiting = holder is not None and not _take_turn(conn, holder)
            if waiting:  # another thread is doing this work: two would only take turns with the lock
                more = True
            elif free is not None and free(conn):
                more = True  # room made for the chunks to come, in a transaction of its own
            else:
                started = time.monotonic()
                more = advance(conn, rows) if step is None else step(conn)
                rows = next_chunk_rows(rows, time.monotonic() - started, chunk_rows)
            if not more and holder is not None:
                conn.execute("DELETE FROM state_meta WHERE key = ? AND substr(value, 1, ?) = ?",
                             (WORKER_KEY, len(holder), holder))  # as release_turn, inside this chunk
        held = time.monotonic() - began  # the commit included
        if not more:
            return True
        if stop is not None and (pause_s or waiting):
            stop.wait(LEASE_RETRY_S if waiting else max(pause_s, held * BACKGROUND_DUTY))
    return False


def background_worker(writer: Writer, patience_s: float, policy: RetryPolicy, chunk_rows: int,
                      stop: threading.Event, pause_s: float = BACKGROUND_PAUSE_S, holder: str | None = None,
                      free: Callable[[sqlite3.Connection], bool] | None = None) -> None:
    """Thread body: finish pending FTS work in the background; log (never raise) on failure."""
    try:
        if run_pending(writer, patience_s, policy, chunk_rows, stop, pause_s, holder=holder, free=free):
            logger.info("full-text index is up to date")
    except Exception as exc:  # noqa: BLE001 - a background thread has nobody to raise to
        if not stop.is_set():
            logger.warning("background full-text rebuild stopped (%s); it resumes at the next open "
                           "or with rebuild_fts()", exc)


def rebuild(writer: Writer, patience_s: float, policy: RetryPolicy, chunk_rows: int = REBUILD_CHUNK_ROWS,
            free: Callable[[sqlite3.Connection], bool] | None = None) -> None:
    """Rebuild every FTS index to the end: resume the rebuild under way, else start a full one.

    Opens its own write transactions (one to start, one per chunk); safe to interrupt at any
    point and to resume from another process.
    """
    with writer.transaction(patience_s, policy) as conn:
        if not inspect(conn).declared:
            create_fts(conn)
        start_rebuild(conn)
    run_pending(writer, patience_s, policy, chunk_rows, free=free)


def rebuild_status(conn: sqlite3.Connection) -> dict[str, object]:
    """Return {pending, total, indexed, percent, in_progress, cjk_pending} for the FTS indexes."""
    state = inspect(conn)
    cjk_pending = conn.execute(f"SELECT COUNT(*) FROM {CJK_PENDING}").fetchone()[0] if state.cjk_pending else 0
    if state.rebuild is not None:
        progress, high_water = state.rebuild
        total = conn.execute("SELECT COUNT(*) FROM messages WHERE id <= ?", (high_water,)).fetchone()[0]
        pending = conn.execute("SELECT COUNT(*) FROM messages WHERE id > ? AND id <= ?",
                               (progress, high_water)).fetchone()[0]
    else:
        total = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        pending = 0 if state.tables == frozenset(FTS_TABLES) else total
    indexed = total - pending
    return {"pending": pending, "total": total, "indexed": indexed,
            "percent": round(100.0 * indexed / total, 1) if total else 100.0,
            "in_progress": state.rebuild is not None, "cjk_pending": cjk_pending}


def integrity_report(conn: sqlite3.Connection, tables: Iterable[str] | None = None, *,
                     compare: bool = True) -> dict[str, str]:
    """Return {table: "ok" or the error} of FTS5's own integrity-check for each index present (or of `tables`).

    With `compare` the check also compares each index with its content source (rank 1): a row
    indexed twice or stale terms are caught, not only a damaged structure. FTS5 runs it as a
    write command, so it needs a writable connection; it changes nothing, and queued rows need no
    flush first (the content sources leave them out, as the indexes do).
    """
    report = {}
    present = inspect(conn).tables
    for table in sorted(present if tables is None else set(tables) & present):
        try:
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', {int(compare)})")
            report[table] = "ok"
        except sqlite3.DatabaseError as exc:
            report[table] = f"{exc} (the index disagrees with the messages it was built from)"
    return report


def optimize(conn: sqlite3.Connection) -> int:
    """Merge every present FTS index into one segment; return how many indexes were optimized.

    Maintenance, never the hot path: it rewrites each whole index inside the caller's write
    transaction (seconds on a large store), changing no search result. Idempotent.
    """
    present = [table for table in FTS_TABLES if table in inspect(conn).tables]
    for table in present:
        found = read_structure(conn, table)
        if found is not None and found.depth + 2 > COMPACT_LEVELS:
            # Each optimize adds levels for good (see OVERGROWN_LEVELS); a rebuild of the index from
            # its source starts it again from a few, and costs about what the optimize costs.
            conn.execute(f"INSERT INTO {table}({table}) VALUES ('rebuild')")
        conn.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")
    return len(present)


_optimizing = threading.local()  # set while a write-path optimize runs, so its own commit starts no other


def optimize_due(writes: int, every: int) -> bool:
    """Tell whether write number `writes` should be followed by a whole-index optimize (every `every`; 0 never)."""
    return bool(every) and writes % every == 0 and not getattr(_optimizing, "active", False)


def optimize_quietly(run: Callable[[], object]) -> None:
    """Call `run` (the handle's optimize); log a failure, never raise: the write that scheduled it has committed."""
    _optimizing.active = True
    try:
        run()
    except Exception as exc:  # noqa: BLE001 - upkeep must never fail the caller's write
        logger.info("periodic FTS optimize skipped: %s", exc)
    finally:
        _optimizing.active = False


def upkeep(conn: sqlite3.Connection, writes: int) -> None:
    """Every 1,000 writes run a bounded incremental FTS5 merge on each index; log, never raise.

    Runs after COMMIT (outside any transaction). `optimize` is never run here: it rewrites the
    whole index and belongs to maintenance, not the hot path.
    """
    if writes % MERGE_EVERY_N_WRITES:
        return
    for table in FTS_TABLES:
        try:
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('merge', ?)", (MERGE_PAGES,))
        except sqlite3.Error as exc:
            logger.info("FTS merge of %s skipped: %s", table, exc)
