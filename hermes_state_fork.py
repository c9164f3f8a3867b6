"""What a fork does to this process's SQLite work: the gate that keeps it out of the way, and the child's handles.

Owns: `ForkGate` and the process's one `GATE` (every stretch in which a library connection holds
a lock of a file passes it), `FORK_WAIT_S`, `tell_child` (objects told, in a forked child, that
they were copied from the parent) and `INHERITED` (the child's copies of the parent's
connections, kept unused and unclosed).
Does not own: what a writer or a registry does in the child (they say, in `after_fork_in_child`).

Transaction contract: none; the hooks are registered once with `os.register_at_fork`.
"""
from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Iterator, Protocol

from hermes_state_common import logger

# The longest a fork waits for the library's work on other threads (a write transaction a caller
# keeps open for long holds it up that long, or until this much has passed).
FORK_WAIT_S = 10.0


class ForkGate:
    """Keeps this process's SQLite work of the library out of the way while the process forks.

    SQLite keeps the state of a file's locks per process, in memory a child copies: a fork while
    one connection of the process holds the file's write lock, or while a thread is inside SQLite
    holding one of its mutexes, leaves the child believing the lock or mutex held by a thread it
    does not have, and the child's own new handle then waits for it for ever. So every stretch in
    which a library connection holds a lock (a write transaction from BEGIN to its release, a
    read, a checkpoint, a VACUUM) runs inside `enter()`/`leave()`, and the at-fork hooks make
    fork() wait until no other thread is inside one and let none start until it has returned.
    The forking thread's own stretches are not waited for (it would wait for itself), and the wait
    is bounded by FORK_WAIT_S, so a fork never deadlocks on a transaction that waits for it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._working = 0
        self._mine: dict[int, int] = {}  # thread -> stretches it is inside
        self._forker: int | None = None

    def enter(self) -> None:
        """Start a stretch of SQLite work, waiting while another thread forks."""
        me = threading.get_ident()
        with self._cond:
            while self._forker is not None and self._forker != me:
                self._cond.wait()
            self._working += 1
            self._mine[me] = self._mine.get(me, 0) + 1

    def leave(self) -> None:
        """End the stretch `enter` started."""
        me = threading.get_ident()
        with self._cond:
            self._working -= 1
            left = self._mine.get(me, 1) - 1
            if left:
                self._mine[me] = left
            else:
                self._mine.pop(me, None)
            self._cond.notify_all()

    @contextmanager
    def work(self) -> Iterator[None]:
        """Run the block as one stretch of SQLite work."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def before_fork(self) -> None:
        """Wait until no other thread is inside a stretch; hold the gate shut (its lock held) across the fork."""
        self._cond.acquire()
        me = threading.get_ident()
        self._forker = me
        deadline = time.monotonic() + FORK_WAIT_S
        while self._working - self._mine.get(me, 0) > 0:
            if not self._cond.wait(max(deadline - time.monotonic(), 0.0)):
                if time.monotonic() >= deadline:
                    logger.warning("fork() went ahead after %.0f s while another thread of this process still "
                                   "held a lock of state.db; the child's own handle may wait for that lock",
                                   FORK_WAIT_S)
                    break

    def after_fork_in_parent(self) -> None:
        """Open the gate again in the parent."""
        self._forker = None
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        """Start the child with a fresh, open gate: none of the parent's other threads exist in it."""
        self.__init__()  # type: ignore[misc]


class CopiedByFork(Protocol):
    """An object with something to undo in a forked child."""

    def after_fork_in_child(self, parent: int) -> None:
        """Make the child's copy safe: the parent's connections and threads are not its own."""


GATE = ForkGate()
_TOLD: "weakref.WeakSet[CopiedByFork]" = weakref.WeakSet()
# A forked child's copies of the parent's connections: never used, never closed (closing one could
# wait on a mutex the fork copied held), only kept so that collecting them does not close them either.
INHERITED: list[sqlite3.Connection] = []


def tell_child(obj: CopiedByFork) -> None:
    """Have `obj.after_fork_in_child(parent_pid)` run in every child this process forks while `obj` lives."""
    _TOLD.add(obj)


def _after_fork_in_child() -> None:
    GATE.after_fork_in_child()
    parent = os.getppid()
    for obj in list(_TOLD):
        obj.after_fork_in_child(parent)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=GATE.before_fork, after_in_parent=GATE.after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
