"""hermes-state: the `SessionDB` facade over one SQLite file per profile.

Owns: opening and closing a handle, choosing each call's transaction and patience, and the
method table that turns module functions into public methods. It holds no SQL. Re-exports the
public names.

Transaction contract: every write method is exactly one BEGIN IMMEDIATE transaction (the
`transaction()` context, which also serves callers); reads run under the handle's read lock,
in one short read transaction where the table says "snapshot". See docs/architecture.md.
"""
from __future__ import annotations

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

import os
import sqlite3
import sys  # noqa: F401  (hermes-agent's tests patch hermes_state.sys.platform)
import time  # noqa: F401  (and hermes_state.time.time)
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import hermes_state_common as common
import hermes_state_compression as compression
import hermes_state_conversation as conversation
import hermes_state_fts as fts
import hermes_state_gateway as gateway
import hermes_state_gateway_sessions as gateway_sessions
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
import hermes_state_table as table
import hermes_state_telegram as telegram
import hermes_state_titles as titles
import hermes_state_upgrade as upgrade
import hermes_state_writer as writer
from hermes_state_gateway import receipt_digest
from hermes_state_cjk import has_cjk
from hermes_state_query import MAX_QUERY_CHARS as MAX_FTS5_QUERY_CHARS  # noqa: F401 - hermes-agent's name
from hermes_state_portability import EXPORT_FORMAT, EXPORT_VERSION, ImportReport
from hermes_state_ownership import input_marker
from hermes_state_provider import ReasoningFieldMemory, strip_echoed_user_input, to_provider_messages
from hermes_state_listings import workspace_key
from hermes_state_recovery import RecoveryReport, TableRecovery, recover
from hermes_state_repair import (ATTEMPTED_PATHS as _repair_attempted_paths, db_opens_cleanly as _db_opens_cleanly,
                                 is_malformed_db_error, open_repairing, repair_state_db_schema as _repair_file)
from hermes_state_common import SCHEMA_VERSION
from hermes_state_table import Entry
from hermes_state_writer import RetryPolicy, SharedHandles, Transaction, Writer
from hermes_state_errors import (ForeignDatabaseError, HermesStateError, ImportConflictError,  # noqa: F401
                                 ImportValidationError,
                                 LedgerStateError, OwnershipReadError, ProfileNotFoundError, ReadOnlyError,
                                 ReceiptDigestError, ReceiptOrderError, SessionBusyError, SessionClosedByCompressionError,
                                 SessionCompressionInProgressError, SessionNotFoundError, SessionPersistenceError,
                                 StaleEpochError, StateDbBusyError, StateDbCorruptError, StateDbIncompatibleError,
                                 StateDbUninitializedError, StoreUnavailableError, TitleConflictError,
                                 classify_persistence_error, is_sqlite_lock_error, typed_errors)
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
    "workspace_key", "ForeignDatabaseError",
    "SessionDB", "AsyncSessionDB", "SCHEMA_VERSION", "list_sessions_across_profiles",
    "get_hermes_home", "hermes_home_override", "profile_home", "child_env", "display_hermes_home",
    "ReasoningFieldMemory", "to_provider_messages", "configure_error_log",
    "HermesStateError", "SessionPersistenceError", "StateDbCorruptError", "StateDbIncompatibleError",
    "StateDbUninitializedError", "StateDbBusyError", "StoreUnavailableError", "ReadOnlyError",
    "SessionNotFoundError", "TitleConflictError", "SessionBusyError", "SessionCompressionInProgressError",
    "SessionClosedByCompressionError", "StaleEpochError", "ReceiptOrderError", "ReceiptDigestError",
    "OwnershipReadError", "ProfileNotFoundError", "is_sqlite_lock_error", "classify_persistence_error",
    "recover", "RecoveryReport", "TableRecovery", "ImportReport", "ImportValidationError", "ImportConflictError",
    "EXPORT_FORMAT", "EXPORT_VERSION", "Transaction", "repair_state_db_schema", "is_malformed_db_error",
    "LedgerStateError", "receipt_digest", "input_marker", "strip_echoed_user_input",
]

def _resolve_path(db_path: str | os.PathLike | None, home: Path) -> Path:
    if db_path is None:
        return home / "state.db"
    if str(db_path) == ":memory:":
        return Path(":memory:")
    return Path(db_path).expanduser().absolute()


_SHARED = SharedHandles()


def repair_state_db_schema(db_path: str | os.PathLike, *, backup: bool = True) -> dict[str, Any]:
    """Repair a malformed schema or full-text index in place, a copy kept first; return the report."""
    return _repair_file(db_path, backup=backup, check=lambda path: _db_opens_cleanly(path))


class SessionDB:
    """One profile's session store: a WAL connection shared by every sibling module."""

    # Timing policy, read at call time so an application or a test can tune it on the class
    # or on one instance.
    _WRITE_PATIENCE_S, _TRANSCRIPT_WRITE_PATIENCE_S = common.WRITE_PATIENCE_S, common.TRANSCRIPT_WRITE_PATIENCE_S
    _ACTIVITY_WRITE_PATIENCE_S, _READ_BUSY_TIMEOUT_S = common.ACTIVITY_WRITE_PATIENCE_S, common.READ_BUSY_TIMEOUT_S
    _WRITE_RETRY_MIN_S, _WRITE_RETRY_MAX_S = common.WRITE_RETRY_MIN_S, common.WRITE_RETRY_MAX_S
    _WRITE_RETRY_SLOW_MIN_S, _WRITE_RETRY_SLOW_MAX_S = common.WRITE_RETRY_SLOW_MIN_S, common.WRITE_RETRY_SLOW_MAX_S
    _CHECKPOINT_EVERY_N_WRITES, _OPTIMIZE_EVERY_N_WRITES = common.CHECKPOINT_EVERY_N_WRITES, fts.OPTIMIZE_EVERY_N_WRITES
    # Transcript writes wait this long for another holder's compression.
    _COMPRESSION_WAIT_S = compression.COMPRESSION_WAIT_S
    # Rows per FTS rebuild transaction; whether open leaves a rebuild to a background thread (tests turn it off).
    _FTS_REBUILD_CHUNK_ROWS = fts.REBUILD_CHUNK_ROWS
    _FTS_REBUILD_IN_BACKGROUND = True
    _shared_key: str | None = None  # set on handles handed out by shared()
    _fts: upgrade.FtsRebuild | None = None  # the background index rebuild this open started, if any
    # The patience of each kind of table write that does not wait the default _WRITE_PATIENCE_S.
    _PATIENCE = {"activity": "_ACTIVITY_WRITE_PATIENCE_S", "compression": "_TRANSCRIPT_WRITE_PATIENCE_S"}

    def __init__(self, db_path: str | os.PathLike | None = None, *, read_only: bool = False,
                 backup_before_upgrade: bool = True, force: bool = False):
        # Absolute, so a later chdir or HERMES_HOME change cannot move this handle.
        self.profile_home = get_hermes_home().absolute()
        self.db_path = _resolve_path(db_path, self.profile_home)
        self.read_only, self._backup_before_upgrade = read_only, backup_before_upgrade
        self._closed, self._fts = False, None
        check_db_path_allowed(self.db_path)  # before any directory, file or pragma
        # A writable file gets a second connection for reads (opened on first read); read-only
        # handles and in-memory databases (a second connection would be another database) do not.
        separate_reads = not read_only and str(self.db_path) != ":memory:"
        # force: add the store's tables even to another program's database. upgrade_backup: the copy
        # written before this handle upgraded the file; mode_changes: files this open tightened to 0600.
        try:
            opened = open_repairing(lambda: upgrade.open_connection(
                self.db_path, read_only=read_only, read_busy_s=self._READ_BUSY_TIMEOUT_S,
                patience_s=self._WRITE_PATIENCE_S, policy=self._policy(), backup=backup_before_upgrade, force=force,
                on_give_up=self._log_lock_holders), self.db_path, _repair_attempted_paths,
                None if read_only else repair_state_db_schema)
            conn, self.schema_version = opened.conn, opened.schema_version
            self.upgrade_backup, self.mode_changes = opened.upgrade_backup, opened.mode_changes
            self._writer = Writer(conn, on_give_up=self._log_lock_holders, open_reader=(
                lambda: schema.connect_reader(self.db_path)) if separate_reads else None)
            self._writer.after_commit.append(self._upkeep)
            self._open_fts()
        except Exception as exc:  # kept for a caller that reports the failure later (a slash command)
            set_last_init_error(describe_init_failure(exc))
            raise

    # --- lifecycle -----------------------------------------------------------------------------------

    def _open_fts(self) -> None:
        writable = not self.read_only and (self.schema_version or 0) <= SCHEMA_VERSION
        try:
            with typed_errors(self.db_path, reading=True):  # a damaged index page -> StateDbCorruptError
                self._fts = upgrade.open_fts(self._writer, self.db_path, self._WRITE_PATIENCE_S, self._policy(),
                                             writable=writable, chunk_rows=self._FTS_REBUILD_CHUNK_ROWS,
                                             background=self._FTS_REBUILD_IN_BACKGROUND)
        except BaseException:
            self._writer.close(checkpoint=False)
            raise

    @property
    def _fts_worker(self) -> Any:  # the background rebuild thread, or None (the FTS tests join it)
        return self._fts.thread if self._fts is not None else None

    def close(self) -> None:
        """Checkpoint (PASSIVE) and close; twice is harmless. A `shared()` handle gives back one use, like `release()`."""
        if self._shared_key is None or _SHARED.release(self._shared_key, self):
            self._close_now()

    def _close_now(self) -> None:
        if self._closed:
            return
        if self._fts is not None:
            self._fts.stop()
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

        def open_handle() -> SessionDB:
            handle = cls(path)
            handle._shared_key = key
            return handle
        return _SHARED.take(key, open_handle, lambda handle: handle.closed)

    def release(self) -> None:
        """Give back one use of a shared handle; the last release closes it."""
        self.close()

    @property
    def closed(self) -> bool:
        """True once this handle is closed (for a shared handle: once its last user released it)."""
        return self._closed

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

    # --- the transactions -------------------------------------------------------------------------------

    def transaction(self, *, patience_s: float | None = None) -> AbstractContextManager[Transaction]:
        """Open one BEGIN IMMEDIATE write transaction for a `with` block; it gets `txn.conn`, `txn.after_commit(fn)`.

        Commits when the block ends, rolls back on any exception (KeyboardInterrupt too). The
        handle's own methods called inside join it. Callbacks run after COMMIT, in order.
        """
        self._check_writable()  # refused at the call, before any SQL, like every write
        return self._transaction(patience_s)

    @contextmanager
    def _transaction(self, patience_s: float | None) -> Iterator[Transaction]:
        with self._write(patience_s):
            yield Transaction(self._writer)

    def _policy(self) -> RetryPolicy:
        return RetryPolicy(self._WRITE_RETRY_MIN_S, self._WRITE_RETRY_MAX_S,
                           self._WRITE_RETRY_SLOW_MIN_S, self._WRITE_RETRY_SLOW_MAX_S)

    def _log_lock_holders(self, patience_s: float) -> None:
        log_write_lock_holders(self.db_path, patience_s)

    def _upkeep(self, conn: sqlite3.Connection, writes: int) -> None:
        if writes % self._CHECKPOINT_EVERY_N_WRITES == 0:
            writer.passive_checkpoint(conn)
        fts.upkeep(conn, writes)  # a bounded FTS merge every 1,000 writes
        if fts.optimize_due(writes, self._OPTIMIZE_EVERY_N_WRITES):  # after the lock is let go, in its own transaction
            self._writer.defer(lambda: fts.optimize_quietly(lambda: self.optimize_fts()))

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
        self._check_writable()
        return compression.transcript_write(lambda: self._write(self._TRANSCRIPT_WRITE_PATIENCE_S), self._read,
                                            session_id, body, wait_s=self._COMPRESSION_WAIT_S)

    @contextmanager
    def _read(self, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
        if self._closed:
            raise HermesStateError(f"SessionDB for {self.db_path} is closed")
        with typed_errors(self.db_path, reading=True), self._writer.reading(snapshot) as conn:
            yield conn

    def _run(self, entry: Entry, args: tuple, kwargs: dict) -> Any:
        # Every table method comes through here: the one place that maps a kind to its transaction.
        if (key := entry.unstorable(args, kwargs)) is not None:
            return entry.answer_unknown(key)
        args, kwargs = entry.arguments(args, kwargs)
        if entry.kind in table.READS:
            with self._read(snapshot=entry.kind == "snapshot") as conn:
                return entry.function(conn, *args, **kwargs)
        if entry.kind == "transcript":
            return self._transcript_write(entry.key(args, kwargs), lambda conn: entry.function(conn, *args, **kwargs))
        patience = getattr(self, self._PATIENCE[entry.kind]) if entry.kind in self._PATIENCE else None
        with self._write(patience) as conn:
            return entry.function(conn, *args, **kwargs)

    # --- the method table: one line per public method that only delegates ------------------------------
    # name = Entry(transaction kind, module function, unknown=what a read answers for an unknown id).
    # Kinds: read, snapshot (one read transaction), write, transcript (transcript patience, waits out
    # another holder's compression), compression (transcript patience: the compression itself),
    # activity (short patience: bookkeeping that must never stall a turn).
    get_session = Entry("read", sessions.get_session, unknown=None)
    end_session = Entry("write", sessions.end_session)
    reopen_session = Entry("write", sessions.reopen_session)
    update_session = Entry("write", sessions.update_session, pack="columns")
    update_token_counts = Entry("write", sessions.update_token_counts)
    archive_session = Entry("write", sessions.archive_session)
    unarchive_session = Entry("write", sessions.unarchive_session)
    pin_session = Entry("write", sessions.pin_session)
    auto_archive = Entry("write", sessions.auto_archive)
    update_system_prompt = Entry("write", sessions.update_system_prompt)
    update_session_model = Entry("write", sessions.update_session_model)
    update_session_billing_route = Entry("write", sessions.update_session_billing_route)
    update_session_cwd = Entry("write", sessions.update_session_cwd)
    distinct_session_cwds = Entry("read", sessions.distinct_session_cwds)
    backfill_repo_roots = Entry("write", sessions.backfill_repo_roots)
    set_session_archived = Entry("write", sessions.set_session_archived)
    session_count = Entry("read", sessions.session_count)
    set_session_title = Entry("write", titles.set_session_title)
    set_auto_title_if_empty = Entry("write", titles.set_auto_title_if_empty)
    get_session_title = Entry("read", titles.get_session_title, unknown=None)
    get_session_by_title = Entry("read", titles.get_session_by_title, unknown=None)
    resolve_session_by_title = Entry("read", titles.resolve_session_by_title, unknown=None)
    get_next_title_in_lineage = Entry("read", titles.get_next_title_in_lineage)
    sanitize_title = staticmethod(titles.sanitize_title)
    append_message = Entry("transcript", message_rows.append_message)
    merge_messages = Entry("transcript", message_rows.merge_messages)
    get_messages = Entry("read", message_rows.get_messages, unknown=[])
    message_count = Entry("read", message_rows.message_count, unknown=0)
    set_latest_user_api_content = Entry("transcript", message_rows.set_latest_user_api_content)
    replace_messages = Entry("transcript", message_rows.replace_messages)
    clear_messages = Entry("transcript", message_rows.clear_messages)
    get_resume_conversations = Entry("snapshot", conversation.get_resume_conversations, unknown=([], []))
    get_ancestor_display_prefix = Entry("snapshot", conversation.get_ancestor_display_prefix, unknown=[])
    get_lineage = Entry("read", lineage.get_lineage, unknown=[])
    get_descendants = Entry("read", lineage.get_descendants, unknown=[])
    get_compression_successor = Entry("read", lineage.compression_successor_id, unknown=None)
    get_compression_ancestors = Entry("read", lineage.compression_ancestor_ids, unknown=[])
    get_compression_lineage = Entry("snapshot", lineage.compression_chain_ids, unknown=[])
    resolve_session_id = Entry("read", listings.resolve_session_id, unknown=None)
    list_sessions = Entry("read", listings.list_sessions)
    count_sessions = Entry("read", listings.count_sessions)
    usage_by_model = Entry("read", listings.usage_by_model)
    top_sessions_by_tokens = Entry("read", listings.top_sessions_by_tokens)
    list_sessions_rich = Entry("snapshot", listings.list_sessions_rich)
    search_sessions = Entry("read", listings.search_sessions)
    search_sessions_by_id = Entry("snapshot", listings.search_sessions_by_id)
    list_cron_job_runs = Entry("read", listings.list_cron_job_runs, unknown=[])
    search_messages = Entry("snapshot", search.search_messages)
    _sanitize_fts5_query = staticmethod(fts._sanitize_fts5_query)  # the sanitizer, by the name callers know
    _contains_cjk = staticmethod(has_cjk)  # hermes-agent's name for "does this text hold CJK letters"
    fts_rebuild_status = Entry("read", fts.rebuild_status)
    optimize_fts = Entry("write", fts.optimize)
    compress_in_place = Entry("compression", compression.compress_in_place)
    rotate_session = Entry("compression", compression.rotate_session, pack="child_columns")
    acquire_compression_lock = Entry("write", compression.acquire_compression_lock)
    release_compression_lock = Entry("write", compression.release_compression_lock)
    try_acquire_compression_lock = Entry("write", compression.try_acquire_compression_lock)
    refresh_compression_lock = Entry("write", compression.refresh_compression_lock)
    get_compression_lock_holder = Entry("read", compression.get_compression_lock_holder, unknown=None)
    record_compression_failure_cooldown = Entry("write", compression.record_compression_failure_cooldown)
    get_compression_failure_cooldown = Entry("read", compression.get_compression_failure_cooldown, unknown=None)
    clear_compression_failure_cooldown = Entry("write", compression.clear_compression_failure_cooldown)
    get_compression_fallback_streak = Entry("read", compression.get_compression_fallback_streak, unknown=0)
    set_compression_fallback_streak = Entry("write", compression.set_compression_fallback_streak)
    claim_runtime = Entry("write", gateway.claim_runtime)
    get_runtime = Entry("read", gateway.get_runtime)
    admit_input = Entry("write", gateway.admit_input)
    next_admission = Entry("read", gateway.next_admission, unknown=None)
    start_admission = Entry("write", gateway.start_admission)
    finish_admission = Entry("write", gateway.finish_admission)
    resolve_unknown = Entry("write", gateway.resolve_unknown)
    get_admission = Entry("read", gateway.get_admission, unknown=None)
    list_admissions = Entry("read", gateway.list_admissions, unknown=[])
    start_execution = Entry("write", gateway.start_execution)
    finish_execution = Entry("write", gateway.finish_execution)
    get_execution = Entry("read", gateway.get_execution, unknown=None)
    list_executions = Entry("read", gateway.list_executions, unknown=[])
    record_receipt = Entry("write", gateway.record_receipt)
    list_receipts = Entry("read", gateway.list_receipts, unknown=[])
    record_gateway_session_peer = Entry("write", gateway_sessions.record_gateway_session_peer)
    set_expiry_finalized = Entry("write", gateway_sessions.set_expiry_finalized)
    find_latest_gateway_session_for_peer = Entry("read", gateway_sessions.find_latest_gateway_session_for_peer, unknown=None)
    list_gateway_sessions = Entry("read", gateway_sessions.list_gateway_sessions, unknown=[])
    find_session_by_origin = Entry("read", gateway_sessions.find_session_by_origin, unknown=None)
    owe_delivery = Entry("write", routing.owe_delivery)
    begin_delivery = Entry("activity", routing.begin_delivery)
    mark_delivered = Entry("activity", routing.mark_delivered)
    mark_failed = Entry("activity", routing.mark_failed)
    recover_deliveries = Entry("write", routing.recover_deliveries)
    list_owed = Entry("read", routing.list_owed, unknown=[])
    get_delivery = Entry("read", routing.get_delivery, unknown=None)
    set_route = Entry("write", routing.set_route)
    get_route = Entry("read", routing.get_route, unknown=None)
    list_routes = Entry("read", routing.list_routes, unknown=[])
    delete_route = Entry("write", routing.delete_route)
    record_delegation = Entry("write", routing.record_delegation)
    get_delegation = Entry("read", routing.get_delegation, unknown=None)
    list_delegations = Entry("read", routing.list_delegations, unknown=[])
    export_session = Entry("snapshot", portability.export_session, unknown=None)
    export_session_lineage = Entry("snapshot", portability.export_session_lineage, unknown=None)
    backup = Entry("read", recovery.backup_to)
    list_prune_candidates = Entry("snapshot", maintenance.list_prune_candidates, pack="filters")
    archive_sessions = Entry("write", maintenance.archive_sessions, pack="filters")
    count_empty_sessions = Entry("snapshot", maintenance.count_empty_sessions)
    apply_telegram_topic_migration = Entry("write", telegram.apply_telegram_topic_migration)
    bind_telegram_topic = Entry("write", telegram.bind_telegram_topic)
    get_telegram_topic_binding = Entry("read", telegram.get_telegram_topic_binding, unknown=None)
    get_telegram_topic_binding_by_session = Entry("read", telegram.get_telegram_topic_binding_by_session, unknown=None)
    is_telegram_session_linked_to_topic = Entry("read", telegram.is_telegram_session_linked_to_topic, unknown=False)
    list_telegram_topic_bindings_for_chat = Entry("read", telegram.list_telegram_topic_bindings_for_chat, unknown=[])
    delete_telegram_topic_binding = Entry("write", telegram.delete_telegram_topic_binding)
    enable_telegram_topic_mode = Entry("write", telegram.enable_telegram_topic_mode)
    disable_telegram_topic_mode = Entry("write", telegram.disable_telegram_topic_mode)
    is_telegram_topic_mode_enabled = Entry("read", telegram.is_telegram_topic_mode_enabled, unknown=False)
    list_unlinked_telegram_sessions_for_user = Entry("read", telegram.list_unlinked_telegram_sessions_for_user, unknown=[])
    get_meta = Entry("read", maintenance.get_meta, unknown=None)
    set_meta = Entry("write", maintenance.set_meta)
    to_provider_messages = staticmethod(to_provider_messages)

    # --- explicit methods: the arguments are reshaped, or one call composes several steps --------------

    def create_session(self, session_id: str, source: str, model: str | None = None, *,
                       model_config: Any = None, system_prompt: str | None = None, user_id: str | None = None,
                       parent_session_id: str | None = None, **columns: Any) -> str:
        """Create the session, or fill the still-empty columns of an existing one (first write wins); return the id."""
        columns.update(model=model, model_config=model_config, system_prompt=system_prompt, user_id=user_id,
                       parent_session_id=parent_session_id)
        with self._write() as conn:
            return sessions.create_session(conn, session_id, source, columns)

    def ensure_session(self, session_id: str, source: str, model: str | None = None, *,
                       model_config: Any = None, system_prompt: str | None = None, user_id: str | None = None,
                       parent_session_id: str | None = None, **columns: Any) -> str:
        """Create the session unless it exists (an existing row is left as it is); return the id."""
        columns.update(model=model, model_config=model_config, system_prompt=system_prompt, user_id=user_id,
                       parent_session_id=parent_session_id)
        with self._write() as conn:
            return sessions.ensure_session(conn, session_id, source, columns)

    def update_delegation(self, delegation_id: str, **changes: Any) -> None:
        """Move a delegation on (`state=`) and/or set its `result=` or `target=`; a finished one is final."""
        with self._write() as conn:
            routing.update_delegation(conn, delegation_id, **changes)

    def persist_failed_turn_input(self, session_id: str, message: Any, marker: str) -> int | None:
        """Append a failed turn's user input unless a row already owns `marker`; return the row id or None."""
        self._check_writable()
        with self._read() as conn:  # where it would go, so a compression there is waited out first
            target = ownership.input_target(conn, session_id)
        return self._transcript_write(target, lambda conn: ownership.persist_failed_turn_input(
            conn, session_id, message, marker))

    def check_integrity(self, full: bool = False) -> dict[str, Any]:
        """Return {"ok", "problems", "fts"}: SQLite's quick check (full with `full`) and each FTS index's check.

        The FTS checks need a writable handle (FTS5 runs them as write commands, changing
        nothing); on a read-only handle "fts" is empty.
        """
        return recovery.check_integrity(self._read, None if self.read_only else self._write, full)

    def rebuild_fts(self) -> dict[str, Any]:
        """Rebuild the FTS indexes to the end in short chunks (resuming one under way); return the status."""
        self._check_writable()  # one transaction per chunk, by design: other writers get turns
        with typed_errors(self.db_path, reading=True):
            upgrade.rebuild_fts(self._writer, self.db_path, self._WRITE_PATIENCE_S, self._policy(),
                                self._FTS_REBUILD_CHUNK_ROWS)
        return self.fts_rebuild_status()

    def import_sessions(self, data: Any, on_conflict: str = "skip", *, strict: bool = False) -> ImportReport:
        """Import export documents (any iterable, read once) in one transaction; see ImportReport and `strict`."""
        return portability.import_stream(self._write, data, on_conflict, strict)

    def get_messages_as_conversation(self, session_id: str, include_ancestors: bool = False,
                                     with_row_ids: bool = False, include_inactive: bool = False,
                                     repair_alternation: bool = False) -> list[dict[str, Any]]:
        """Return the transcript as OpenAI-format dicts (the parent chain first, repaired for sending, if asked)."""
        if isinstance(session_id, str) and common.has_surrogate(session_id):
            return []  # no stored id can hold a lone surrogate
        with self._read(snapshot=True) as conn:
            return conversation.get_messages_as_conversation(conn, session_id, include_ancestors, with_row_ids,
                                                             include_inactive, repair_alternation)

    def iter_export(self, source: str | None = None) -> Iterator[dict[str, Any]]:
        """Yield export documents one session at a time, by id (memory stays flat)."""
        return portability.iter_export(self._read, source)

    def export_all(self, source: str | None = None) -> list[dict[str, Any]]:
        """Return the export documents of every session (of `source` when given), by id."""
        return list(self.iter_export(source))

    def restore(self, source_path: str | os.PathLike) -> None:
        """Replace the content with a checked backup, in one transaction every handle sees whole."""
        self._check_writable()
        source = recovery.check_restorable(source_path)
        if self._fts is not None:
            self._fts.stop()
        with self._writer.exclusive() as conn:
            self.schema_version, copied, _ = recovery.restore_from(conn, source, lambda conn: upgrade.set_up(
                conn, self.db_path, self._WRITE_PATIENCE_S, self._policy(), backup=self._backup_before_upgrade,
                on_give_up=self._log_lock_holders))
        self.upgrade_backup = copied or self.upgrade_backup
        self._open_fts()

    def vacuum(self) -> dict[str, int]:
        """Give free pages back to the file system; writers wait while it runs (seconds per GB)."""
        self._check_writable()
        with self._writer.exclusive() as conn:
            return recovery.vacuum(conn, self._WRITE_PATIENCE_S, self._policy())

    # --- maintenance: deleting, pruning, the empty-session sweeps (hermes_state_maintenance;
    # docs/maintenance.md). Transcript files go only after COMMIT.

    @property
    def _conn(self) -> Any:
        """The handle's connection, rows readable by column name (for tests and agent code that peek)."""
        return writer.RowConnection(self._writer.conn)

    def delete_session(self, session_id: str, sessions_dir: str | os.PathLike | None = None) -> bool:
        """Delete a session with its whole conversation and its delegates; False for an unknown id."""
        if isinstance(session_id, str) and common.has_surrogate(session_id):
            return False  # no stored id can hold a lone surrogate
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

    def maybe_auto_prune_and_vacuum(self, retention_days: float = 90, min_interval_hours: float = 24,
                                    vacuum: bool = True, sessions_dir: str | os.PathLike | None = None) -> dict[str, Any]:
        """Prune old ended conversations at most once per interval, then VACUUM if any went; see docs/maintenance.md."""
        self._check_writable()  # a read-only or closed handle is the caller's mistake, not an unattended failure
        return maintenance.auto_prune_and_vacuum(self._write, self.vacuum if vacuum else None, retention_days,
                                                 min_interval_hours, sessions_dir)

    def get_compression_tip(self, session_id: str) -> str | None:
        """Return the live tip of the session's compression chain; the id itself when nothing continues it."""
        if isinstance(session_id, str) and common.has_surrogate(session_id):
            return None  # no stored id can hold a lone surrogate
        with self._read() as conn:
            return lineage.compression_successor_id(conn, session_id) or session_id


# hermes-agent's names for the background-review filter the conversation applies.
_is_background_review_harness_message = conversation.is_background_review_harness_message
_strip_background_review_harness = conversation.strip_background_review_harness


def list_sessions_across_profiles(root: str | os.PathLike | None = None, **filters: Any) -> dict[str, Any]:
    """List sessions of every profile under `root`, read-only; one profile's failure does not fail the rest.

    Returns {"sessions": [...], "errors": [{"profile", "error"}]}: sessions carry their `profile`
    ("default" for the root's own), newest first across profiles, cut to `limit` (default 20).
    """
    return listings.list_across_profiles(lambda path: SessionDB(path, read_only=True), root, **filters)


class AsyncSessionDB(table.AsyncFacade):
    """The SessionDB API as coroutines; each call runs on a worker thread. `AsyncSessionDB(db)` wraps a handle.

    Every public method of SessionDB that touches the database has a twin here with the same
    signature: a coroutine, or for the streaming `iter_*` methods an async generator that reads
    each item on a worker thread. `to_provider_messages` does no I/O and stays a plain function.
    """

    to_provider_messages = staticmethod(to_provider_messages)


# Public I/O methods only: lifecycle, pure helpers and the thread-bound transaction are not database calls.
table.add_async_twins(SessionDB, AsyncSessionDB, skip={"close", "release", "shared", "to_provider_messages", "tracer",
                                                       "transaction"})
