"""Session lineage: the parent links, the compression edge and every walk over them.

Owns: `COMPRESSION_END_REASON`, the compression edge (`COMPRESSION_CHILD_SQL`: which child
continues a session compression closed; `compression_links`, every such edge at once), the walks along it (`compression_successor_id`,
`compression_ancestor_ids`, `live_continuation`, `compression_chain_ids`, `resolve_resume_session_id`)
and the plain parent-link walks (`get_lineage`, `get_descendants`, `get_conversation_root`). Every walk is cycle-safe and visits at most `WALK_CAP`
sessions, so bad data is bounded, never an endless loop.
Does not own: writing sessions or ending them (hermes_state_sessions), rotating
(hermes_state_compression).

Transaction contract: read-only functions on the caller's connection; they never write,
open or commit a transaction.
"""
from __future__ import annotations

import sqlite3
from collections import defaultdict
from typing import Any

from hermes_state_common import SESSION_ROW_SQL, has_surrogate, session_dicts

# The end reason rotate_session stamps on a parent it continues in a compression child.
COMPRESSION_END_REASON = "compression"
WALK_CAP = 10_000  # sessions a walk may visit

# The compression edge, as SQL over an outer `sessions` row aliased `p`: the id of p's
# compression child, or NULL. rotate_session creates that child in the transaction that ends p
# and stamps child.started_at and p.ended_at with one Python float, so they compare equal
# exactly; several such children -> the lowest rowid (the one the rotation inserted). Databases
# written before that stamp (the child created in its own write right after the end) fall back
# to p's oldest child started no earlier than COMPRESSION_EDGE_SLACK_S before p ended. Branches
# and other later children are never the edge while an exact child exists. A session ended by
# compression without an end time (imported from hermes-agent, which follows the parent link
# alone) takes its oldest child. Successor and ancestor walks both use this one fragment, so
# they always agree.
COMPRESSION_EDGE_SLACK_S = 1.0
# Two lookups, not one ORDER BY: SQLite's ORDER BY in a correlated subquery cannot name the outer row.
COMPRESSION_CHILD_SQL = (
    f"CASE WHEN p.end_reason = '{COMPRESSION_END_REASON}' THEN COALESCE("
    "(SELECT cc.id FROM sessions cc WHERE cc.parent_session_id = p.id AND cc.started_at = p.ended_at "
    "ORDER BY cc.rowid LIMIT 1), "
    "(SELECT cc.id FROM sessions cc WHERE cc.parent_session_id = p.id "
    f"AND (p.ended_at IS NULL OR cc.started_at >= p.ended_at - {COMPRESSION_EDGE_SLACK_S!r}) "
    "ORDER BY cc.started_at, cc.rowid LIMIT 1)) END")


def compression_links(conn: sqlite3.Connection) -> dict[str, str]:
    """Return {session: the session that continues it} for every session compression closed."""
    # A compression parent has a child, so the candidates are the few sessions some session names
    # as its parent (a range of the parent index, past its NULLs), not every session: on a
    # cron-heavy store that is tens of thousands of index entries against a few hundred.
    rows = conn.execute(f"SELECT p.id, {COMPRESSION_CHILD_SQL} FROM sessions p "
                        "WHERE p.id IN (SELECT parent_session_id FROM sessions WHERE parent_session_id IS NOT NULL) "
                        f"AND p.end_reason = '{COMPRESSION_END_REASON}'")
    return {parent: child for parent, child in rows if child is not None and child != parent}


def forward_chain(start: str, links: dict[str, str]) -> list[str]:
    """Return `start` and the sessions that continue it in `links` (from compression_links), in order."""
    chain, seen = [start], {start}
    while chain[-1] in links and links[chain[-1]] not in seen and len(chain) < WALK_CAP:
        chain.append(links[chain[-1]])
        seen.add(chain[-1])
    return chain


def compression_ancestor_ids(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """Return the compression ancestors' ids, oldest first (not the session itself; [] when none).

    Steps to the parent only while the session is that parent's compression child;
    reset/branch parents and later children end the walk. A session already on the path stops it.
    """
    rows = conn.execute(
        f"""WITH RECURSIVE chain(id, parent, depth, path) AS (
               SELECT id, parent_session_id, 0, json_array(id) FROM sessions WHERE id = ?
               UNION ALL
               SELECT p.id, p.parent_session_id, ch.depth + 1, json_insert(ch.path, '$[#]', p.id)
               FROM chain ch JOIN sessions p ON p.id = ch.parent
               WHERE p.end_reason = '{COMPRESSION_END_REASON}' AND {COMPRESSION_CHILD_SQL} = ch.id
                 AND NOT EXISTS (SELECT 1 FROM json_each(ch.path) WHERE json_each.value = p.id)
                 AND ch.depth < {WALK_CAP}
           )
           SELECT id FROM chain WHERE depth > 0 ORDER BY depth DESC""", (session_id,)).fetchall()
    return [r[0] for r in rows]


def compression_successor_id(conn: sqlite3.Connection, session_id: str) -> str | None:
    """Return the live tip of the session's compression chain: the id itself when nothing follows it.

    An unknown id gives None. A parent_session_id cycle planted by bad data ends the walk at
    the last new session.
    """
    # UNION (not UNION ALL) queues each id once, so a cycle cannot loop; the path order is
    # rebuilt in Python from the (id, next) links.
    rows = conn.execute(
        f"""WITH RECURSIVE walk(id) AS (
                SELECT id FROM sessions WHERE id = ?
                UNION
                SELECT {COMPRESSION_CHILD_SQL} FROM walk w JOIN sessions p ON p.id = w.id
                 WHERE p.end_reason = '{COMPRESSION_END_REASON}'
                LIMIT {WALK_CAP}
            )
            SELECT p.id, {COMPRESSION_CHILD_SQL} FROM walk w JOIN sessions p ON p.id = w.id""",
        (session_id,)).fetchall()
    links = dict(rows)
    if session_id not in links:
        return None
    current, seen = session_id, {session_id}
    while links.get(current) is not None and links[current] in links and links[current] not in seen:
        current = links[current]
        seen.add(current)
    return current


def live_continuation(conn: sqlite3.Connection, session_id: str) -> str | None:
    """Return the live tip that continues a session compression closed, or None when it has none."""
    tip = compression_successor_id(conn, session_id)
    return None if tip == session_id else tip


# Both parent-link walks collect ids with a recursive CTE using UNION (not UNION ALL): a row
# already in the result is not queued again, so a cycle ends the walk instead of looping; the
# order is then rebuilt in Python from the links.

def get_lineage(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """Return the session's ancestors oldest first, ending with the session itself.

    Every row is a full `sessions` row. An unknown session gives []. On a cycle the walk stops
    at the first repeated session.
    """
    rows = session_dicts(conn.execute(
        f"""WITH RECURSIVE lineage(id) AS (
                SELECT id FROM sessions WHERE id = ?
                UNION
                SELECT s.parent_session_id FROM sessions s JOIN lineage l ON s.id = l.id
                 WHERE s.parent_session_id IS NOT NULL
                LIMIT {WALK_CAP}
            )
            SELECT {SESSION_ROW_SQL} FROM sessions s JOIN lineage l ON s.id = l.id""", (session_id,)))
    by_id = {row["id"]: row for row in rows}
    chain: list[dict[str, Any]] = []
    current: str | None = session_id
    while current in by_id:
        chain.append(by_id.pop(current))  # pop: a cycle cannot revisit a row
        current = chain[-1]["parent_session_id"]
    chain.reverse()
    return chain


def get_descendants(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """Return every descendant of the session (not the session itself), breadth-first.

    Siblings come in (started_at, id) order. An unknown session or a leaf gives []. On a cycle
    each session appears once.
    """
    rows = session_dicts(conn.execute(
        f"""WITH RECURSIVE descendants(id) AS (
                SELECT id FROM sessions WHERE id = ?
                UNION
                SELECT s.id FROM sessions s JOIN descendants d ON s.parent_session_id = d.id
                LIMIT {WALK_CAP}
            )
            SELECT {SESSION_ROW_SQL} FROM sessions s JOIN descendants d ON s.id = d.id
             WHERE s.id != ? ORDER BY s.started_at, s.id""", (session_id, session_id)))
    children: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:  # already in (started_at, id) order, so each child list is too
        children[row["parent_session_id"]].append(row)
    out: list[dict[str, Any]] = []
    seen = {session_id}
    level = [session_id]
    while level:
        following = []
        for parent in level:
            for row in children.get(parent, ()):
                if row["id"] not in seen:
                    seen.add(row["id"])
                    out.append(row)
                    following.append(row["id"])
        level = following
    return out


def compression_chain_ids(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """Return the whole compression chain the session belongs to, oldest first ([] when unknown).

    Its compression ancestors, the session, then each session that continued it up to the
    live tip. Cycle-safe and bounded like every walk here.
    """
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        return []
    chain = compression_ancestor_ids(conn, session_id) + [session_id]
    seen = set(chain)
    while len(chain) < WALK_CAP:
        row = conn.execute(f"SELECT {COMPRESSION_CHILD_SQL} FROM sessions p WHERE p.id = ?", (chain[-1],)).fetchone()
        if row is None or row[0] is None or row[0] in seen:
            break
        chain.append(row[0])
        seen.add(row[0])
    return chain


def get_conversation_root(conn: sqlite3.Connection, session_id: str) -> str:
    """Return the top of the session's parent links (the session itself when it has no parent, or is unknown)."""
    if not isinstance(session_id, str) or has_surrogate(session_id):
        return session_id  # no stored id is anything else
    chain = get_lineage(conn, session_id)
    return chain[0]["id"] if chain else session_id


def resolve_resume_session_id(conn: sqlite3.Connection, session_id: str) -> str:
    """Return the session a resume of `session_id` should load: its compression chain's live tip, else the id itself."""
    if not isinstance(session_id, str) or has_surrogate(session_id):
        return session_id
    return compression_successor_id(conn, session_id) or session_id
