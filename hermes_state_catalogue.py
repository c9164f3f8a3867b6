"""What in a file and beside it is this library's: another program's database, planted objects, leftovers.

Owns: `check_ours` (an open refuses a non-empty SQLite file holding none of the store's tables,
before anything is written to it or its mode changed) and `foreign_objects` /
`refuse_foreign_objects` (a file to restore may carry only the objects the library creates: a
planted trigger would rewrite or delete rows long after the restore), and the name of a copy
being written (`partial_path`) with `clean_partial_copies`, which removes the ones a killed
process left behind, and the copies an upgrade takes first: their names (`pending_path`, the
one listing `upgrade_copies`), the one recorded as the upgrade's (`recorded_copy`), naming it
(`name_upgrade_copy`) and removing the ones no upgrade began with (`settle_pending_copies`).
`check_read_only` and `shadow_missing` read any layout the upgrade path handles without
changing it (missing columns and tables as their defaults).
Does not own: creating the objects (hermes_state_schema, hermes_state_fts) or restoring
(hermes_state_recovery).

Transaction contract: catalogue reads only, on the caller's connection; never writes to a
database. `clean_partial_copies` and `settle_pending_copies` remove files, never one whose
writer is still running, nor a complete copy an upgrade began with.
"""
from __future__ import annotations

import calendar
import os
import re
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from hermes_state_common import (DAY_S, DICTIONARY, INDEX_SQL, READ_BUSY_TIMEOUT_S, RETIRED_INDEXES, SCHEMA_VERSION,
                                 TABLES, UPGRADE_COPY_KEEP_DAYS, logger, object_exists, split_sql)
from hermes_state_errors import (ForeignDatabaseError, StateDbBusyError, StateDbIncompatibleError,
                                 StateDbUninitializedError, is_sqlite_lock_error)
from hermes_state_schema import (UID_TRIGGER, UID_TRIGGER_SQL, default_sql, effective_version, missing_columns,
                                 table_columns)


def _index_names() -> set[str]:
    return {sql.split(" IF NOT EXISTS ")[1].split()[0] for sql in INDEX_SQL} | set(RETIRED_INDEXES)


# Statements that write rows: a trigger body holding one that names a declared table can
# rewrite or remove user data behind the library's back.
_DECLARED = sorted(name for name, _, _ in TABLES) + ["delivery_obligations"]
_WRITES_DECLARED = re.compile(r"\b(" + "|".join(_DECLARED) + r")\b", re.IGNORECASE)


# Which objects not made by the library are still acceptable, per kind; each is told whether the
# object is an earlier layout's full-text object in a file due for an upgrade.
def _trigger_accepted(name: str, table: str, sql: str, old_fts: bool) -> bool:
    body = re.split(r"\bBEGIN\b", sql, maxsplit=1, flags=re.IGNORECASE)[-1]
    return old_fts and table == "messages" and not _WRITES_DECLARED.search(body)


def _view_accepted(name: str, table: str, sql: str, old_fts: bool) -> bool:
    return old_fts


def _table_accepted(name: str, table: str, sql: str, old_fts: bool) -> bool:
    return not sql.upper().startswith("CREATE VIRTUAL TABLE") or (old_fts and "fts5" in sql.lower())


def _index_accepted(name: str, table: str, sql: str, old_fts: bool) -> bool:
    unique = sql.upper().startswith("CREATE UNIQUE")
    return table not in _DECLARED or not unique or name in _index_names()


_ACCEPTED = {"trigger": _trigger_accepted, "view": _view_accepted, "table": _table_accepted,
             "index": _index_accepted}


# --- what hermes-agent releases create --------------------------------------------------------------
# The full-text objects each known hermes-agent release creates, as it defines them (only runs of
# whitespace outside quotes may differ): a file both programs use carries them, so a restore
# accepts them, and nothing that merely resembles them. One statement per object; a release that
# defines more adds its statements here.
AGENT_OBJECT_SQL: dict[str, str] = {
    "hermes-agent 0.19.0": """
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN DELETE FROM messages_fts WHERE rowid =
    old.id; END;
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN INSERT INTO messages_fts(rowid, content)
    VALUES ( new.id, COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' ||
    COALESCE(new.tool_calls, '') ); END;
    CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages BEGIN DELETE FROM messages_fts_trigram
    WHERE rowid = old.id; END;
    CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages BEGIN INSERT INTO
    messages_fts_trigram(rowid, content) VALUES ( new.id, COALESCE(new.content, '') || ' ' ||
    COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '') ); END;
    CREATE TRIGGER messages_fts_trigram_update AFTER UPDATE ON messages BEGIN DELETE FROM messages_fts_trigram
    WHERE rowid = old.id; INSERT INTO messages_fts_trigram(rowid, content) VALUES ( new.id,
    COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '') );
    END;
    CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN DELETE FROM messages_fts WHERE rowid =
    old.id; INSERT INTO messages_fts(rowid, content) VALUES ( new.id, COALESCE(new.content, '') || ' ' ||
    COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '') ); END;
    CREATE VIRTUAL TABLE messages_fts USING fts5( content );
    CREATE VIRTUAL TABLE messages_fts_trigram USING fts5( content, tokenize='trigram' );
""",
    "hermes-agent 0.20.1": """
    CREATE VIEW messages_fts_trigram_src AS SELECT id, role, content, tool_name, tool_calls FROM messages WHERE
    role <> 'tool';
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages WHEN (old.id > COALESCE((SELECT CAST(value AS
    INTEGER) FROM state_meta WHERE key = 'fts_rebuild_high_water'), -1) OR old.id <= COALESCE((SELECT CAST(value
    AS INTEGER) FROM state_meta WHERE key = 'fts_rebuild_progress'), -1)) BEGIN INSERT INTO
    messages_fts(messages_fts, rowid, content, tool_name, tool_calls) VALUES ('delete', old.id, old.content,
    old.tool_name, old.tool_calls); END;
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages WHEN (new.id > COALESCE((SELECT CAST(value AS
    INTEGER) FROM state_meta WHERE key = 'fts_rebuild_high_water'), -1) OR new.id <= COALESCE((SELECT CAST(value
    AS INTEGER) FROM state_meta WHERE key = 'fts_rebuild_progress'), -1)) BEGIN INSERT INTO messages_fts(rowid,
    content, tool_name, tool_calls) VALUES (new.id, new.content, new.tool_name, new.tool_calls); END;
    CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages WHEN old.role <> 'tool' AND (old.id >
    COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_rebuild_high_water'), -1) OR old.id
    <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_rebuild_progress'), -1)) BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name, tool_calls) VALUES
    ('delete', old.id, old.content, old.tool_name, old.tool_calls); END;
    CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages WHEN new.role <> 'tool' AND (new.id >
    COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_rebuild_high_water'), -1) OR new.id
    <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_rebuild_progress'), -1)) BEGIN
    INSERT INTO messages_fts_trigram(rowid, content, tool_name, tool_calls) VALUES (new.id, new.content,
    new.tool_name, new.tool_calls); END;
    CREATE TRIGGER messages_fts_trigram_update AFTER UPDATE OF content, tool_name, tool_calls, role ON messages
    WHEN (old.content IS NOT new.content OR old.tool_name IS NOT new.tool_name OR old.tool_calls IS NOT
    new.tool_calls OR old.role IS NOT new.role) AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM
    state_meta WHERE key = 'fts_rebuild_high_water'), -1) OR old.id <= COALESCE((SELECT CAST(value AS INTEGER)
    FROM state_meta WHERE key = 'fts_rebuild_progress'), -1)) BEGIN INSERT INTO
    messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name, tool_calls) SELECT 'delete', old.id,
    old.content, old.tool_name, old.tool_calls WHERE old.role <> 'tool'; INSERT INTO messages_fts_trigram(rowid,
    content, tool_name, tool_calls) SELECT new.id, new.content, new.tool_name, new.tool_calls WHERE new.role <>
    'tool'; END;
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF content, tool_name, tool_calls ON messages WHEN
    (old.content IS NOT new.content OR old.tool_name IS NOT new.tool_name OR old.tool_calls IS NOT
    new.tool_calls) AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key =
    'fts_rebuild_high_water'), -1) OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE
    key = 'fts_rebuild_progress'), -1)) BEGIN INSERT INTO messages_fts(messages_fts, rowid, content, tool_name,
    tool_calls) VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls); INSERT INTO
    messages_fts(rowid, content, tool_name, tool_calls) VALUES (new.id, new.content, new.tool_name,
    new.tool_calls); END;
    CREATE VIRTUAL TABLE messages_fts USING fts5( content, tool_name, tool_calls, content='messages',
    content_rowid='id' );
    CREATE VIRTUAL TABLE messages_fts_trigram USING fts5( content, tool_name, tool_calls,
    content='messages_fts_trigram_src', content_rowid='id', tokenize='trigram' );
""",
    "hermes-agent 0.20.1 on a file of 0.19.0 (its update triggers narrowed, no rebuild)": """
    CREATE TRIGGER messages_fts_trigram_update AFTER UPDATE OF content, tool_name, tool_calls ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id; INSERT INTO messages_fts_trigram(rowid, content)
    VALUES ( new.id, COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' ||
    COALESCE(new.tool_calls, '') ); END;
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF content, tool_name, tool_calls ON messages BEGIN DELETE
    FROM messages_fts WHERE rowid = old.id; INSERT INTO messages_fts(rowid, content) VALUES ( new.id,
    COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '') );
    END;
""",
    "hermes-agent 0.20.1's CJK index, where its cjk_unicode61 tokenizer is installed": """
    CREATE VIEW messages_fts_cjk_src AS SELECT id, role, content, tool_name, tool_calls FROM messages WHERE role
    <> 'tool';
    CREATE VIRTUAL TABLE messages_fts_cjk USING fts5( content, tool_name, tool_calls,
    content='messages_fts_cjk_src', content_rowid='id', tokenize='cjk_unicode61' );
    CREATE TRIGGER messages_fts_cjk_insert AFTER INSERT ON messages WHEN new.role <> 'tool' AND (new.id >
    COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_cjk_rebuild_high_water'), -1) OR
    new.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_cjk_rebuild_progress'),
    -1)) BEGIN INSERT INTO messages_fts_cjk(rowid, content, tool_name, tool_calls) VALUES (new.id, new.content,
    new.tool_name, new.tool_calls); END;
    CREATE TRIGGER messages_fts_cjk_delete AFTER DELETE ON messages WHEN old.role <> 'tool' AND (old.id >
    COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_cjk_rebuild_high_water'), -1) OR
    old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = 'fts_cjk_rebuild_progress'),
    -1)) BEGIN INSERT INTO messages_fts_cjk(messages_fts_cjk, rowid, content, tool_name, tool_calls) VALUES
    ('delete', old.id, old.content, old.tool_name, old.tool_calls); END;
    CREATE TRIGGER messages_fts_cjk_update AFTER UPDATE OF content, tool_name, tool_calls, role ON messages WHEN
    (old.content IS NOT new.content OR old.tool_name IS NOT new.tool_name OR old.tool_calls IS NOT
    new.tool_calls OR old.role IS NOT new.role) AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM
    state_meta WHERE key = 'fts_cjk_rebuild_high_water'), -1) OR old.id <= COALESCE((SELECT CAST(value AS
    INTEGER) FROM state_meta WHERE key = 'fts_cjk_rebuild_progress'), -1)) BEGIN INSERT INTO
    messages_fts_cjk(messages_fts_cjk, rowid, content, tool_name, tool_calls) SELECT 'delete', old.id,
    old.content, old.tool_name, old.tool_calls WHERE old.role <> 'tool'; INSERT INTO messages_fts_cjk(rowid,
    content, tool_name, tool_calls) SELECT new.id, new.content, new.tool_name, new.tool_calls WHERE new.role <>
    'tool'; END;
""",
}

_QUOTED = re.compile(r"('(?:''|[^'])*')")
_HEAD = re.compile(r"CREATE (VIRTUAL TABLE|TABLE|VIEW|TRIGGER|INDEX|UNIQUE INDEX) (IF NOT EXISTS )?(\w+)")


def normalized_sql(sql: str) -> str:
    """Return a schema statement as compared: whitespace outside quotes as single spaces, no IF NOT EXISTS, no `;`."""
    parts = _QUOTED.split(sql)
    flat = "".join(p if i % 2 else re.sub(r"\s+", " ", p) for i, p in enumerate(parts)).strip().rstrip(";").rstrip()
    head = _HEAD.match(flat)  # sqlite_master keeps a statement without its IF NOT EXISTS
    return flat if head is None or head.group(2) is None else flat[:head.start(2)] + flat[head.end(2):]


def _agent_objects() -> frozenset[tuple[str, str, str]]:
    found = set()
    for release, script in AGENT_OBJECT_SQL.items():
        for statement in split_sql(script):
            sql = normalized_sql(statement)
            head = _HEAD.match(sql)
            if head is None:
                raise ValueError(f"{release}: not a CREATE statement of a named object: {sql[:80]}")
            kind = "table" if head.group(1).endswith("TABLE") else head.group(1).split()[-1].lower()
            found.add((kind, head.group(3), sql))
    return frozenset(found)


# (type, name, normalized SQL) of every object in AGENT_OBJECT_SQL, as sqlite_master names them.
AGENT_OBJECTS = _agent_objects()


def foreign_objects(conn: sqlite3.Connection, own: Iterable[tuple[str, str, str]], *, older: bool) -> list[str]:
    """Name the schema objects of a file this library would not have made (each as "trigger 'x' on t").

    `own` lists the library's derived objects (type, name, SQL) as it creates them: a trigger,
    a view or a virtual table is accepted only when it is one of them exactly, or one a known
    hermes-agent release creates (AGENT_OBJECTS, compared as `normalized_sql`). In an `older`
    file (an upgrade is due) an earlier layout's full-text objects are accepted too, as long as
    a trigger writes only to full-text tables: the upgrade drops them before any row is written.
    Tables are data and are all accepted; a UNIQUE index on a declared table must be one of ours
    (another would refuse writes the library makes). Reads the catalogue only.
    """
    # SQLite stores a CREATE ... IF NOT EXISTS without its IF NOT EXISTS.
    mine = set(own) | {("trigger", UID_TRIGGER, UID_TRIGGER_SQL.replace(" IF NOT EXISTS", "", 1))}
    out = []
    rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' "
                        "ESCAPE '\\' ORDER BY type, name").fetchall()
    for kind, name, table, sql in rows:
        sql = sql or ""
        if (kind, name, sql) in mine or (kind, name, normalized_sql(sql)) in AGENT_OBJECTS:
            continue
        accepted = _ACCEPTED.get(kind)
        if accepted is not None and accepted(name, table, sql, older and name.startswith("messages_fts")):
            continue
        out.append(f"{kind} {name!r}" + (f" on {table}" if table != name else ""))
    return out


def restorable_version(conn: sqlite3.Connection, path: Path, own: Iterable[tuple[str, str, str]]) -> int | None:
    """Return a file's schema version as `effective_version` reads it, once `refuse_foreign_objects` passed it."""
    version = effective_version(conn)
    refuse_foreign_objects(conn, path, own, version)  # a planted trigger would outlive the restore
    return version


def refuse_foreign_objects(conn: sqlite3.Connection, path: Path, own: Iterable[tuple[str, str, str]],
                           version: int | None) -> None:
    """Raise StateDbIncompatibleError naming every object `foreign_objects` finds in a file to restore.

    A file without a schema version is left to the caller (it is not a hermes-state file at all).
    """
    if version is None:
        return
    foreign = foreign_objects(conn, own, older=version < SCHEMA_VERSION)
    if foreign:
        raise StateDbIncompatibleError(
            f"{path} carries schema objects hermes-state does not create ({', '.join(foreign[:5])}"
            f"{f' and {len(foreign) - 5} more' if len(foreign) > 5 else ''}); nothing was restored. "
            f"`hermes-state recover {path} <new path>` copies its rows into a clean file, which restores.")


def check_ours(conn: sqlite3.Connection, path: Path, *, force: bool = False) -> None:
    """Refuse a non-empty database holding none of this store's tables (another program's file).

    Raises ForeignDatabaseError naming the file before anything is written to it or its mode
    changed; with `force` the file is taken as it is. Reads the catalogue only.
    """
    if force:
        return
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if names and not names & (set(_DECLARED) | {"schema_version"}):
        raise ForeignDatabaseError(
            f"{path} is a SQLite database of another program ({len(names)} table(s), none of hermes-state's); "
            "it was left untouched. Point --db at the store, or pass force (`hermes-state init --force`, "
            "SessionDB(path, force=True)) to add this store's tables to it.")


# --- copies being written -------------------------------------------------------------------------

_PARTIAL = re.compile(r"\.partial-(\d+)-[0-9a-f]{8}(-journal|-wal|-shm)?")


def partial_path(target: Path) -> Path:
    """Return the temporary name a copy is written under before it takes `target`'s name.

    It carries the writer's pid, so a later open can tell a copy still being written from one
    whose writer was killed.
    """
    return target.with_name(f"{target.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def process_running(pid: int) -> bool:
    """Tell whether a process of this pid may still run (any doubt counts as running)."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to someone else
        return True
    return True


def clean_partial_copies(db_path: Path) -> list[Path]:
    """Remove the half-written copies (and their journals) a killed process left beside `db_path`; return them.

    A SIGKILL during the copy an upgrade writes first (or a refused retry on a full disk) left
    `state.db.pre-v...bak.partial-<pid>-<hex>` forever. Only names this library makes, starting
    with the database's own name, whose writer is no longer running, are removed.
    """
    if os.name != "posix" or str(db_path) == ":memory:":
        return []  # without a safe liveness probe (os.kill on Windows ends the process) nothing is touched
    try:
        names = os.listdir(db_path.parent)
    except OSError:
        return []
    removed = []
    for name in names:
        match = _PARTIAL.search(name)
        if (match is None or match.end() != len(name) or not name.startswith(db_path.name + ".")
                or int(match.group(1)) == os.getpid() or process_running(int(match.group(1)))):
            continue
        try:
            (db_path.parent / name).unlink()
        except FileNotFoundError:  # another opener removed it first
            continue
        removed.append(db_path.parent / name)
    if removed:
        logger.info("removed %d half-written copies a killed process left: %s", len(removed),
                    ", ".join(p.name for p in removed))
    return removed


# --- the copies an upgrade takes first ------------------------------------------------------------
# One copy per upgrade, however many openers race or are killed. A copy is written under a
# temporary name (`partial_path`), then waits, complete and synced, under a pending name
# (`<final>.pending-<pid>-<hex>`) until its upgrade begins. The upgrade's first transaction holds
# the database's write lock, so exactly one opener begins it: that transaction records the pending
# name in state_meta (UPGRADE_COPY_KEY), and once it commits the copy takes its final name
# (`state.db.pre-v31-<UTC time>.bak`). A pending copy whose upgrade never began is removed: by its
# own process when another opener began first, and, once its process is gone, by the next opener
# whose upgrade begins or by a writable open of the upgraded file. A named copy is never removed.

UPGRADE_COPY_KEY = "hermes_upgrade_copy"  # state_meta: the pending name of the copy the upgrade began with
_COPY_NAME = re.compile(r"\.pre-v(\d+)-\d{8}T\d{6}Z(?:-\d+)*\.bak(?:\.pending-(\d+)-[0-9a-f]{8})?")
_PENDING_SUFFIX = re.compile(r"\.pending-\d+-[0-9a-f]{8}$")


@dataclass(frozen=True)
class UpgradeCopy:
    """A complete copy an upgrade took first, found beside its database."""

    path: Path
    version: int                    # the schema version the upgrade goes to
    pending_pid: int | None = None  # while it waits for its upgrade to begin: the process that wrote it

    @property
    def final(self) -> Path:
        """Return the name the copy has (or takes once its upgrade began)."""
        return self.path.with_name(_PENDING_SUFFIX.sub("", self.path.name))


def upgrade_copies(db_path: Path) -> list[UpgradeCopy]:
    """List the complete pre-upgrade copies beside `db_path`, oldest first, pending ones included."""
    try:
        names = os.listdir(db_path.parent)
    except OSError:
        return []
    found = []
    for name in sorted(names):
        match = _COPY_NAME.match(name, len(db_path.name))
        if name.startswith(db_path.name) and match is not None and match.end() == len(name):
            found.append(UpgradeCopy(db_path.parent / name, int(match.group(1)),
                                     None if match.group(2) is None else int(match.group(2))))
    return found


# The copies kept: the newest UPGRADE_COPIES_KEPT finished ones, each for `keep_days` after the
# upgrade that took it (SessionDB.upgrade_copy_keep_days). A writable open removes the others.
UPGRADE_COPIES_KEPT = 2
_STAMP = re.compile(r"\.pre-v\d+-(\d{8}T\d{6}Z)")


def copy_taken_at(copy: Path) -> float | None:
    """Return when an upgrade took `copy` (the UTC time in its name), or None for a name without one."""
    match = _STAMP.search(copy.name)
    if match is None:
        return None
    try:
        return calendar.timegm(time.strptime(match.group(1), "%Y%m%dT%H%M%SZ"))
    except ValueError:
        return None


def copies_to_remove(db_path: Path, keep_days: float | None, *, now: float | None = None) -> list[Path]:
    """Return the finished pre-upgrade copies past the policy: beyond the newest UPGRADE_COPIES_KEPT, or older than `keep_days`.

    None keeps every copy. Pending copies are never among them (their upgrade settles them).
    """
    if keep_days is None:
        return []
    now = time.time() if now is None else now
    dated = sorted(((taken, c.path) for c in upgrade_copies(db_path) if c.pending_pid is None
                    and (taken := copy_taken_at(c.path)) is not None), reverse=True)
    return [path for n, (taken, path) in enumerate(dated)
            if n >= UPGRADE_COPIES_KEPT or now - taken > keep_days * DAY_S]


def remove_old_copies(db_path: Path, keep_days: float | None, *, now: float | None = None) -> list[Path]:
    """Remove the pre-upgrade copies past the policy (`copies_to_remove`); return those removed."""
    removed = []
    for path in copies_to_remove(db_path, keep_days, now=now):
        try:
            path.unlink()
        except FileNotFoundError:
            continue  # another opener removed it
        except OSError as exc:  # left for a later open
            logger.warning("could not remove %s (%s)", path, exc)
            continue
        removed.append(path)
        logger.info("removed %s: pre-upgrade copies are kept %g days, the newest %d at most "
                    "(SessionDB.upgrade_copy_keep_days)", path.name, keep_days, UPGRADE_COPIES_KEPT)
    return removed


def pending_path(final: Path) -> Path:
    """Return the name a complete pre-upgrade copy waits under until its upgrade begins (it carries the writer's pid)."""
    return final.with_name(f"{final.name}.pending-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def recorded_copy(conn: sqlite3.Connection) -> str | None:
    """Return the pending name of the copy the upgrade to SCHEMA_VERSION began with, or None when none began."""
    if not object_exists(conn, "table", "state_meta"):
        return None
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (UPGRADE_COPY_KEY,)).fetchone()
    name = row[0] if row is not None and isinstance(row[0], str) else ""
    match = _COPY_NAME.search(name)
    return name if match is not None and int(match.group(1)) == SCHEMA_VERSION else None


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # a platform that cannot open a folder (Windows) has no entry to sync either
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sync_copy(path: Path) -> None:
    """Make a written copy outlive a power cut: its bytes and its name (before an upgrade changes the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync_folder(path.parent)


def name_upgrade_copy(pending: Path) -> Path:
    """Give a pending copy whose upgrade began its final name; return that name.

    Linked, never renamed over a file; a second opener naming the same copy finds it done.
    """
    final = first = UpgradeCopy(pending, SCHEMA_VERSION).final
    n = 2
    while True:
        try:
            os.link(pending, final)
            break
        except FileExistsError:
            try:
                if os.path.samefile(pending, final):
                    break
            except FileNotFoundError:  # another opener gave it the name and dropped the pending one
                return final
            final = first.with_name(f"{first.name[:-len('.bak')]}-{n}.bak")  # another file took the name
            n += 1
        except FileNotFoundError:  # the same, before this opener got to it
            return final
        except OSError:  # no hard links on this file system: take the name only while it is free
            if final.exists():
                raise
            os.replace(pending, final)
            _sync_folder(final.parent)
            return final
    pending.unlink(missing_ok=True)
    _sync_folder(final.parent)
    return final


def settle_pending_copies(db_path: Path, recorded: str | None, *, keep: str | None = None) -> Path | None:
    """Name the `recorded` pending copy once its writer is gone, and remove other pending copies whose writer is gone.

    Their upgrade never began with them (a running writer settles its own; `keep` is spared).
    Returns the recorded copy's path, pending or named, when it exists.
    """
    def gone(pid: int) -> bool:  # without a safe liveness probe (os.kill on Windows ends the process): never
        return os.name == "posix" and pid != os.getpid() and not process_running(pid)

    found = None
    recorded_final = None if recorded is None else UpgradeCopy(db_path.parent / recorded, SCHEMA_VERSION).final.name
    for copy in upgrade_copies(db_path):
        writer = copy.pending_pid
        try:
            if writer is None:
                found = copy.path if copy.path.name == recorded_final else found
            elif copy.path.name == recorded:
                found = name_upgrade_copy(copy.path) if gone(writer) else copy.path
            elif copy.path.name != keep and gone(writer):
                copy.path.unlink(missing_ok=True)
                logger.info("removed %s: a copy taken for an upgrade that never began with it (its process "
                            "is gone)", copy.path.name)
        except OSError as exc:  # a folder that refuses: the copy stays as it is, for a later open
            logger.warning("could not settle %s (%s)", copy.path, exc)
    return found


# --- reading any layout read-only -----------------------------------------------------------------

# What any layout the ladder upgrades has had: without these a file is not a session store.
_CORE_COLUMNS = {"sessions": ("id", "source", "started_at"),
                 "messages": ("id", "session_id", "role", "content", "timestamp")}


def shadow_missing(conn: sqlite3.Connection) -> list[str]:
    """On a read-only connection, make every declared table and column readable; return the tables shadowed.

    A table the file lacks a column of gets a TEMP view of the same name that adds the column at
    its default (unqualified names find the temp schema first); a table the file lacks entirely
    gets an empty one. The temp schema lives outside the database file, so its bytes stay the same.
    """
    have_tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    shadowed = []
    for table in (t for t in DICTIONARY.values() if t.at_open):
        name = table.name
        if name in have_tables:
            have = table_columns(conn, name)
            lacking = [c for c in table.columns if c.name not in have]
            if not lacking:
                continue
            added = ", ".join(f"{default_sql(c.default)} AS {c.name}" for c in lacking)
            conn.execute(f"CREATE TEMP VIEW {name} AS SELECT *, {added} FROM main.{name}")
        else:
            cols = ", ".join(f"{default_sql(c.default)} AS {c.name}" for c in table.columns)
            conn.execute(f"CREATE TEMP VIEW {name} AS SELECT {cols} WHERE 0")
        shadowed.append(name)
    return shadowed


def check_read_only(conn: sqlite3.Connection, path: Path, read_busy_s: float = READ_BUSY_TIMEOUT_S) -> int:
    """Verify a read-only handle can serve reads; return the version or raise a 503-class error.

    A file of any older layout the ladder upgrades (hermes-agent's included) is read as it is:
    the columns and tables it lacks read as their defaults (see shadow_missing), nothing is written.
    """
    try:
        version = effective_version(conn)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.OperationalError as exc:
        if is_sqlite_lock_error(exc):
            raise StateDbBusyError(f"{path} stayed locked for {read_busy_s:.1f}s") from exc
        raise
    if version is None and "sessions" not in tables:
        raise StateDbUninitializedError(f"{path} has no hermes-state schema yet")
    lacking = [f"{t}.{c}" for t, cols in _CORE_COLUMNS.items()
               for c in cols if t not in tables or c not in table_columns(conn, t)]
    if lacking:
        raise StateDbIncompatibleError(
            f"{path} is not a session store this library can read (it lacks {', '.join(lacking[:4])}). Open the "
            f"right file, or let the program that wrote it upgrade it; `hermes-state --db {path} migrate` "
            "upgrades any hermes-agent or hermes-state layout.")
    if version is not None and version > SCHEMA_VERSION:
        # A newer version holding every column we know is read as it is: a writer of a newer
        # release may upgrade the file while dashboards keep reading it. One without them has
        # changed what a column means, which defaults cannot stand in for.
        gone = missing_columns(conn)
        if gone:
            raise StateDbIncompatibleError(
                f"{path} has schema version {version}, newer than this library's {SCHEMA_VERSION}, without some "
                f"columns it reads ({', '.join(sorted(gone))}); upgrade hermes-state to read it.")
        return version
    shadow_missing(conn)  # an older layout reads with defaults for what it lacks
    return version if version is not None else 0
