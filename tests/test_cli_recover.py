"""`hermes-state recover` as scripts use it: a copy that lost anything exits 1 and says which sessions lost what."""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from hermes_state import SessionDB
from hermes_state_cli import main


def _damaged(tmp_path: Path) -> Path:
    # Two sessions of 150 messages each; one table page in the second session's rows is garbage.
    src = tmp_path / "state.db"
    with SessionDB(src) as db:
        for sid in ("alpha", "beta"):
            db.create_session(sid, "cli")
            for n in range(150):
                db.append_message(sid, "user", f"{sid.upper()}-{n:04d} " + "x" * 300)
    conn = sqlite3.connect(src)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    leaves = {r[0] for r in conn.execute("SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf'")}
    conn.close()
    data = bytearray(src.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    at = data.find(b"BETA-0075")
    while at // page + 1 not in leaves:  # the row itself, not an index entry
        at = data.find(b"BETA-0075", at + 1)
    data[at - at % page:at - at % page + page] = os.urandom(page)
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(bytes(data))
    return damaged


def test_recover_that_lost_messages_exits_1_and_names_the_sessions(tmp_path, capsys):
    damaged = _damaged(tmp_path)
    assert main(["recover", str(damaged), str(tmp_path / "new.db")]) == 1
    out, err = capsys.readouterr()
    assert "complete: no" in out
    lost = [line for line in out.splitlines() if "session beta:" in line]
    assert len(lost) == 1 and "of its 150 messages lost" in lost[0]
    assert "session alpha" not in out
    assert "not complete" in err and err.count("\n") == 1
    with SessionDB(tmp_path / "new.db", read_only=True) as db:
        kept = db.get_session("beta")["message_count"]
    assert f"{150 - kept} of its 150" in lost[0]


def test_recover_reports_the_short_sessions_to_machines_too(tmp_path, capsys):
    damaged = _damaged(tmp_path)
    assert main(["recover", str(damaged), str(tmp_path / "new.db"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    counted, kept = report["sessions_short"]["beta"]
    assert counted == 150 and 0 < kept < 150 and list(report["sessions_short"]) == ["beta"]


def test_a_complete_recover_exits_0(tmp_path, capsys):
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "hello")
    assert main(["recover", str(tmp_path / "state.db"), str(tmp_path / "new.db")]) == 0
    assert "complete: yes" in capsys.readouterr().out
