"""A writer killed with SIGKILL loses no acknowledged message and leaves integrity_check = ok."""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from hermes_state import SessionDB

CHILD = r"""
import sys
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
db.ensure_session("crash", "cli")
i = 0
while True:
    i += 1
    row_id = db.append_message("crash", "user", f"message {i} " + "x" * (i % 500))
    print(row_id, flush=True)  # acknowledged: append_message returned
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_mid_write_loses_no_acknowledged_message(tmp_path, seed):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    env = dict(os.environ, HERMES_HOME=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, env=env, text=True)
    acknowledged: list[int] = []
    target = random.Random(seed).randint(20, 400)
    deadline = time.monotonic() + 60
    while len(acknowledged) < target and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acknowledged.append(int(line))
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert len(acknowledged) == target, "the child stopped writing early"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    stored = {r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = 'crash'")}
    assert set(acknowledged) <= stored
    count = conn.execute("SELECT message_count FROM sessions WHERE id = 'crash'").fetchone()[0]
    assert count == len(stored)  # the counter moved in the same transaction as each row
    conn.close()
    with SessionDB(path) as db:  # the library reopens the crashed file normally
        assert len(db.get_messages("crash")) == len(stored)
