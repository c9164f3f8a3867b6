"""Several writer processes on one file: nothing lost, no lock error within patience."""
from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from hermes_state import SessionDB

WRITERS, WRITES = 4, 200


def _writer(path: str, k: int, start) -> None:
    with SessionDB(path) as db:
        start.wait()
        for i in range(WRITES):
            db.create_session(f"w{k}_{i:04d}", "cli", "m")


@pytest.mark.slow
def test_four_processes_two_hundred_writes_each(tmp_path):
    path = str(tmp_path / "state.db")
    SessionDB(path).close()
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(path, k, start)) for k in range(WRITERS)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    conn = sqlite3.connect(path)
    ids = {r[0] for r in conn.execute("SELECT id FROM sessions")}
    assert ids == {f"w{k}_{i:04d}" for k in range(WRITERS) for i in range(WRITES)}
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
