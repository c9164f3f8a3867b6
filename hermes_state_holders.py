"""Compression lock holders: who a holder string names and whether that process is provably gone.

Owns: the holder string's fields (`parse_holder`), this process's pid namespace (`own_pidns`,
`UNKNOWN_PIDNS`), `holder_is_gone` and `lock_is_live` (a lock counts until it expires or its
holder is provably gone). Does not own: issuing holders and the `compression_locks` rows
(hermes_state_compression), the transcript write's check that reads them (hermes_state_messages).
Imports only the standard library; runs no SQL. hermes_state_compression re-exports every
public name.
"""
from __future__ import annotations

import os
import re

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
