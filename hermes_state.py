"""hermes-state: the `SessionDB` facade over one SQLite file per profile.

Owns: the public methods. Most are one line each in the method table (`name = Entry(kind,
module function)`, the module function named directly), taking their signature and docstring
from the module function; explicit methods remain where arguments are reshaped or one call
composes several steps. Re-exports the public names; the modules behind them are declared once,
as plain imports loaded at their first use. It holds no SQL and no plumbing: opening and closing,
the shared handles, the timing knobs and what each kind of call means as a transaction are
`hermes_state_handle.Handle`, the base class; the table's machinery is `hermes_state_methods`.

Transaction contract: every write method is exactly one BEGIN IMMEDIATE transaction (the
`transaction()` context, which also serves callers); reads run under the handle's read lock,
in one short read transaction where the table says "snapshot". See docs/architecture.md.
"""
from __future__ import annotations

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

import abc
import importlib
import types
import os
import sqlite3
import sys  # hermes-agent's tests also patch hermes_state.sys.platform
import time  # noqa: F401  (and hermes_state.time.time)
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import hermes_state_common as common
import hermes_state_home as home
import hermes_state_titles as titles
import hermes_state_writer as writer
from hermes_state_provider import ReasoningFieldMemory, sanitize_context, strip_echoed_user_input, to_provider_messages
from hermes_state_common import DEFERRED_INDEX_SQL, SCHEMA_SQL, SCHEMA_VERSION
from hermes_state_handle import Handle
from hermes_state_methods import AsyncFacade, Entry, Lookup, add_async_twins, deferred_imports, same_arguments, static
from hermes_state_writer import RetryPolicy, SharedHandles, Transaction, Writer
# The modules behind the method table and the explicit methods, and the public names of modules most
# programs never need: checkers and editors see these imports as written; at run time each module is
# imported at its first use, and each name at its first read (hermes_state_methods.deferred_imports).
# A program that opens a store and lists its sessions does not pay for the gateway ledgers or recovery.
with deferred_imports(globals()) as _LAZY_NAMES:
    import hermes_state_cjk as cjk
    import hermes_state_compression as compression
    import hermes_state_conversation as conversation
    import hermes_state_fts as fts
    import hermes_state_gateway as gateway
    import hermes_state_lineage as lineage
    import hermes_state_listings as listings
    import hermes_state_maintenance as maintenance
    import hermes_state_messages as message_rows
    import hermes_state_portability as portability
    import hermes_state_query as query
    import hermes_state_recovery as recovery
    import hermes_state_schema as schema
    import hermes_state_routing as routing
    import hermes_state_search as search
    import hermes_state_sessions as sessions
    import hermes_state_telegram as telegram
    import hermes_state_upgrade as upgrade
    from hermes_state_gateway import receipt_digest
    from hermes_state_cjk import has_cjk
    from hermes_state_query import MAX_QUERY_CHARS as MAX_FTS5_QUERY_CHARS  # noqa: F401 - hermes-agent's name
    from hermes_state_portability import EXPORT_FORMAT, EXPORT_VERSION, ImportReport
    from hermes_state_routing import input_marker
    from hermes_state_listings import workspace_key
    from hermes_state_recovery import RecoveryReport, TableRecovery, recover
    from hermes_state_repair import (ATTEMPTED_PATHS as _repair_attempted_paths, db_opens_cleanly as _db_opens_cleanly,
                                     is_malformed_db_error, open_repairing, repair_state_db_schema as _repair_file)
    from hermes_state_fts import FTS_SQL, FTS_TRIGRAM_SQL
    from hermes_state_lockowners import configure_error_log, log_write_lock_holders
    from hermes_state_schema import apply_wal_with_fallback, wal_fallback_warned as _wal_fallback_warned_paths
    # hermes-agent 0.20.1's lifecycle states and size guards.
    from hermes_state_listings import (SESSION_STATUS_COMPLETE, SESSION_STATUS_EMPTY, SESSION_STATUS_ERROR,
                                       SESSION_STATUS_INTERRUPTED, classify_session_status)
    from hermes_state_messages import (MAX_SAFE_EXPORT_MESSAGES, MAX_SAFE_RESUME_MESSAGES, resolved_max_export_messages,
                                       resolved_max_resume_messages)
    # hermes-agent 0.20.1's /skill scaffolding names.
    from hermes_state_listings import SKILL_EXCERPT_JOINT, SKILL_SCAFFOLD_SQL_LIKE, describe_skill_invocation
    from hermes_state_sessions import ActivityProvenance  # hermes-agent's agent.session_activity
    # hermes-agent 0.20.1: the file's health, journal and writability checks.
    from hermes_state_schema import apply_database_pragmas, preflight_db_writability, resolve_journal_mode
    from hermes_state_recovery import collect_state_db_stats, is_zeroed_state_db, quarantine_zeroed_state_db
    from hermes_state_lockowners import count_db_holders
    # hermes-agent's names for the background-review filter the conversation applies.
    from hermes_state_conversation import (is_background_review_harness_message as _is_background_review_harness_message,
                                           strip_background_review_harness as _strip_background_review_harness)
from hermes_state_errors import (AdoptionRefusedError, ForeignDatabaseError, HermesStateError, ImportConflictError,  # noqa: F401
                                 ImportValidationError, SessionFilterError,
                                 CompressionSessionBusyError, CompressionSessionClosedError, SessionTurnLeaseLostError,
                                 LedgerStateError, OwnershipReadError, ProfileNotFoundError, ReadOnlyError,
                                 ReceiptDigestError, ReceiptOrderError, SessionBusyError, SessionClosedByCompressionError,
                                 SessionCompressionInProgressError, SessionExportTooLargeError, SessionNotFoundError,
                                 SessionPersistenceError, SessionResumeTooLargeError, PERSISTENCE_ERROR_CAUSES,
                                 StaleEpochError, StateDbBusyError, StateDbCorruptError, StateDbIncompatibleError,
                                 StateDbUninitializedError, StoreUnavailableError, TitleConflictError,
                                 classify_persistence_error, is_sqlite_lock_error, typed_errors)
from hermes_state_home import (check_db_path_allowed, child_env, default_hermes_root,  # noqa: F401
                               display_hermes_home, get_hermes_home, hermes_home_override, profile_home)
from hermes_state_errors import (StateDbJournalError, describe_init_failure, format_session_db_unavailable,
                                 get_last_init_error, set_last_init_error)
# hermes-agent 0.20.1: the file's health, journal and writability checks (the rest are read lazily).
from hermes_state_errors import WalUnsupportedError, is_disk_full_error  # noqa: E402,F401
from hermes_state_common import is_sqlite_wal_reset_vulnerable, sqlite_source_id  # noqa: E402,F401
# hermes-agent's module exposes its imports as public names, and its callers' tests patch some of
# them (hermes_state.time.time, hermes_state.random, hermes_state.logger): the same names are here,
# the logger being this library's own ("hermes_state").
import json  # noqa: E402,F401
import logging  # noqa: E402,F401
import random  # noqa: E402,F401
import re  # noqa: E402,F401
import threading  # noqa: E402,F401
from typing import Dict, List, Optional, Set, Tuple, TypeVar  # noqa: E402,F401,UP035
from collections import deque  # noqa: E402,F401  (hermes-agent 0.20.1's module has it among its names)
from hermes_state_common import logger  # noqa: E402,F401
T = TypeVar("T")
# hermes-agent's private names for the same process-wide state, which its callers and tests reset.
_set_last_init_error = set_last_init_error

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
    "SessionFilterError",
    "EXPORT_FORMAT", "EXPORT_VERSION", "Transaction", "repair_state_db_schema", "is_malformed_db_error",
    "LedgerStateError", "receipt_digest", "input_marker", "strip_echoed_user_input",
    "DEFAULT_DB_PATH", "SCHEMA_SQL", "FTS_SQL", "FTS_TRIGRAM_SQL", "DEFERRED_INDEX_SQL", "sanitize_context",
    # hermes-agent 0.20.1: transcript, turn leases and compression
    "CompressionSessionBusyError", "CompressionSessionClosedError", "SessionTurnLeaseLostError",
    # hermes-agent 0.20.1: lifecycle states, size guards, persistence causes.
    "SESSION_STATUS_COMPLETE", "SESSION_STATUS_EMPTY", "SESSION_STATUS_ERROR", "SESSION_STATUS_INTERRUPTED",
    "classify_session_status", "MAX_SAFE_EXPORT_MESSAGES", "MAX_SAFE_RESUME_MESSAGES",
    "resolved_max_export_messages", "resolved_max_resume_messages", "SessionExportTooLargeError",
    "SessionResumeTooLargeError", "PERSISTENCE_ERROR_CAUSES",
    # hermes-agent 0.20.1: the file's health, journal and writability checks; SessionDB's facets.
    "WalUnsupportedError", "is_disk_full_error", "is_sqlite_wal_reset_vulnerable", "sqlite_source_id",
    "preflight_db_writability", "apply_database_pragmas", "resolve_journal_mode", "is_zeroed_state_db",
    "quarantine_zeroed_state_db", "count_db_holders", "collect_state_db_stats",
    "SessionPortabilityMixin", "SessionSchemaMixin", "SessionSearchMixin",
]

# hermes-agent's module has asyncio among its names; importing it costs a fifth of this module's
# start-up, so it is imported at its first read too.
_LAZY_NAMES["asyncio"] = ("asyncio", "")


def __getattr__(name: str) -> Any:
    # The names the deferred imports above left out of the namespace: the first read imports the
    # module and keeps the value here, so a caller's replacement of it is what later reads get.
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _LAZY_NAMES[name]
    module = importlib.import_module(module_name)
    value = globals()[name] = getattr(module, attribute) if attribute else module
    return value


def repair_state_db_schema(db_path: str | os.PathLike, *, backup: bool = True) -> dict[str, Any]:
    """Repair a malformed schema or full-text index in place, a copy kept first; return the report."""
    # Read as attributes of this module, so a caller's replacement of either hook is the one called.
    this = sys.modules[__name__]
    return this._repair_file(db_path, backup=backup, check=lambda path: this._db_opens_cleanly(path))


class _Module(types.ModuleType):
    """The class of this module: DEFAULT_DB_PATH is a property, and dir() lists the public API, not the imports."""

    # hermes-agent's DEFAULT_DB_PATH is a module attribute its callers read and patch. Here it is
    # computed when read, so it follows HERMES_HOME as every default path must; assigning it pins
    # SessionDB()'s default, deleting it unpins (hermes_state_home.DEFAULT_PATH). Only a module's
    # class can give an attribute a setter, hence the class.
    @property
    def DEFAULT_DB_PATH(self) -> Path:  # noqa: N802 - hermes-agent's name
        return home.DEFAULT_PATH.current()

    @DEFAULT_DB_PATH.setter
    def DEFAULT_DB_PATH(self, value: str | os.PathLike[str]) -> None:  # noqa: N802
        home.DEFAULT_PATH.pin(value)

    @DEFAULT_DB_PATH.deleter
    def DEFAULT_DB_PATH(self) -> None:  # noqa: N802
        home.DEFAULT_PATH.pin(None)

    def __dir__(self) -> list[str]:
        # The imports stay attributes (hermes-agent's callers patch hermes_state.time.time and the
        # like) but are not the API: dir() and Tab completion offer the exports and the lazy names.
        lazy = (name for name, (_, attribute) in _LAZY_NAMES.items() if attribute and not name.startswith("_"))
        return sorted({*__all__, *lazy, "__version__"})


sys.modules[__name__].__class__ = _Module
if TYPE_CHECKING:
    DEFAULT_DB_PATH: Path


class SessionDB(Handle):
    """One profile's session store: sessions, their messages and search in one SQLite file (WAL).

    Open it with `SessionDB()` (<HERMES_HOME>/state.db), `SessionDB(path)`, `SessionDB(path,
    read_only=True)` or `SessionDB.shared(path)`; use it as a context manager or call close().
    Every write method is one BEGIN IMMEDIATE transaction; `transaction()` opens one of your own.
    The methods, by task (each has its own help; docs/api.md has the details):

    Sessions: create_session ensure_session get_session update_session end_session reopen_session
      update_token_counts queue_token_counts flush_token_counts update_system_prompt
      update_session_model update_session_billing_route update_session_cwd update_session_meta
      archive_session unarchive_session set_session_archived archive_stale_sessions auto_archive
      pin_session set_session_pinned set_session_hidden set_session_read session_unread
      touch_session_activity get_session_activity clear_session_activity_labels
      patch_session_model_config get_session_model_config_value set_session_yolo session_yolo_enabled
      update_session_runtime_lock session_gateway_runtime publish_session_git_metadata
      record_auxiliary_usage promote_to_session_reset get_dominant_session_model_route
      distinct_session_cwds backfill_repo_roots.
      Titles: set_session_title get_session_title get_session_by_title resolve_session_by_title
      get_next_title_in_lineage sanitize_title set_auto_title set_auto_title_if_empty
      get_session_title_source set_session_title_source (MAX_TITLE_LENGTH, TITLE_SOURCE_*).
      Lineage: get_lineage get_descendants get_conversation_root resolve_resume_session_id.
    Messages and the conversation: append_message append_messages_batch merge_messages get_messages
      message_count replace_messages clear_messages set_latest_user_api_content
      get_messages_as_conversation get_resume_conversations get_ancestor_display_prefix
      get_messages_around get_anchored_view list_recent_user_messages get_first_assistant_text
      get_message_role latest_message_row_id latest_user_message_row_id has_platform_message_id
      find_pr_url_messages set_latest_matching_message_display_kind set_message_reaction
      get_message_reactions take_unseen_reactions (REACTIONS_METADATA_KEY)
      persist_failed_turn_input get_resume_message_count assert_resume_safe assert_export_safe;
      to_provider_messages formats a conversation for a provider.
    Search: search_messages search_sessions search_sessions_by_id session_ids_with_prefix
      resolve_session_id; the indexes: fts_rebuild_status rebuild_fts wait_for_fts_rebuild optimize_fts.
    Listings and usage: list_sessions list_sessions_rich get_session_rich_row count_sessions
      session_count session_count_by_source session_count_ge session_lifecycle_statuses usage
      usage_by_model usage_totals top_sessions_by_tokens largest_sessions stored_names
      list_cron_job_runs list_skill_scaffolded_sessions.
    Compression: compress_in_place rotate_session archive_and_compact has_archived_messages
      rewind_to_message restore_rewound publish_compression_child find_live_compression_child
      reopen_orphaned_compression_session get_active_message_watermark get_compression_tip
      get_compression_successor get_compression_ancestors get_compression_lineage;
      its lock: acquire_compression_lock try_acquire_compression_lock refresh_compression_lock
      release_compression_lock get_compression_lock_holder; the turn lease:
      acquire_session_turn_lease try_acquire_session_turn_lease refresh_session_turn_lease
      release_session_turn_lease; its bookkeeping: record_compression_failure_cooldown
      get_compression_failure_cooldown get_compression_failure_cooldown_row
      restore_compression_failure_cooldown_row clear_compression_failure_cooldown
      get_compression_fallback_streak set_compression_fallback_streak
      get_compression_ineffective_count set_compression_ineffective_count.
    Portability and whole-file safety: export_session export_session_lineage export_all iter_export
      import_sessions backup restore vacuum check_integrity logical_size_bytes (module functions:
      recover, repair_state_db_schema).
    Maintenance: delete_session delete_sessions delete_session_if_empty delete_empty_sessions
      count_empty_sessions get_session_delete_targets get_session_delete_plan prune_sessions list_prune_candidates
      count_open_prune_matches archive_sessions maybe_auto_prune_and_vacuum maybe_auto_archive
      purge_stale_tool_call_markers prune_empty_ghost_sessions finalize_orphaned_compression_sessions
      list_never_active_keyed_sessions prune_never_active_keyed_sessions retag_kanban_worker_sessions
      get_meta set_meta list_meta_prefix.
    Gateway ledgers (docs/gateway.md): claim_runtime get_runtime; admissions: admit_input
      next_admission start_admission finish_admission resolve_unknown get_admission list_admissions;
      executions: start_execution finish_execution get_execution list_executions; receipts:
      record_receipt list_receipts; deliveries: owe_delivery begin_delivery mark_delivered mark_failed
      recover_deliveries list_owed get_delivery; routes: set_route get_route list_routes delete_route;
      delegations: record_delegation update_delegation get_delegation list_delegations;
      gateway sessions: record_gateway_session_peer find_latest_gateway_session_for_peer
      list_gateway_sessions find_session_by_origin set_expiry_finalized find_orphaned_gateway_sessions
      adopt_orphaned_gateway_session increment_hygiene_failure_streak reset_hygiene_failure_streak;
      hand-offs: request_handoff claim_handoff complete_handoff fail_handoff get_handoff_state
      list_pending_handoffs; routing entries: save_gateway_routing_entry load_gateway_routing_entries
      replace_gateway_routing_entries delete_gateway_routing_entries; Telegram topics:
      apply_telegram_topic_migration bind_telegram_topic get_telegram_topic_binding
      get_telegram_topic_binding_by_session is_telegram_session_linked_to_topic
      list_telegram_topic_bindings_for_chat delete_telegram_topic_binding enable_telegram_topic_mode
      disable_telegram_topic_mode is_telegram_topic_mode_enabled list_unlinked_telegram_sessions_for_user.
    The handle: close shared release transaction in_transaction closed write_count tracer upgrading;
      the timing knobs (write_patience_s, ...; set on the class or one handle).
    hermes-agent's names: every knob also answers to hermes-agent's name for it
      (HERMES_AGENT_ALIASES maps each to its public name); hermes-agent's other names are listed in
      docs/api.md, "hermes-agent's names".
    """

    def __init__(self, db_path: str | os.PathLike | None = None, *, read_only: bool = False,
                 backup_before_upgrade: bool = True, force: bool = False):
        """Open (creating it if missing, unless `read_only`) the store at `db_path`.

        Arguments:
          db_path: the SQLite file; None means DEFAULT_DB_PATH (<HERMES_HOME>/state.db, or the path
            a caller assigned to hermes_state.DEFAULT_DB_PATH). ":memory:" is a private in-memory store.
          read_only: open without writing anything (no file created, no upgrade, no repair); every
            write method then raises ReadOnlyError before any SQL.
          backup_before_upgrade: copy an older file aside (its path in `upgrade_backup`) before
            upgrading it.
          force: add the store's tables even to a non-empty database that holds none of them.

        What an open does: a writable open creates the file 0600 (tightening looser modes, listed
        in `mode_changes`), turns on WAL, upgrades an older layout in one transaction per step
        (a large file in the background: `upgrading`, `wait_for_fts_rebuild()`), repairs a
        malformed schema catalogue once if it meets one, and starts any full-text index rebuild on
        a background thread. A read-only open only checks the file is a store it can read.

        Errors: ForeignDatabaseError (another program's database, without `force`),
        StateDbUninitializedError (read-only, and the file is missing or holds no store), StateDbIncompatibleError
        (a layout this release cannot read), StateDbCorruptError (a damaged file), StateDbBusyError
        (another process held the write lock past the patience), StoreUnavailableError (the file
        cannot be opened or created); all are HermesStateError. A test process opening the real
        Hermes home raises RuntimeError. The reason is also kept for get_last_init_error().
        """
        # The repair hooks are read from this module at each open: callers replace them here.
        # No path: DEFAULT_DB_PATH, which is <HERMES_HOME>/state.db now unless a caller pinned it.
        super().__init__(home.DEFAULT_PATH.pinned if db_path is None else db_path, read_only=read_only,
                         backup_before_upgrade=backup_before_upgrade, force=force,
                         repair=lambda: (sys.modules[__name__]._repair_attempted_paths, repair_state_db_schema))

    # --- the method table: one line per public method that only delegates ------------------------------
    # name = Entry(transaction kind, module function). name = Lookup(...) for a read by key: for a key
    # no row can have, it answers the empty value of the function's return type (None, [], 0, False).
    # Kinds: read, snapshot (one read transaction), write, transcript (transcript patience, waits out
    # another holder's compression), compression (transcript patience: the compression itself),
    # activity (short patience: bookkeeping that must never stall a turn). A function parameter
    # annotated `Keywords` (a dict) is offered by the method as `**keywords`.
    get_session = Lookup("read", sessions.get_session)
    end_session = Entry("write", sessions.end_session)
    reopen_session = Entry("write", sessions.reopen_session)
    update_session = Entry("write", sessions.update_session)
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
    get_session_title = Lookup("read", titles.get_session_title)
    get_session_by_title = Lookup("read", titles.get_session_by_title)
    resolve_session_by_title = Lookup("read", titles.resolve_session_by_title)
    get_next_title_in_lineage = Entry("read", titles.get_next_title_in_lineage)
    sanitize_title = static(titles.sanitize_title)
    append_message = Entry("transcript", message_rows.append_message)
    merge_messages = Entry("transcript", message_rows.merge_messages)
    get_messages = Lookup("read", message_rows.get_messages)
    message_count = Lookup("read", message_rows.message_count)
    set_latest_user_api_content = Entry("transcript", message_rows.set_latest_user_api_content)
    replace_messages = Entry("transcript", message_rows.replace_messages)
    clear_messages = Entry("transcript", message_rows.clear_messages)
    get_resume_conversations = Lookup("snapshot", conversation.get_resume_conversations)
    get_ancestor_display_prefix = Lookup("snapshot", conversation.get_ancestor_display_prefix)
    get_lineage = Lookup("read", lineage.get_lineage)
    get_descendants = Lookup("read", lineage.get_descendants)
    get_compression_successor = Lookup("read", lineage.compression_successor_id)
    get_compression_ancestors = Lookup("read", lineage.compression_ancestor_ids)
    get_compression_lineage = Lookup("snapshot", lineage.compression_chain_ids)
    resolve_session_id = Lookup("read", listings.resolve_session_id)
    session_ids_with_prefix = Entry("read", listings.session_ids_with_prefix)
    usage = Entry("read", listings.usage)
    largest_sessions = Entry("read", listings.largest_sessions)
    stored_names = Entry("read", listings.stored_names)
    list_sessions = Entry("read", listings.list_sessions)
    count_sessions = Entry("read", listings.count_sessions)
    usage_by_model = Entry("read", listings.usage_by_model)
    top_sessions_by_tokens = Entry("read", listings.top_sessions_by_tokens)
    list_sessions_rich = Entry("snapshot", listings.list_sessions_rich)
    search_sessions = Entry("read", listings.search_sessions)
    search_sessions_by_id = Entry("snapshot", listings.search_sessions_by_id)
    list_cron_job_runs = Lookup("read", listings.list_cron_job_runs)
    search_messages = Entry("snapshot", search.search_messages)
    _sanitize_fts5_query = static(query._sanitize_fts5_query)  # the sanitizer, by the name callers know
    _contains_cjk = static(cjk.has_cjk)  # hermes-agent's name for "does this text hold CJK letters"
    optimize_fts = Entry("write", fts.optimize)
    compress_in_place = Entry("compression", compression.compress_in_place)
    rotate_session = Entry("compression", compression.rotate_session)
    acquire_compression_lock = Entry("write", compression.acquire_compression_lock)
    release_compression_lock = Entry("write", compression.release_compression_lock)
    try_acquire_compression_lock = Entry("write", compression.try_acquire_compression_lock)
    refresh_compression_lock = Entry("write", compression.refresh_compression_lock)
    get_compression_lock_holder = Lookup("read", compression.get_compression_lock_holder)
    record_compression_failure_cooldown = Entry("write", compression.record_compression_failure_cooldown)
    get_compression_failure_cooldown = Lookup("read", compression.get_compression_failure_cooldown)
    clear_compression_failure_cooldown = Entry("write", compression.clear_compression_failure_cooldown)
    get_compression_fallback_streak = Lookup("read", compression.get_compression_fallback_streak)
    set_compression_fallback_streak = Entry("write", compression.set_compression_fallback_streak)
    claim_runtime = Entry("write", gateway.claim_runtime)
    get_runtime = Entry("read", gateway.get_runtime)
    admit_input = Entry("write", gateway.admit_input)
    next_admission = Lookup("read", gateway.next_admission)
    start_admission = Entry("write", gateway.start_admission)
    finish_admission = Entry("write", gateway.finish_admission)
    resolve_unknown = Entry("write", gateway.resolve_unknown)
    get_admission = Lookup("read", gateway.get_admission)
    list_admissions = Lookup("read", gateway.list_admissions)
    start_execution = Entry("write", gateway.start_execution)
    finish_execution = Entry("write", gateway.finish_execution)
    get_execution = Lookup("read", gateway.get_execution)
    list_executions = Lookup("read", gateway.list_executions)
    record_receipt = Entry("write", gateway.record_receipt)
    list_receipts = Lookup("read", gateway.list_receipts)
    record_gateway_session_peer = Entry("write", sessions.record_gateway_session_peer)
    set_expiry_finalized = Entry("write", sessions.set_expiry_finalized)
    find_latest_gateway_session_for_peer = Lookup("read", sessions.find_latest_gateway_session_for_peer)
    list_gateway_sessions = Lookup("read", sessions.list_gateway_sessions)
    find_session_by_origin = Lookup("read", sessions.find_session_by_origin)
    owe_delivery = Entry("write", routing.owe_delivery)
    begin_delivery = Entry("activity", routing.begin_delivery)
    mark_delivered = Entry("activity", routing.mark_delivered)
    mark_failed = Entry("activity", routing.mark_failed)
    recover_deliveries = Entry("write", routing.recover_deliveries)
    list_owed = Lookup("read", routing.list_owed)
    get_delivery = Lookup("read", routing.get_delivery)
    set_route = Entry("write", routing.set_route)
    get_route = Lookup("read", routing.get_route)
    list_routes = Lookup("read", routing.list_routes)
    delete_route = Entry("write", routing.delete_route)
    record_delegation = Entry("write", routing.record_delegation)
    get_delegation = Lookup("read", routing.get_delegation)
    list_delegations = Lookup("read", routing.list_delegations)
    export_session = Lookup("snapshot", portability.export_session)
    export_session_lineage = Lookup("snapshot", portability.export_session_lineage)
    backup = Entry("read", recovery.backup_to)
    list_prune_candidates = Entry("snapshot", maintenance.list_prune_candidates)
    archive_sessions = Entry("write", maintenance.archive_sessions)
    count_empty_sessions = Entry("snapshot", maintenance.count_empty_sessions)
    delete_sessions = Entry("write", maintenance.delete_sessions_and_transcripts)
    prune_sessions = Entry("write", maintenance.prune_sessions_and_transcripts)
    delete_empty_sessions = Entry("write", maintenance.delete_empty_sessions_and_transcripts)
    delete_session_if_empty = Entry("write", maintenance.delete_session_if_empty_and_transcripts)
    apply_telegram_topic_migration = Entry("write", telegram.apply_telegram_topic_migration)
    bind_telegram_topic = Entry("write", telegram.bind_telegram_topic)
    get_telegram_topic_binding = Lookup("read", telegram.get_telegram_topic_binding)
    get_telegram_topic_binding_by_session = Lookup("read", telegram.get_telegram_topic_binding_by_session)
    is_telegram_session_linked_to_topic = Lookup("read", telegram.is_telegram_session_linked_to_topic)
    list_telegram_topic_bindings_for_chat = Lookup("read", telegram.list_telegram_topic_bindings_for_chat)
    delete_telegram_topic_binding = Entry("write", telegram.delete_telegram_topic_binding)
    enable_telegram_topic_mode = Entry("write", telegram.enable_telegram_topic_mode)
    disable_telegram_topic_mode = Entry("write", telegram.disable_telegram_topic_mode)
    is_telegram_topic_mode_enabled = Lookup("read", telegram.is_telegram_topic_mode_enabled)
    list_unlinked_telegram_sessions_for_user = Lookup("read", telegram.list_unlinked_telegram_sessions_for_user)
    get_meta = Lookup("read", maintenance.get_meta)
    to_provider_messages = staticmethod(to_provider_messages)
    # hermes-agent's names (docs/api.md, "hermes-agent's names"): its handoffs, routing entries,
    # rewinds, excerpts and start-up sweeps.
    MAX_TITLE_LENGTH = titles.TITLE_MAX_CHARS
    request_handoff = Entry("write", sessions.request_handoff)
    claim_handoff = Entry("write", sessions.claim_handoff)
    complete_handoff = Entry("write", sessions.complete_handoff)
    fail_handoff = Entry("write", sessions.fail_handoff)
    get_handoff_state = Lookup("read", sessions.get_handoff_state)
    list_pending_handoffs = Entry("read", sessions.list_pending_handoffs)
    save_gateway_routing_entry = Entry("write", routing.save_gateway_routing_entry)
    load_gateway_routing_entries = Entry("read", routing.load_gateway_routing_entries)
    replace_gateway_routing_entries = Entry("write", routing.replace_gateway_routing_entries)
    delete_gateway_routing_entries = Entry("write", routing.delete_gateway_routing_entries)
    rewind_to_message = Entry("transcript", compression.rewind_to_message)
    restore_rewound = Entry("transcript", compression.restore_rewound)
    archive_and_compact = Entry("compression", compression.archive_and_compact)
    has_archived_messages = Lookup("read", compression.has_archived_messages)
    get_messages_around = Entry("snapshot", message_rows.get_messages_around, unknown=message_rows.EMPTY_AROUND)
    get_anchored_view = Entry("snapshot", message_rows.get_anchored_view, unknown=message_rows.EMPTY_ANCHORED)
    list_recent_user_messages = Lookup("read", message_rows.list_recent_user_messages)
    has_platform_message_id = Lookup("read", message_rows.has_platform_message_id)
    update_session_meta = Entry("write", sessions.update_session_meta)
    promote_to_session_reset = Entry("write", sessions.promote_to_session_reset)
    record_auxiliary_usage = Entry("activity", sessions.record_auxiliary_usage)
    finalize_orphaned_compression_sessions = Entry("write", maintenance.finalize_orphaned_compression_sessions)
    prune_empty_ghost_sessions = Entry("write", maintenance.prune_empty_ghost_sessions_and_transcripts)
    # hermes-agent 0.20.1: transcript, turn leases and compression (docs/api.md, "Turn leases and
    # compression hand-offs"). try_/acquire_session_turn_lease are explicit methods below.
    refresh_session_turn_lease = Entry("write", compression.refresh_session_turn_lease)
    release_session_turn_lease = Entry("write", compression.release_session_turn_lease)
    append_messages_batch = Entry("transcript", message_rows.append_messages_batch)
    publish_compression_child = Entry("compression", compression.publish_compression_child)
    find_live_compression_child = Lookup("read", compression.find_live_compression_child)
    reopen_orphaned_compression_session = Entry("write", compression.reopen_orphaned_compression_session)
    get_active_message_watermark = Lookup("read", compression.get_active_message_watermark)
    get_compression_ineffective_count = Lookup("read", compression.get_compression_ineffective_count)
    set_compression_ineffective_count = Entry("write", compression.set_compression_ineffective_count)
    get_compression_failure_cooldown_row = Entry("read", compression.get_compression_failure_cooldown_row,
                                                 unknown={"session_exists": False, "cooldown_until": None,
                                                          "error": None})
    restore_compression_failure_cooldown_row = Entry("write", compression.restore_compression_failure_cooldown_row)
    # hermes-agent 0.20.1: gateway hygiene, counts, statistics, deletion, size guards (docs/api.md).
    increment_hygiene_failure_streak = Entry("write", sessions.increment_hygiene_failure_streak)
    reset_hygiene_failure_streak = Entry("write", sessions.reset_hygiene_failure_streak)
    session_count_by_source = Entry("read", listings.session_count_by_source)
    session_count_ge = Entry("read", listings.session_count_ge)
    session_lifecycle_statuses = Entry("read", listings.session_lifecycle_statuses)
    usage_totals = Entry("read", listings.usage_totals)
    logical_size_bytes = Entry("snapshot", recovery.logical_size_bytes)
    get_dominant_session_model_route = Lookup("read", sessions.get_dominant_session_model_route)
    count_open_prune_matches = Entry("snapshot", maintenance.count_open_prune_matches)
    get_session_delete_targets = Lookup("snapshot", maintenance.get_session_delete_targets)
    get_session_delete_plan = Entry("snapshot", maintenance.get_session_delete_plan, unknown=maintenance.NO_DELETE)
    list_meta_prefix = Entry("read", maintenance.list_meta_prefix)
    assert_export_safe = Lookup("read", message_rows.assert_export_safe)
    assert_resume_safe = Lookup("snapshot", message_rows.assert_resume_safe)
    get_resume_message_count = Lookup("snapshot", message_rows.get_resume_message_count)
    # hermes-agent 0.20.1: orphaned gateway sessions, never-active keyed sessions, kanban workers'
    # sessions (docs/api.md, "hermes-agent 0.20.1: gateway orphans and never-active sessions").
    find_orphaned_gateway_sessions = Entry("read", sessions.find_orphaned_gateway_sessions)
    adopt_orphaned_gateway_session = Entry("write", sessions.adopt_orphaned_gateway_session)
    list_never_active_keyed_sessions = Entry("read", maintenance.list_never_active_keyed_sessions)
    prune_never_active_keyed_sessions = Entry("write", maintenance.prune_never_active_keyed_sessions_and_transcripts)
    retag_kanban_worker_sessions = Entry("write", maintenance.retag_kanban_worker_sessions)
    # hermes-agent 0.20.1: messages, reactions, lookups and search (docs/api.md, "Messages, reactions
    # and lookups"). A reaction lives in the row's display_metadata under this key, as there.
    REACTIONS_METADATA_KEY = "reactions"
    set_message_reaction = Entry("write", message_rows.set_message_reaction)
    get_message_reactions = Lookup("read", message_rows.get_message_reactions)
    take_unseen_reactions = Entry("write", message_rows.take_unseen_reactions)
    get_message_role = Lookup("read", message_rows.get_message_role)
    latest_message_row_id = Lookup("read", message_rows.latest_message_row_id)
    latest_user_message_row_id = Lookup("read", message_rows.latest_user_message_row_id)
    get_first_assistant_text = Entry("read", message_rows.get_first_assistant_text, unknown="")
    find_pr_url_messages = Entry("read", message_rows.find_pr_url_messages)
    set_latest_matching_message_display_kind = Entry("write", message_rows.set_latest_matching_message_display_kind)
    list_skill_scaffolded_sessions = Entry("read", listings.list_skill_scaffolded_sessions)
    # hermes-agent 0.20.1: session rows: pin, hide, read, stale archive, activity, titles, model_config
    # (docs/api.md, "hermes-agent 0.20.1: session rows").
    set_session_pinned = Entry("write", sessions.set_session_pinned)
    set_session_hidden = Entry("write", sessions.set_session_hidden)
    set_session_read = Entry("write", sessions.set_session_read)
    archive_stale_sessions = Entry("write", sessions.archive_stale_sessions)
    session_unread = static(sessions.session_unread)
    touch_session_activity = Entry("activity", sessions.touch_session_activity)
    get_session_activity = Lookup("read", sessions.get_session_activity)
    clear_session_activity_labels = Entry("activity", sessions.clear_session_activity_labels)
    TITLE_SOURCE_DERIVED = titles.TITLE_SOURCE_DERIVED
    TITLE_SOURCE_LLM = titles.TITLE_SOURCE_LLM
    TITLE_SOURCE_USER = titles.TITLE_SOURCE_USER
    set_auto_title = Entry("write", titles.set_auto_title)
    get_session_title_source = Lookup("read", titles.get_session_title_source)
    set_session_title_source = Entry("write", titles.set_session_title_source)
    patch_session_model_config = Entry("write", sessions.patch_session_model_config)
    get_session_model_config_value = Entry("read", sessions.get_session_model_config_value, unknown=None)
    set_session_yolo = Entry("write", sessions.set_session_yolo)
    update_session_runtime_lock = Entry("write", sessions.update_session_runtime_lock)
    session_yolo_enabled = static(sessions.session_yolo_enabled)
    session_gateway_runtime = static(sessions.session_gateway_runtime)
    publish_session_git_metadata = Entry("write", sessions.publish_session_git_metadata)
    get_session_rich_row = Lookup("snapshot", listings.get_session_rich_row)

    def _execute_write(self, body: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run `body(conn)` in one `transaction()` and return its result (hermes-agent's name for that seam)."""
        with self.transaction() as txn:
            return body(txn.conn)

    # --- explicit methods: the arguments are reshaped, or one call composes several steps --------------

    def create_session(self, session_id: str, source: str, model: str | None = None, *,
                       model_config: Any = None, system_prompt: str | None = None, user_id: str | None = None,
                       parent_session_id: str | None = None, **columns: Any) -> str:
        """Create the session, or fill the still-empty columns of an existing one (first write wins); return the id."""
        columns.update(model=model, model_config=model_config, system_prompt=system_prompt, user_id=user_id,
                       parent_session_id=parent_session_id)
        with self._write() as conn:
            return sessions.create_session(conn, session_id, source, columns)

    @same_arguments(create_session)
    def ensure_session(self, session_id: str, source: str, model: str | None = None, **columns: Any) -> str:
        """Create the session unless it exists (an existing row is left as it is); return the id."""
        # create_session's named columns arrive in `columns`; one left out means no value, as None does.
        with self._write() as conn:
            return sessions.ensure_session(conn, session_id, source, dict(columns, model=model))

    def update_delegation(self, delegation_id: str, **changes: Any) -> None:
        """Move a delegation on (`state=`) and/or set its `result=` or `target=`; a finished one is final."""
        with self._write() as conn:
            routing.update_delegation(conn, delegation_id, **changes)

    def persist_failed_turn_input(self, session_id: str, message: Any, marker: str) -> int | None:
        """Append a failed turn's user input unless a row already owns `marker`; return the row id or None."""
        self._check_writable(self.transcript_write_patience_s)
        with self._read() as conn:  # where it would go, so a compression there is waited out first
            target = routing.input_target(conn, session_id)
        return self._transcript_write(target, lambda conn: routing.persist_failed_turn_input(
            conn, session_id, message, marker))

    def check_integrity(self, full: bool = False) -> dict[str, Any]:
        """Return {"ok", "problems", "fts"}: SQLite's quick check (full with `full`) and each FTS index's check.

        The FTS checks need a writable handle (FTS5 runs them as write commands, changing
        nothing); on a read-only handle "fts" is empty.
        """
        return recovery.check_integrity(self._read, None if self.read_only else self._write, full)

    def fts_rebuild_status(self) -> dict[str, Any]:
        """Return {pending, total, indexed, percent, in_progress, cjk_pending} of the full-text indexes (moving in counts)."""
        with self._read() as conn:
            status = fts.rebuild_status(conn)
        # While an older file is copied and upgraded its old index is still read, and the rebuild
        # starts right after: the work is under way, though no rebuild is recorded in the file yet.
        if self.upgrading:
            status["in_progress"] = True
        return status

    def rebuild_fts(self) -> dict[str, Any]:
        """Rebuild the FTS indexes to the end in short chunks (resuming one under way); return the status."""
        self._check_writable()  # one transaction per chunk, by design: other writers get turns
        with typed_errors(self.db_path, reading=True):
            upgrade.rebuild_fts(self._writer, self.db_path, self.write_patience_s, self._policy(),
                                self.fts_rebuild_chunk_rows)
        return self.fts_rebuild_status()

    def import_sessions(self, sessions: Any = None, on_conflict: str = "skip", *, strict: bool = False,
                        max_ids: int | None = None, data: Any = None) -> ImportReport:
        """Import export documents (any iterable, read once) in one transaction; see ImportReport, `strict`, `max_ids`.

        `sessions` is hermes-agent's name of the input; `data`, this library's earlier one, is still taken by keyword.
        """
        if data is not None and sessions is not None:
            raise TypeError("give the documents once: sessions or data")
        return portability.import_stream(self._write, sessions if data is None else data, on_conflict, strict, max_ids)

    def get_messages_as_conversation(self, session_id: str, include_ancestors: bool = False,
                                     with_row_ids: bool = False, include_inactive: bool = False,
                                     repair_alternation: bool = False, include_row_ids: bool = False
                                     ) -> list[dict[str, Any]]:
        """Return the transcript as OpenAI-format dicts (the parent chain first, repaired for sending, if asked)."""
        # include_row_ids is hermes-agent 0.20.1's name for with_row_ids: either adds `_row_id`.
        if isinstance(session_id, str) and common.has_surrogate(session_id):
            return []  # no stored id can hold a lone surrogate
        with self._read(snapshot=True) as conn:
            return conversation.get_messages_as_conversation(conn, session_id, include_ancestors,
                                                             bool(with_row_ids or include_row_ids),
                                                             include_inactive, repair_alternation)

    def try_acquire_session_turn_lease(self, session_id: str, holder: str, *, ttl_seconds: float = 300.0,
                                       patience_s: float | None = None) -> bool:
        """Take or renew the conversation's turn lease for `holder`; False while another holds it live."""
        # An explicit method: `patience_s` bounds this one write's wait for the write lock.
        if patience_s is not None:
            common.check_number("patience_s", patience_s)
        with self._write(patience_s) as conn:
            return compression.try_acquire_session_turn_lease(conn, session_id, holder, ttl_seconds=ttl_seconds)

    def acquire_session_turn_lease(self, session_id: str, holder: str, *, ttl_seconds: float = 300.0,
                                   wait_seconds: float = 1800.0, poll_interval_seconds: float = 1.0,
                                   on_wait: Callable[[float], Any] | None = None,
                                   wait_notice_interval_seconds: float = 15.0,
                                   should_abort: Callable[[], bool] | None = None,
                                   acquire_patience_s: float = 0.5) -> bool:
        """Wait up to `wait_seconds` for the conversation's turn lease, holding no lock between tries; return whether taken."""
        def attempt() -> bool:
            try:
                return self.try_acquire_session_turn_lease(session_id, holder, ttl_seconds=ttl_seconds,
                                                           patience_s=acquire_patience_s)
            except StateDbBusyError:  # another writer held the file past the patience: try again later
                return False
        return compression.acquire_session_turn_lease(
            attempt, wait_seconds=wait_seconds, poll_interval_seconds=poll_interval_seconds, on_wait=on_wait,
            wait_notice_interval_seconds=wait_notice_interval_seconds, should_abort=should_abort)

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
                conn, self.db_path, self.write_patience_s, self._policy(), backup=self._backup_before_upgrade,
                on_give_up=self._log_lock_holders))
        self.upgrade_backup = copied or self.upgrade_backup
        self._open_fts()

    def vacuum(self) -> dict[str, int]:
        """Give free pages back to the file system (building first the indexes an open leaves); writers wait."""
        self._check_writable()
        with self._writer.exclusive() as conn:
            return recovery.vacuum(conn, self.write_patience_s, self._policy())

    # --- maintenance: deleting, pruning, the empty-session sweeps (hermes_state_maintenance;
    # docs/maintenance.md). Transcript files go only after COMMIT.

    def delete_session(self, session_id: str, sessions_dir: str | os.PathLike | None = None,
                       expected_delete_ids: list[str] | None = None) -> bool:
        """Delete a session with its whole conversation and its delegates; False for an unknown id.

        With `expected_delete_ids` (what get_session_delete_targets answered) it deletes only if
        that is still exactly what goes, checked in the deleting transaction; else nothing, False.
        """
        if isinstance(session_id, str) and common.has_surrogate(session_id):
            return False  # no stored id can hold a lone surrogate
        common.check_id("session_id", session_id)
        with self.transaction() as txn:
            return maintenance.delete_session_and_transcripts(txn, session_id, sessions_dir, expected_delete_ids)

    def maybe_auto_prune_and_vacuum(self, retention_days: float = 90, min_interval_hours: float = 24,
                                    vacuum: bool = True, sessions_dir: str | os.PathLike | None = None,
                                    min_vacuum_interval_days: float = 30) -> dict[str, Any]:
        """Prune old ended conversations at most once per interval, then VACUUM if any went (docs/maintenance.md)."""
        self._check_writable()  # a read-only or closed handle is the caller's mistake, not an unattended failure
        return maintenance.auto_prune_and_vacuum(self._write, self.vacuum if vacuum else None, retention_days,
                                                 min_interval_hours, sessions_dir, min_vacuum_interval_days)

    def set_meta(self, key: str, value: str, *, cursor: sqlite3.Cursor | None = None) -> None:
        """Store `value` under `key` in state_meta: in a transaction of its own, or on `cursor` in its connection's."""
        if cursor is not None and not isinstance(cursor, sqlite3.Cursor):
            raise TypeError(f"cursor must be a sqlite3.Cursor or None, not {type(cursor).__name__}")
        if cursor is None or cursor.connection is self._writer.conn:
            with self._write() as conn:  # inside this thread's open transaction of the handle, that one
                maintenance.set_meta(conn, key, value)
        else:  # another connection's cursor: its owner's transaction, as the caller asked
            maintenance.set_meta(cursor, key, value)

    # --- the token queue: deltas filed cheaply on a turn, applied together (hermes_state_sessions.TokenQueue)

    def _token_queue(self) -> sessions.TokenQueue:
        queue = vars(self).get("_queued_tokens")
        if queue is None:  # made at the first queued delta; setdefault keeps one if two threads race here
            queue = vars(self).setdefault("_queued_tokens", sessions.TokenQueue())
        return queue

    def queue_token_counts(self, session_id: str, **kwargs: Any) -> None:
        """Queue a token/cost delta (update_token_counts' arguments, checked now) to be applied with others.

        Applied at flush_token_counts(), at close(), and by this call once TokenQueue.BATCH
        deltas wait. On a closed handle it is update_token_counts, and raises as it does.
        """
        if self.closed:
            self.update_token_counts(session_id, **kwargs)
            return
        if self.read_only:
            self._check_writable()  # refused at the call, like every write: nothing could ever apply it
        if self._token_queue().put(session_id, kwargs) >= sessions.TokenQueue.BATCH:
            # Bookkeeping must not stall a turn: a busy store keeps the deltas for the next chance.
            self._token_queue().drain(lambda: self._write(self.activity_write_patience_s))

    def flush_token_counts(self, timeout: float = 5.0) -> bool:
        """Apply every queued token delta now, waiting up to `timeout` seconds for the lock; True once none wait."""
        patience = common.check_number("timeout", timeout)
        if self.read_only:
            self._check_writable()  # a read-only handle never queued anything: calling this is a mistake
        queue = vars(self).get("_queued_tokens")
        if queue is None or not len(queue):
            return True
        if self.closed or self.read_only:
            return False
        return queue.drain(lambda: self._write(min(patience, self.write_patience_s)))

    def _close_now(self) -> None:
        # The deltas still queued go in before the handle lets go of the file.
        queue = vars(self).get("_queued_tokens")
        if queue is not None and len(queue) and not self.closed and not self.read_only:
            queue.drain(lambda: self._write())
        super()._close_now()

    def maybe_auto_archive(self, idle_days: float = 3, min_interval_hours: int = 24,
                           exclude_pinned: bool = True) -> dict[str, Any]:
        """Idle-archive conversations untouched for `idle_days`, at most once per interval (archive_stale_sessions)."""
        self._check_writable()  # a read-only or closed handle is the caller's mistake, not an unattended failure
        return maintenance.auto_archive_stale(self._write, idle_days, min_interval_hours, exclude_pinned)

    def get_conversation_root(self, session_id: str) -> str:
        """Return the top of the session's parent links (the session itself when it has none, or is unknown)."""
        with self._read() as conn:
            return lineage.get_conversation_root(conn, session_id)

    def resolve_resume_session_id(self, session_id: str) -> str:
        """Return the session a resume of `session_id` loads: its compression chain's live tip, else the id itself."""
        with self._read() as conn:
            return lineage.resolve_resume_session_id(conn, session_id)

    def purge_stale_tool_call_markers(self, *, dry_run: bool = False, backup: bool = True) -> dict[str, Any]:
        """Empty assistant text that is only a "[tool]" marker (a copy of the file first, unless not `backup`); report the rows."""
        self._check_writable()
        return maintenance.purge_stale_tool_call_markers(self._read, self._write, self.backup if backup else None,
                                                         self.db_path, dry_run)

    def get_compression_tip(self, session_id: str) -> str | None:
        """Return the live tip of the session's compression chain; the id itself when nothing continues it."""
        if isinstance(session_id, str) and common.has_surrogate(session_id):
            return None  # no stored id can hold a lone surrogate
        with self._read() as conn:
            return lineage.compression_successor_id(conn, session_id) or session_id


# --- hermes-agent 0.20.1's mixins: facets of SessionDB ----------------------------------------------
# hermes-agent 0.20.1 builds its SessionDB from three mixin classes. Here SessionDB is one class over
# the method table; each mixin is an abstract facet it is registered with, so issubclass/isinstance
# checks hold, and reading one of the facet's method names from the mixin gives SessionDB's method
# (only the names SessionDB has: a name another part of the library has not added yet is absent).

class _Facet(abc.ABCMeta):
    """The metaclass of a mixin facet: its method names are read from SessionDB."""

    _names: tuple[str, ...]

    def __getattr__(cls, name: str) -> Any:
        if name in cls._names and name in dir(SessionDB):
            return getattr(SessionDB, name)
        raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")

    def __dir__(cls) -> list[str]:
        return sorted(set(super().__dir__()) | {name for name in cls._names if name in dir(SessionDB)})


def _facet(name: str, doc: str, names: tuple[str, ...]) -> _Facet:
    facet = _Facet(name, (), {"__doc__": doc, "__module__": __name__, "__slots__": (), "_names": names})
    facet.register(SessionDB)
    return facet


SessionPortabilityMixin = _facet(
    "SessionPortabilityMixin", "SessionDB's export, import and rich-row reads (hermes-agent 0.20.1's mixin).",
    ("distinct_session_cwds", "export_all", "export_session", "export_session_lineage", "get_first_assistant_text",
     "get_session_rich_row", "import_sessions", "list_cron_job_runs", "list_skill_scaffolded_sessions"))
SessionSchemaMixin = _facet(
    "SessionSchemaMixin", "SessionDB's schema set-up and migrations at open (hermes-agent 0.20.1's mixin); no public methods.",
    ())
SessionSearchMixin = _facet(
    "SessionSearchMixin", "SessionDB's full-text search and index upkeep (hermes-agent 0.20.1's mixin).",
    ("fts_cjk_rebuild_status", "fts_cjk_rebuild_step", "fts_optimize_available", "fts_rebuild_status",
     "fts_rebuild_step", "get_anchored_view", "list_recent_user_messages", "optimize_fts", "optimize_fts_storage",
     "rebuild_fts", "search_messages", "search_sessions_by_id", "_sanitize_fts5_query", "_contains_cjk"))


def list_sessions_across_profiles(root: str | os.PathLike | None = None, **filters: Any) -> dict[str, Any]:
    """List sessions of every profile under `root`, read-only; one profile's failure does not fail the rest.

    Returns {"sessions": [...], "errors": [{"profile", "error"}]}: sessions carry their `profile`
    ("default" for the root's own), newest first across profiles, cut to `limit` (default 20).
    """
    return listings.list_across_profiles(lambda path: SessionDB(path, read_only=True), root, **filters)


class AsyncSessionDB(AsyncFacade):
    """The SessionDB API as coroutines; each call runs on a worker thread. `AsyncSessionDB(db)` wraps a handle.

    Every public method of SessionDB that touches the database has a twin here with the same
    signature: a coroutine, or for the streaming `iter_*` methods an async generator that reads
    each item on a worker thread. `to_provider_messages` does no I/O and stays a plain function.
    """

    to_provider_messages = staticmethod(to_provider_messages)


# Public I/O methods only: lifecycle, pure helpers and the thread-bound transaction are not database calls.
add_async_twins(SessionDB, AsyncSessionDB, skip={"close", "release", "shared", "to_provider_messages", "tracer",
                                                       "transaction"})
