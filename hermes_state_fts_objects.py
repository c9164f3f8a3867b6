"""The full-text objects' declarations: FTS5 tables, their source views, queues and triggers, as SQL.

Owns: the names of the FTS tables and queues, `OBJECTS` (what a current file holds, as
sqlite_master stores it), the layout one release older that open converts in place, the rebuild
gate and the writer's-queue gate the triggers apply, and the per-connection TEMP trigger that
feeds the CJK index. Does not own: creating, rebuilding or checking them (hermes_state_fts).

Transaction contract: none here; this module never touches a connection.
"""
from __future__ import annotations

import re

from hermes_state_cjk import terms_sql

WORD, TRIGRAM, CJK = "messages_fts", "messages_fts_trigram", "messages_fts_cjk"
REASONING = "messages_fts_reasoning"
CJK_PENDING = "messages_fts_cjk_pending"
FTS_TABLES = (WORD, TRIGRAM, CJK, REASONING)
HIGH_WATER, PROGRESS = "fts_rebuild_high_water", "fts_rebuild_progress"
# Set by the rebuild's last chunk: a rebuild leaves each index in dozens of segments, which every
# search seeks one by one, so they are merged afterwards a bounded step at a time.
MERGE_PENDING = "fts_merge_after_rebuild"
# An older layout's substring index (hermes-agent's trigram table), kept under this name while the
# upgrade's rebuild runs: searches find the rows not rebuilt yet through it instead of a bounded
# scan. It holds the messages up to the id under OLD_SUBSTRINGS_UPTO in state_meta.
OLD_SUBSTRINGS, OLD_SUBSTRINGS_UPTO = "hermes_old_substrings", "fts_old_substrings_upto"
# Rows a library handle appended and will index itself, in batches (hermes_state_fts_tail).
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
    ("table", WORD, f"CREATE VIRTUAL TABLE {WORD} USING fts5(content, tool_name, tool_calls, "
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
