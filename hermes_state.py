"""hermes-state: the `SessionDB` facade over one SQLite file per profile.

Owns: opening and closing the one WAL connection of a handle, choosing each write's patience
and running it through the retrying writer, and delegating every public method to the
sibling modules in a line or two. It holds no SQL. Re-exports the public names.

Transaction contract: every write method is exactly one BEGIN IMMEDIATE transaction
(`self._write(patience)`); reads run under the handle's lock. See docs/architecture.md.
"""
from __future__ import annotations

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

import asyncio
import functools
import os
import sqlite3
import sys  # noqa: F401  (hermes-agent's tests patch hermes_state.sys.platform)
import threading
import time  # noqa: F401  (and hermes_state.time.time)
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import hermes_state_catalogue as catalogue
import hermes_state_common as common
import hermes_state_compression as compression
import hermes_state_conversation as conversation
import hermes_state_fts as fts
import hermes_state_gateway as gateway
import hermes_state_lineage as lineage
import hermes_state_listings as listings
import hermes_state_maintenance as maintenance
import hermes_state_messages as message_rows
import hermes_state_ownership as ownership
import hermes_state_portability as portability
import hermes_state_recovery as recovery
import hermes_state_schema as schema
import hermes_state_routing as routing
import hermes_state_search as search
import hermes_state_sessions as sessions
import hermes_state_titles as titles
import hermes_state_writer as writer
from hermes_state_gateway import receipt_digest
from hermes_state_cjk import has_cjk
from hermes_state_query import MAX_QUERY_CHARS as MAX_FTS5_QUERY_CHARS  # noqa: F401 - hermes-agent's name
from hermes_state_portability import EXPORT_FORMAT, EXPORT_VERSION, ImportReport
from hermes_state_ownership import input_marker
from hermes_state_provider import ReasoningFieldMemory, strip_echoed_user_input, to_provider_messages
from hermes_state_listings import workspace_key
from hermes_state_recovery import RecoveryReport, TableRecovery, recover
from hermes_state_repair import (db_opens_cleanly as _db_opens_cleanly, is_malformed_db_error, open_repairing,
                                 repair_state_db_schema as _repair_file)
from hermes_state_common import SCHEMA_VERSION, logger
from hermes_state_writer import RetryPolicy, Writer
from hermes_state_errors import (ForeignDatabaseError, HermesStateError, ImportConflictError,  # noqa: F401
                                 ImportValidationError,
                                 LedgerStateError, OwnershipReadError,
                                 ProfileNotFoundError, ReadOnlyError, ReceiptDigestError, ReceiptOrderError,
                                 SessionBusyError, SessionClosedByCompressionError, SessionCompressionInProgressError,
                                 SessionNotFoundError,
                                 SessionPersistenceError, StaleEpochError, StateDbBusyError,
                                 StateDbCorruptError, StateDbIncompatibleError, StateDbUninitializedError,
                                 StoreUnavailableError, TitleConflictError, classify_persistence_error,
                                 is_sqlite_lock_error, typed_errors)
from hermes_state_home import (check_db_path_allowed, child_env, default_hermes_root,  # noqa: F401
                               display_hermes_home, get_hermes_home, hermes_home_override, profile_home)
from hermes_state_lockowners import configure_error_log, log_write_lock_holders
from hermes_state_errors import (StateDbJournalError, describe_init_failure, format_session_db_unavailable,
                                 get_last_init_error, set_last_init_error)
from hermes_state_schema import apply_wal_with_fallback
# hermes-agent's private names for the same process-wide state, which its callers and tests reset.
_set_last_init_error = set_last_init_error
_wal_fallback_warned_paths = schema.wal_fallback_warned

__all__ = [
    "apply_wal_with_fallback", "get_last_init_error", "format_session_db_unavailable", "StateDbJournalError",
    "workspace_key",
    "SessionDB", "AsyncSessionDB", "SCHEMA_VERSION", "list_sessions_across_profiles",
    "get_hermes_home", "hermes_home_override", "profile_home", "child_env", "display_hermes_home",
    "ReasoningFieldMemory", "to_provider_messages", "configure_error_log",
    "HermesStateError", "SessionPersistenceError", "StateDbCorruptError", "StateDbIncompatibleError", "ForeignDatabaseError",
    "StateDbUninitializedError", "StateDbBusyError", "StoreUnavailableError", "ReadOnlyError",
    "SessionNotFoundError", "TitleConflictError", "SessionBusyError", "SessionCompressionInProgressError",
    "SessionClosedByCompressionError", "StaleEpochError", "ReceiptOrderError", "ReceiptDigestError",
    "OwnershipReadError", "ProfileNotFoundError", "is_sqlite_lock_error", "classify_persistence_error",
    "recover", "RecoveryReport", "TableRecovery", "ImportReport", "ImportValidationError", "ImportConflictError",
    "EXPORT_FORMAT", "EXPORT_VERSION", "repair_state_db_schema", "is_malformed_db_error",
    "LedgerStateError", "receipt_digest", "input_marker", "strip_echoed_user_input",
]



def _unknown_if_unstorable(default: Callable[[], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a read by id answer like an unknown id when the id holds a lone surrogate.

    No stored id can hold one (SQLite cannot store it), so the answer is known without asking,
    and asking would fail to bind it.
    """
    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def read(self: "SessionDB", key: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(key, str) and common.has_surrogate(key):
                return default()
            return method(self, key, *args, **kwargs)
        return read
    return wrap


_repair_attempted_paths: set[str] = set()  # hermes-agent's name: an open repairs a path once per process


def repair_state_db_schema(db_path: str | os.PathLike, *, backup: bool = True) -> dict[str, Any]:
    """Repair a malformed schema or full-text index in place, a copy kept first; return the report."""
    return _repair_file(db_path, backup=backup, check=lambda path: _db_opens_cleanly(path))


def _resolve_path(db_path: str | os.PathLike | None, home: Path) -> Path:
    if db_path is None:
        return home / "state.db"
    if str(db_path) == ":memory:":
        return Path(":memory:")
    return Path(db_path).expanduser().absolute()


class SessionDB:
    """One profile's session store: a WAL connection shared by every sibling module."""

    # Timing policy, read at call time so an application or a test can tune it on the class
    # or on one instance.
    _WRITE_PATIENCE_S = common.WRITE_PATIENCE_S
    _TRANSCRIPT_WRITE_PATIENCE_S = common.TRANSCRIPT_WRITE_PATIENCE_S
    _ACTIVITY_WRITE_PATIENCE_S = common.ACTIVITY_WRITE_PATIENCE_S
    _WRITE_RETRY_MIN_S, _WRITE_RETRY_MAX_S = common.WRITE_RETRY_MIN_S, common.WRITE_RETRY_MAX_S
    _WRITE_RETRY_SLOW_MIN_S = common.WRITE_RETRY_SLOW_MIN_S
    _WRITE_RETRY_SLOW_MAX_S = common.WRITE_RETRY_SLOW_MAX_S
    _CHECKPOINT_EVERY_N_WRITES = common.CHECKPOINT_EVERY_N_WRITES
    _READ_BUSY_TIMEOUT_S = common.READ_BUSY_TIMEOUT_S
    # Transcript writes wait this long for another holder's compression.
    _COMPRESSION_WAIT_S = compression.COMPRESSION_WAIT_S

    _shared: dict[str, list[Any]] = {}
    _shared_key: str | None = None  # set on handles handed out by shared()
    _shared_lock = threading.Lock()

    def __init__(self, db_path: str | os.PathLike | None = None, *, read_only: bool = False,
                 backup_before_upgrade: bool = True, force: bool = False):
        # Absolute, so a later chdir or HERMES_HOME change cannot move this handle.
        self.profile_home = get_hermes_home().absolute()
        self.db_path = _resolve_path(db_path, self.profile_home)
        self.read_only, self._backup_before_upgrade = read_only, backup_before_upgrade
        self._force, self.mode_changes = force, []  # mode_changes: files this open tightened to 0600
        self.upgrade_backup: Path | None = None  # the copy written before this handle upgraded the file
        self.schema_version: int | None = None
        self._closed = False
        check_db_path_allowed(self.db_path)  # before any directory, file or pragma
        # A writable file gets a second connection for reads (opened on first read); read-only
        # handles and in-memory databases (a second connection would be another database) do not.
        separate_reads = not read_only and str(self.db_path) != ":memory:"
        try:
            self._writer = Writer(self._connect(), on_give_up=self._log_lock_holders,
                                  open_reader=(lambda: schema.connect_reader(self.db_path)) if separate_reads else None)
            self._writer.after_commit.append(self._upkeep)
            self._open_fts()
        except Exception as exc:  # kept for a caller that reports the failure later (a slash command)
            set_last_init_error(describe_init_failure(exc))
            raise

    # --- lifecycle -----------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        path = self.db_path
        if self.read_only:
            if not path.is_file() or path.stat().st_size == 0:
                raise StateDbUninitializedError(f"{path} does not exist yet")
        else:
            try:
                schema.prepare_file(path)
            except OSError as exc:
                raise StoreUnavailableError(f"cannot create or open {path}: {exc}") from exc
        return open_repairing(lambda: self._connect_once(path), path, _repair_attempted_paths,
                              None if self.read_only else repair_state_db_schema)

    def _connect_once(self, path: Path) -> sqlite3.Connection:
        with typed_errors(path):  # a directory or a path SQLite cannot open -> StoreUnavailableError
            conn = schema.connect(path, read_only=self.read_only, read_busy_s=self._READ_BUSY_TIMEOUT_S)
        try:
            with typed_errors(path, reading=True):  # "not a database" at open -> StateDbCorruptError
                if self.read_only:
                    self.schema_version = catalogue.check_read_only(conn, path, self._READ_BUSY_TIMEOUT_S)
                else:
                    catalogue.check_ours(conn, path, force=self._force)  # before any write or chmod
                    self.mode_changes = schema.tighten_files(path)
                    catalogue.clean_partial_copies(path)  # a killed upgrade's half-written copy
                    self.schema_version = self._set_up(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _set_up(self, conn: sqlite3.Connection) -> int:
        schema.enable_wal(conn, self.db_path, self._WRITE_PATIENCE_S, self._policy())
        self.mode_changes += schema.tighten_side_files(self.db_path)
        if not schema.needs_migration(conn):
            return schema.read_version(conn)
        self.upgrade_backup = recovery.start_upgrade(conn, self.db_path, backup=self._backup_before_upgrade)
        migrator = Writer(conn, on_give_up=self._log_lock_holders)
        found = schema.migrate(migrator, self._WRITE_PATIENCE_S, self._policy(),
                               before_upgrade=recovery.prepare_upgrade)
        if found > SCHEMA_VERSION:
            logger.warning("%s has schema version %s, newer than %s: writes are refused",
                           self.db_path, found, SCHEMA_VERSION)
        return max(found, SCHEMA_VERSION)

    def close(self) -> None:
        """Checkpoint (PASSIVE) and close the connection; calling it twice is harmless.

        On a handle from `shared()` this gives back one use, like `release()`: a retiring
        owner never closes the handle its successor took over.
        """
        if self._shared_key is not None:
            self.release()
            return
        self._close_now()

    def _close_now(self) -> None:
        if self._closed:
            return
        self._stop_fts_worker()
        self._closed = True
        self._writer.close(checkpoint=not self.read_only)

    def __enter__(self) -> "SessionDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def shared(cls, db_path: str | os.PathLike | None = None) -> "SessionDB":
        """Return the process-wide handle for a path, counting one more user of it."""
        path = _resolve_path(db_path, get_hermes_home().absolute())
        key = os.path.realpath(path)
        with cls._shared_lock:
            entry = cls._shared.get(key)
            if entry is None or entry[0]._closed:
                entry = cls._shared[key] = [cls(path), 0]
                entry[0]._shared_key = key
            entry[1] += 1
            return entry[0]

    def release(self) -> None:
        """Give back one use of a shared handle; the last release closes it."""
        with self._shared_lock:
            entry = self._shared.get(self._shared_key) if self._shared_key else None
            if entry is not None and entry[0] is self:
                entry[1] -= 1
                if entry[1] > 0:
                    return
                del self._shared[self._shared_key]
        self._close_now()

    @property
    def in_transaction(self) -> bool:
        """True while this handle holds a transaction open (a write, or a read snapshot)."""
        return not self._closed and self._writer.in_transaction()

    @contextmanager
    def tracer(self, callback: Callable[[str], None] | None = None) -> Iterator[list[str]]:
        """Record every SQL statement this handle runs inside the block (and pass each to `callback`).

        Yields the list the statements are appended to; meant for tests and debugging.
        """
        with self._writer.tracing(callback) as statements:
            yield statements

    # --- the write/read choke points -----------------------------------------------------------

    def _policy(self) -> RetryPolicy:
        return RetryPolicy(self._WRITE_RETRY_MIN_S, self._WRITE_RETRY_MAX_S,
                           self._WRITE_RETRY_SLOW_MIN_S, self._WRITE_RETRY_SLOW_MAX_S)

    def _log_lock_holders(self, patience_s: float) -> None:
        log_write_lock_holders(self.db_path, patience_s)

    def _upkeep(self, conn: sqlite3.Connection, writes: int) -> None:
        if writes % self._CHECKPOINT_EVERY_N_WRITES == 0:
            writer.passive_checkpoint(conn)
        fts.upkeep(conn, writes)  # a bounded FTS merge every 1,000 writes

    def _check_writable(self) -> None:
        if self._closed:
            raise HermesStateError(f"SessionDB for {self.db_path} is closed")
        if self.read_only:
            raise ReadOnlyError(f"{self.db_path} was opened read-only; open it without read_only to write")
        if self.schema_version is not None and self.schema_version > SCHEMA_VERSION:
            raise StateDbIncompatibleError(
                f"{self.db_path} has schema version {self.schema_version}, newer than this library's "
                f"{SCHEMA_VERSION}; writes are refused so nothing is downgraded. Upgrade hermes-state.")

    @contextmanager
    def _write(self, patience_s: float | None = None) -> Iterator[sqlite3.Connection]:
        self._check_writable()
        with typed_errors(self.db_path), self._writer.transaction(
                self._WRITE_PATIENCE_S if patience_s is None else patience_s, self._policy()) as conn:
            yield conn

    def _transcript_write(self, session_id: str, body: Callable[[sqlite3.Connection], Any]) -> Any:
        # The common case costs one indexed lookup inside the transaction. Only when another
        # holder is compressing do we leave the transaction, wait (holding no lock) up to
        # _COMPRESSION_WAIT_S, and try once more.
        def attempt() -> Any:
            with self._write(self._TRANSCRIPT_WRITE_PATIENCE_S) as conn:
                compression.check_transcript_writable(conn, session_id)
                return body(conn)

        self._check_writable()
        common.check_id("session_id", session_id)
        try:
            return attempt()
        except SessionCompressionInProgressError:
            compression.wait_for_compression(self._read, session_id, timeout_s=self._COMPRESSION_WAIT_S)
        return attempt()

    @contextmanager
    def _read(self, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
        if self._closed:
            raise HermesStateError(f"SessionDB for {self.db_path} is closed")
        with typed_errors(self.db_path, reading=True), self._writer.reading(snapshot) as conn:
            yield conn

    # --- sessions ------------------------------------------------------------------------------------

    def create_session(self, session_id: str, source: str, model: str | None = None, *,
                       model_config: Any = None, system_prompt: str | None = None, user_id: str | None = None,
                       parent_session_id: str | None = None, **columns: Any) -> str:
        """Create the session, or fill the still-empty columns of an existing one (first write wins); return the id."""
        columns.update(model=model, model_config=model_config, system_prompt=system_prompt, user_id=user_id,
                       parent_session_id=parent_session_id)
        with self._write() as conn:
            return sessions.create_session(conn, session_id, source, columns)

    @_unknown_if_unstorable(lambda: None)
    def get_session(self, session_id: str) -> dict[str, Any] | None:
        """Return the session row, or None when there is none."""
        with self._read() as conn:
            return sessions.get_session(conn, session_id)

    # --- session records, messages, conversation -----------------------------------------------------

    def ensure_session(self, session_id: str, source: str, model: str | None = None, *,
                       model_config: Any = None, system_prompt: str | None = None, user_id: str | None = None,
                       parent_session_id: str | None = None, **columns: Any) -> str:
        """Create the session unless it exists (an existing row is left as it is); return the id."""
        columns.update(model=model, model_config=model_config, system_prompt=system_prompt, user_id=user_id,
                       parent_session_id=parent_session_id)
        with self._write() as conn:
            return sessions.ensure_session(conn, session_id, source, columns)

    def end_session(self, session_id: str, end_reason: str) -> None:
        """End a session; the first end wins."""
        with self._write() as conn:
            sessions.end_session(conn, session_id, end_reason)

    def reopen_session(self, session_id: str) -> None:
        """Clear ended_at/end_reason (and an archive only the idle sweep made)."""
        with self._write() as conn:
            sessions.reopen_session(conn, session_id)

    def update_session(self, session_id: str, **columns: Any) -> None:
        """Set session columns; unknown column -> ValueError, taken title -> TitleConflictError."""
        with self._write() as conn:
            sessions.update_session(conn, session_id, columns)

    def update_token_counts(self, session_id: str, input_tokens: int = 0, output_tokens: int = 0,
                            cache_read_tokens: int = 0, cache_write_tokens: int = 0, reasoning_tokens: int = 0, *,
                            estimated_cost_usd: float | None = None, api_call_count: int = 0,
                            model: str | None = None, absolute: bool = False, actual_cost_usd: float | None = None,
                            billing_provider: str | None = None, billing_base_url: str | None = None,
                            billing_mode: str | None = None, cost_status: str | None = None,
                            cost_source: str | None = None, pricing_version: str | None = None) -> None:
        """Add to (or set, with `absolute`) the token counters; keep the billing route and per-model usage."""
        with self._write() as conn:
            sessions.update_token_counts(
                conn, session_id, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                reasoning_tokens, estimated_cost_usd=estimated_cost_usd, actual_cost_usd=actual_cost_usd,
                api_call_count=api_call_count, model=model, billing_provider=billing_provider,
                billing_base_url=billing_base_url, billing_mode=billing_mode, cost_status=cost_status,
                cost_source=cost_source, pricing_version=pricing_version, absolute=absolute)

    def archive_session(self, session_id: str) -> None:
        """Archive a session deliberately."""
        with self._write() as conn:
            sessions.archive_session(conn, session_id)

    def unarchive_session(self, session_id: str) -> None:
        """Clear a session's archive."""
        with self._write() as conn:
            sessions.unarchive_session(conn, session_id)

    def pin_session(self, session_id: str, pinned: bool = True) -> None:
        """Pin or unpin a session (pinned sessions are never auto-archived)."""
        with self._write() as conn:
            sessions.pin_session(conn, session_id, pinned)

    def auto_archive(self, idle_days: float) -> int:
        """Archive unpinned sessions idle for more than `idle_days`; return how many."""
        with self._write() as conn:
            return sessions.auto_archive(conn, idle_days)

    def append_message(self, session_id: str, role: str, content: str | None = None, *,
                       tool_call_id: str | None = None, tool_calls: Any = None, tool_name: str | None = None,
                       token_count: int | None = None, finish_reason: str | None = None,
                       reasoning: str | None = None, reasoning_content: str | None = None,
                       reasoning_details: Any = None, codex_reasoning_items: Any = None,
                       codex_message_items: Any = None, api_content: str | None = None,
                       display_kind: str | None = None, display_metadata: Any = None,
                       platform_message_id: str | None = None, observed: bool = False,
                       effect_disposition: str | None = None, timestamp: float | None = None,
                       name: str | None = None, message_uid: str | None = None, **runtime_keys: Any) -> int:
        """Append a message (transcript patience) and return its row id; unknown session -> SessionNotFoundError.

        `append_message(sid, **msg)` takes a conversation dict back: `name` is `tool_name`,
        `message_uid` keeps the copy's uid, the `_`-prefixed runtime keys are kept or ignored.
        """
        message_rows.check_runtime_keys(runtime_keys)
        fields = dict(role=role, content=content, tool_call_id=tool_call_id, tool_calls=tool_calls,
                      tool_name=tool_name, token_count=token_count, finish_reason=finish_reason, reasoning=reasoning,
                      reasoning_content=reasoning_content, reasoning_details=reasoning_details,
                      codex_reasoning_items=codex_reasoning_items, codex_message_items=codex_message_items,
                      api_content=api_content, display_kind=display_kind, display_metadata=display_metadata,
                      platform_message_id=platform_message_id, observed=observed,
                      effect_disposition=effect_disposition, timestamp=timestamp, name=name,
                      message_uid=message_uid, **runtime_keys)
        return self._transcript_write(session_id, lambda conn: message_rows.append_message(conn, session_id, fields))

    def merge_messages(self, session_id: str, row_ids: list[int]) -> int:
        """Fold same-role active rows into the first (their uids recorded as absorbed); return its id."""
        return self._transcript_write(session_id, lambda conn: message_rows.merge_messages(conn, session_id, row_ids))

    @_unknown_if_unstorable(list)
    def get_messages(self, session_id: str, include_inactive: bool = False, limit: int | None = None,
                     offset: int = 0) -> list[dict[str, Any]]:
        """Return raw rows (all columns, JSON decoded) ordered by id; active only unless asked; paged by limit/offset."""
        with self._read() as conn:
            return message_rows.get_messages(conn, session_id, include_inactive, limit, offset)

    def replace_messages(self, session_id: str, messages: list[dict[str, Any]]) -> int:
        """Rewrite the active transcript in one transaction, keeping uids; return how many rows."""
        return self._transcript_write(session_id,
                                      lambda conn: message_rows.replace_messages(conn, session_id, messages))

    def clear_messages(self, session_id: str) -> int:
        """Delete the session's messages (every generation), keep the session; return how many."""
        return self._transcript_write(session_id, lambda conn: message_rows.clear_messages(conn, session_id))

    @_unknown_if_unstorable(list)
    def get_messages_as_conversation(self, session_id: str, include_ancestors: bool = False,
                                     with_row_ids: bool = False, include_inactive: bool = False,
                                     repair_alternation: bool = False) -> list[dict[str, Any]]:
        """Return the transcript as OpenAI-format dicts (the parent chain first, repaired for sending, if asked)."""
        with self._read(snapshot=True) as conn:
            return conversation.get_messages_as_conversation(conn, session_id, include_ancestors, with_row_ids,
                                                             include_inactive, repair_alternation)

    @_unknown_if_unstorable(lambda: ([], []))
    def get_resume_conversations(self, session_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Return (the session repaired for the model, the whole chain for display) from one snapshot."""
        with self._read(snapshot=True) as conn:
            return conversation.get_resume_conversations(conn, session_id)

    @_unknown_if_unstorable(list)
    def get_ancestor_display_prefix(self, session_id: str) -> list[dict[str, Any]]:
        """Return the display's messages from the session's ancestors only."""
        with self._read(snapshot=True) as conn:
            return conversation.get_ancestor_display_prefix(conn, session_id)

    to_provider_messages = staticmethod(to_provider_messages)

    # --- titles, lineage, listings, statistics, archive ----------------------------------------------

    def set_session_title(self, session_id: str, title: str | None) -> bool:
        """Set or clear (None/blank) a session's title; True when set, False for an unknown session."""
        with self._write() as conn:
            return titles.set_session_title(conn, session_id, title)

    @_unknown_if_unstorable(lambda: None)
    def get_session_title(self, session_id: str) -> str | None:
        """Return the session's title, or None."""
        with self._read() as conn:
            return titles.get_session_title(conn, session_id)

    @_unknown_if_unstorable(lambda: None)
    def resolve_session_by_title(self, title: str) -> str | None:
        """Return the id of the newest session of the title's lineage ("T", "T #2", ...), or None."""
        with self._read() as conn:
            return titles.resolve_session_by_title(conn, title)

    def get_next_title_in_lineage(self, title: str) -> str:
        """Return the next free title of the lineage: "T" -> "T #2" -> "T #3"."""
        with self._read() as conn:
            return titles.get_next_title_in_lineage(conn, title)

    @_unknown_if_unstorable(list)
    def get_lineage(self, session_id: str) -> list[dict[str, Any]]:
        """Return the session's ancestors oldest first, ending with the session itself."""
        with self._read() as conn:
            return lineage.get_lineage(conn, session_id)

    @_unknown_if_unstorable(list)
    def get_descendants(self, session_id: str) -> list[dict[str, Any]]:
        """Return the session's descendants breadth-first (not the session itself)."""
        with self._read() as conn:
            return lineage.get_descendants(conn, session_id)

    def list_sessions(self, source: str | None = None, limit: int = 20, offset: int = 0,
                      include_archived: bool = False, *, model: str | None = None, since: float | None = None,
                      until: float | None = None, order: str = "started") -> list[dict[str, Any]]:
        """Return sessions newest first (by start, or by last activity), each with `preview` and `last_active`."""
        with self._read() as conn:
            return listings.list_sessions(conn, source, limit, offset, include_archived, model=model, since=since,
                                        until=until, order=order)

    def count_sessions(self, source: str | None = None, include_archived: bool = False, *,
                       model: str | None = None, since: float | None = None, until: float | None = None) -> int:
        """Return how many sessions `list_sessions` with the same filters pages through."""
        with self._read() as conn:
            return listings.count_sessions(conn, source, include_archived, model=model, since=since, until=until)

    def usage_by_model(self, include_unset: bool = False) -> list[dict[str, Any]]:
        """Return sessions, tokens and estimated cost per model, costliest first (model None last if asked)."""
        with self._read() as conn:
            return listings.usage_by_model(conn, include_unset)

    def top_sessions_by_tokens(self, limit: int = 10) -> list[dict[str, Any]]:
        """Return the sessions with the most input + output tokens."""
        with self._read() as conn:
            return listings.top_sessions_by_tokens(conn, limit)

    # --- full-text search --------------------

    # Rows per rebuild/catch-up transaction, and whether open leaves a pending rebuild to a
    # background thread (tests switch it off to drive the rebuild by hand).
    _FTS_REBUILD_CHUNK_ROWS = fts.REBUILD_CHUNK_ROWS
    _FTS_REBUILD_IN_BACKGROUND = True

    def _open_fts(self) -> None:
        # Build missing FTS objects and catch up a short CJK queue now; a rebuild (after an
        # upgrade) runs on a background thread, one short transaction per chunk.
        self._fts_stop, self._fts_worker = threading.Event(), None
        writable = not self.read_only and (self.schema_version or 0) <= SCHEMA_VERSION
        try:
            with typed_errors(self.db_path, reading=True):  # a damaged index page -> StateDbCorruptError
                pending = fts.ensure_fts(self._writer, self._WRITE_PATIENCE_S, self._policy(), writable=writable)
            if writable:
                # This connection's TEMP trigger feeds the CJK index; it lives in the temp
                # schema only, so it takes no lock on the file and costs open nothing.
                fts.install_write_triggers(self._writer.conn)
        except BaseException:
            self._writer.close(checkpoint=False)
            raise
        if pending and self._FTS_REBUILD_IN_BACKGROUND:
            self._fts_worker = threading.Thread(
                target=self._fts_background, name="hermes-state-fts", daemon=True,
                args=(self._writer, self._WRITE_PATIENCE_S, self._policy(), self._FTS_REBUILD_CHUNK_ROWS,
                      self._fts_stop))
            self._fts_worker.start()

    def _fts_background(self, *args: Any) -> None:
        fts.background_worker(*args)
        if not self._fts_stop.is_set():
            self._reclaim_after_upgrade(quiet=True)  # a background thread has nobody to raise to

    def _stop_fts_worker(self) -> None:
        self._fts_stop.set()
        if self._fts_worker is not None:
            self._fts_worker.join(5.0)  # a chunk is short; a worker stuck on a lock just fails later

    _sanitize_fts5_query = staticmethod(fts._sanitize_fts5_query)  # the sanitizer, by the name callers know
    _contains_cjk = staticmethod(has_cjk)  # hermes-agent's name for "does this text hold CJK letters"

    def search_messages(self, query: str, source_filter: list[str] | None = None,
                        exclude_sources: list[str] | None = None, role_filter: list[str] | None = None,
                        session_id: str | None = None, limit: int = 20, offset: int = 0,
                        include_inactive: bool = False, include_reasoning: bool = False) -> search.SearchResults:
        """Search message text (word, CJK and substring indexes), best match first, with snippet and context.

        The result is a list; its `complete` attribute is False only when a scan (terms too short
        for every index) stopped before the oldest rows with fewer hits than asked.
        """
        with self._read(snapshot=True) as conn:
            return search.search_messages(conn, query, source_filter, exclude_sources, role_filter, session_id,
                                          limit, offset, include_inactive, include_reasoning)

    def fts_rebuild_status(self) -> dict[str, Any]:
        """Return {pending, total, indexed, percent, in_progress, cjk_pending} for the FTS indexes."""
        with self._read() as conn:
            return fts.rebuild_status(conn)

    def check_integrity(self, full: bool = False) -> dict[str, Any]:
        """Return {"ok", "problems", "fts"}: SQLite's quick check (full with `full`) and each FTS index's check.

        The FTS checks need a writable handle (FTS5 runs them as write commands, changing
        nothing); on a read-only handle "fts" is empty.
        """
        with self._read() as conn:
            problems = schema.integrity_problems(conn, full)
        report: dict[str, str] = {}
        if not self.read_only:
            with self._write() as conn:
                report = fts.integrity_report(conn)
        return {"ok": not problems and all(v == "ok" for v in report.values()), "problems": problems, "fts": report}

    def optimize_fts(self) -> int:
        """Merge each full-text index into one segment (maintenance: one long write); return how many."""
        with self._write() as conn:
            return fts.optimize(conn)

    def rebuild_fts(self) -> dict[str, Any]:
        """Rebuild the FTS indexes to the end in short chunks (resuming one under way); return the status."""
        self._check_writable()  # one transaction per chunk, by design: other writers get turns
        with typed_errors(self.db_path, reading=True):
            fts.rebuild(self._writer, self._WRITE_PATIENCE_S, self._policy(), self._FTS_REBUILD_CHUNK_ROWS)
        self._reclaim_after_upgrade()
        return self.fts_rebuild_status()

    def _reclaim_after_upgrade(self, quiet: bool = False) -> None:
        with self._writer.exclusive() as conn:
            recovery.reclaim_after_upgrade(conn, self.db_path, self._WRITE_PATIENCE_S, self._policy(), quiet=quiet)

    # --- compression generations and locks -----------------------------------------------------------

    def compress_in_place(self, session_id: str, kept_messages: list[dict[str, Any]], *,
                          holder: str | None = None) -> list[int]:
        """Archive the live rows and make `kept_messages` the live generation; return the new row ids."""
        with self._write(self._TRANSCRIPT_WRITE_PATIENCE_S) as conn:
            return compression.compress_in_place(conn, session_id, kept_messages, holder=holder)

    def rotate_session(self, parent_id: str, child_id: str, kept_messages: list[dict[str, Any]], *,
                       holder: str | None = None, **child_columns: Any) -> str:
        """Continue a session in a compression child holding `kept_messages`; end the parent; return the child id."""
        with self._write(self._TRANSCRIPT_WRITE_PATIENCE_S) as conn:
            return compression.rotate_session(conn, parent_id, child_id, kept_messages, child_columns, holder=holder)

    @_unknown_if_unstorable(lambda: None)
    def get_compression_successor(self, session_id: str) -> str | None:
        """Return the live tip of the session's compression chain (itself when none; None when unknown)."""
        with self._read() as conn:
            return lineage.compression_successor_id(conn, session_id)

    @_unknown_if_unstorable(list)
    def get_compression_ancestors(self, session_id: str) -> list[str]:
        """Return the session's compression ancestors' ids, oldest first."""
        with self._read() as conn:
            return lineage.compression_ancestor_ids(conn, session_id)

    def acquire_compression_lock(self, session_id: str, ttl_s: float = compression.DEFAULT_LOCK_TTL_S) -> str | None:
        """Take the session's compression lock; return the holder string, or None when another holds it."""
        with self._write() as conn:
            return compression.acquire_compression_lock(conn, session_id, ttl_s)

    def release_compression_lock(self, session_id: str, holder: str) -> bool:
        """Release the compression lock `holder` holds; return whether one was released."""
        with self._write() as conn:
            return compression.release_compression_lock(conn, session_id, holder)

    def try_acquire_compression_lock(self, session_id: str, holder: str,
                                     ttl_seconds: float = compression.DEFAULT_LOCK_TTL_S) -> bool:
        """Take or renew the session's compression lease for `holder`; False when another holds it live."""
        with self._write() as conn:
            return compression.try_acquire_compression_lock(conn, session_id, holder, ttl_seconds)

    def refresh_compression_lock(self, session_id: str, holder: str,
                                 ttl_seconds: float = compression.DEFAULT_LOCK_TTL_S) -> bool:
        """Extend `holder`'s live lease by `ttl_seconds` from now; False when it does not hold one."""
        with self._write() as conn:
            return compression.refresh_compression_lock(conn, session_id, holder, ttl_seconds)

    @_unknown_if_unstorable(lambda: None)
    def get_compression_lock_holder(self, session_id: str) -> str | None:
        """Return who holds the session's live compression lock, or None."""
        with self._read() as conn:
            return compression.get_compression_lock_holder(conn, session_id)

    # --- gateway ledgers, routing, outbox, input ownership, deletion (hermes_state_gateway,
    # hermes_state_routing). Delivery bookkeeping around a send is an activity write: it must
    # never stall a turn, and the outbox's recovery covers a write that gave up.

    def claim_runtime(self, instance_id: str | None = None) -> int:
        """Become the gateway owner: bump and return the epoch; older started/running work turns unknown."""
        with self._write() as conn:
            return gateway.claim_runtime(conn, instance_id)

    def get_runtime(self) -> dict[str, Any] | None:
        """Return the current owner's {epoch, instance_id, pid, started_at}, or None."""
        with self._read() as conn:
            return gateway.get_runtime(conn)

    def admit_input(self, session_id: str, payload: Any, admission_key: str | None = None) -> int:
        """Queue an inbound input in the session's FIFO (idempotent by key); return its id."""
        with self._write() as conn:
            return gateway.admit_input(conn, session_id, payload, admission_key)

    def next_admission(self, session_id: str) -> dict[str, Any] | None:
        """Return the queued head of the session's FIFO, or None when empty or blocked."""
        with self._read() as conn:
            return gateway.next_admission(conn, session_id)

    def start_admission(self, admission_id: int, epoch: int) -> None:
        """Start the queue's head under `epoch` (StaleEpochError, LedgerStateError)."""
        with self._write() as conn:
            gateway.start_admission(conn, admission_id, epoch)

    def finish_admission(self, admission_id: int, state: str, epoch: int) -> None:
        """Finish a started admission as completed, failed or cancelled (a queued one: cancelled only)."""
        with self._write() as conn:
            gateway.finish_admission(conn, admission_id, state, epoch)

    def resolve_unknown(self, admission_id: int, resolution: str, epoch: int | None = None) -> None:
        """Settle an unknown admission as completed, failed or cancelled; unblocks the queue."""
        with self._write() as conn:
            gateway.resolve_unknown(conn, admission_id, resolution, epoch)

    def get_admission(self, admission_id: int) -> dict[str, Any] | None:
        """Return one admission (payload decoded), or None."""
        with self._read() as conn:
            return gateway.get_admission(conn, admission_id)

    def list_admissions(self, session_id: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        """Return admissions in queue order, optionally of one session and/or state."""
        with self._read() as conn:
            return gateway.list_admissions(conn, session_id, state)

    def start_execution(self, session_id: str, kind: str, epoch: int) -> int:
        """Record a managed run bound to the session and `epoch`; return its id."""
        with self._write() as conn:
            return gateway.start_execution(conn, session_id, kind, epoch)

    def finish_execution(self, execution_id: int, state: str, epoch: int) -> None:
        """Finish a running (or settle an unknown) execution as completed, failed or cancelled."""
        with self._write() as conn:
            gateway.finish_execution(conn, execution_id, state, epoch)

    def get_execution(self, execution_id: int) -> dict[str, Any] | None:
        """Return one execution row, or None."""
        with self._read() as conn:
            return gateway.get_execution(conn, execution_id)

    def list_executions(self, session_id: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        """Return executions by id, optionally of one session and/or state."""
        with self._read() as conn:
            return gateway.list_executions(conn, session_id, state)

    def record_receipt(self, execution_id: int, seq: int, payload: Any, digest: str, *,
                       epoch: int | None = None) -> bool:
        """Record result `seq` (1, 2, ...) with its SHA-256 digest; False for an identical repeat."""
        with self._write() as conn:
            return gateway.record_receipt(conn, execution_id, seq, payload, digest, epoch=epoch)

    def list_receipts(self, execution_id: int) -> list[dict[str, Any]]:
        """Return the execution's receipts in seq order."""
        with self._read() as conn:
            return gateway.list_receipts(conn, execution_id)

    def owe_delivery(self, session_id: str, payload: Any, *, platform: str | None = None,
                     chat_id: str | None = None, thread_id: str | None = None, key: str | None = None) -> int:
        """Record a reply owed before sending it (pending; idempotent by key); return its id."""
        with self._write() as conn:
            return routing.owe_delivery(conn, session_id, payload, platform=platform, chat_id=chat_id,
                                        thread_id=thread_id, key=key)

    def begin_delivery(self, obligation_id: int, *, epoch: int | None = None) -> int:
        """Start a send attempt (pending/failed -> attempting); return the attempt's fence. Activity write."""
        with self._write(self._ACTIVITY_WRITE_PATIENCE_S) as conn:
            return routing.begin_delivery(conn, obligation_id, epoch=epoch)

    def mark_delivered(self, obligation_id: int, *, fence: int | None = None) -> None:
        """Mark an obligation delivered (from pending or attempting; fenced when given). Activity write."""
        with self._write(self._ACTIVITY_WRITE_PATIENCE_S) as conn:
            routing.mark_delivered(conn, obligation_id, fence=fence)

    def mark_failed(self, obligation_id: int, error: str, *, fence: int | None = None) -> None:
        """Record a failed attempt (attempting -> failed, still owed). Activity write."""
        with self._write(self._ACTIVITY_WRITE_PATIENCE_S) as conn:
            routing.mark_failed(conn, obligation_id, error, fence=fence)

    def recover_deliveries(self, max_attempts: int = 3, *, epoch: int | None = None) -> dict[str, int]:
        """At owner start: attempting -> pending (recovered=1), over the cap -> abandoned; return the counts."""
        with self._write() as conn:
            return routing.recover_deliveries(conn, max_attempts, epoch=epoch)

    def list_owed(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Return obligations still owed (pending, attempting, failed), oldest first."""
        with self._read() as conn:
            return routing.list_owed(conn, session_id)

    def get_delivery(self, obligation_id: int) -> dict[str, Any] | None:
        """Return one delivery obligation, or None."""
        with self._read() as conn:
            return routing.get_delivery(conn, obligation_id)

    def set_route(self, scope: str, session_key: str, entry: dict[str, Any]) -> None:
        """Publish the routing entry for (scope, session_key); `entry["session_id"]` names its session."""
        with self._write() as conn:
            routing.set_route(conn, scope, session_key, entry)

    def get_route(self, scope: str, session_key: str) -> dict[str, Any] | None:
        """Return the routing entry for (scope, session_key), or None."""
        with self._read() as conn:
            return routing.get_route(conn, scope, session_key)

    def list_routes(self, scope: str | None = None) -> list[dict[str, Any]]:
        """Return routing rows {scope, session_key, entry, updated_at}."""
        with self._read() as conn:
            return routing.list_routes(conn, scope)

    def delete_route(self, scope: str, session_key: str) -> bool:
        """Remove a routing entry; return whether there was one."""
        with self._write() as conn:
            return routing.delete_route(conn, scope, session_key)

    def record_delegation(self, delegation_id: str, origin_session_id: str, *, target: str | None = None,
                          payload: Any = None) -> bool:
        """Record work handed off by the origin session (pending); False when the id is already recorded."""
        with self._write() as conn:
            return routing.record_delegation(conn, delegation_id, origin_session_id, target=target, payload=payload)

    def update_delegation(self, delegation_id: str, **changes: Any) -> None:
        """Move a delegation on (`state=`) and/or set its `result=` or `target=`; a finished one is final."""
        with self._write() as conn:
            routing.update_delegation(conn, delegation_id, **changes)

    def get_delegation(self, delegation_id: str) -> dict[str, Any] | None:
        """Return one delegation, or None."""
        with self._read() as conn:
            return routing.get_delegation(conn, delegation_id)

    def list_delegations(self, origin_session_id: str, state: str | None = None) -> list[dict[str, Any]]:
        """Return the origin session's delegations oldest first."""
        with self._read() as conn:
            return routing.list_delegations(conn, origin_session_id, state)

    def persist_failed_turn_input(self, session_id: str, message: Any, marker: str) -> int | None:
        """Append a failed turn's user input unless a row already owns `marker`; return the row id or None."""
        self._check_writable()
        with self._read() as conn:  # where it would go, so a compression there is waited out first
            target = ownership.input_target(conn, session_id)
        return self._transcript_write(target, lambda conn: ownership.persist_failed_turn_input(
            conn, session_id, message, marker))

    # --- export, import, backup, restore, vacuum --------------------------------------------------

    @_unknown_if_unstorable(lambda: None)
    def export_session(self, session_id: str) -> dict[str, Any] | None:
        """Return one session as an export document (every column, every generation, usage rows), or None."""
        with self._read(snapshot=True) as conn:
            return portability.export_session(conn, session_id)

    def iter_export(self, source: str | None = None) -> Iterator[dict[str, Any]]:
        """Yield export documents one session at a time, by id (memory stays flat)."""
        return portability.iter_export(self._read, source)

    def export_all(self, source: str | None = None) -> list[dict[str, Any]]:
        """Return the export documents of every session (of `source` when given), by id."""
        return list(self.iter_export(source))

    def import_sessions(self, data: Any, on_conflict: str = "skip") -> ImportReport:
        """Validate all export documents, then import them in one transaction; see ImportReport."""
        self._check_writable()
        portability.check_on_conflict(on_conflict)
        plan = portability.validate(data)  # before the write lock: checking a large input keeps no writer waiting
        with self._write() as conn:
            return portability.import_validated(conn, plan, on_conflict)

    def backup(self, target_path: str | os.PathLike) -> Path:
        """Write a consistent copy of the database (ledgers included) to a new file; return its path."""
        with self._read() as conn:
            return recovery.backup_to(conn, target_path)

    def restore(self, source_path: str | os.PathLike) -> None:
        """Replace the content with a checked backup, in one transaction every handle sees whole."""
        self._check_writable()
        source = recovery.check_restorable(source_path)
        self._stop_fts_worker()
        with self._writer.exclusive() as conn:
            self.schema_version = recovery.restore_from(conn, source, self._set_up)
        self._open_fts()

    def vacuum(self) -> dict[str, int]:
        """Give free pages back to the file system; writers wait while it runs (seconds per GB)."""
        self._check_writable()
        with self._writer.exclusive() as conn:
            return recovery.vacuum(conn, self._WRITE_PATIENCE_S, self._policy())

    # --- maintenance: deleting, pruning, the empty-session sweeps, state_meta -------------------
    # (hermes_state_maintenance; docs/maintenance.md). Transcript files go only after COMMIT.

    @_unknown_if_unstorable(lambda: False)
    def delete_session(self, session_id: str, sessions_dir: str | os.PathLike | None = None) -> bool:
        """Delete a session with its whole conversation and its delegates; False for an unknown id."""
        common.check_id("session_id", session_id)
        return bool(self.delete_sessions([session_id], sessions_dir=sessions_dir))

    def delete_sessions(self, session_ids: list[str], sessions_dir: str | os.PathLike | None = None) -> int:
        """Delete the listed sessions (conversations and delegates with them) in one transaction; return how many went."""
        with self._write() as conn:
            removed = maintenance.delete_sessions(conn, maintenance.id_list(session_ids))
        maintenance.remove_transcripts(sessions_dir, removed)
        return len(removed)

    def prune_sessions(self, older_than_days: float | None = 90, source: str | None = None,
                       sessions_dir: str | os.PathLike | None = None, **filters: Any) -> int:
        """Delete ended conversations started more than `older_than_days` ago (and matching `filters`); return how many sessions."""
        with self._write() as conn:
            removed = maintenance.prune_sessions(conn, older_than_days, source, filters)
        maintenance.remove_transcripts(sessions_dir, removed)
        return len(removed)

    def list_prune_candidates(self, older_than_days: float | None = None, source: str | None = None,
                              **filters: Any) -> list[dict[str, Any]]:
        """Return the sessions `prune_sessions` with the same arguments would delete, oldest first."""
        with self._read(snapshot=True) as conn:
            return maintenance.list_prune_candidates(conn, older_than_days, source, filters)

    def archive_sessions(self, older_than_days: float | None = None, source: str | None = None, **filters: Any) -> int:
        """Archive ended, unarchived conversations matching the prune filters; return how many sessions."""
        with self._write() as conn:
            return maintenance.archive_sessions(conn, older_than_days, source, filters)

    def count_empty_sessions(self) -> int:
        """Return how many sessions `delete_empty_sessions` would delete."""
        with self._read(snapshot=True) as conn:
            return maintenance.count_empty_sessions(conn)

    def delete_empty_sessions(self, sessions_dir: str | os.PathLike | None = None) -> int:
        """Delete ended, unarchived sessions that never got a message; return how many."""
        with self._write() as conn:
            removed = maintenance.delete_empty_sessions(conn)
        maintenance.remove_transcripts(sessions_dir, removed)
        return len(removed)

    def delete_session_if_empty(self, session_id: str, sessions_dir: str | os.PathLike | None = None) -> bool:
        """Delete the session only if it has no messages, title or children; return whether it went."""
        with self._write() as conn:
            removed = maintenance.delete_session_if_empty(conn, session_id)
        maintenance.remove_transcripts(sessions_dir, [session_id] if removed else [])
        return removed

    def get_meta(self, key: str) -> str | None:
        """Return the state_meta value under `key`, or None."""
        with self._read() as conn:
            return maintenance.get_meta(conn, key)

    def set_meta(self, key: str, value: str) -> None:
        """Store a state_meta value (text) under `key`, replacing the old one."""
        with self._write() as conn:
            maintenance.set_meta(conn, key, value)

    def maybe_auto_prune_and_vacuum(self, retention_days: float = 90, min_interval_hours: float = 24,
                                    vacuum: bool = True, sessions_dir: str | os.PathLike | None = None) -> dict[str, Any]:
        """Prune old ended conversations at most once per interval, then VACUUM if any went; see docs/maintenance.md."""
        self._check_writable()  # a read-only or closed handle is the caller's mistake, not an unattended failure
        return maintenance.auto_prune_and_vacuum(self._write, self.vacuum if vacuum else None, retention_days,
                                                 min_interval_hours, sessions_dir)

    # --- hermes-agent's conversation listings (hermes_state_listings) ---------------------------

    def list_sessions_rich(self, source: str | None = None, exclude_sources: list[str] | None = None,
                           cwd_prefix: str | None = None, limit: int = 20, offset: int = 0,
                           include_children: bool = False, min_message_count: int = 0,
                           project_compression_tips: bool = True, order_by_last_active: bool = False,
                           include_archived: bool = False, archived_only: bool = False, id_query: str | None = None,
                           search_query: str | None = None, compact_rows: bool = False) -> list[dict[str, Any]]:
        """Return a page of conversations, a compressed one as its live tip, each with `preview` and `last_active`."""
        with self._read(snapshot=True) as conn:
            return listings.list_sessions_rich(conn, source, exclude_sources, cwd_prefix, limit, offset, include_children,
                                               min_message_count, project_compression_tips, order_by_last_active,
                                               include_archived, archived_only, id_query, search_query, compact_rows)

    def search_sessions(self, source: str | None = None, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
        """Return every session (children included), newest first, with `last_active`."""
        with self._read() as conn:
            return listings.search_sessions(conn, source, limit, offset)

    def search_sessions_by_id(self, query: str, limit: int = 20, include_archived: bool = True) -> list[dict[str, Any]]:
        """Return listed conversations whose id contains `query` (case-insensitive), exact matches first."""
        with self._read(snapshot=True) as conn:
            return listings.search_sessions_by_id(conn, query, limit, include_archived)

    def list_cron_job_runs(self, job_id: str, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
        """Return one cron job's run sessions newest first, each with `preview` and `last_active`."""
        with self._read() as conn:
            return listings.list_cron_job_runs(conn, job_id, limit, offset)

    @_unknown_if_unstorable(lambda: None)
    def get_compression_tip(self, session_id: str) -> str | None:
        """Return the live tip of the session's compression chain; the id itself when nothing continues it."""
        with self._read() as conn:
            return lineage.compression_successor_id(conn, session_id) or session_id

    @_unknown_if_unstorable(lambda: None)
    def resolve_session_id(self, session_id_or_prefix: str) -> str | None:
        """Return the exact id, else the one id starting with the prefix; None when none or ambiguous."""
        with self._read() as conn:
            return listings.resolve_session_id(conn, session_id_or_prefix)

    @_unknown_if_unstorable(list)
    def get_compression_lineage(self, session_id: str) -> list[str]:
        """Return the ids of the session's whole compression chain, oldest first ([] when unknown)."""
        with self._read(snapshot=True) as conn:
            return lineage.compression_chain_ids(conn, session_id)

    @_unknown_if_unstorable(lambda: None)
    def export_session_lineage(self, session_id: str) -> dict[str, Any] | None:
        """Return the session's compression chain as one export document, or None when unknown."""
        with self._read(snapshot=True) as conn:
            return portability.export_session_lineage(conn, session_id)


    # --- the names agent code written for hermes-agent calls ---------------------------------------

    sanitize_title = staticmethod(titles.sanitize_title)

    @property
    def _conn(self) -> Any:
        """The handle's connection, rows readable by column name (for tests and agent code that peek)."""
        return writer.RowConnection(self._writer.conn)

    def update_system_prompt(self, session_id: str, system_prompt: str | None) -> None:
        """Store the system prompt the session's turns are built with."""
        with self._write() as conn:
            sessions.update_system_prompt(conn, session_id, system_prompt)

    def update_session_model(self, session_id: str, model: str) -> None:
        """Set the session's model (a deliberate switch; token updates never change it)."""
        with self._write() as conn:
            sessions.update_session_model(conn, session_id, model)

    def update_session_billing_route(self, session_id: str, *, provider: str | None, base_url: str | None,
                                     billing_mode: str | None = None) -> None:
        """Switch the billing route (billing_mode kept unless given) and clear the stored system prompt."""
        with self._write() as conn:
            sessions.update_session_billing_route(conn, session_id, provider=provider, base_url=base_url,
                                                  billing_mode=billing_mode)

    def update_session_cwd(self, session_id: str, cwd: str, git_branch: str | None = None,
                           git_repo_root: str | None = None) -> None:
        """Record the working directory; an empty branch or repo root keeps the one already stored."""
        with self._write() as conn:
            sessions.update_session_cwd(conn, session_id, cwd, git_branch, git_repo_root)

    def distinct_session_cwds(self, include_archived: bool = False) -> list[dict[str, Any]]:
        """Return each working directory with its number of sessions, most used first."""
        with self._read() as conn:
            return sessions.distinct_session_cwds(conn, include_archived)

    def backfill_repo_roots(self, cwd_to_root: dict[str, str]) -> int:
        """Fill empty git_repo_root values from a {cwd: root} map; return how many rows changed."""
        with self._write() as conn:
            return sessions.backfill_repo_roots(conn, cwd_to_root)

    def set_session_archived(self, session_id: str, archived: bool) -> bool:
        """Archive or unarchive a session; False for an unknown session."""
        with self._write() as conn:
            return sessions.set_session_archived(conn, session_id, archived)

    def set_auto_title_if_empty(self, session_id: str, title: str | None) -> bool:
        """Set a generated title only while the session has none; True when it was set."""
        with self._write() as conn:
            return titles.set_auto_title_if_empty(conn, session_id, title)

    @_unknown_if_unstorable(lambda: None)
    def get_session_by_title(self, title: str) -> dict[str, Any] | None:
        """Return the session row with exactly this title, or None."""
        with self._read() as conn:
            return titles.get_session_by_title(conn, title)

    def session_count(self, source: str | None = None, cwd_prefix: str | None = None, min_message_count: int = 0,
                      include_archived: bool = False, archived_only: bool = False, exclude_children: bool = False,
                      exclude_sources: list[str] | None = None) -> int:
        """Return how many sessions match the filters (archived ones only when asked)."""
        with self._read() as conn:
            return sessions.session_count(conn, source, cwd_prefix, min_message_count, include_archived,
                                          archived_only, exclude_children, exclude_sources)

    def message_count(self, session_id: str | None = None) -> int:
        """Return how many live messages the store (or one session) holds."""
        with self._read() as conn:
            return message_rows.message_count(conn, session_id)

    def set_latest_user_api_content(self, session_id: str, content: Any, api_content: str) -> int:
        """Record what was really sent for the latest user turn whose text is `content`; return rows changed (0 or 1)."""
        return self._transcript_write(session_id, lambda conn: message_rows.set_latest_user_api_content(
            conn, session_id, content, api_content))


# hermes-agent's names for the background-review filter the conversation applies.
_is_background_review_harness_message = conversation.is_background_review_harness_message
_strip_background_review_harness = conversation.strip_background_review_harness


def list_sessions_across_profiles(root: str | os.PathLike | None = None, **filters: Any) -> dict[str, Any]:
    """List sessions of every profile under `root`, read-only; one profile's failure does not fail the rest.

    Returns {"sessions": [...], "errors": [{"profile", "error"}]}: each session carries its
    `profile` ("default" for the root's own state.db), newest first across profiles, cut to
    `limit` (default 20). A profile whose store is missing, locked, corrupt or of another
    schema version is reported in `errors` with the reason.
    """
    base = Path(root).expanduser() if root is not None else default_hermes_root()
    homes = [("default", base)]
    profiles_dir = base / "profiles"
    if profiles_dir.is_dir():
        homes += sorted((p.name, p) for p in profiles_dir.iterdir() if p.is_dir())
    limit = common.check_count("limit", filters.pop("limit", 20))
    offset = common.check_count("offset", filters.pop("offset", 0))
    found: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    for name, home in homes:
        try:
            with SessionDB(home / "state.db", read_only=True) as db:
                # The page is cut from the merged order, so each profile gives its first offset + limit.
                found += [dict(row, profile=name) for row in db.list_sessions(limit=offset + limit, **filters)]
        except (HermesStateError, sqlite3.Error, OSError) as exc:
            errors.append({"profile": name, "error": f"{type(exc).__name__}: {exc}"})
    found.sort(key=lambda row: (row["started_at"], row["profile"], row["id"]), reverse=True)
    return {"sessions": found[offset:offset + limit], "errors": errors}


class AsyncSessionDB:
    """The SessionDB API as coroutines; each call runs on a worker thread.

    Every public method of SessionDB that touches the database has a coroutine twin here with
    the same signature; `to_provider_messages` does no I/O and stays a plain function.
    """

    to_provider_messages = staticmethod(to_provider_messages)

    def __init__(self, db: SessionDB):
        self.db = db

    def __getattr__(self, name: str) -> Any:
        # Plain attributes (db_path, read_only, profile_home...) read through; methods are the
        # coroutine twins defined below, so a private or unknown method is an AttributeError.
        value = getattr(self.db, name)
        if callable(value):
            raise AttributeError(f"AsyncSessionDB has no coroutine {name!r}")
        return value

    async def close(self) -> None:
        """Close the wrapped handle (on a worker thread)."""
        await asyncio.to_thread(self.db.close)

    async def __aenter__(self) -> "AsyncSessionDB":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _coroutine_twin(name: str) -> Callable[..., Any]:
    method = getattr(SessionDB, name)

    @functools.wraps(method)  # keeps the name, docstring and signature for help() and editors
    async def call(self: AsyncSessionDB, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.db, name), *args, **kwargs)
    return call


# Public I/O methods only: lifecycle and pure helpers are not database calls.
_NOT_ASYNC = {"close", "release", "shared", "to_provider_messages", "tracer"}
for _name, _member in list(vars(SessionDB).items()):
    if not _name.startswith("_") and _name not in _NOT_ASYNC and callable(_member):
        setattr(AsyncSessionDB, _name, _coroutine_twin(_name))
del _name, _member
