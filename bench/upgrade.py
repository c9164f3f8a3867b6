"""Moving in from hermes-agent: how long opening an older state.db blocks, and the file size after.

    python bench/upgrade.py OLD_STATE_DB [--no-backup]

OLD_STATE_DB is a database written by hermes-agent (bench/make_agent_db.py makes one through its
public API). The file is copied first and only the copy is upgraded. Prints: the constructor's
blocking time (backup + schema upgrade), the time the background FTS rebuild then takes, the
file sizes before and after, and the size of a fresh database holding the same content (made by
export/import) as the floor the upgraded file is compared with.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HERMES_TEST_ISOLATION", "1")  # never near a real home

from hermes_state import SessionDB  # noqa: E402


def size_mb(path: Path) -> float:
    """Return the database's size in MB after folding its WAL in."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path.stat().st_size / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--no-backup", action="store_true", help="open with backup_before_upgrade=False")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hermes-upgrade-"))
    try:
        old = work / "state.db"
        shutil.copyfile(args.path, old)
        conn = sqlite3.connect(old)
        messages = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        conn.close()
        before = size_mb(old)
        SessionDB._FTS_REBUILD_IN_BACKGROUND = False  # run the rebuild in the foreground to time it alone
        t0 = time.perf_counter()
        db = SessionDB(old, backup_before_upgrade=not args.no_backup)
        opened = time.perf_counter() - t0
        t1 = time.perf_counter()
        db.rebuild_fts()
        rebuilt = time.perf_counter() - t1
        db.close()
        after = size_mb(old)
        fresh = work / "fresh.db"
        with SessionDB(old, read_only=True) as src, SessionDB(fresh) as dst:
            dst.import_sessions(src.iter_export())
        floor = size_mb(fresh)
        print(f"{messages:,} messages, {before:.1f} MB written by hermes-agent")
        print(f"open (blocking): {opened * 1000:.0f} ms{' without' if args.no_backup else ' with'} the backup")
        print(f"background FTS rebuild, then space reclaim: {rebuilt * 1000:.0f} ms")
        print(f"file after upgrade: {after:.1f} MB; fresh file of the same content: {floor:.1f} MB "
              f"({after / floor:.2f}x)")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
