"""The writer's queue: messages a library handle appends and indexes itself, in batches.

Owns: deciding whether an insert may skip the triggers' indexing (only when the file holds
exactly the declared FTS objects, checked against the schema cookie inside the write
transaction), reserving the row's id in `messages_fts_pending` before the row is written, indexing
the queue in one batch once it holds `BATCH_ROWS` rows, and `flush` for a handle about to search
or close. Does not own: the objects and their SQL (hermes_state_fts_objects), the batch's
statements (hermes_state_fts.index_queued), searching the queued rows (hermes_state_search).

Why: FTS5 writes a new segment in every index at each flush of its pending terms, and a flush
happens at the end of every statement that changes an index inside a transaction. Indexing each
message on its own wrote three segments per message; a batch writes three per batch. A queued row
is committed like any other and searches find it by scanning the queue, so nothing waits for the
batch. Other programs writing the file (no queue rows of theirs) are indexed by the triggers as before.

Transaction contract: `reserve_id` and `after_insert` run inside the caller's write transaction;
`flush` opens its own short one, and never raises.
"""
from __future__ import annotations

import sqlite3

import hermes_state_fts as fts
from hermes_state_common import logger
from hermes_state_writer import RetryPolicy, Writer

# Rows per batch: each costs one FTS5 segment per index instead of one per row. Searches scan
# at most this many queued rows of a handle that has not searched or closed since.
BATCH_ROWS = 128

# The new row's id, as AUTOINCREMENT would pick it, queued in one statement that also checks the
# schema cookie and this connection's token (see fts.cached_state): no row is queued when the
# catalogue may have changed since it was read, so a file whose triggers another program replaced
# is never indexed twice.
_RESERVE_SQL = (f"INSERT OR REPLACE INTO {fts.PENDING}(id) SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence "
                "WHERE name = 'messages'), 0), COALESCE((SELECT MAX(id) FROM messages), 0)) + 1 "
                f"FROM pragma_schema_version WHERE schema_version = ? AND {fts.TOKEN_FUNCTION}() = ?")


def reserve_id(conn: sqlite3.Connection) -> int | None:
    """Queue the id the next message row will get and return it; None when the triggers must index it.

    The caller inserts the row with this id in the same transaction. Only a file holding exactly
    the declared FTS objects (with no rebuild needed) queues rows.
    """
    for _ in range(2):
        entry = fts.cached_catalogue(conn)
        if entry is None:
            fts.cached_state(conn)  # reads the catalogue and gives this connection its token
            continue
        token, version, catalogue = entry
        if not (catalogue.declared and catalogue.pending):
            return None
        try:
            cursor = conn.execute(_RESERVE_SQL, (version, token))
        except sqlite3.OperationalError:
            cursor = None  # no token function on this connection: a new connection reusing an old id()
        if cursor is not None and cursor.rowcount == 1:
            return cursor.lastrowid
        fts.cached_state(conn)  # the schema changed: read the catalogue again, then decide again
    return None


# Rows queued per connection since its queue was last counted: the count is read only when this
# says a batch may be due (a rollback or another path emptying the queue makes it only too high).
_since_count: dict[int, int] = {}


def after_insert(conn: sqlite3.Connection) -> None:
    """Index the queue in one batch once it holds BATCH_ROWS rows (inside the caller's transaction)."""
    queued = _since_count.get(id(conn), 0) + 1
    if queued >= BATCH_ROWS:
        queued = conn.execute(f"SELECT COUNT(*) FROM {fts.PENDING}").fetchone()[0]
        if queued >= BATCH_ROWS:
            index_batch(conn)
            queued = 0
    if len(_since_count) > 256:
        _since_count.clear()  # entries of closed connections; a live one only counts its queue once more
    _since_count[id(conn)] = queued


def index_batch(conn: sqlite3.Connection) -> None:
    """Index the queued rows into every index, the CJK one included (needs the library's SQL function)."""
    fts.index_queued(conn)
    while fts.drain_cjk(conn):
        pass


def flush(writer: Writer, patience_s: float, policy: RetryPolicy) -> None:
    """Index whatever the queue holds, in its own write transaction; log, never raise.

    A handle runs it before it searches and when it closes, so its own searches read every row
    from the indexes and other programs find its rows once it is done.
    """
    if not _since_count.get(id(writer.conn)):
        return  # nothing queued through this connection since its queue was last emptied: no SQL at all
    try:
        with writer.transaction(patience_s, policy) as conn:
            state = fts.inspect(conn)
            if state.declared and state.queued:
                index_batch(conn)
        _since_count[id(writer.conn)] = 0
    except Exception as exc:  # noqa: BLE001 - searches scan queued rows; the next batch or open indexes them
        logger.info("indexing the queued messages was put off: %s", exc)
