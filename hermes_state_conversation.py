"""The conversation projection: a session's live rows as OpenAI-format message dicts.

Owns: turning active `messages` rows into the dicts an agent replays (the bytes that were sent
win over the display text; reasoning fields on assistant turns only; tool-call uids derived
where rows lack them), and stitching compression ancestors in front without replaying a
message twice.
Does not own: writing rows (hermes_state_messages), wire formats per provider
(hermes_state_provider), the compression edge (hermes_state_lineage).

Transaction contract: read-only; call it inside one read snapshot so the ancestors and the
session are read at the same moment.
"""
from __future__ import annotations

import sqlite3
import uuid
from typing import Any

import hermes_state_lineage as lineage
from hermes_state_common import decode_json, row_dicts
from hermes_state_messages import DISPLAY_KEY, pick_tool_call_uid

_CONVERSATION_SQL = ("SELECT id, role, content, api_content, tool_calls, tool_call_id, tool_name, reasoning, "
                     "reasoning_content, reasoning_details, codex_reasoning_items, codex_message_items, "
                     "message_uid, absorbed_message_uids, tool_call_uids, tool_call_uid, session_id, content_parts "
                     "FROM messages "
                     "WHERE session_id = ? AND active = 1 ORDER BY id")
# Reasoning fields an assistant turn carries: plain text ("" too: some routes need the empty
# field), then JSON ones.
_REASONING_TEXT = ("reasoning", "reasoning_content")
_REASONING_JSON = ("reasoning_details", "codex_reasoning_items", "codex_message_items")


# Rows written by older programs may lack a message_uid. They get a stable one derived from
# where they live, so a copy made from the conversation (compression, rotation) keeps naming
# the same message and replay across a compression seam shows it once.
_DERIVED_UID_NAMESPACE = uuid.UUID("5b0c3f52-2d7e-4f8a-9a35-7c1e0e6f4a21")


def derived_uid(session_id: str, row_id: int) -> str:
    """Return the stable uid the conversation gives a stored row that has none."""
    return uuid.uuid5(_DERIVED_UID_NAMESPACE, f"{session_id}/{row_id}").hex


class _Projector:
    """Turns rows into conversation dicts, deriving tool-call uids the rows lack."""

    def __init__(self, with_row_ids: bool):
        self.with_row_ids = with_row_ids
        self.turn_uids: dict[str, Any] = {}
        self.answered: dict[str, int] = {}

    def message(self, r: dict[str, Any]) -> dict[str, Any]:
        """Return the conversation dict of one row (a dict of _CONVERSATION_SQL's columns)."""
        role, content, api_content = r["role"], r["content"], r["api_content"]
        # Replay fidelity: the bytes that were sent win over the display text; a multimodal
        # message was sent as its list of parts.
        msg: dict[str, Any] = {"role": role, "content": api_content if api_content is not None else content}
        if r["content_parts"] is not None:
            msg["content"] = decode_json(r["content_parts"])
        elif api_content is not None and api_content != content:
            # Runtime-only (never sent): lets replace_messages/compression write both columns back.
            msg[DISPLAY_KEY] = content
        if r["tool_calls"] is not None:
            msg["tool_calls"] = decode_json(r["tool_calls"])
        if r["tool_call_id"] is not None:
            msg["tool_call_id"] = r["tool_call_id"]
        if r["tool_name"] is not None:
            msg["name"] = r["tool_name"]
        if role == "assistant":
            self._assistant(msg, r)
        msg["message_uid"] = r["message_uid"] or derived_uid(r["session_id"], r["id"])
        if self.with_row_ids:
            msg["_row_id"] = r["id"]
        if role == "assistant" and r["tool_call_uids"] is not None:
            msg["_tool_call_uids"] = self.turn_uids
        if role == "tool" and r["tool_call_id"] is not None:
            derived = self._answer_uid(r["tool_call_id"], r["tool_call_uid"])
            if derived is not None:
                msg["_tool_call_uid"] = derived
        if r["absorbed_message_uids"] is not None:
            msg["_absorbed_message_uids"] = decode_json(r["absorbed_message_uids"])
        return msg

    def _assistant(self, msg: dict[str, Any], r: dict[str, Any]) -> None:
        for key in _REASONING_TEXT:
            if r[key] is not None:
                msg[key] = r[key]
        for key in _REASONING_JSON:
            if r[key] is not None:
                msg[key] = decode_json(r[key])
        uids = decode_json(r["tool_call_uids"]) if r["tool_call_uids"] is not None else {}
        self.turn_uids = uids if isinstance(uids, dict) else {}
        self.answered = {}

    def _answer_uid(self, tool_call_id: str, stored: str | None) -> str | None:
        # The Nth result of one call id answers the Nth uid of a merged turn's list.
        nth = self.answered.get(tool_call_id, 0)
        self.answered[tool_call_id] = nth + 1
        return stored if stored is not None else pick_tool_call_uid(self.turn_uids.get(tool_call_id), nth)


def get_messages_as_conversation(conn: sqlite3.Connection, session_id: str, include_ancestors: bool = False,
                                 with_row_ids: bool = False) -> list[dict[str, Any]]:
    """Return the active rows as OpenAI-format dicts, compression ancestors first when asked.

    Each dict has role, content (api_content when set), tool_calls/tool_call_id/name when
    present, the assistant's reasoning fields, message_uid, `_row_id` when asked, and the
    runtime-only `_tool_call_uids`/`_tool_call_uid`/`_absorbed_message_uids` when known, and
    `_display_content` (the stored content) when api_content differs from it.
    Across a compression seam, copies of messages already replayed (same uid) and a user
    prompt identical to the one just replayed are skipped. Call it inside one read snapshot.
    """
    chain = [*lineage.compression_ancestor_ids(conn, session_id), session_id] if include_ancestors else [session_id]
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    projector = _Projector(with_row_ids)
    for position, sid in enumerate(chain):
        at_seam = position > 0
        emitted = []
        for r in row_dicts(conn.execute(_CONVERSATION_SQL, (sid,))):
            msg = projector.message(r)
            if msg["message_uid"] in seen:
                continue  # a rotation copy of a message an ancestor already replayed
            repeated = (at_seam and bool(out) and msg["role"] == "user" and out[-1]["role"] == "user"
                        and msg["content"] == out[-1]["content"])
            at_seam = False
            if repeated:
                continue  # the prompt the child re-sent after the seam; shown once
            out.append(msg)
            emitted.append(msg["message_uid"])
        seen.update(emitted)
    return out
