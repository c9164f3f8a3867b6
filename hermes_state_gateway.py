"""Gateway ledgers: the runtime epoch, the admissions FIFO, worker executions and their receipts,
and the ledger machinery every gateway ledger shares.

Owns: `runtime_epoch` (claiming the runtime; fencing writes from a replaced owner with
`check_epoch`), `session_admissions` (a durable per-session FIFO of inbound input),
`worker_executions` and `worker_receipts` (ordered, digest-checked results of managed runs),
and `Ledger`: a ledger table's state table (which state may move to which) with its one
compare-and-set transition and its one row fetch that decodes the JSON columns.
Does not own: the routing table, the delivery outbox and async delegations
(hermes_state_routing, on the same machinery and fenced by the same epoch), session and
message rows (hermes_state_sessions, hermes_state_messages), deleting sessions with their
ledger rows (hermes_state_maintenance).

Transaction contract: every write runs inside the caller's BEGIN IMMEDIATE transaction and is a
compare-and-set: it reads the row, checks the epoch and the state, and only then changes
anything, so an illegal transition raises a typed error and leaves the database as it was.
Reads run under the caller's lock and never write.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

from hermes_state_common import LIVE_ADMISSION_SQL, check_count, check_id, decoded, encode_json, row_dicts
from hermes_state_errors import LedgerStateError, ReceiptDigestError, ReceiptOrderError, StaleEpochError
from hermes_state_sessions import require_session

TERMINAL_STATES = ("completed", "failed", "cancelled")
LIVE_ADMISSION_STATES = ("queued", "started", "unknown")
LIVE_EXECUTION_STATES = ("running", "unknown")
_TERMINAL = frozenset(TERMINAL_STATES)


def stamp(now: float | None) -> float:
    """Return `now`, or the current time when it is None (the ledgers' injectable clock)."""
    return time.time() if now is None else now


def _check_terminal(state: Any) -> str:
    if state not in TERMINAL_STATES:
        raise ValueError(f"state must be one of {', '.join(TERMINAL_STATES)}, not {state!r}")
    return state


# --- the ledger machinery -----------------------------------------------------------------------

def fetch(conn: sqlite3.Connection, table: str, where: str = "1", args: Any = (), order: str = "id",
          limit: int | None = None) -> list[dict[str, Any]]:
    """Return the rows of `table` matching `where`, in `order`, JSON columns decoded (see `decoded`)."""
    cur = conn.execute(f"SELECT * FROM {table} WHERE {where} ORDER BY {order}"
                       + ("" if limit is None else f" LIMIT {int(limit)}"), args)
    return [decoded(table, row) for row in row_dicts(cur)]


@dataclass(frozen=True)
class Ledger:
    """A ledger table: the word its errors use, its key column and its state table.

    `moves` maps each state to the states a row in it may move to; a state not in it is final.
    `counted` names the argument a caller's key is checked as (a row id: a non-negative integer)
    before any lookup, so every accessor of the ledger refuses a bad id alike.
    """

    table: str
    what: str
    moves: dict[str, frozenset[str]]
    key: str = "id"
    counted: str | None = None

    def get(self, conn: sqlite3.Connection, key: Any) -> dict[str, Any] | None:
        """Return the row with this key (JSON columns decoded), or None."""
        if self.counted is not None:
            check_count(self.counted, key)
        rows = fetch(conn, self.table, f"{self.key} = ?", (key,), order=self.key)
        return rows[0] if rows else None

    def row(self, conn: sqlite3.Connection, key: Any) -> dict[str, Any]:
        """Return the row a transition acts on; a missing row makes any transition illegal."""
        found = self.get(conn, key)
        if found is None:
            raise LedgerStateError(f"{self.what} {key!r} does not exist")
        return found

    def check(self, row: dict[str, Any], to: str, refusal: str) -> None:
        """Raise LedgerStateError(refusal) unless the state table lets `row` move to state `to`."""
        if to not in self.moves.get(row["state"], ()):
            raise LedgerStateError(refusal)

    def move(self, conn: sqlite3.Connection, row: dict[str, Any], to: str, refusal: str, **changes: Any) -> None:
        """Move `row` to state `to` with `changes`, if its state table allows it; else raise LedgerStateError(refusal).

        A compare-and-set: the UPDATE names the state the row was read in, so a row that moved
        meanwhile is left alone.
        """
        self.check(row, to, refusal)
        values = {"state": to, **changes}
        conn.execute(f"UPDATE {self.table} SET {', '.join(f'{c} = ?' for c in values)} "
                     f"WHERE {self.key} = ? AND state = ?", (*values.values(), row[self.key], row["state"]))


def _listing(ledger: Ledger, conn: sqlite3.Connection, session_id: str | None,
             state: str | None) -> list[dict[str, Any]]:
    # The ledgers' listings: every row by id, narrowed to a session and/or a state when given.
    filters = [(column, value) for column, value in (("session_id", session_id), ("state", state)) if value is not None]
    where = " AND ".join(f"{column} = ?" for column, _ in filters) or "1"
    return fetch(conn, ledger.table, where, [v for _, v in filters])


# An admission waits queued, runs started, and ends in a terminal state; one whose owner died
# turns unknown (claim_runtime) and is settled by resolve_unknown, never requeued.
ADMISSIONS = Ledger("session_admissions", "admission", {
    "queued": frozenset({"started", "cancelled"}), "started": _TERMINAL, "unknown": _TERMINAL},
    counted="admission_id")
# An execution runs, then ends; one whose owner died turns unknown and the next owner settles it.
EXECUTIONS = Ledger("worker_executions", "execution", {"running": _TERMINAL, "unknown": _TERMINAL},
                    counted="execution_id")


# --- runtime epoch ------------------------------------------------------------------------------

def current_epoch(conn: sqlite3.Connection) -> int | None:
    """Return the current runtime epoch, or None when no owner has claimed the runtime yet."""
    row = conn.execute("SELECT epoch FROM runtime_epoch WHERE id = 1").fetchone()
    return row[0] if row else None


def get_runtime(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """Return {epoch, instance_id, pid, started_at} of the current owner, or None."""
    rows = row_dicts(conn.execute("SELECT epoch, instance_id, pid, started_at FROM runtime_epoch WHERE id = 1"))
    return rows[0] if rows else None


def claim_runtime(conn: sqlite3.Connection, instance_id: str | None = None, *, now: float | None = None) -> int:
    """Become the owner: bump the epoch and return it.

    Every admission still `started` and every execution still `running` under an older epoch
    turns `unknown`: its owner is gone and nobody can tell whether its work finished, so it is
    neither retried nor silently dropped. Writes carrying an older epoch are refused from now on.
    """
    check_id("instance_id", instance_id, optional=True)
    epoch = (current_epoch(conn) or 0) + 1
    conn.execute(
        "INSERT INTO runtime_epoch (id, epoch, instance_id, pid, started_at) VALUES (1, ?, ?, ?, ?) "
        "ON CONFLICT(id) DO UPDATE SET epoch = excluded.epoch, instance_id = excluded.instance_id, "
        "pid = excluded.pid, started_at = excluded.started_at",
        (epoch, instance_id or uuid.uuid4().hex, os.getpid(), stamp(now)))
    # Set-based, for every row the old owner left: one statement each, not one per row.
    conn.execute("UPDATE session_admissions SET state = 'unknown' WHERE state = 'started' AND COALESCE(epoch, 0) < ?",
                 (epoch,))
    conn.execute("UPDATE worker_executions SET state = 'unknown' WHERE state = 'running' AND COALESCE(epoch, 0) < ?",
                 (epoch,))
    return epoch


def check_epoch(conn: sqlite3.Connection, epoch: Any) -> int:
    """Raise StaleEpochError unless `epoch` is the current runtime epoch (the fence)."""
    check_count("epoch", epoch)
    current = current_epoch(conn)
    if current is None:
        raise StaleEpochError(f"epoch {epoch} is not valid: no owner has claimed the runtime; call claim_runtime()")
    if epoch != current:
        raise StaleEpochError(
            f"epoch {epoch} is stale: the runtime is at epoch {current}, claimed by another owner; "
            "this owner must stop writing (nothing was changed)")
    return epoch


def check_epoch_if_given(conn: sqlite3.Connection, epoch: Any) -> None:
    """Fence a call whose epoch is optional: check it when given (see check_epoch)."""
    if epoch is not None:
        check_epoch(conn, epoch)


# --- admissions ---------------------------------------------------------------------------------

def _queue_head(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    # The oldest admission that is not finished: queued, started or unknown. Terminal rows
    # never block, so the head is whatever the queue is waiting on.
    rows = fetch(conn, ADMISSIONS.table, f"session_id = ? AND {LIVE_ADMISSION_SQL}", (session_id,), limit=1)
    return rows[0] if rows else None


def admit_input(conn: sqlite3.Connection, session_id: str, payload: Any, admission_key: str | None = None, *,
                now: float | None = None) -> int:
    """Queue an inbound input at the tail of the session's FIFO; return its id.

    Idempotent by `admission_key`: a key the session already admitted returns the existing id
    and changes nothing (the first payload stays).
    """
    check_id("admission_key", admission_key, optional=True)
    encoded = encode_json(payload, "payload")
    if admission_key is not None:
        row = conn.execute("SELECT id FROM session_admissions WHERE session_id = ? AND admission_key = ?",
                           (session_id, admission_key)).fetchone()
        if row is not None:
            return row[0]
    require_session(conn, session_id)
    return cast(int, conn.execute(  # an INSERT always sets lastrowid
        "INSERT INTO session_admissions (session_id, admission_key, payload_json, state, created_at) "
        "VALUES (?, ?, ?, 'queued', ?)", (session_id, admission_key, encoded, stamp(now))).lastrowid)


def next_admission(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return the queue's head if it is queued; None when the queue is empty or blocked.

    An earlier admission that is `started` (running now) or `unknown` (its owner died) blocks
    everything behind it: inputs are processed strictly in order, and an unknown one needs a
    decision (resolve_unknown) before anything after it may run.
    """
    head = _queue_head(conn, session_id)
    return head if head is not None and head["state"] == "queued" else None


def get_admission(conn: sqlite3.Connection, admission_id: int) -> dict[str, Any] | None:
    """Return one admission (payload decoded), or None."""
    return ADMISSIONS.get(conn, admission_id)


def list_admissions(conn: sqlite3.Connection, session_id: str | None = None,
                    state: str | None = None) -> list[dict[str, Any]]:
    """Return admissions in queue order, optionally of one session and/or one state."""
    return _listing(ADMISSIONS, conn, session_id, state)


def _admission(conn: sqlite3.Connection, admission_id: Any) -> dict[str, Any]:
    return ADMISSIONS.row(conn, admission_id)


def start_admission(conn: sqlite3.Connection, admission_id: int, epoch: int, *, now: float | None = None) -> None:
    """Move the queue's head from queued to started under the caller's epoch."""
    row = _admission(conn, admission_id)
    check_epoch(conn, epoch)
    refusal = f"admission {admission_id} is {row['state']}; only a queued admission can start"
    if row["state"] == "queued":
        head = _queue_head(conn, row["session_id"])
        assert head is not None  # this queued admission is itself in the queue
        if head["id"] != admission_id:
            raise LedgerStateError(
                f"admission {admission_id} is not the head of session {row['session_id']!r}'s queue: "
                f"admission {head['id']} ({head['state']}) comes first")
    ADMISSIONS.move(conn, row, "started", refusal, epoch=epoch, started_at=stamp(now))


def finish_admission(conn: sqlite3.Connection, admission_id: int, state: str, epoch: int, *,
                     now: float | None = None) -> None:
    """Move a started admission to completed/failed/cancelled; a queued one may only be cancelled."""
    _check_terminal(state)
    row = _admission(conn, admission_id)
    check_epoch(conn, epoch)
    refusal = (f"admission {admission_id} is {row['state']}; only an admission started under epoch {epoch} can "
               f"finish (a queued one can only be cancelled, an unknown one is settled by resolve_unknown)")
    if row["state"] == "unknown" or (row["state"] == "started" and row["epoch"] != epoch):
        raise LedgerStateError(refusal)
    ADMISSIONS.move(conn, row, state, refusal, finished_at=stamp(now))


def resolve_unknown(conn: sqlite3.Connection, admission_id: int, resolution: str, epoch: int | None = None, *,
                    now: float | None = None) -> None:
    """Settle an unknown admission as completed, failed or cancelled; it is never requeued.

    The resolution is also kept in the `resolution` column, so a reader can tell a settled
    unknown from an ordinary finish. With `epoch`, the call is fenced like the others.
    """
    _check_terminal(resolution)
    row = _admission(conn, admission_id)
    check_epoch_if_given(conn, epoch)
    if row["state"] != "unknown":
        raise LedgerStateError(f"admission {admission_id} is {row['state']}; only an unknown admission is resolved")
    ADMISSIONS.move(conn, row, resolution, "", resolution=resolution, finished_at=stamp(now))


# --- worker executions and receipts ---------------------------------------------------------------

def _execution(conn: sqlite3.Connection, execution_id: Any) -> dict[str, Any]:
    return EXECUTIONS.row(conn, execution_id)


def start_execution(conn: sqlite3.Connection, session_id: str, kind: str, epoch: int, *,
                    now: float | None = None) -> int:
    """Record a managed run (worker, child agent, cron, kanban...) as running; return its id."""
    check_id("kind", kind)
    check_epoch(conn, epoch)
    require_session(conn, session_id)
    return cast(int, conn.execute(  # an INSERT always sets lastrowid
        "INSERT INTO worker_executions (session_id, kind, state, epoch, started_at) VALUES (?, ?, 'running', ?, ?)",
        (session_id, kind, epoch, stamp(now))).lastrowid)


def finish_execution(conn: sqlite3.Connection, execution_id: int, state: str, epoch: int, *,
                     now: float | None = None) -> None:
    """Move an execution to completed/failed/cancelled.

    Allowed from `running` under the caller's epoch, and from `unknown` (the current owner
    settles a run its predecessor lost, typically after reading its receipts).
    """
    _check_terminal(state)
    row = _execution(conn, execution_id)
    check_epoch(conn, epoch)
    refusal = (f"execution {execution_id} is {row['state']}; only a running execution of this "
               "epoch or an unknown one can finish")
    if row["state"] == "running" and row["epoch"] != epoch:
        raise LedgerStateError(refusal)
    EXECUTIONS.move(conn, row, state, refusal, finished_at=stamp(now))


def get_execution(conn: sqlite3.Connection, execution_id: int) -> dict[str, Any] | None:
    """Return one execution row, or None."""
    return EXECUTIONS.get(conn, execution_id)


def list_executions(conn: sqlite3.Connection, session_id: str | None = None,
                    state: str | None = None) -> list[dict[str, Any]]:
    """Return executions by id, optionally of one session and/or one state."""
    return _listing(EXECUTIONS, conn, session_id, state)


def canonical_json(payload: Any) -> str:
    """Return the canonical JSON text of a receipt payload (sorted keys, no spaces, UTF-8 kept)."""
    try:
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"receipt payload is not JSON-serialisable: {exc}") from exc
    except RecursionError as exc:
        raise ValueError("receipt payload is nested too deeply to encode as JSON") from exc


def receipt_digest(payload: Any) -> str:
    """Return the SHA-256 hex digest of the payload's canonical JSON encoded as UTF-8."""
    try:
        data = canonical_json(payload).encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate has no UTF-8 form
        raise ValueError(f"receipt payload cannot be encoded as UTF-8: {exc}") from exc
    return hashlib.sha256(data).hexdigest()


def record_receipt(conn: sqlite3.Connection, execution_id: int, seq: int, payload: Any, digest: str, *,
                   epoch: int | None = None, now: float | None = None) -> bool:
    """Record result `seq` of an execution; return True when stored, False for an identical repeat.

    Results arrive in order 1, 2, ...: a gap raises ReceiptOrderError. The digest must be the
    SHA-256 of the payload's canonical JSON (ReceiptDigestError otherwise, also when `seq` was
    already recorded with other content). A repeat of a stored receipt changes nothing, so a
    worker may resend after a crash. New receipts are taken while the execution is running or
    unknown, never after it finished.
    """
    check_count("seq", seq)
    if not isinstance(digest, str):
        raise ValueError("digest must be a hex str")
    computed = receipt_digest(payload)
    if digest.lower() != computed:
        raise ReceiptDigestError(f"receipt {seq} of execution {execution_id}: digest {digest!r} does not match "
                                 f"the payload's SHA-256 {computed}")
    row = _execution(conn, execution_id)
    check_epoch_if_given(conn, epoch)
    stored = conn.execute("SELECT digest FROM worker_receipts WHERE execution_id = ? AND seq = ?",
                          (execution_id, seq)).fetchone()
    if stored is not None:
        if stored[0] == computed:
            return False
        raise ReceiptDigestError(f"receipt {seq} of execution {execution_id} was already recorded with digest "
                                 f"{stored[0]}, not {computed}")
    if row["state"] not in LIVE_EXECUTION_STATES:
        raise LedgerStateError(f"execution {execution_id} is {row['state']}; it takes no more receipts")
    last = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM worker_receipts WHERE execution_id = ?",
                        (execution_id,)).fetchone()[0]
    if seq != last + 1:
        raise ReceiptOrderError(f"receipt {seq} of execution {execution_id} is out of order: "
                                f"the next one is {last + 1}")
    conn.execute("INSERT INTO worker_receipts (execution_id, session_id, seq, payload_json, digest, recorded_at) "
                 "VALUES (?, ?, ?, ?, ?, ?)", (execution_id, row["session_id"], seq, canonical_json(payload),
                                               computed, stamp(now)))
    return True


def list_receipts(conn: sqlite3.Connection, execution_id: int) -> list[dict[str, Any]]:
    """Return the execution's receipts by seq: {execution_id, session_id, seq, payload, digest, recorded_at}."""
    check_count("execution_id", execution_id)
    return fetch(conn, "worker_receipts", "execution_id = ?", (execution_id,), order="seq")
