"""The writer's queue: messages a library handle appends and indexes itself, in batches.

Owns: `flush`, for a handle about to search or close, and the reason for the queue (below).
The write-time part is the message write's own step and lives beside it in
hermes_state_messages: `reserve_id` (the row's id queued in `messages_fts_pending`, only when the
file holds exactly the declared FTS objects, checked against the schema cookie inside the write
transaction) and `after_insert` (the queue indexed in one batch once it holds `BATCH_ROWS`
rows); the batch itself is hermes_state_fts's `index_batch`. Those names are re-exported here.
Does not own: the objects and their SQL (hermes_state_fts_objects), searching the queued rows
(hermes_state_search).

Why: FTS5 writes a new segment in every index at each flush of its pending terms, and a flush
happens at the end of every statement that changes an index inside a transaction. Indexing each
message on its own wrote three segments per message; a batch writes three per batch. A queued row
is committed like any other and searches find it by scanning the queue, so nothing waits for the
batch. Other programs writing the file (no queue rows of theirs) are indexed by the triggers as before.

Transaction contract: `reserve_id` and `after_insert` run inside the caller's write transaction;
`flush` opens its own short one, and never raises.
"""
from __future__ import annotations

import hermes_state_fts as fts
from hermes_state_common import logger
from hermes_state_fts import index_batch as index_batch
from hermes_state_messages import BATCH_ROWS as BATCH_ROWS, QUEUED_SINCE_COUNT
from hermes_state_messages import after_insert as after_insert, reserve_id as reserve_id
from hermes_state_writer import RetryPolicy, Writer


def flush(writer: Writer, patience_s: float, policy: RetryPolicy) -> None:
    """Index whatever the queue holds, in its own write transaction; log, never raise.

    A handle runs it before it searches and when it closes, so its own searches read every row
    from the indexes and other programs find its rows once it is done.
    """
    if not QUEUED_SINCE_COUNT.get(id(writer.conn)):
        return  # nothing queued through this connection since its queue was last emptied: no SQL at all
    try:
        with writer.transaction(patience_s, policy) as conn:
            state = fts.inspect(conn)
            if state.declared and state.queued:
                index_batch(conn)
        QUEUED_SINCE_COUNT[id(writer.conn)] = 0
    except Exception as exc:  # noqa: BLE001 - searches scan queued rows; the next batch or open indexes them
        logger.info("indexing the queued messages was put off: %s", exc)
