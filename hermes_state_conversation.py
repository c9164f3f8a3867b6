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

import json
import re
import sqlite3
from itertools import chain
from operator import itemgetter
from typing import Any, Iterable, Iterator

import hermes_state_lineage as lineage
from hermes_state_common import decode_json, derived_uid
from hermes_state_messages import DISPLAY_KEY, pick_tool_call_uid
from hermes_state_schema import StreamedRead, read_strict_text

# The columns a conversation reads, in the order Projector.message unpacks each row.
_COLUMNS = ("id", "role", "content", "api_content", "tool_calls", "tool_call_id", "tool_name", "reasoning",
            "reasoning_content", "reasoning_details", "codex_reasoning_items", "codex_message_items",
            "message_uid", "absorbed_message_uids", "tool_call_uids", "tool_call_uid", "content_parts",
            "timestamp", "finish_reason", "observed", "platform_message_id", "effect_disposition")
_CONVERSATION_SQL = f"SELECT {', '.join(_COLUMNS)} FROM messages WHERE session_id = ?"
_LIVE_ONLY, _BY_ID = " AND active = 1", " ORDER BY id"
# The columns every row of a conversation uses. The others are NULL on most rows (on every row
# hermes-agent wrote without reasoning or delivery fields), and each column read costs the
# sqlite3 module a call into SQLite per row (on Python 3.11 releasing and taking back the GIL
# too): the lean read takes these and one flag saying a row holds any other, and the flagged
# rows are read again by id with every column (Projector.plain makes the rest).
_COMMON = ("id", "role", "content", "tool_calls", "tool_call_id", "tool_name", "timestamp", "message_uid")
_HOLDS_MORE = " OR ".join(f"{c} IS NOT NULL" for c in _COLUMNS if c not in _COMMON and c != "observed")
_LEAN_SQL = (f"SELECT {', '.join(_COMMON)}, ({_HOLDS_MORE} OR COALESCE(observed, 0) != 0) FROM messages "
             "WHERE session_id = ?")
_BY_IDS_SQL = f"SELECT {', '.join(_COLUMNS)} FROM messages WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id"
# The JSON reasoning fields an assistant turn carries (after its plain-text ones).
_REASONING_JSON = ("reasoning_details", "codex_reasoning_items", "codex_message_items")


def _sent_content(msg: dict[str, Any], content: Any, api_content: Any, content_parts: Any) -> None:
    # Replay fidelity: the bytes that were sent win over the display text (msg["content"] is
    # api_content already); a multimodal message was sent as its list of parts.
    if content_parts is not None:
        msg["content"] = decode_json(content_parts)
    elif api_content is not None and api_content != content:
        # Runtime-only (never sent): lets replace_messages/compression write both columns back.
        msg[DISPLAY_KEY] = content


def _add_delivery_fields(msg: dict[str, Any], observed: Any, platform_message_id: Any,
                         effect_disposition: Any) -> None:
    # What a gateway recorded about the message's delivery, under the conversation's names.
    if observed:
        msg["observed"] = True  # a side remark the agent saw but was not asked to answer
    if platform_message_id is not None:
        msg["message_id"] = platform_message_id
    if effect_disposition is not None:
        msg["effect_disposition"] = effect_disposition


class _Projector:
    """Turns rows into conversation dicts, deriving tool-call uids the rows lack."""

    def __init__(self, with_row_ids: bool):
        self.with_row_ids = with_row_ids
        self.session_id = ""  # the session whose rows are being read (derives the uids they lack)
        self.turn_uids: dict[str, Any] = {}
        self.answered: dict[str, int] = {}

    def message(self, row: tuple[Any, ...]) -> dict[str, Any]:
        """Return the conversation dict of one row (a tuple of _COLUMNS)."""
        # One unpacking, no dict per row: a 33,000-message session is read in one pass. This is
        # the loop of that read, so the common fields are set here, without a call, and the rare
        # ones by a call only when present; keys go in in the order the dict is documented in.
        (row_id, role, content, api_content, tool_calls, tool_call_id, tool_name, reasoning, reasoning_content,
         reasoning_details, codex_reasoning_items, codex_message_items, message_uid, absorbed, tool_call_uids,
         tool_call_uid, content_parts, timestamp, finish_reason, observed, platform_message_id,
         effect_disposition) = row
        if api_content is None and content_parts is None:
            msg: dict[str, Any] = {"role": role, "content": content}
        else:
            msg = {"role": role, "content": content if api_content is None else api_content}
            _sent_content(msg, content, api_content, content_parts)
        if tool_calls is not None:
            msg["tool_calls"] = decode_json(tool_calls)
        if tool_call_id is not None:
            msg["tool_call_id"] = tool_call_id
        if tool_name is not None:
            msg["name"] = tool_name
        msg["timestamp"] = timestamp
        if observed or platform_message_id is not None or effect_disposition is not None:
            _add_delivery_fields(msg, observed, platform_message_id, effect_disposition)
        if role == "assistant":
            if finish_reason is not None:
                msg["finish_reason"] = finish_reason
            if api_content is None and isinstance(msg["content"], str) and _MEMORY_OPEN in msg["content"]:
                # Recalled memory the model echoed into its answer is not part of the answer.
                # Bytes recorded as sent (api_content) are replayed as they are.
                msg["content"] = strip_memory_context(msg["content"])
            # Plain text (reasoning_content "" too: some routes need the empty field; an empty
            # `reasoning` is no reasoning), then the JSON documents.
            if reasoning is not None and reasoning != "":
                msg["reasoning"] = reasoning
            if reasoning_content is not None:
                msg["reasoning_content"] = reasoning_content
            if reasoning_details is not None or codex_reasoning_items is not None or codex_message_items is not None:
                _add_reasoning_documents(msg, reasoning_details, codex_reasoning_items, codex_message_items)
            # A new turn: the results after it answer its calls, counted afresh.
            uids = decode_json(tool_call_uids) if tool_call_uids is not None else {}
            self.turn_uids = uids if isinstance(uids, dict) else {}
            self.answered = {}
        # The message's own uid (derived when the row has none), then the runtime-only keys
        # (never sent): the row id when asked, the tool-call uids, the absorbed uids.
        msg["message_uid"] = message_uid or derived_uid(self.session_id, row_id)
        if self.with_row_ids:
            msg["_row_id"] = row_id
        if role == "assistant":
            if tool_call_uids is not None:
                msg["_tool_call_uids"] = self.turn_uids
        elif role == "tool" and tool_call_id is not None and (tool_call_uid is not None or self.turn_uids):
            # With no uids on the turn and none stored, a result has none: nothing to count.
            derived = self._answer_uid(tool_call_id, tool_call_uid)
            if derived is not None:
                msg["_tool_call_uid"] = derived
        if absorbed is not None:
            msg["_absorbed_message_uids"] = decode_json(absorbed)
        return msg

    def plain(self, row: tuple[Any, ...]) -> dict[str, Any]:
        """Return the conversation dict of a row of the lean read (_COMMON and its flag) that holds nothing more.

        The same dict `message` makes of the row with its other columns NULL (observed 0), with
        none of their checks: most rows of a large session take this path.
        """
        row_id, role, content, tool_calls, tool_call_id, tool_name, timestamp, message_uid, _ = row
        msg: dict[str, Any] = {"role": role, "content": content}
        if tool_calls is not None:
            msg["tool_calls"] = decode_json(tool_calls)
        if tool_call_id is not None:
            msg["tool_call_id"] = tool_call_id
        if tool_name is not None:
            msg["name"] = tool_name
        msg["timestamp"] = timestamp
        if role == "assistant":
            if isinstance(content, str) and _MEMORY_OPEN in content:
                msg["content"] = strip_memory_context(content)
            self.turn_uids = {}  # a turn without uids: its results have none to pair
            self.answered = {}
        msg["message_uid"] = message_uid or derived_uid(self.session_id, row_id)
        if self.with_row_ids:
            msg["_row_id"] = row_id
        if role == "tool" and tool_call_id is not None and self.turn_uids:
            derived = self._answer_uid(tool_call_id, None)
            if derived is not None:
                msg["_tool_call_uid"] = derived
        return msg

    def _answer_uid(self, tool_call_id: str, stored: str | None) -> str | None:
        # The Nth result of one call id answers the Nth uid of a merged turn's list.
        nth = self.answered.get(tool_call_id, 0)
        self.answered[tool_call_id] = nth + 1
        return stored if stored is not None else pick_tool_call_uid(self.turn_uids.get(tool_call_id), nth)


def _add_reasoning_documents(msg: dict[str, Any], *documents: Any) -> None:
    # The JSON reasoning fields of an assistant turn, in _REASONING_JSON's order, those stored.
    for key, value in zip(_REASONING_JSON, documents):
        if value is not None:
            msg[key] = decode_json(value)


_MEMORY_OPEN, _MEMORY_CLOSE = "<memory-context>", "</memory-context>"
_MEMORY_BLOCK = re.compile(re.escape(_MEMORY_OPEN) + r".*?" + re.escape(_MEMORY_CLOSE) + r"\s*", re.S)


def strip_memory_context(text: str) -> str:
    """Return `text` without its <memory-context>...</memory-context> blocks (and the blank lines after them)."""
    return _MEMORY_BLOCK.sub("", text).strip() if _MEMORY_OPEN in text else text


# The prompt of the background skill/memory review. That review runs in the user's session for
# prompt-cache warmth; builds that persisted its turn left the prompt and the curator's reply in
# the real transcript, where a resumed agent would take them as standing instructions.
_HARNESS_PREFIX = "Review the conversation above"
_HARNESS_ROLES = ("user", "system")


def is_background_review_harness_message(message: Any) -> bool:
    """Return True for a stored background-review prompt (a user or system turn starting with it)."""
    return (isinstance(message, dict) and message.get("role") in _HARNESS_ROLES
            and isinstance(message.get("content"), str) and message["content"].lstrip().startswith(_HARNESS_PREFIX))


def strip_background_review_harness(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return `messages` without background-review prompts and the assistant reply right after each."""
    out: list[dict[str, Any]] = []
    skip_reply = False
    for message in messages:
        if is_background_review_harness_message(message):
            skip_reply = True
            continue
        if skip_reply and isinstance(message, dict) and message.get("role") == "assistant":
            skip_reply = False
            continue
        skip_reply = False
        out.append(message)
    return out


def repair_alternation(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the conversation with what providers refuse taken out, for sending a transcript again.

    An assistant turn whose tool calls are not all answered by the tool results right after it is
    dropped with those results; a tool result no preceding turn asked for is dropped; of several
    assistant replies in a row (no tool calls) only the last is kept, since it superseded the others.
    """
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            i = _take_answered_turn(messages, i, out)
        elif msg.get("role") == "tool":
            i += 1  # a result nobody asked for
        else:
            if _supersedes(msg, out):
                out[-1] = msg
            else:
                out.append(msg)
            i += 1
    return out


def _take_answered_turn(messages: list[dict[str, Any]], i: int, out: list[dict[str, Any]]) -> int:
    # The tool-calling turn at `i` and the results answering it go to `out` only when every call
    # is answered; return the index past its results.
    wanted = {c.get("id") for c in messages[i]["tool_calls"] if isinstance(c, dict)}
    j = i + 1
    while j < len(messages) and messages[j].get("role") == "tool":
        j += 1
    results = messages[i + 1:j]
    if wanted and wanted <= {r.get("tool_call_id") for r in results}:
        out.append(messages[i])
        out.extend(r for r in results if r.get("tool_call_id") in wanted)
    return j


def _supersedes(msg: dict[str, Any], out: list[dict[str, Any]]) -> bool:
    # An assistant reply right after another one that called no tools replaces it.
    return bool(msg.get("role") == "assistant" and out and out[-1].get("role") == "assistant"
                and not out[-1].get("tool_calls"))


def _repeats_prompt(msg: dict[str, Any], last: dict[str, Any] | None) -> bool:
    return (last is not None and msg["role"] == "user" and last["role"] == "user"
            and msg["content"] == last["content"])


# One stitched read: the messages in order, and where each session's part of them starts.
_Parts = list[tuple[str, int]]


def _stitched(conn: sqlite3.Connection, session_id: str, include_ancestors: bool, with_row_ids: bool,
              include_inactive: bool) -> tuple[list[dict[str, Any]], _Parts]:
    """Return the session's messages, its ancestors' first when asked, and (session id, first index) of each part."""
    return read_strict_text(conn, lambda: _stitch(conn, session_id, include_ancestors, with_row_ids,
                                                  include_inactive))


def _stitch(conn: sqlite3.Connection, session_id: str, include_ancestors: bool, with_row_ids: bool,
            include_inactive: bool) -> tuple[list[dict[str, Any]], _Parts]:
    chain = [row["id"] for row in lineage.get_lineage(conn, session_id)] if include_ancestors else []
    chain = chain or [session_id]
    live = "" if include_inactive else _LIVE_ONLY
    out: list[dict[str, Any]] = []
    parts: _Parts = []
    seen: set[str] = set()
    projector = _Projector(with_row_ids)
    with StreamedRead(conn) as stream:
        for sid in chain:
            parts.append((sid, len(out)))
            projector.session_id = sid
            batches = _projected(conn, sid, live, projector, stream)
            if not include_ancestors:
                # No seams to collapse, no replays to skip: every row is a message.
                for batch in batches:
                    out.extend(batch)
                continue
            # Repeated prompts collapse in the ancestors and across each seam (a prompt re-sent on
            # resume); inside the session itself a repeat is the user's own and stays.
            _read_part(batches, out, seen, sid != session_id)
            if sid != chain[-1]:  # uids only matter to the sessions after this one
                seen.update(m["message_uid"] for m in out[parts[-1][1]:])
    if any(m["role"] in _HARNESS_ROLES and is_background_review_harness_message(m) for m in out):
        return _without_harness(out, parts)
    return out, parts


_BATCH_ROWS = 500
_LEAN_CONTENT, _CONTENT = _COMMON.index("content"), _COLUMNS.index("content")
_OTHER_AT = tuple(i for i, column in enumerate(_COLUMNS) if column not in _COMMON)
_MOST_HOLD_MORE = 4  # more than 1 row in 4 holding more: the rest is read with every column
_SAMPLE = 64  # the rows of the first batch looked at to choose


def _projected(conn: sqlite3.Connection, session_id: str, live: str, projector: _Projector,
               stream: StreamedRead) -> Iterator[list[dict[str, Any]]]:
    """Yield the session's messages (rows matching `live`, in order) in batches, telling `stream` how much text each held."""
    # In batches, never fetched whole: only the conversation is held, never a second copy of the
    # session as raw rows beside it (a 33,000-message session is tens of MB). The first batch is
    # read with every column: a session that fits in it is read in one statement, and its last
    # rows tell whether the lean read pays for the rest.
    cursor = conn.execute(_CONVERSATION_SQL + live + _BY_ID, (session_id,))
    batch = cursor.fetchmany(_BATCH_ROWS)
    stream.passed(_text_chars(batch, _CONTENT))
    yield list(map(projector.message, batch))
    sample = batch[-_SAMPLE:]
    if len(batch) == _BATCH_ROWS and sum(map(_holds_more, sample)) * _MOST_HOLD_MORE <= len(sample):
        cursor.close()
        yield from _lean_batches(conn, session_id, live, batch[-1][0], projector, stream)
    else:
        yield from _full_batches(cursor, projector, stream)


def _holds_more(row: tuple[Any, ...]) -> bool:
    # Whether a row of _COLUMNS holds a value outside _COMMON (a guess: "" and 0 count as none).
    return any(map(row.__getitem__, _OTHER_AT))


def _text_chars(batch: list[tuple[Any, ...]], at: int) -> int:
    # The batch's content, counted without a Python step per row (content is text, bytes or NULL).
    return sum(map(len, filter(None, map(itemgetter(at), batch))))


def _full_batches(cursor: sqlite3.Cursor, projector: _Projector, stream: StreamedRead) -> Iterator[list[dict[str, Any]]]:
    # The rest of a read of every column.
    while batch := cursor.fetchmany(_BATCH_ROWS):
        stream.passed(_text_chars(batch, _CONTENT))
        yield list(map(projector.message, batch))


def _lean_batches(conn: sqlite3.Connection, session_id: str, live: str, after: int, projector: _Projector,
                  stream: StreamedRead) -> Iterator[list[dict[str, Any]]]:
    # The rows past `after` by the lean read: the flagged ones read again by id, or, once most
    # rows of a batch hold more, the rest (that batch included) with every column.
    plain, message = projector.plain, projector.message
    cursor = conn.execute(_LEAN_SQL + live + " AND id > ?" + _BY_ID, (session_id, after))
    while batch := cursor.fetchmany(_BATCH_ROWS):
        stream.passed(_text_chars(batch, _LEAN_CONTENT))
        flagged = [row[0] for row in batch if row[-1]]
        if not flagged:
            yield list(map(plain, batch))
        elif len(flagged) * _MOST_HOLD_MORE <= len(batch):
            full = {row[0]: row for row in conn.execute(_BY_IDS_SQL, (json.dumps(flagged),))}
            # A row gone since the lean read (only outside one read snapshot) is left out.
            yield [plain(row) if not row[-1] else message(full[row[0]]) for row in batch
                   if not row[-1] or row[0] in full]
        else:
            cursor.close()
            yield from _full_batches(conn.execute(_CONVERSATION_SQL + live + " AND id >= ?" + _BY_ID,
                                                  (session_id, batch[0][0])), projector, stream)
            return


def _read_part(batches: Iterable[list[dict[str, Any]]], out: list[dict[str, Any]], seen: set[str],
               collapse_rest: bool) -> None:
    """Append one session's messages to `out`, skipping replays of `seen` and a prompt repeating the one before."""
    collapse = True  # the part's first message may repeat the last one of the part before
    for msg in chain.from_iterable(batches):
        if seen and msg["message_uid"] in seen:
            continue  # a rotation copy of a message an ancestor already replayed
        repeated = collapse and _repeats_prompt(msg, out[-1] if out else None)
        collapse = collapse_rest
        if not repeated:
            out.append(msg)


def _each_part(messages: list[dict[str, Any]], parts: _Parts) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Yield (session id, its messages) for each part of a stitched read."""
    bounds = [start for _, start in parts[1:]] + [len(messages)]
    for (sid, start), stop in zip(parts, bounds):
        yield sid, messages[start:stop]


def _without_harness(messages: list[dict[str, Any]], parts: _Parts) -> tuple[list[dict[str, Any]], _Parts]:
    # The background review's prompts and replies go; each part starts where its first kept message is.
    kept = {id(m) for m in strip_background_review_harness(messages)}
    out: list[dict[str, Any]] = []
    new_parts: _Parts = []
    for sid, part in _each_part(messages, parts):
        new_parts.append((sid, len(out)))
        out.extend(m for m in part if id(m) in kept)
    return out, new_parts


def get_messages_as_conversation(conn: sqlite3.Connection, session_id: str, include_ancestors: bool = False,
                                 with_row_ids: bool = False, include_inactive: bool = False,
                                 repair: bool = False) -> list[dict[str, Any]]:
    """Return the session's rows as OpenAI-format dicts, its whole parent chain first when asked.

    Each dict has role, content (api_content when set), timestamp, tool_calls/tool_call_id/name
    when present, finish_reason and the reasoning fields on assistant turns, `observed` (True)
    on observed rows, `message_id` (the platform's id) and effect_disposition when stored,
    message_uid, `_row_id` when asked, the runtime-only `_tool_call_uids`/`_tool_call_uid`/
    `_absorbed_message_uids` when known, and `_display_content` (the stored content) when
    api_content differs from it. Background-review prompts and their replies are left out, and
    an assistant's echoed <memory-context> blocks. With ancestors, copies of messages already
    replayed (same uid) and a user prompt identical to the one just before are skipped; with
    `repair`, see `repair_alternation`. Call it inside one read snapshot.
    """
    out, _ = _stitched(conn, session_id, include_ancestors, with_row_ids, include_inactive)
    return repair_alternation(out) if repair else out


def get_resume_conversations(conn: sqlite3.Connection,
                             session_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return (what to send the model: this session repaired, what to show: the whole chain) in one read."""
    return (get_messages_as_conversation(conn, session_id, repair=True),
            get_messages_as_conversation(conn, session_id, include_ancestors=True))


def get_ancestor_display_prefix(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """Return the messages the display shows before this session's own: its ancestors' part only."""
    messages, parts = _stitched(conn, session_id, True, False, False)
    return [m for sid, part in _each_part(messages, parts) if sid != session_id for m in part]
