"""Who holds a lock: the processes holding SQLite write-class locks on a state database, and lock holder strings.

Owns: decoding `/proc/locks` for the three files of one database (`state.db`, `-wal`, `-shm`),
turning each WRITE lock into a readable sentence with the owner's command line, logging that once
when a writer gives up ("database is locked"), telling whether this process has a descriptor open
on a database (`open_in_this_process`: then no plain copy of it may be made), and the
`configure_error_log(home)` helper that routes those warnings to `<home>/logs/errors.log`; and the
holder strings the library's own locks carry (a compression lock, the background worker's lease):
who a holder string names (`parse_holder`), this process's pid namespace (`own_pidns`,
`UNKNOWN_PIDNS`), `holder_is_gone` and `lock_is_live` (a lock counts until it expires or its holder
is provably gone; any doubt counts as alive).

Does not own: retrying, timeouts or transactions (the caller decides when patience ran out and calls
`log_write_lock_holders` once), nor any SQL. It never opens the database files: closing any
descriptor on a file drops every POSIX lock this process holds on it, so files are only stat()ed.

Everything here is best effort and never raises: off Linux, or when `/proc/locks` cannot be read,
the answer is an empty list.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

LOGGER_NAME = "hermes_state"

# Byte offsets SQLite's unix VFS locks in the shared-memory index (see sqlite3.c, WAL_*_LOCK).
_SHM_LOCKS = {
    120: "WAL write lock",
    121: "WAL checkpoint lock",
    122: "WAL recover lock",
    **{123 + slot: f"WAL read slot {slot} lock" for slot in range(5)},
    128: "WAL DMS lock",
}
_PENDING_BYTE = 0x40000000
_SHARED_FIRST = _PENDING_BYTE + 2
_SHARED_SIZE = 510
_CMDLINE_MAX = 200

# Only byte-range (fcntl) locks can block SQLite; flock(2), leases and delegations live in a
# separate namespace on Linux, so their lines are skipped.
_RANGE_LOCK_TYPES = {"POSIX": False, "OFDLCK": True}


@dataclass(frozen=True)
class LockHolder:
    """One WRITE lock on one of the database's files."""

    pid: int
    file: str
    what: str
    ofd: bool


def _describe_offset(file: str, start: int) -> str:
    if file.endswith("-shm"):
        return _SHM_LOCKS.get(start, f"lock at offset {start}")
    if file.endswith("-wal"):
        return f"lock at offset {start}"
    if start == _PENDING_BYTE:
        return "PENDING lock"
    if start == _PENDING_BYTE + 1:
        return "RESERVED lock"
    # A WRITE lock on the SHARED range is how SQLite spells EXCLUSIVE on the main file.
    if _SHARED_FIRST <= start < _SHARED_FIRST + _SHARED_SIZE:
        return "SHARED lock"
    return f"lock at offset {start}"


def _parse_line(line: str, inodes: Mapping[tuple[int, int], str]) -> LockHolder | None:
    fields = line.split()
    # Blocked waiters are printed as "N: -> TYPE ..."; they hold nothing yet.
    if len(fields) < 8 or fields[1] == "->":
        return None
    kind, access, pid_text, dev_ino, start_text = fields[1], fields[3], fields[4], fields[5], fields[6]
    if kind not in _RANGE_LOCK_TYPES or access != "WRITE":
        return None
    try:
        major, minor, ino = dev_ino.split(":")
        key = (os.makedev(int(major, 16), int(minor, 16)), int(ino))
        pid, start = int(pid_text), int(start_text)
    except ValueError:
        return None
    file = inodes.get(key)
    if file is None:
        return None
    return LockHolder(pid=pid, file=file, what=_describe_offset(file, start),
                      ofd=_RANGE_LOCK_TYPES[kind])


def parse_proc_locks(text: str, inodes: Mapping[tuple[int, int], str]) -> list[LockHolder]:
    """Decode the WRITE locks in `/proc/locks` text that sit on the files named in `inodes`.

    `inodes` maps `(st_dev, st_ino)` to a base name. Lines that do not parse are skipped.
    """
    holders = []
    for line in text.splitlines():
        holder = _parse_line(line, inodes)
        if holder is not None:
            holders.append(holder)
    return holders


def describe(holder: LockHolder, cmdline: str | None) -> str:
    """Render one holder as `PID <pid> (<cmdline>) holds <what> on <file>`."""
    if holder.ofd:
        # OFD locks belong to an open file description, which may be shared by several processes.
        who = "an OFD lock (no owning pid)"
    elif holder.pid <= 0:
        # The kernel prints 0 when the owner lives in a PID namespace we cannot see.
        who = "a process outside this PID namespace"
    else:
        who = f"PID {holder.pid} ({cmdline or '?'})"
    return f"{who} holds {holder.what} on {holder.file}"


def _read_cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # Arguments may contain newlines; one log record must stay one line, and bounded.
    text = " ".join(raw.replace(b"\0", b" ").decode("utf-8", "replace").split())
    if len(text) > _CMDLINE_MAX:
        text = text[:_CMDLINE_MAX - 3] + "..."
    return text or None


def _database_inodes(db_path: str | os.PathLike) -> dict[tuple[int, int], str]:
    base = os.fspath(db_path)
    inodes = {}
    for path in (base, base + "-wal", base + "-shm"):
        try:
            st = os.stat(path)
        except OSError:
            continue
        inodes[(st.st_dev, st.st_ino)] = os.path.basename(path)
    return inodes


def _held_here(files: Mapping[tuple[int, int], str]) -> bool | None:
    # Whether a descriptor of this process is on one of `files`; None when /proc/self cannot be read.
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in descriptors:
        try:
            found = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor among them)
        if (found.st_dev, found.st_ino) in files:
            return True
    return False


def open_in_this_process(db_path: str | os.PathLike) -> bool:
    """Tell whether any descriptor of this process is open on a database's files (True when that cannot be told)."""
    held = _held_here(_database_inodes(db_path))
    return True if held is None else held  # no way to see this process's descriptors: assume the worst


def write_lock_holders(db_path: str | os.PathLike) -> list[str]:
    """List who holds WRITE locks on the database's files, one sentence each, without duplicates.

    Returns `[]` off Linux, when no file exists, or when `/proc/locks` cannot be read.
    """
    if not sys.platform.startswith("linux"):
        return []
    try:
        inodes = _database_inodes(db_path)
        if not inodes:
            return []
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            text = fh.read()
        holders = parse_proc_locks(text, inodes)
        cmdlines = {h.pid: _read_cmdline(h.pid) for h in holders if h.pid > 0 and not h.ofd}
        described = [describe(h, cmdlines.get(h.pid)) for h in holders]
    except (OSError, ValueError):
        return []
    return list(dict.fromkeys(described))


def log_write_lock_holders(
    db_path: str | os.PathLike,
    patience_s: float,
    logger: logging.Logger | None = None,
) -> list[str]:
    """Log one WARNING naming the write-lock holders of `db_path` and return them.

    Meant to be called once, right before raising a "database is locked" error. Never raises.
    """
    try:
        holders = write_lock_holders(db_path)
        detail = "; ".join(holders) if holders else "no holder visible in /proc/locks"
        name = os.path.basename(os.fspath(db_path))
        (logger or logging.getLogger(LOGGER_NAME)).warning(
            "%s write lock still held after %.1fs: %s", name, patience_s, detail)
        return holders
    except Exception:  # a diagnostic must never replace the error the caller is about to raise
        return []


def configure_error_log(home: str | os.PathLike) -> logging.Handler:
    """Send the `hermes_state` logger's warnings to `<home>/logs/errors.log`.

    Idempotent: a second call for the same file returns the handler already attached.
    """
    logs_dir = os.path.join(os.path.abspath(os.fspath(home)), "logs")
    path = os.path.join(logs_dir, "errors.log")
    logger = logging.getLogger(LOGGER_NAME)
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler) and handler.baseFilename == path:
            return handler
    os.makedirs(logs_dir, mode=0o700, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    # With an unconfigured root logger above WARNING the records would be dropped before any handler.
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    return handler


def _pids_with_open(files: Mapping[tuple[int, int], str], program: str | None) -> list[int] | None:
    # Other processes (running `program`, or any) with a descriptor on one of `files`; None when
    # /proc cannot be listed. Another user's process is skipped: the answer is a lower bound.
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]
    except OSError:
        return None
    found = []
    for pid in pids:
        if program is not None:
            cmdline = _read_cmdline(pid)
            if not cmdline or os.path.basename(cmdline.split()[0]) != program:
                continue
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # another user's process, or gone meanwhile
        for fd in descriptors:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in files:
                found.append(pid)
                break
    return found


def processes_with_open(db_path: str | os.PathLike, program: str) -> list[int]:
    """List the PIDs of other processes running `program` that have one of the database's files open."""
    files = _database_inodes(db_path)
    if not files or not sys.platform.startswith("linux"):
        return []
    return _pids_with_open(files, program) or []


def count_db_holders(db_path: str | os.PathLike) -> int | None:
    """Count the processes (this one included) with the database file open, from /proc; None where that cannot be told.

    Linux only; never raises. Other users' processes cannot be seen without privileges, so the
    count is a lower bound. A file that does not exist has 0.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        st = os.stat(db_path)
    except FileNotFoundError:
        return 0
    except (OSError, ValueError):
        return None
    main = {(st.st_dev, st.st_ino): os.path.basename(os.fspath(db_path))}  # the database itself, as hermes-agent counts
    others = _pids_with_open(main, None)
    if others is None:
        return None
    return len(others) + (1 if _held_here(main) else 0)


# --- lock holder strings: who a holder names, and whether that process is provably gone -------

_PID = re.compile(r"(?:^|\s)pid=(\d+)(?:\s|$)")
_HOST = re.compile(r"(?:^|\s)host=(\S+)")
_PIDNS = re.compile(r"(?:^|\s)pidns=(\S+)")
# Written when this process cannot read its pid namespace: a pid it names proves nothing here.
UNKNOWN_PIDNS = "-"


def own_pidns() -> str:
    """Return this process's pid-namespace id (the inode of /proc/self/ns/pid), or UNKNOWN_PIDNS."""
    # Containers with host networking share the host name but not pids: the namespace says
    # whose pid numbers a holder string uses. Read each time: a fork may sit in a new one.
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except (OSError, ValueError):
        return UNKNOWN_PIDNS


def parse_holder(holder: str) -> tuple[int | None, str | None, str | None]:
    """Return (pid, host, pidns) named by a holder string; each is None when absent or malformed."""
    pid = _PID.search(holder or "")
    host = _HOST.search(holder or "")
    pidns = _PIDNS.search(holder or "")
    return (int(pid.group(1)) if pid else None), (host.group(1) if host else None), \
        (pidns.group(1) if pidns else None)


def holder_is_gone(holder: str) -> bool:
    """Return True only when the holder's process is provably gone: same host and pid namespace, no such pid.

    Any doubt counts as alive: another host, another or unknown pid namespace (a container
    sharing the host name; a holder string without `pidns=`), a missing or zero pid, a pid we
    may not signal (PermissionError: it exists), a recycled pid that is alive again, or a
    platform where signal 0 is not a harmless probe (on Windows os.kill would terminate it).
    """
    import socket  # here, not at start-up: few calls need the host name
    pid, host, pidns = parse_holder(holder)
    if os.name != "posix" or pid is None or pid <= 0 or host != socket.gethostname():
        return False
    if pidns is None or pidns == UNKNOWN_PIDNS or pidns != own_pidns():
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    # A process that exited but was not reaped yet still answers signal 0, for as long as its
    # parent lives; /proc says it is dead ('Z' zombie, 'X' dead). Off Linux: no proof, alive.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The command name in parentheses may hold spaces or ')'; the state follows the last ')'.
    state = stat[stat.rfind(b")") + 1:].split()[:1]
    return state in ([b"Z"], [b"X"])


def lock_is_live(holder: str, expires_at: float, now: float) -> bool:
    """Tell whether a lock of `holder` expiring at `expires_at` still holds at `now`: unexpired, holder not gone."""
    return expires_at > now and not holder_is_gone(holder)
