"""Reliability under load, at a size the default suite affords (the long runs live in reliability/).

Soak: writer and reader processes on one file lose nothing and see no error. Crash: a writer
SIGKILLed at random points, several times in a row on one file, loses no acknowledged message.
Disk full: a writer under a file-size limit gets a typed `disk` error, nothing half-written, and
the file works once space returns. Every scenario ends with the same health check of the file.
"""
from __future__ import annotations

import json
import os
import random
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

HEALTHY = {"integrity": [], "fts": [], "counters_off": []}


@pytest.mark.slow
def test_soak_two_writers_two_readers_lose_nothing_and_see_no_error(tmp_path):
    path = str(tmp_path / "state.db")
    run = workers.run_soak(path, writers=2, readers=2, duration_s=2.5)
    assert run["exitcodes"] == [0, 0, 0, 0]
    assert [r["errors"] for r in run["writers"] + run["readers"]] == [[]] * 4
    acked = [a for r in run["writers"] for a in r["acked"]]
    assert all(len(r["acked"]) >= 5 for r in run["writers"]), "a writer made no progress"
    assert all(r["reads"] > 0 for r in run["readers"])
    assert workers.missing_acknowledged(path, acked) == []
    assert workers.check_file(path) == HEALTHY
    with SessionDB(path, read_only=True) as db:  # each writer's last message is found by its unique token
        for r in run["writers"]:
            last_id, sid, content = r["acked"][-1]
            hits = db.search_messages(content.split()[0])
            assert [(h["id"], h["session_id"]) for h in hits] == [(last_id, sid)]


def _kill_writer_at_random_point(path: Path, run: int, rng: random.Random) -> list[tuple[int, str]]:
    env = dict(os.environ, HERMES_HOME=str(path.parent))
    proc = subprocess.Popen([sys.executable, WORKERS, "crash", str(path), str(run)],
                            stdout=subprocess.PIPE, env=env, text=True)
    acked: list[tuple[int, str]] = []
    target = rng.randint(1, 80)
    deadline = time.monotonic() + 60
    try:
        while len(acked) < target and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            row_id, mark = line.split()
            acked.append((int(row_id), mark))
        time.sleep(rng.random() * 0.01)  # land anywhere: between appends, mid-append, mid-compression
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    assert len(acked) == target, "the writer stopped early"
    return acked


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_six_times_in_a_row_on_one_file_loses_no_acknowledged_message(tmp_path):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    rng = random.Random(14)
    acked_all: list[tuple[int, str]] = []
    for run in range(6):
        acked_all += _kill_writer_at_random_point(path, run, rng)
        assert workers.check_file(path) == HEALTHY, f"after kill {run + 1}"
    with SessionDB(path) as db:  # reopened normally, every acknowledged row present and searchable
        for run in range(6):
            stored = {m["id"]: m["content"] for m in db.get_messages(f"crash-{run}", include_inactive=True)}
            for row_id, mark in (a for a in acked_all if a[1].startswith(f"w{run}m")):
                assert stored.get(row_id, "").startswith(mark + " ")
        row_id, mark = acked_all[-1]
        assert [h["id"] for h in db.search_messages(mark, include_inactive=True)] == [row_id]


@pytest.mark.skipif(sys.platform == "win32", reason="needs RLIMIT_FSIZE and SIGXFSZ")
def test_disk_full_is_a_typed_disk_error_rolled_back_and_the_file_works_after(tmp_path):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    env = dict(os.environ, HERMES_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, WORKERS, "disk-full", str(path), "200000"],
                         capture_output=True, env=env, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["error_type"] == "SessionPersistenceError"
    assert report["typed"] and report["classified"] == "disk"
    assert report["in_transaction"] is False
    assert report["acked"], "the limit bit before anything was written; raise the headroom"
    assert report["after_found"] == 1
    assert workers.check_file(path) == HEALTHY
    with SessionDB(path) as db:
        rows = db.get_messages("full")
        contents = [m["content"] for m in rows]
        assert [m["id"] for m in rows] == [a[0] for a in report["acked"]] + [report["after_row_id"]]
        assert not any(c.startswith(report["failed_marker"] + " ") for c in contents)  # nothing half-written
        assert db.get_session("full")["message_count"] == len(rows)
