"""The full-text objects' declarations: FTS5 tables, their source views, queues and triggers, as SQL.

Owns: the names of the FTS tables and queues (`NAMES`, the library's own namespace, apart from
every `messages_fts*` object hermes-agent makes), `OBJECTS` (what a current file holds, as
sqlite_master stores it), the earlier layouts open moves in place (`CONVERTIBLE_LAYOUTS`: under
hermes-agent's names), the rebuild gate and the writer's-queue gate the triggers apply, and the
per-connection TEMP trigger that feeds the CJK index. Does not own: creating, rebuilding or checking them (hermes_state_fts).

Transaction contract: none here; this module never touches a connection.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from hermes_state_cjk import terms_sql

class Names(NamedTuple):
    """The names one layout of the full-text objects uses: tables, queues, views, triggers, markers."""

    word: str
    trigram: str
    cjk: str
    reasoning: str
    cjk_pending: str
    pending: str
    high_water: str
    progress: str

    def source(self, table: str) -> str:
        """Return the name of `table`'s content source view."""
        return f"{table}_source"


# The library's own namespace. Every `messages_fts*` object of a file is hermes-agent's: its
# releases create, check and rebuild objects under those names (each release differently), so
# nothing of the library's shares a name, a trigger, a column layout or a state_meta key with them.
NAMES = Names(word="hermes_fts_words", trigram="hermes_fts_substrings", cjk="hermes_fts_cjk",
              reasoning="hermes_fts_reasoning", cjk_pending="hermes_fts_cjk_pending", pending="hermes_fts_pending",
              high_water="hermes_fts_high_water", progress="hermes_fts_progress")
# Where earlier releases of this library kept the same objects: under hermes-agent's names (so
# that its 0.19.0 release found its six triggers and created none), with its rebuild markers.
# Open moves a file's objects from here to NAMES by renaming them, with no re-indexing.
LEGACY_NAMES = Names(word="messages_fts", trigram="messages_fts_trigram", cjk="messages_fts_cjk",
                     reasoning="messages_fts_reasoning", cjk_pending="messages_fts_cjk_pending",
                     pending="messages_fts_pending", high_water="fts_rebuild_high_water",
                     progress="fts_rebuild_progress")

# The word index is the design document's `messages_fts`, built exactly as the document (and
# hermes-agent 0.20.1, identically) defines it: over messages itself, kept at once by its three
# triggers, which its own state_meta markers gate during a rebuild. Either program may create it
# or run its rebuild steps; neither changes it. The library's other indexes keep their own names.
WORD = "messages_fts"
WORD_HIGH_WATER, WORD_PROGRESS = "fts_rebuild_high_water", "fts_rebuild_progress"
TRIGRAM, CJK, REASONING = NAMES.trigram, NAMES.cjk, NAMES.reasoning
CJK_PENDING = NAMES.cjk_pending
DOC_TRIGRAM = "messages_fts_trigram"  # the document's substring index (DOC_TRIGRAM_OBJECTS)
AGENT_CJK = "messages_fts_cjk"  # the document's CJK index: hermes-agent's, with its native tokenizer
FTS_TABLES = (WORD, DOC_TRIGRAM, TRIGRAM, CJK, REASONING)
HIGH_WATER, PROGRESS = NAMES.high_water, NAMES.progress


class Family(NamedTuple):
    """Indexes rebuilt together, under one pair of rebuild markers."""

    tables: tuple[str, ...]
    high_water: str
    progress: str


# The document's word and substring indexes under the document's markers; the library's own under its own.
WORD_FAMILY = Family((WORD, DOC_TRIGRAM), WORD_HIGH_WATER, WORD_PROGRESS)
OWN_FAMILY = Family((TRIGRAM, REASONING, CJK), HIGH_WATER, PROGRESS)
FAMILIES = (WORD_FAMILY, OWN_FAMILY)

# The document's word index and its triggers, as sqlite_master stores them (hermes-agent 0.20.1
# stores exactly this text). A file is compared with it whitespace aside.
_DOC_GATE = ("(old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta\n"
             "                         WHERE key = 'fts_rebuild_high_water'), -1)\n"
             "   OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta\n"
             "                          WHERE key = 'fts_rebuild_progress'), -1))")
WORD_OBJECTS: tuple[tuple[str, str, str], ...] = (
    ("table", WORD, "CREATE VIRTUAL TABLE messages_fts USING fts5(\n    content,\n    tool_name,\n    tool_calls,\n"
                    "    content='messages',\n    content_rowid='id'\n)"),
    ("trigger", "messages_fts_insert",
     "CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages\nWHEN " + _DOC_GATE.replace("old.", "new.") +
     "\nBEGIN\n    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)\n"
     "    VALUES (new.id, new.content, new.tool_name, new.tool_calls);\nEND"),
    ("trigger", "messages_fts_delete",
     "CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages\nWHEN " + _DOC_GATE +
     "\nBEGIN\n    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)\n"
     "    VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls);\nEND"),
    ("trigger", "messages_fts_update",
     "CREATE TRIGGER messages_fts_update\nAFTER UPDATE OF content, tool_name, tool_calls ON messages\n"
     "WHEN (old.content IS NOT new.content\n    OR old.tool_name IS NOT new.tool_name\n"
     "    OR old.tool_calls IS NOT new.tool_calls)\n   AND "
     + _DOC_GATE.replace("\n   OR", "\n     OR").replace("\n                         W", "\n                           W")
     .replace("\n                          W", "\n                            W") +
     "\nBEGIN\n    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)\n"
     "    VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls);\n"
     "    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)\n"
     "    VALUES (new.id, new.content, new.tool_name, new.tool_calls);\nEND"),
)
# hermes-agent 0.20.1's substring index, built exactly as that release defines it (the design
# document's layout): the view leaves tool output out, the triggers are gated by the word index's
# markers, so both tables are rebuilt together. The library's own substring search does not read
# it (it misses tool output); it is there so that every release of the agent finds the layout it
# expects: 0.20.1 its own, 0.19.0 the six trigger names it counts (without them, 0.19.0 creates
# its own substring index and writes the word index its own way, which corrupts it).
DOC_TRIGRAM_SOURCE = "messages_fts_trigram_src"
_TRIGRAM_GATE = (_DOC_GATE.replace("\n   OR", "\n     OR").replace("\n                         W", "\n                           W")
                 .replace("\n                          W", "\n                            W"))
DOC_TRIGRAM_OBJECTS: tuple[tuple[str, str, str], ...] = (
    ("view", DOC_TRIGRAM_SOURCE,
     "CREATE VIEW messages_fts_trigram_src AS\n    SELECT id, role, content, tool_name, tool_calls\n"
     "    FROM messages\n    WHERE role <> 'tool'"),
    ("table", DOC_TRIGRAM,
     "CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(\n    content,\n    tool_name,\n    tool_calls,\n"
     "    content='messages_fts_trigram_src',\n    content_rowid='id',\n    tokenize='trigram'\n)"),
    ("trigger", "messages_fts_trigram_insert",
     "CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages\nWHEN new.role <> 'tool'\n   AND "
     + _TRIGRAM_GATE.replace("old.", "new.") +
     "\nBEGIN\n    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls)\n"
     "    VALUES (new.id, new.content, new.tool_name, new.tool_calls);\nEND"),
    ("trigger", "messages_fts_trigram_delete",
     "CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages\nWHEN old.role <> 'tool'\n   AND "
     + _TRIGRAM_GATE +
     "\nBEGIN\n    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name, tool_calls)\n"
     "    VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls);\nEND"),
    ("trigger", "messages_fts_trigram_update",
     "CREATE TRIGGER messages_fts_trigram_update\nAFTER UPDATE OF content, tool_name, tool_calls, role ON messages\n"
     "WHEN (old.content IS NOT new.content\n    OR old.tool_name IS NOT new.tool_name\n"
     "    OR old.tool_calls IS NOT new.tool_calls\n    OR old.role IS NOT new.role)\n   AND " + _TRIGRAM_GATE +
     "\nBEGIN\n    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name, tool_calls)\n"
     "    SELECT 'delete', old.id, old.content, old.tool_name, old.tool_calls\n    WHERE old.role <> 'tool';\n"
     "    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls)\n"
     "    SELECT new.id, new.content, new.tool_name, new.tool_calls\n    WHERE new.role <> 'tool';\nEND"),
)
# The document's objects the library builds: both share one pair of rebuild markers.
DOCUMENT_OBJECTS = (*WORD_OBJECTS, *DOC_TRIGRAM_OBJECTS)
# Set when the full-text set-up dropped an index whose pages a rebuild does not reuse at once (an
# agent's index replaced by the document's): the file is given back its free pages after the rebuild.
RECLAIM_AFTER_REBUILD = "reclaim_after_rebuild"
# Set by the rebuild's last chunk: a rebuild leaves each index in dozens of segments, which every
# search seeks one by one, so they are merged afterwards a bounded step at a time.
MERGE_PENDING = "hermes_fts_merge_after_rebuild"
# Rows a library handle appended and will index itself, in batches (hermes_state_fts_tail).
PENDING = NAMES.pending
# The state_meta keys earlier releases used, each with the key it moves to (the rebuild markers
# were hermes-agent 0.20.1's own key names, which its triggers read).
# An earlier release's rebuild under way goes on in both families: the word index's markers stay
# where they are (they are the document's), the others' are copied to the library's keys.
LEGACY_KEYS = ((LEGACY_NAMES.high_water, HIGH_WATER), (LEGACY_NAMES.progress, PROGRESS),
               ("fts_merge_after_rebuild", MERGE_PENDING))
# What an earlier release's move-in of a hermes-agent file left while its rebuild ran: the
# agent's substring index under this name and the id it held rows up to. A file moved to NAMES
# keeps neither (nothing reads them any more); the table's pages are freed in the background.
LEFTOVER_SUBSTRINGS, LEFTOVER_SUBSTRINGS_UPTO = "hermes_old_substrings", "fts_old_substrings_upto"
# FTS5 options every index keeps in its config table (`<index>_config`, which sqlite_master does not
# show): open writes them into a file that lacks them, and every program writing the file follows
# them, since FTS5 reads them from the file.
FTS_OPTIONS: tuple[tuple[str, int], ...] = (("automerge", 8),)


# --- the declared FTS objects ----------------------------------------------------------------------

def rebuild_gate(row_id: str, n: Names = NAMES) -> str:
    """Return SQL true when row `row_id` is outside the range a rebuild under way has still to index."""
    # A row is indexed by the triggers iff no rebuild is under way, or it is at or below
    # the progress marker (already rebuilt), or above the high-water mark (newer than the
    # rebuild). Rows in (P, H] are left to the rebuild, so none is indexed twice or missed.
    return (f"(NOT EXISTS (SELECT 1 FROM state_meta WHERE key = '{n.high_water}')"
            f" OR {row_id} > (SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = '{n.high_water}')"
            f" OR {row_id} <= (SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = '{n.progress}'))")


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


def cjk_table_sql(n: Names = NAMES) -> str:
    """Return the CREATE statement of the CJK index under `n`'s names."""
    return f"CREATE VIRTUAL TABLE {n.cjk} USING fts5(terms)"


CJK_TABLE_SQL = cjk_table_sql()


def indexed(row_id: str, n: Names = NAMES) -> str:
    """Return SQL true when row `row_id` belongs in the word, substring and reasoning indexes now.

    Not while it waits in the writer's queue or in the range a rebuild under way has still to
    index. The indexes' content sources hold exactly these rows, so FTS5's own `rebuild` and
    `integrity-check`, run by any program, agree with what the library indexed.
    """
    # A row in the writer's queue is not in the word, substring or reasoning index yet: the library
    # handle that wrote it indexes it with others in one batch. Plain SQL, so every writer obeys it.
    return f"{rebuild_gate(row_id, n)} AND NOT EXISTS (SELECT 1 FROM {n.pending} WHERE id = {row_id})"


def _tables(n: Names, gated: bool) -> tuple[tuple[str, str, str], ...]:
    """Return the declared tables and source views; without `gated`, the layout whose sources held every row."""
    where = f" WHERE {indexed('messages.id', n)}" if gated else ""
    also = f" AND {indexed('messages.id', n)}" if gated else ""
    word_source = (("view", n.source(n.word),
                    f"CREATE VIEW {n.source(n.word)} AS SELECT id, content, tool_name, tool_calls FROM messages"
                    f"{where}"),) if gated else ()
    # The current layout's word index is the document's (WORD_OBJECTS), apart from these.
    word = () if n == NAMES else (
        *word_source,
        ("table", n.word, f"CREATE VIRTUAL TABLE {n.word} USING fts5(content, tool_name, tool_calls, "
                          f"content='{n.source(n.word) if gated else 'messages'}', content_rowid='id')"))
    return (
    *word,
    # Substrings of every message's text: trigrams with detail=none store which rows hold each
    # trigram but no positions, about half the size of a position-full index over less text.
    # Nothing ranks these hits, so no per-row token counts are kept either (columnsize=0).
    ("view", n.source(n.trigram),
     f"CREATE VIEW {n.source(n.trigram)} AS SELECT id, {searchable_text('messages')} AS content FROM messages"
     f"{where}"),
    ("table", n.trigram, f"CREATE VIRTUAL TABLE {n.trigram} USING fts5(content, content='{n.source(n.trigram)}', "
                         "content_rowid='id', tokenize='trigram', detail='none', columnsize=0)"),
    ("table", n.cjk, cjk_table_sql(n)),
    ("view", n.source(n.reasoning),
     f"CREATE VIEW {n.source(n.reasoning)} AS SELECT id, {reasoning_text('messages')} AS reasoning "
     f"FROM messages WHERE {reasons('messages')}{also}"),
    ("table", n.reasoning, f"CREATE VIRTUAL TABLE {n.reasoning} USING fts5(reasoning, "
                           f"content='{n.source(n.reasoning)}', content_rowid='id')"),
    ("table", n.cjk_pending, f"CREATE TABLE {n.cjk_pending} (id INTEGER PRIMARY KEY)"),
    )


def _triggers(n: Names, queued: bool) -> tuple[tuple[str, str, str], ...]:
    """Return the declared triggers; without `queued`, the layout before the writer's queue existed."""
    def gate(row_id: str) -> str:  # the rebuild gate, and the queue's when the queue exists
        return indexed(row_id, n) if queued else rebuild_gate(row_id, n)
    word, trigram, reasoning, cjk, cjk_pending = n.word, n.trigram, n.reasoning, n.cjk, n.cjk_pending
    add_reasoning = (f"INSERT INTO {reasoning}(rowid, reasoning) SELECT new.id, {reasoning_text('new')} "
                     f"WHERE {reasons('new')}; ")
    remove_reasoning = (f"INSERT INTO {reasoning}({reasoning}, rowid, reasoning) SELECT 'delete', old.id, "
                        f"{reasoning_text('old')} WHERE {reasons('old')}; ")
    current = n == NAMES  # the word index has the document's own triggers; the reasoning index rides the substrings'
    words = () if current else (
    ("trigger", f"{word}_insert",
     f"CREATE TRIGGER {word}_insert AFTER INSERT ON messages WHEN {gate('new.id')} BEGIN "
     f"INSERT INTO {word}(rowid, content, tool_name, tool_calls) "
     f"VALUES (new.id, new.content, new.tool_name, new.tool_calls); "
     f"{add_reasoning}"
     "END"),)
    word_delete = () if current else (
    ("trigger", f"{word}_delete",
     f"CREATE TRIGGER {word}_delete AFTER DELETE ON messages WHEN {gate('old.id')} BEGIN "
     f"INSERT INTO {word}({word}, rowid, content, tool_name, tool_calls) "
     f"VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls); "
     f"{remove_reasoning}"
     "END"),)
    word_update = () if current else (
    ("trigger", f"{word}_update",
     f"CREATE TRIGGER {word}_update AFTER UPDATE OF id, role, content, tool_name, tool_calls ON messages "
     "BEGIN "
     f"INSERT INTO {word}({word}, rowid, content, tool_name, tool_calls) "
     f"SELECT 'delete', old.id, old.content, old.tool_name, old.tool_calls WHERE {gate('old.id')}; "
     f"INSERT INTO {word}(rowid, content, tool_name, tool_calls) "
     f"SELECT new.id, new.content, new.tool_name, new.tool_calls WHERE {gate('new.id')}; "
     "END"),)
    return (
    *words,
    ("trigger", f"{trigram}_insert",
     f"CREATE TRIGGER {trigram}_insert AFTER INSERT ON messages WHEN {gate('new.id')} BEGIN "
     f"INSERT INTO {trigram}(rowid, content) VALUES (new.id, {searchable_text('new')}); "
     f"{add_reasoning if current else ''}"
     "END"),
    *word_delete,
    ("trigger", f"{trigram}_delete",
     f"CREATE TRIGGER {trigram}_delete AFTER DELETE ON messages WHEN {gate('old.id')} BEGIN "
     f"INSERT INTO {trigram}({trigram}, rowid, content) VALUES ('delete', old.id, {searchable_text('old')}); "
     f"{remove_reasoning if current else ''}"
     "END"),
    *word_update,
    ("trigger", f"{trigram}_update",
     f"CREATE TRIGGER {trigram}_update AFTER UPDATE OF id, role, content, tool_name, tool_calls ON messages "
     "BEGIN "
     f"INSERT INTO {trigram}({trigram}, rowid, content) SELECT 'delete', old.id, {searchable_text('old')} "
     f"WHERE {gate('old.id')}; "
     f"INSERT INTO {trigram}(rowid, content) SELECT new.id, {searchable_text('new')} WHERE {gate('new.id')}; "
     "END"),
    ("trigger", f"{reasoning}_update",
     f"CREATE TRIGGER {reasoning}_update AFTER UPDATE OF id, reasoning, reasoning_content ON messages "
     f"BEGIN INSERT INTO {reasoning}({reasoning}, rowid, reasoning) SELECT 'delete', old.id, {reasoning_text('old')} "
     f"WHERE {reasons('old')} AND {gate('old.id')}; "
     f"INSERT INTO {reasoning}(rowid, reasoning) SELECT new.id, {reasoning_text('new')} "
     f"WHERE {reasons('new')} AND {gate('new.id')}; END"),
    # The CJK index cannot be fed by persistent triggers (they would need our function, and a
    # plain shell has none), so persistent triggers only queue possibly-CJK rows; this library's
    # connections drain the queue at once through a TEMP trigger, other writers leave it for the
    # next open. Deleted and updated rows are queued too, so their stale terms are removed.
    ("trigger", f"{cjk}_insert",
     f"CREATE TRIGGER {cjk}_insert AFTER INSERT ON messages WHEN {_wide('new')} BEGIN "
     f"INSERT OR REPLACE INTO {cjk_pending}(id) VALUES (new.id); "
     "END"),
    ("trigger", f"{cjk}_delete",
     f"CREATE TRIGGER {cjk}_delete AFTER DELETE ON messages WHEN {_wide('old')} BEGIN "
     f"INSERT OR REPLACE INTO {cjk_pending}(id) VALUES (old.id); "
     "END"),
    ("trigger", f"{cjk}_update",
     f"CREATE TRIGGER {cjk}_update AFTER UPDATE OF id, content, tool_calls ON messages "
     f"WHEN {_wide('old')} OR {_wide('new')} BEGIN "
     f"INSERT OR REPLACE INTO {cjk_pending}(id) SELECT old.id WHERE old.id IS NOT new.id; "
     f"INSERT OR REPLACE INTO {cjk_pending}(id) VALUES (new.id); "
     "END"),
    )


def _queue(n: Names) -> tuple[str, str, str]:
    return ("table", n.pending, f"CREATE TABLE {n.pending} (id INTEGER PRIMARY KEY)")


Layout = tuple[tuple[str, str, str], ...]


def _layouts(n: Names) -> tuple[Layout, Layout, Layout]:
    # The current layout, then the older ones whose indexes hold exactly what it would: one release
    # older, the content sources held every row (queued ones too); two releases older, there was no
    # writer's queue and the triggers had no queue gate.
    return ((*_tables(n, True), _queue(n), *_triggers(n, True)),
            (*_tables(n, False), _queue(n), *_triggers(n, True)),
            (*_tables(n, False), *_triggers(n, False)))


OBJECTS = (*DOCUMENT_OBJECTS, *_layouts(NAMES)[0])
# The layouts earlier releases made, under hermes-agent's names: the current one, the one whose
# sources held queued rows, the one before the queue. Open moves any of them into NAMES by renaming,
# with no re-indexing (their indexes hold exactly what the current layout's would). Each object
# is known by its exact SQL; one of another definition under those names is hermes-agent's and is
# never touched.
LEGACY_OBJECTS_V31, UNGATED_OBJECTS, UNQUEUED_OBJECTS = CONVERTIBLE_LAYOUTS = _layouts(LEGACY_NAMES)
LEGACY_OBJECTS = frozenset(obj for layout in CONVERTIBLE_LAYOUTS for obj in layout)
# Every object a release of this schema version made: what a file to restore may carry.
OWN_OBJECTS = frozenset(OBJECTS) | LEGACY_OBJECTS
OBJECT_NAMES = frozenset(name for _, name, _ in OBJECTS)
# The names of earlier layouts that no hermes-agent release uses: whatever holds them is the library's.
LIBRARY_ONLY_NAMES = frozenset({LEGACY_NAMES.source(LEGACY_NAMES.word), LEGACY_NAMES.source(LEGACY_NAMES.trigram),
                                LEGACY_NAMES.reasoning, LEGACY_NAMES.source(LEGACY_NAMES.reasoning),
                                f"{LEGACY_NAMES.reasoning}_update", LEGACY_NAMES.pending, LEGACY_NAMES.cjk_pending})
# Each earlier table with the name it moves to; the word index keeps its name (its statement becomes
# the document's), the views and triggers are made afresh.
RENAMES = {getattr(LEGACY_NAMES, key): getattr(NAMES, key) for key in ("trigram", "cjk", "reasoning", "pending",
                                                                          "cjk_pending")}

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


# --- the declarations as scripts ----------------------------------------------------------------------

def _script(objects: tuple[tuple[str, str, str], ...]) -> str:
    # Each statement as sqlite_master stores it, made idempotent, so the script runs on any file.
    return "".join(re.sub(r"^CREATE (VIRTUAL TABLE|TABLE|VIEW|TRIGGER) ", r"CREATE \1 IF NOT EXISTS ", sql) + ";\n"
                   for _, _, sql in objects)


# The full-text objects except the substring index (word, reasoning and CJK indexes, their
# queues and triggers), and the substring index alone. Run after SCHEMA_SQL.
FTS_SQL = _script(tuple(o for o in OBJECTS if TRIGRAM not in o[1]))
FTS_TRIGRAM_SQL = _script(tuple(o for o in OBJECTS if TRIGRAM in o[1]))
