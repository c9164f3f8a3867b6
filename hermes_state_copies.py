"""A message copied into a generation: the list check and the fields a conversation dict drops.

Owns: `message_list` (a list of message dicts, one message_uid at most once) and
`with_stored_fields` (the fields a conversation dict does not carry, filled from the stored row
of its message_uid). Does not own: validating and inserting the rows (hermes_state_messages, which
re-exports both names), compression generations (hermes_state_compression).

Transaction contract: `with_stored_fields` reads under the caller's transaction; `message_list`
runs no SQL.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterable

from hermes_state_common import row_dicts


def message_list(messages: Iterable[dict[str, Any]], what: str = "message") -> list[dict[str, Any]]:
    """Return `messages` as a list of dicts; raise ValueError for anything else or one message_uid twice.

    A uid names one message: two live rows with the same uid would be two copies of it in one
    generation, which compression and replay cannot tell apart.
    """
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Iterable):
        raise ValueError(f"{what}s must be a list of message dicts")
    out = list(messages)
    first_with: dict[str, int] = {}
    for index, message in enumerate(out):
        if not isinstance(message, dict):
            raise ValueError(f"{what} {index} is not a dict")
        uid = message.get("message_uid")
        if isinstance(uid, str) and uid in first_with:
            raise ValueError(f"{what}s {first_with[uid]} and {index} have the same message_uid {uid!r}; "
                             "a message appears at most once in a generation")
        if isinstance(uid, str):
            first_with[uid] = index
    return out


# What a stored row knows about a message that its conversation dict does not carry. A copy
# (compression, rotation) keeps these unless the caller's dict gives its own value.
_KEPT_FROM_STORED = ("timestamp", "effect_disposition", "observed", "platform_message_id", "display_kind",
                     "display_metadata", "token_count", "finish_reason")


def with_stored_fields(conn: sqlite3.Connection, session_id: str,
                       messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return `messages` with the fields a conversation dict drops filled from the stored row of its uid.

    The row is looked up by message_uid (this session's live row first, then its archive,
    then any other copy); keys the dict already carries (not None) win.
    """
    uids = [m["message_uid"] for m in messages if isinstance(m.get("message_uid"), str)]
    if not uids:
        return messages
    stored: dict[str | None, dict[str, Any]] = {}
    # Ascending preference: later rows overwrite earlier ones in `stored`.
    for row in row_dicts(conn.execute(
            f"SELECT message_uid, {', '.join(_KEPT_FROM_STORED)} FROM messages "
            "WHERE message_uid IN (SELECT value FROM json_each(?)) "
            "ORDER BY session_id = ?, active, id", (json.dumps(uids), session_id))):
        stored[row.pop("message_uid")] = row
    out = []
    for message in messages:
        known = stored.get(message.get("message_uid"))
        if known:
            message = {**{k: v for k, v in known.items() if v is not None},
                       **{k: v for k, v in message.items() if v is not None or k not in known}}
        out.append(message)
    return out
