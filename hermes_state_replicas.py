"""Whether Litestream replicates a database, and how far its copy of the log has come.

Seen without opening the database: the processes that hold its files open (from /proc), and the
change sets Litestream keeps in its folder beside the file (`.state.db-litestream/ltx/0/*.ltx`),
whose headers say which stretch of the log each one was made from. What Litestream has uploaded
is not kept locally; `litestream sync -wait` is the way to know that.
"""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

from hermes_state_lockowners import processes_with_open

_LTX_MAGIC = b"LTX1"
_LTX_HEADER = 100
_WAL_FRAME_HEADER = 24


def _newest_change_set(folder: Path) -> dict[str, Any] | None:
    # The level-0 files are named <min TXID>-<max TXID>.ltx in hex; the highest is the newest.
    try:
        names = [p for p in (folder / "ltx" / "0").iterdir() if p.suffix == ".ltx"]
    except OSError:
        return None
    for path in sorted(names, key=lambda p: p.stem.split("-")[-1], reverse=True):
        try:
            with path.open("rb") as fh:  # Litestream's own file, not the database's
                head = fh.read(_LTX_HEADER)
        except OSError:
            continue
        if len(head) < _LTX_HEADER or head[:4] != _LTX_MAGIC:
            continue
        page_size, = struct.unpack(">I", head[8:12])
        max_txid, = struct.unpack(">Q", head[24:32])
        millis, = struct.unpack(">q", head[32:40])
        offset, size = struct.unpack(">QQ", head[48:64])
        return {"txid": max_txid, "at": millis / 1000, "wal_end": offset + size, "page_size": page_size}
    return None


def replicating(db_path: str | os.PathLike) -> list[int]:
    """Return the PIDs of the Litestream processes that have the database's files open (Linux; else empty)."""
    return processes_with_open(Path(db_path), "litestream")


def litestream_status(db_path: str | os.PathLike) -> dict[str, Any]:
    """Describe Litestream's hold on a database: {"pids", "folder", "txid", "frames_waiting", "written_after_s"}."""
    path = Path(db_path)
    folder = path.with_name(f".{path.name}-litestream")
    status: dict[str, Any] = {"pids": replicating(path),
                              "folder": folder if folder.is_dir() else None,
                              "txid": None, "frames_waiting": None, "written_after_s": None}
    newest = _newest_change_set(folder) if status["folder"] else None
    if newest is None:
        return status
    status["txid"] = newest["txid"]
    try:
        wal = os.stat(f"{path}-wal")
    except OSError:
        status["frames_waiting"] = 0  # no log: every change is in the file itself
        return status
    if wal.st_size > newest["wal_end"]:
        status["frames_waiting"] = (wal.st_size - newest["wal_end"]) // (newest["page_size"] + _WAL_FRAME_HEADER)
    elif wal.st_mtime > newest["at"] + 1:
        # The log restarted from its start after that change set: frames may wait that its size hides.
        status["written_after_s"] = round(min(wal.st_mtime, time.time()) - newest["at"], 1)
    else:
        status["frames_waiting"] = 0
    return status
